"""The decode loop and what it measures.

- :mod:`~specdec.decode.engine`: ``speculative_generate`` and ``autoregressive_generate`` (prefill, then draft →
  verify → commit, one host sync a step);
- :mod:`~specdec.decode.cache`: the per-row static KV cache (rollback is a pointer move, a tree's accepted path a
  gather);
- :mod:`~specdec.decode.sampling`: temperature / top-k / top-p applied the same way to draft and target;
- :mod:`~specdec.decode.metrics`: ``DecodeStats`` (α, τ, per-position acceptance, the times of each phase) and the
  predicted speedups;
- :mod:`~specdec.decode.speed_of_light`: a step's bytes against the machine's read bandwidth.

The acceptance rules themselves are :mod:`specdec.verify`; drafters are :mod:`specdec.drafters`.
"""
