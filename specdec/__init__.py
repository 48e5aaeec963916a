"""specdec: speculative decoding with pluggable drafters and an exact verifier.

Terms (draft, accepted, recovered, bonus, α, τ) are defined once in :mod:`specdec.verify`.
"""

from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import GenerationOutput, autoregressive_generate, speculative_generate
from specdec.loading import load_target
from specdec.sampling import logits_to_probs
from specdec.verify import rejection_sample

__all__ = [
    "DraftModelDrafter",
    "GenerationOutput",
    "NgramDrafter",
    "autoregressive_generate",
    "load_target",
    "logits_to_probs",
    "rejection_sample",
    "speculative_generate",
]
