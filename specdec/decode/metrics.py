"""Decode statistics in one object: acceptance, mean accepted length, forward counts and times.

Terms as in :mod:`specdec.verify`. Counting conventions, fixed here once:

- a *verify step* is one row taking part in one target forward over [last token, K drafts];
  ``target_forwards`` and ``target_time_s`` count those forwards (batched: one per step), the prompt's
  prefill is timed apart in ``prefill_time_s``;
- *end to end* (``wall_time_s``, ``tokens_per_second``): the whole generation, the prompt's prefill and the
  token it gives included; *decode only* (``decode_time_s``, ``decode_tokens_per_second``): the prefill's time
  and its token left out (the drafter's start on the prompt stays in: it is drafting work), so long prompts
  do not hide what the decode loop achieves;
- α (``acceptance_rate``) = accepted draft tokens / proposed draft tokens;
- α_i (``acceptance_per_position[i]``) = P(draft i accepted | drafts 0..i-1 accepted), i.e. accepted at
  i / verify steps that reached i (for a tree: level i, with any of its candidates; levels below the
  tree's depth stay nan). Their pooled ratio (``acceptance_rate_conditional``) is the per-token
  acceptance probability Leviathan et al.'s formulas assume; accepted/proposed understates it;
- τ (``mean_accepted_length``) = tokens the verifier emitted per verify step, bonus/recovered token
  included (so τ ≥ 1); truncation at EOS or ``max_new_tokens`` does not count against it;
- c (cost ratio) = drafter time per draft token / time of one plain target decode step;
- the *predicted speedup* (``predicted_speedup``) = τ · plain step time / (verify + draft time per step), from the
  costs measured in the run: it holds for trees as well as chains and, like decode only, leaves the prefill out;
  its gap to the measured ``decode_speedup`` is the loop's host work. ``leviathan_chain_formula`` is Leviathan
  et al.'s (1 − α^(K+1)) / ((1 − α)(K·c + 1)) (2023, Thm 3.8; α the pooled conditional rate above), an
  idealisation: a chain of K drafts whose verification costs one plain step; its gap to ``predicted_speedup`` is
  what verifying K + 1 tokens costs beyond that. results.json files written before these names hold the two as
  ``predicted_speedup_measured_costs`` and ``predicted_speedup`` (the sweep report reads them under these names);
- a *speedup's interval* (``speedup_interval``, ``decode_speedup_interval``): the 95% percentile interval of the
  speedup over prompts resampled with replacement (a seeded bootstrap of :func:`speedup_interval`), so a figure
  is read with the noise of the prompts it rests on; a group of fewer than :data:`MIN_PROMPTS` prompts has none
  (``few_prompts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Sequence

import numpy as np

MIN_PROMPTS = 3  # prompts (batches) a group's speedup needs for an interval; fewer are marked few_prompts


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per verify] with i.i.d. acceptance α: (1 − α^(K+1)) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def leviathan_chain_formula(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. Thm 3.8: (1 − α^(K+1)) / ((1 − α)(K·c + 1)), the speedup of a chain of K drafts whose
    verification costs one plain step (results.json's ``leviathan_chain_formula``; see the module docstring)."""
    return expected_tokens_per_step(alpha, k) / (k * cost_ratio + 1.0)


@dataclass
class DecodeStats:
    k: int = 0
    proposed_per_position: list[int] = field(default_factory=list)  # [K]
    accepted_per_position: list[int] = field(default_factory=list)  # [K]
    proposed_tokens: int = 0  # genuine drafts proposed (a drafter may propose fewer than K)
    verify_steps: int = 0
    tree_steps: int = 0  # target forwards that verified a tree of drafts (0: chain drafting throughout)
    verified_tokens: int = 0  # accepted + 1 per verify step (bonus or recovered included)
    new_tokens: int = 0  # tokens returned to the caller (after EOS / max_new_tokens truncation)
    prefill_tokens: int = 0  # of new_tokens, those the prefill gave (one per row)
    target_forwards: int = 0
    drafter_forwards: int = 0
    target_time_s: float = 0.0
    prefill_time_s: float = 0.0
    drafter_time_s: float = 0.0
    wall_time_s: float = 0.0
    # graph captures (torch.compile's compiling with them) during the run: one-off costs, left out of the times above
    capture_time_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.proposed_per_position:
            self.proposed_per_position = [0] * self.k
            self.accepted_per_position = [0] * self.k

    def record_step(self, num_proposed: list[int], num_accepted: list[int], active: list[bool],
                    depth: int | None = None) -> None:
        """One target verify forward: per row, drafts proposed and accepted (host ints). ``depth``: for a
        tree of drafts, its number of levels (a position is then a level: reached while every level above
        it was accepted, and only when it exists); None for a chain (depth = drafts proposed)."""
        self.tree_steps += depth is not None
        for proposed, accepted, on in zip(num_proposed, num_accepted, active):
            if not on:
                continue
            accepted = min(accepted, proposed)
            self.verify_steps += 1
            self.verified_tokens += accepted + 1
            for i in range(min(proposed if depth is None else depth, accepted + 1)):  # positions reached
                self.proposed_per_position[i] += 1
            for i in range(accepted):
                self.accepted_per_position[i] += 1
            self.proposed_tokens += proposed

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else math.nan

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else math.nan for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    @property
    def acceptance_rate_conditional(self) -> float:
        reached = sum(self.proposed_per_position)
        return self.accepted_tokens / reached if reached else math.nan

    @property
    def mean_accepted_length(self) -> float:
        return self.verified_tokens / self.verify_steps if self.verify_steps else math.nan

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else math.nan

    @property
    def decode_time_s(self) -> float:
        return self.wall_time_s - self.prefill_time_s

    @property
    def decode_tokens_per_second(self) -> float:
        decode_time = self.decode_time_s
        return (self.new_tokens - self.prefill_tokens) / decode_time if decode_time > 0 else math.nan

    @property
    def target_time_per_forward(self) -> float:
        return self.target_time_s / self.target_forwards if self.target_forwards else math.nan

    def cost_ratio(self, target_step_time_s: float) -> float:
        """c, given the time of one plain (single-token) target decode step."""
        draft_tokens = self.k * self.verify_steps
        if not draft_tokens or not target_step_time_s > 0:
            return math.nan
        return (self.drafter_time_s / draft_tokens) / target_step_time_s

    def merge(self, other: "DecodeStats") -> "DecodeStats":
        """Sum two runs' counts and times, field by field (per-position counts padded to the larger K)."""
        k = max(self.k, other.k)
        pad = lambda xs: xs + [0] * (k - len(xs))  # noqa: E731

        def add(a, b):  # a count or time, or per-position counts
            return [x + y for x, y in zip(pad(a), pad(b))] if isinstance(a, list) else a + b

        return DecodeStats(k=k, **{f.name: add(getattr(self, f.name), getattr(other, f.name))
                                   for f in fields(self) if f.name != "k"})

    def summary(self) -> dict:
        return {
            "k": self.k,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_rate_conditional": self.acceptance_rate_conditional,
            "acceptance_per_position": self.acceptance_per_position,
            "mean_accepted_length": self.mean_accepted_length,
            "proposed_tokens": self.proposed_tokens,
            "accepted_tokens": self.accepted_tokens,
            "verify_steps": self.verify_steps,
            "tree_steps": self.tree_steps,
            "new_tokens": self.new_tokens,
            "prefill_tokens": self.prefill_tokens,
            "target_forwards": self.target_forwards,
            "drafter_forwards": self.drafter_forwards,
            "target_time_s": self.target_time_s,
            "prefill_time_s": self.prefill_time_s,
            "drafter_time_s": self.drafter_time_s,
            "wall_time_s": self.wall_time_s,
            "capture_time_s": self.capture_time_s,
            "tokens_per_second": self.tokens_per_second,
            "decode_time_s": self.decode_time_s,
            "decode_tokens_per_second": self.decode_tokens_per_second,
        }


def total(stats: Iterable[DecodeStats]) -> DecodeStats | None:
    """Several generations' statistics summed (:meth:`DecodeStats.merge`); None for none."""
    merged = None
    for s in stats:
        merged = s if merged is None else merged.merge(s)
    return merged


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan  # no decode steps (max_new_tokens=1): no decode-only rate


def summarize(spec: DecodeStats, base: DecodeStats | None, k: int, num_prompts: int) -> dict[str, Any]:
    """The metrics of results.json for one group of prompts (all of them, or one category).

    Rates and speedups come twice (see the module docstring): ``tokens_per_second``,
    ``baseline_tokens_per_second`` and ``speedup`` end to end, the prompt's prefill included (as they always
    were); ``decode_tokens_per_second``, ``baseline_decode_tokens_per_second`` and ``decode_speedup`` decode
    only, the prefill's time and its token left out (on long prompts the prefill can take most of the time).
    ``predicted_speedup``, from the measured costs, is the prediction (the table's ``predicted`` column);
    ``leviathan_chain_formula`` the idealised chain formula (the module docstring defines both), which fits only
    where ``drafting`` (the shape the drafter proposed) is ``chain``."""
    out = {
        "num_prompts": num_prompts,
        "acceptance_rate": spec.acceptance_rate,
        "acceptance_rate_conditional": spec.acceptance_rate_conditional,
        "acceptance_per_position": spec.acceptance_per_position,
        "mean_accepted_length": spec.mean_accepted_length,
        "tokens_per_second": spec.tokens_per_second,
        "baseline_tokens_per_second": math.nan,
        "speedup": math.nan,
        "decode_tokens_per_second": spec.decode_tokens_per_second,
        "baseline_decode_tokens_per_second": math.nan,
        "decode_speedup": math.nan,
        "predicted_speedup": math.nan,
        "leviathan_chain_formula": math.nan,
        "drafting": "tree" if spec.tree_steps else "chain",
        "cost_ratio": math.nan,
    }
    if base is not None and base.target_forwards:
        step_time = base.target_time_s / base.target_forwards
        cost = spec.cost_ratio(step_time)
        per_step = spec.target_time_per_forward + (spec.drafter_time_s / spec.target_forwards
                                                   if spec.target_forwards else math.nan)
        out.update(
            baseline_tokens_per_second=base.tokens_per_second,
            speedup=_ratio(spec.tokens_per_second, base.tokens_per_second),
            baseline_decode_tokens_per_second=base.decode_tokens_per_second,
            decode_speedup=_ratio(spec.decode_tokens_per_second, base.decode_tokens_per_second),
            cost_ratio=cost,
            predicted_speedup=spec.mean_accepted_length * step_time / per_step,
            leviathan_chain_formula=leviathan_chain_formula(spec.acceptance_rate_conditional, k, cost),
            target_step_time_s=step_time,
            verify_step_time_s=spec.target_time_per_forward,
        )
    return out


def speedup_interval(spec: Sequence[DecodeStats], base: Sequence[DecodeStats], *, decode_only: bool = False,
                     level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The ``level`` percentile bootstrap interval of a group's speedup: ``spec[i]`` and ``base[i]`` are one
    prompt's (one batch's) speculative and plain decoding; each of ``resamples`` draws takes as many prompts with
    replacement and computes the speedup as :func:`summarize` does, total tokens over total time of each (end to
    end, or ``decode_only``). Seeded: the same runs give the same interval. (nan, nan) below :data:`MIN_PROMPTS`."""
    if len(spec) != len(base):
        raise ValueError(f"speedup_interval pairs each prompt's two runs: got {len(spec)} and {len(base)}")
    if len(spec) < MIN_PROMPTS:
        return math.nan, math.nan

    def tokens_and_times(stats: Sequence[DecodeStats]) -> tuple[np.ndarray, np.ndarray]:
        if decode_only:
            return (np.array([s.new_tokens - s.prefill_tokens for s in stats], dtype=float),
                    np.array([s.decode_time_s for s in stats], dtype=float))
        return (np.array([s.new_tokens for s in stats], dtype=float),
                np.array([s.wall_time_s for s in stats], dtype=float))

    (spec_tokens, spec_times), (base_tokens, base_times) = tokens_and_times(spec), tokens_and_times(base)
    draws = np.random.default_rng(seed).integers(0, len(spec), size=(resamples, len(spec)))  # [R, n] prompt indices
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (spec_tokens[draws].sum(1) / spec_times[draws].sum(1)) / (base_tokens[draws].sum(1) /
                                                                          base_times[draws].sum(1))  # [R]
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return math.nan, math.nan
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def speedup_intervals(spec: Sequence[DecodeStats], base: Sequence[DecodeStats]) -> dict[str, Any]:
    """results.json's noise fields for a group of prompts: ``speedup_interval`` and ``decode_speedup_interval``
    ([low, high], None below :data:`MIN_PROMPTS` prompts) and ``few_prompts`` (fewer than that: the group's
    speedups rest on too few prompts to tell from noise)."""
    def interval(decode_only: bool) -> list[float] | None:
        low, high = speedup_interval(spec, base, decode_only=decode_only)
        return None if math.isnan(low) else [low, high]

    return {"speedup_interval": interval(False), "decode_speedup_interval": interval(True),
            "few_prompts": len(spec) < MIN_PROMPTS}


def summarize_prompts(spec: Sequence[DecodeStats], base: Sequence[DecodeStats] | None, k: int,
                      num_prompts: int) -> dict[str, Any]:
    """:func:`summarize` of a group of prompts given per prompt (per batch: ``spec[i]`` and ``base[i]`` decoded the
    same prompts), with the speedups' intervals and ``few_prompts`` (:func:`speedup_intervals`)."""
    if not base:
        noise = {"speedup_interval": None, "decode_speedup_interval": None, "few_prompts": len(spec) < MIN_PROMPTS}
    else:
        noise = speedup_intervals(spec, base)
    return {**summarize(total(spec), total(base) if base else None, k, num_prompts), **noise}


# What a replayed group's figures leave out (as_replayed): what only wall clock measures, the end-to-end figures (no
# prefill is timed) and the two formulas that leave the loop's host work out
NOT_REPLAYED = ("tokens_per_second", "baseline_tokens_per_second", "speedup", "speedup_interval", "decode_speedup",
                "decode_speedup_interval", "leviathan_chain_formula")


def as_replayed(figures: dict[str, Any]) -> dict[str, Any]:
    """:func:`summarize_prompts`' figures of a group of runs replayed under a cost model (:mod:`specdec.replay`), with
    the one prediction a replay makes: ``predicted_speedup`` is the replay's decode speedup (each step timed as the
    live loop spends it, its host work included; ``predicted_speedup_interval`` its interval over the prompts), and
    the decode rates it rests on stay (predictions too). The rest of :data:`NOT_REPLAYED` goes: a replay measures no
    wall clock, times no prefill (its end-to-end figures would repeat the decode-only ones), and the formulas leave
    the host work out, so they run high against the replay and a live run (Leviathan's chain formula assumes a
    cheaper verify still)."""
    out = {key: value for key, value in figures.items() if key not in NOT_REPLAYED}
    out["predicted_speedup"] = figures.get("decode_speedup", math.nan)
    out["predicted_speedup_interval"] = figures.get("decode_speedup_interval")
    return out
