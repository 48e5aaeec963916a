"""Everything a learned drafter is trained with, method-agnostic (``python -m specdec.train method=<name>``).

- :mod:`.distill`: the self-distillation data: prompts held out from the benchmarks (``prompts``), the
  target's own answers with the hidden states behind them (``answers``), a fingerprinted safetensors store
  built once (``store``), draft vocabularies (``vocab``);
- :mod:`.methods`: one small module per drafter behind the :class:`~.methods.TrainMethod` protocol (its
  model, loss, data needs, held-out evaluation, weight file): ``medusa``;
- :mod:`.loop` (the one training loop), :mod:`.checkpoint` (resumable, atomic), :mod:`.export` (weights +
  provenance), :mod:`.trainer` (all of it in order), :mod:`.config` (the typed Hydra configs).
"""
