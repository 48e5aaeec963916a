"""The cost model a replay predicts time with, measured on this machine: the target's verify time per block width
and the drafter's time per step.

- **verify**: the target's forward over a block of w tokens (the last token and w − 1 drafts) after a prompt, for
  each width asked (the median of a few repeats), as the decode loop runs it: under a tree's mask where a tree of
  that size was logged (the first such shape), capturing the drafter's feature layers; width 1 is a plain step.
- **draft**: the drafter's proposal time per step at each lookahead K (a chain's K, a tree's size): a short
  logging pass per K, whose proposal times are averaged, the first left out as a warm-up.

A replayed run is then timed as the live loop would spend it: per verify step, ``verify[width]`` +
``draft[K]``; plain decoding, ``verify[1]`` per token. Loop overhead (host work between steps, the drafter's start
and observe) is left out: it is what a measured speedup loses against this prediction.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.models import as_decoder
from specdec.verify.tree import Tree

if TYPE_CHECKING:
    from specdec.replay.log import ReplayLog

REPEATS = 5
DRAFT_POSITIONS = 12  # proposals timed per K (the first is a warm-up)


@dataclass
class CostModel:
    """Seconds per target forward by block width, and per drafting step by K (keys as strings in a saved log)."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_s: dict[int, float] = field(default_factory=dict)
    machine: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModel":
        return cls({int(w): t for w, t in data.get("verify_s", {}).items()},
                   {int(k): t for k, t in data.get("draft_s", {}).items()}, data.get("machine", ""))

    def verify(self, width: int) -> float:
        """A verify forward over ``width`` tokens (linear between the widths measured, the widest beyond)."""
        if not self.verify_s:
            raise ValueError("this cost model holds no verify times: measure them (specdec.replay.costs.measure)")
        if width in self.verify_s:
            return self.verify_s[width]
        widths = sorted(self.verify_s)
        if width >= widths[-1]:
            return self.verify_s[widths[-1]] * width / widths[-1]
        below = max(w for w in widths if w < width) if width > widths[0] else widths[0]
        above = min(w for w in widths if w > width)
        share = (width - below) / (above - below) if above != below else 0.0
        return self.verify_s[below] + share * (self.verify_s[above] - self.verify_s[below])

    def draft(self, k: int) -> float:
        """A drafting step at lookahead ``k`` (the nearest K measured)."""
        if not self.draft_s:
            return 0.0
        return self.draft_s[min(self.draft_s, key=lambda measured: (abs(measured - k), measured))]


def verify_times(target, prompt: Sequence[int], widths: Sequence[int], repeats: int = REPEATS, *,
                 trees: dict[int, Tree] | None = None, capture: tuple[int, ...] = ()) -> dict[int, float]:
    """The median seconds of the target's forward over ``w`` tokens after ``prompt`` (in its cache), for each of
    ``widths``: under ``trees[w]``'s mask where given (a tree of w − 1 nodes), returning the ``capture`` layers'
    features. The block is written past the committed prompt and never committed, so every repeat reads the
    same cache."""
    trees = trees or {}
    decoder = as_decoder(target)
    device = decoder.device
    ids = torch.as_tensor(list(prompt), dtype=torch.long, device=device)[None]  # [1, S]
    length = ids.shape[1]
    cache = decoder.new_cache(1, length + max(widths) + 1, torch.zeros(1, dtype=torch.long, device=device))
    times = {}
    with torch.no_grad():
        decoder(ids, cache, kv_len=length, last_only=True)
        cache.commit(torch.full((1,), length, device=device))
        for width in widths:
            block = ids[:, -1:].expand(1, width).contiguous()  # [1, w]: the tokens do not change the cost
            tree = trees.get(width)
            shape = {} if tree is None else {"tree_mask": tree.mask.to(device), "depths": tree.depths.to(device)}
            decoder(block, cache, kv_len=length + width, capture=capture, **shape)  # a first call packs what it packs
            runs = []
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                decoder(block, cache, kv_len=length + width, capture=capture, **shape)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                runs.append(time.perf_counter() - start)
            times[width] = statistics.median(runs)
    return times


def draft_times(target, drafter: Drafter, prompt: Sequence[int], ks: Sequence[int],
                positions: int = DRAFT_POSITIONS) -> dict[int, float]:
    """The mean seconds of ``drafter``'s proposal at each of ``ks`` over ``positions`` positions of ``prompt``'s
    greedy continuation (a short logging pass per K; the first proposal is left out)."""
    from specdec.replay.log import log_proposals

    out = {}
    for k in ks:
        log = log_proposals(target, drafter, [prompt], k_max=k, max_new_tokens=positions + 1, eos_token_id=[])
        times = log.prompts[0].draft_times_s[1:] or log.prompts[0].draft_times_s
        out[k] = sum(times) / len(times)
    return out


def measure(target, drafter: Drafter, prompt: Sequence[int], *, ks: Sequence[int], widths: Sequence[int],
            trees: dict[int, Tree] | None = None) -> CostModel:
    """The cost model for ``drafter`` on ``target`` (see the module docstring), timed after ``prompt``; ``trees``:
    the tree verified at each block width, where the drafter proposes trees."""
    from specdec.jobs.runs import machine_description

    device = next(target.parameters()).device
    return CostModel(verify_times(target, prompt, sorted(set(widths) | {1}), trees=trees,
                                  capture=tuple(drafter.feature_layers)),
                     draft_times(target, drafter, prompt, ks), machine_description(device))


def logged_trees(log: ReplayLog) -> dict[int, Tree]:
    """The first tree of each size a log holds, by block width (nodes + 1)."""
    trees: dict[int, Tree] = {}
    for prompt in log.prompts:
        for proposed in prompt.proposals:
            if proposed.parents and len(proposed.parents) + 1 not in trees:
                trees[len(proposed.parents) + 1] = Tree.from_parents(proposed.parents)
    return trees
