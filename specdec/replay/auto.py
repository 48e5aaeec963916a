"""``drafter.k=auto``: the lookahead a run drafts with (a chain's K, a tree's size, or none at all), chosen from a
replay of held-out prompts timed by costs measured on this machine at the run's batch size.

For each candidate size the replay (:mod:`specdec.replay`) gives τ on the calibration prompts (one logging pass
covers every chain K; a tree size is its own pass), the cost model (:mod:`specdec.replay.costs`, measured at the
run's batch size, temperature and weight format: the target decoder's backend) times the steps, and the
predicted decode speedup over plain decoding follows. The run drafts at the best candidate, or not at all (k = 0,
plain decoding) where no candidate is predicted to reach ``1 + margin``: the margin absorbs what the prediction
misses (within ~6% at batch 1 here: experiments/README.md#replay-costs-2026-11-26). At a batch of B rows each row
accepts as at batch 1, and the rows step together as a live batch does: each step as wide as the widest row's
block, each batch as long as its slowest row (:func:`~specdec.replay.simulate.batched_speedup`).

Its settings arrive checked before any model loads (:class:`~specdec.jobs.checks.AutoSettings`, from ``auto.*``).
The logs and costs are cached like the replay job's (:func:`~specdec.replay.cache.cached_log`): a second run of the
same configuration on this machine chooses in a fraction of a second. Tree sizes, each logged in a pass of its own,
are timed by one cost model measured for all of them (:func:`~specdec.replay.cache.shared_costs`), so that they are
compared by the same clock.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from specdec.decode.metrics import total
from specdec.drafters.base import Drafter
from specdec.jobs.checks import CHAIN_KS, TREE_SIZES, AutoSettings
from specdec.replay.cache import cached_log, shared_costs
from specdec.replay.simulate import batched_speedup, replay
from specdec.verify.sampling import SamplingParams


@dataclass
class AutoChoice:
    """What ``k=auto`` chose (``k``: 0 = plain decoding) and why: τ and the predicted decode speedup per
    candidate on the calibration prompts, and the seconds choosing took."""

    k: int
    predicted: dict[int, float] = field(default_factory=dict)
    tau: dict[int, float] = field(default_factory=dict)
    margin: float = 0.05
    prompts: int = 0
    batch_size: int = 1
    seconds: float = 0.0
    logs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"k": self.k, "predicted_speedup": self.predicted, "mean_accepted_length": self.tau,
                "margin": self.margin, "prompts": self.prompts, "batch_size": self.batch_size,
                "seconds": self.seconds, "logs": self.logs}


def auto_candidates(drafter: Drafter, tree: bool, given: Sequence[int] | None = None) -> list[int]:
    """The sizes ``k=auto`` tries: ``given``, else :data:`CHAIN_KS` for a chain and :data:`TREE_SIZES` for a tree,
    those the drafter drafts at (:meth:`~specdec.drafters.base.Traits.drafts_at`: e.g. a Medusa tree's sizes
    beyond its lookup nodes, a Medusa chain's up to its heads)."""
    sizes = list(given) if given else list(TREE_SIZES if tree else CHAIN_KS)
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in sizes):
        raise ValueError(f"the lookaheads k=auto tries (auto.ks) must be integers >= 1, got {sizes!r}")
    kept = sorted({k for k in sizes if drafter.traits.drafts_at(k)})
    if not kept:
        raise ValueError(f"{type(drafter).__name__} drafts at none of the sizes {sizes} (auto.ks); try others")
    return kept


def choose_lookahead(target, drafter: Drafter, prompts: Sequence[Sequence[int]], settings: AutoSettings, *,
                     batch_size: int, eos: Sequence[int], tokenizer: Any = None,
                     sampling: SamplingParams = SamplingParams(), run_tokens: int | None = None,
                     timing: Any = None) -> AutoChoice:
    """The lookahead among the sizes ``settings`` names (chain K's, or tree sizes where ``settings.tree``; those the
    drafter drafts at, :func:`auto_candidates`) with the best decode speedup predicted on ``prompts`` at a batch of
    ``batch_size`` rows, or 0 (plain decoding) where none reaches ``1 + settings.margin`` (see the module docstring).
    At temperature > 0 the replay is in expectation along ``settings.seeds`` sampled continuations per prompt.
    ``run_tokens``: the run's new tokens per row (None: the calibration's ``settings.max_new_tokens``), over which
    it pays the drafter's once-a-generation work (:func:`~specdec.replay.simulate.batched_speedup`). ``timing``: what
    the costs are measured through (None: ``target``; on a GPU, the graphed decoder the run replays, while the logs
    come from ``target``'s eager forwards)."""
    tree, margin, candidates = settings.tree, settings.margin, auto_candidates(drafter, settings.tree, settings.ks)
    if not prompts:
        raise ValueError("k=auto needs at least one calibration prompt")
    start = time.perf_counter()
    common = dict(max_new_tokens=settings.max_new_tokens, tokenizer=tokenizer, eos_token_id=list(eos),
                  **asdict(sampling), seeds=settings.seeds, tree=tree, directory=settings.log_dir, costs=True,
                  cost_batch=batch_size, pad_id=getattr(tokenizer, "pad_token_id", None) or 0, timing=timing)
    choice = AutoChoice(0, margin=margin, prompts=len(prompts), batch_size=batch_size)
    logs = {}
    shared = tree and len(candidates) > 1  # tree sizes: one log each, timed by one cost model (shared_costs)
    for size in (candidates if tree else [max(candidates)]):
        log, path, _ = cached_log(target, drafter, prompts, k_max=size, **{**common, "costs": not shared})
        logs[size] = log, path
        choice.logs.append(str(path))
    if shared:
        costs = shared_costs(target, drafter, prompts, logs, batch_size=batch_size, directory=settings.log_dir,
                             pad_id=common["pad_id"], timing=timing, **asdict(sampling))
        logs = {size: (log.timed_by(costs), path) for size, (log, path) in logs.items()}
    for k in candidates:
        log = logs[k if tree else max(candidates)][0]
        choice.tau[k] = total(replay(log, k)).mean_accepted_length
        choice.predicted[k] = batched_speedup(log, k, batch_size, run_tokens=run_tokens)  # expected, at T > 0
    best = max(choice.predicted, key=lambda k: (choice.predicted[k], -k))
    choice.k = best if choice.predicted[best] >= 1 + margin else 0
    choice.seconds = time.perf_counter() - start
    return choice
