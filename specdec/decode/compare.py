"""Speculative against plain decoding from Python, measured as the main job measures them.

A first generation carries one-off costs (the allocator, kernels' first calls, packing the weights), which a
naive comparison charges to whichever method runs first. :func:`compare` does what ``python -m specdec.run``
does: one short untimed generation of each method first, then every prompt decoded speculatively and plainly in
turn (so slow drifts in machine load hit both alike), with the same seed, and the speedup reported with the
interval its prompts give it (:func:`~specdec.decode.metrics.speedup_interval`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.decode.engine import GenerationOutput, autoregressive_generate, speculative_generate
from specdec.decode.metrics import DecodeStats, speedup_interval, total
from specdec.drafters.base import Drafter, registered_name

WARMUP_TOKENS = 8  # the untimed first generation of each method


@dataclass
class Comparison:
    """One :func:`compare`: per prompt, the speculative and the plain generation (``.sequences``: the new tokens;
    ``.stats``: their counts and times), the drafter's name, and the figures over all prompts."""

    speculative: list[GenerationOutput]
    plain: list[GenerationOutput]
    drafter: str  # its registered name (load_drafter's), else its class's

    @property
    def stats(self) -> DecodeStats:
        """The speculative generations' statistics, summed over the prompts (α, τ, forwards, times)."""
        return total(out.stats for out in self.speculative)

    @property
    def speedup(self) -> float:
        """End to end (the prefill included): speculative tokens per second over plain decoding's."""
        plain = total(out.stats for out in self.plain).tokens_per_second
        return self.stats.tokens_per_second / plain if plain > 0 else math.nan

    @property
    def speedup_interval(self) -> tuple[float, float]:
        """The speedup's 95% bootstrap interval over the prompts; (nan, nan) for fewer than 3 prompts."""
        return speedup_interval([o.stats for o in self.speculative], [o.stats for o in self.plain])

    @property
    def same_output(self) -> bool:
        """Whether every prompt's speculative tokens equal plain decoding's (always, greedy)."""
        return all(s.sequences == p.sequences for s, p in zip(self.speculative, self.plain))

    def __str__(self) -> str:
        """E.g. ``eagle, k=24 (tree drafts), 3 prompts: τ 1.81, α 0.412, speedup vs plain decoding 1.03x (measured
        wall clock, end to end; 95% interval 0.95-1.10x), same output as plain decoding: True``."""
        stats = self.stats
        low, high = self.speedup_interval
        interval = (f"95% interval {low:.2f}-{high:.2f}x" if not math.isnan(low)
                    else f"no interval: {len(self.speculative)} prompts, 3 needed")
        return (f"{self.drafter}, k={stats.k} ({'tree' if stats.tree_steps else 'chain'} drafts), "
                f"{len(self.speculative)} prompts: τ {stats.mean_accepted_length:.2f}, "
                f"α {stats.acceptance_rate:.3f}, speedup vs plain decoding {self.speedup:.2f}x (measured wall clock, "
                f"end to end; {interval}), same output as plain decoding: {self.same_output}")


def compare(target, drafter: Drafter, prompts: Sequence[Sequence[int] | torch.Tensor], *, max_new_tokens: int,
            k: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
            warmup: bool = True) -> Comparison:
    """Decode each of ``prompts`` (token ids, one prompt per generation) speculatively with ``drafter`` and
    plainly, as the main job does: ``warmup`` first (one untimed short generation of each), then per prompt
    speculative decoding, then plain decoding with the same seed. ``k``: None = the drafter's config's
    (:func:`~specdec.load_drafter`); sampling as :func:`~specdec.speculative_generate`."""
    if not len(prompts):
        raise ValueError("compare needs at least one prompt (token ids)")
    device = next(target.parameters()).device
    generator = torch.Generator(device=device)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    ids = [torch.as_tensor(p, dtype=torch.long, device=device).reshape(1, -1) for p in prompts]  # each [1, S]
    if warmup:  # one-off costs stay out of the timings
        speculative_generate(target, drafter, ids[0], k=k, max_new_tokens=WARMUP_TOKENS, **sampling)
        autoregressive_generate(target, ids[0], max_new_tokens=WARMUP_TOKENS, **sampling)
    speculative, plain = [], []
    for i, prompt in enumerate(ids):
        generator.manual_seed(seed + i)
        speculative.append(speculative_generate(target, drafter, prompt, k=k, max_new_tokens=max_new_tokens,
                                                **sampling))
        generator.manual_seed(seed + i)
        plain.append(autoregressive_generate(target, prompt, max_new_tokens=max_new_tokens, **sampling))
    return Comparison(speculative, plain, registered_name(drafter))
