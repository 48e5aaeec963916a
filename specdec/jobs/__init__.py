"""What the entry points share: running a Hydra task (:mod:`~specdec.jobs.runs`: config checks, results kept,
failures recorded), the prompt sources (:mod:`~specdec.jobs.data`) and atomic file writes and checked reads
(:mod:`~specdec.jobs.io`)."""
