"""Exactness checks: is a drafter + verifier's output distributed as the target's?

- :mod:`~specdec.exactness.stats`: the statistical tests (per-token scores, two-sample tests, power and budgets);
- :mod:`~specdec.exactness.strata`: the tests split by stratum (drafted vs recovered/bonus positions, depth);
- :mod:`~specdec.exactness.planted`: planted bugs, to show a test has the power to catch one;
- :mod:`~specdec.exactness.shared_prefill`: scoring continuations of one prompt with one prefill;
- :mod:`~specdec.exactness.harness`: sampling, scoring and judging continuations (what ``python -m
  specdec.verify_dist`` runs).
"""
