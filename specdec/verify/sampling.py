"""Logits → probabilities under one set of sampling settings, shared by every drafter and the target.

Exactness depends on the draft distribution q and the target distribution p being processed the same
way (temperature, then top-k, then top-p), so both go through :func:`logits_to_probs`. Temperature 0
means greedy decoding and yields a one-hot distribution on the argmax: greedy is the special case of
rejection sampling with one-hot distributions (the decode loop takes that case from the argmax tokens
directly: :func:`specdec.verify.greedy_tree`, tested equal to the general rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling settings. ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise a ValueError naming the bad value and the valid range."""
    if not (0 <= temperature < math.inf):  # also rejects NaN
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0 = off), got {top_k!r}")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (1 = off), got {top_p!r}")


def logits_to_probs(
    logits: torch.Tensor,  # [..., V]
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:  # [..., V] float32, rows sum to 1
    """Apply temperature, top-k and top-p (in that order) and return probabilities. Top-p keeps the fewest likeliest
    tokens whose mass reaches ``top_p``, and every token whose logit equals the last of them.

    ``temperature == 0`` returns the one-hot distribution of the argmax (ties go to the lowest token
    id, as in ``torch.argmax`` and transformers' greedy search).
    """
    validate_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits = torch.sort(logits, dim=-1, descending=True).values
        sorted_probs = sorted_logits.softmax(-1)
        # Keep a token while the mass strictly before it is below top_p (the first always stays), and every token
        # tied with the last one kept: the tokens kept do not depend on how a sort orders equal logits (bf16 logits
        # tie often), and are those at or above one logit, as a kernel finds it (gpu_kernels.sampling_floors).
        kept = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
        smallest = torch.where(kept, sorted_logits, float("inf")).amin(-1, keepdim=True)
        logits = logits.masked_fill(logits < smallest, float("-inf"))
    return logits.softmax(-1)


def uniforms(rows: int, count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """[rows, count] float64 uniforms in [0, 1) from ``generator``, in one draw: what the exact rule reads, drawn
    before it runs (so that a captured graph replays it with nothing drawn inside)."""
    return torch.rand(rows, count, generator=generator, device=device, dtype=torch.float64)


def sample(
    probs: torch.Tensor,  # [..., V]
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,  # [...] float64 in [0, 1): drawn already (None: drawn here)
) -> torch.Tensor:  # [...] long
    """Draw one token per row of ``probs`` with ``generator`` (inverse-CDF, one uniform per row), or with the
    ``uniforms`` given (a graph's: drawn before it replays)."""
    flat = probs.reshape(-1, probs.shape[-1])
    u = (torch.rand(flat.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64)
         if uniforms is None else uniforms.reshape(-1, 1))
    cdf = flat.double().cumsum(-1)
    # First index whose CDF exceeds u·total: a zero-probability token never is (its CDF step is 0).
    # Scaling by the row total keeps rows that do not sum exactly to 1 in range.
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=flat.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])
