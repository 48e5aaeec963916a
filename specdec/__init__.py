"""specdec: speculative decoding with pluggable drafters and an exact verifier.

The public API (``from specdec import ...``):

- ``load_target(name="smollm2-135m")`` -> ``(model, tokenizer)``: the embedded default target (offline), a local
  directory or a hub id.
- ``load_drafter(name, target, tokenizer, *, backend=Backend(), **overrides)``: a registered drafter ("ngram",
  "draft_model", "medusa", "eagle", "dflash": prompt lookup, an independent draft model, Medusa heads, EAGLE-3,
  DFlash-style block drafting) with the defaults ``python -m specdec.run drafter=<name>`` uses (the shipped weights
  for the default target); ``overrides`` as ``drafter.<setting>=...`` on the command line (``k=4``,
  ``path="outputs/medusa"``). A draft model with another tokenizer than the target's drafts across vocabularies
  (``load_drafter("draft_model", target, tokenizer, path=<its directory or hub id>, draft_vocab=0)``, a
  ``CrossVocabDrafter``; ``drafter=cross_vocab`` on the command line). ``drafter_config(name, **overrides)`` is that config alone.
- ``speculative_generate(target, drafter, input_ids, *, max_new_tokens, k=None, temperature=0.0, ...)`` (or
  ``sampling=SamplingParams(temperature, top_k, top_p)``) and
  ``autoregressive_generate(target, input_ids, *, max_new_tokens, ...)`` return a ``GenerationOutput``:
  ``.sequences`` per row the generated token ids only (lists, the prompt left out), ``.stats`` a ``DecodeStats``
  (α ``acceptance_rate``, τ ``mean_accepted_length``, ``tokens_per_second``, ...).
- ``compare(target, drafter, prompts, *, max_new_tokens)`` -> ``Comparison``: speculative against plain decoding
  measured as the main job measures them (an untimed warm-up first, the two in turn per prompt), the speedup with
  its interval over the prompts.
- Your own drafter: subclass ``Drafter``, ``@register("mine")``; ``DRAFTERS`` holds the registered ones.
  ``NgramDrafter``, ``DraftModelDrafter``, ``CrossVocabDrafter``, ``MedusaDrafter``, ``EagleDrafter``,
  ``DFlashDrafter`` are the built-in ones.
- The verifier's math: ``rejection_sample``, ``logits_to_probs``.
- How a model runs on CPU: ``as_decoder(model, backend=Backend(...))`` (specdec's kernels or torch's ops, the weights
  as their codes or float32); drafters take ``backend=`` too (``load_drafter``, their constructors).

Entry points: ``python -m specdec.run`` (the main job, sweeps with ``-m``), ``specdec.replay`` (a K sweep replayed
from one logged pass: exact greedy α and τ, the speedup predicted from this machine's costs), ``specdec.train``,
``specdec.verify_dist``, ``specdec.export``, ``specdec.report``; the README says what each writes where.
Terms (draft, accepted, recovered, bonus, α, τ) are defined once in :mod:`specdec.verify`.

The names are imported on first use, so ``python -m specdec.report`` and sweep workers do not pay for torch and
transformers until they use them.
"""

from importlib import import_module as _import_module

_EXPORTS = {
    "load_target": "specdec.models.loading",
    "load_drafter": "specdec.drafters.loading",
    "drafter_config": "specdec.drafters.loading",
    "speculative_generate": "specdec.decode.engine",
    "autoregressive_generate": "specdec.decode.engine",
    "GenerationOutput": "specdec.decode.engine",
    "DecodeStats": "specdec.decode.metrics",
    "compare": "specdec.decode.compare",
    "Comparison": "specdec.decode.compare",
    "Drafter": "specdec.drafters",
    "register": "specdec.drafters",
    "DRAFTERS": "specdec.drafters",
    "NgramDrafter": "specdec.drafters",
    "DraftModelDrafter": "specdec.drafters",
    "CrossVocabDrafter": "specdec.drafters.draft_model",
    "EagleDrafter": "specdec.drafters",
    "MedusaDrafter": "specdec.drafters",
    "DFlashDrafter": "specdec.drafters",
    "rejection_sample": "specdec.verify",
    "logits_to_probs": "specdec.verify.sampling",
    "SamplingParams": "specdec.verify.sampling",
    "Backend": "specdec.models.backend",
    "as_decoder": "specdec.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        value = getattr(_import_module(_EXPORTS[name]), name)
        globals()[name] = value  # imported once
        return value
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
