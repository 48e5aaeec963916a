"""The decode loop and what it measures.

- :mod:`~specdec.decode.engine`: ``speculative_generate`` and ``autoregressive_generate`` (prefill, then draft →
  verify → commit, one host sync a step);
- :mod:`~specdec.decode.metrics`: ``DecodeStats`` (α, τ, per-position acceptance, the times of each phase), the
  predicted speedup (and Leviathan's chain formula) and the measured speedup's bootstrap interval over prompts;
- :mod:`~specdec.decode.compare`: ``compare``, speculative against plain decoding measured as the main job does
  (warm-up first, the two in turn per prompt);
- :mod:`~specdec.decode.speed_of_light`: a step's bytes against the machine's read bandwidth.

The loop sits above the layers it drives: drafters (:mod:`specdec.drafters`), the models and their per-row static
KV cache (:mod:`specdec.models`, :mod:`specdec.models.cache`), and the acceptance rules with the sampling processing
they apply alike to draft and target (:mod:`specdec.verify`, :mod:`specdec.verify.sampling`).
"""
