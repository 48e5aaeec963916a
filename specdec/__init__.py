"""specdec: speculative decoding with pluggable drafters and an exact verifier.

Terms (draft, accepted, recovered, bonus, α, τ) are defined once in :mod:`specdec.verify`.
The public names below are imported lazily, so ``python -m specdec.report`` and sweep workers do not
pay for torch and transformers until they use them.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "DraftModelDrafter": "specdec.drafters",
    "NgramDrafter": "specdec.drafters",
    "GenerationOutput": "specdec.decode.engine",
    "autoregressive_generate": "specdec.decode.engine",
    "speculative_generate": "specdec.decode.engine",
    "load_target": "specdec.models.loading",
    "logits_to_probs": "specdec.verify.sampling",
    "rejection_sample": "specdec.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
