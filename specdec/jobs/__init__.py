"""What the entry points share: one decoding job built from the config (:mod:`~specdec.jobs.job`: the target, its
backend, the drafter, the prompts), the checks made before any model loads (:mod:`~specdec.jobs.checks`), running a
Hydra task (:mod:`~specdec.jobs.runs`: config checks, results kept, failures recorded), the prompt sources
(:mod:`~specdec.jobs.data`) and atomic file writes and checked reads (:mod:`~specdec.jobs.io`)."""
