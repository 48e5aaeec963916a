"""One step's EAGLE-2 tree, grown level by level from the draft layer (see :mod:`specdec.drafters.eagle.drafter`).

Candidates are numbered in draw order. Each has a path log-confidence (its own draft log-probability plus its
parent's), and the tree's choices read it through the shared rule of :mod:`specdec.drafters.trees.dynamic`
(:func:`~specdec.drafters.trees.dynamic.mean_confidence`: the confidence averaged over the rows, as every row
verifies the same tree shape). The candidates expanded so far, each with one entry in the draft cache, form a
tree of their own: an expanded candidate attends to its ancestors' entries, which is the ancestor mask of
:class:`~specdec.verify.tree.Tree` over those entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdec.drafters.base import DecodeState
from specdec.drafters.trees.dynamic import mean_confidence
from specdec.drafters.trees.plan import TreeCache

if TYPE_CHECKING:
    from specdec.drafters.eagle.drafter import EagleDrafter


class TreeGrowth:
    """The tree of one step. Column i of ``index`` [B, n] (draft-vocabulary ids) and ``logp`` [B, n] (path
    log-confidences) is candidate i's, appended a level at a time; ``parent[i]`` (-1 = the root), ``level[i]``
    (0 = the root's children) and, in a sampled tree, ``q[i]`` [B, Dv], the law reported for it (the one it was
    drawn from, :class:`~specdec.drafters.trees.siblings.SiblingDraws`). ``entries``
    are the expanded candidates' parents as entries (-1 = the root), entry j written j-th past the committed
    cache; ``masks`` keeps the trees of those entries across steps."""

    prune = True  # leave unexpanded the nodes with no selectable descendant (:meth:`open`)

    def __init__(self, drafter: EagleDrafter, state: DecodeState, sampled: bool, masks: TreeCache):
        self.d, self.state, self.sampled, self.masks = drafter, state, sampled, masks
        self.index: torch.Tensor | None = None  # [B, n] long
        self.logp: torch.Tensor | None = None  # [B, n]
        self.parent: list[int] = []
        self.level: list[int] = []
        self.q: list[torch.Tensor] = []
        self.entry: dict[int, int] = {}  # expanded candidate -> its entry
        self.entries: list[int] = []  # entry -> its parent's entry (-1 = the root)
        self.output: dict[int, torch.Tensor] = {}  # expanded candidate -> the draft layer's output there [B, H]

    def children(self, hidden: torch.Tensor, parents: list[int], level: int) -> None:
        """Draft ``top_k`` children of each of ``parents`` (candidates; -1 = the root) from the draft layer's
        outputs ``hidden`` [B, P, H] at those parents: P·top_k new candidates, parent by parent."""
        d = self.d
        base = hidden.new_zeros(hidden.shape[0], 1, dtype=torch.float32) if parents == [-1] else self.logp[:, parents]
        if self.sampled:
            logits = d.logits(hidden)  # [B, P, Dv]
            q = d.draft_probs(logits, self.state)  # [B, P, Dv]
            logq = q.clamp(min=1e-30).log()
            index, logp = [], []
            for j in range(len(parents)):
                drawn, laws = d.traits.siblings.draw(q[:, j], logits[:, j], d.top_k, self.state.generator)  # [B, top_k]
                index.append(drawn)
                logp.append(base[:, j, None] + logq[:, j].gather(1, drawn))
                self.q += laws
            index, logp = torch.cat(index, 1), torch.cat(logp, 1)
        else:
            values, index = d.top_candidates(hidden)  # [B, P, top_k]
            index, logp = index.flatten(1), (base[..., None] + values).flatten(1)
        self.parent += [p for p in parents for _ in range(d.top_k)]
        self.level += [level] * (len(parents) * d.top_k)
        self.index = index if self.index is None else torch.cat([self.index, index], 1)
        self.logp = logp if self.logp is None else torch.cat([self.logp, logp], 1)

    def grow(self, hidden: torch.Tensor, k: int) -> None:  # hidden [B, H] at the newest committed position
        d = self.d
        self.children(hidden[:, None], [-1], 0)
        levels = self.levels_fitting(k) if self.sampled else d.depth
        for level in range(1, min(d.depth, levels)):
            frontier = [i for i, lv in enumerate(self.level) if lv == level - 1]
            if not self.sampled:
                frontier = self.open(frontier, k)
                if not frontier:
                    break  # nothing below can be selected: the levels left are not drafted
            confidence = mean_confidence(self.logp[:, frontier])  # [n]
            chosen = sorted(frontier[i] for i in confidence.topk(min(d.expand, len(frontier))).indices.tolist())
            tokens = d.token_ids[self.index[:, chosen]]  # [B, E]
            inputs = torch.stack([hidden if self.parent[i] < 0 else self.output[self.parent[i]] for i in chosen], 1)
            drafted, mask = len(self.entries), self.mask(chosen, hidden.device)
            out = d.extend(inputs, tokens, self.state, level - 1, drafted, mask)  # [B, E, H]
            for j, i in enumerate(chosen):
                self.output[i] = out[:, j]
            self.children(out, chosen, level)

    def mask(self, chosen: list[int], device: torch.device) -> torch.Tensor:  # -> [E, drafted + E] bool
        """The entries of the expanded candidates ``chosen`` added to :attr:`entries`, and which of the step's
        entries (those written before, then these E) each of them sees: its ancestors' and its own."""
        drafted = len(self.entries)
        for j, i in enumerate(chosen):
            self.entry[i] = drafted + j
            self.entries.append(self.entry[self.parent[i]] if self.parent[i] >= 0 else -1)
        tree = self.masks.get(tuple(self.entries), device)
        return tree.mask[1 + drafted:, 1:].contiguous()  # block position 0, the root, is no entry

    def open(self, frontier: list[int], k: int) -> list[int]:
        """Fixed-candidate trees: the ``frontier`` candidates whose children could still be selected. A child
        is never more confident than its parent (in every row, so on average too), and :meth:`select` keeps
        the k most confident candidates (ties to the shallower) reaching ``min_confidence``: a node below
        ``min_confidence``, or not above the k-th best confidence drafted so far, has no selectable
        descendant. Leaving them unexpanded (and stopping when none is left) changes no selected tree."""
        if not self.prune:
            return frontier
        if k < 1:
            return []
        confidence = mean_confidence(self.logp)  # [n]
        bar = confidence.topk(k).values[-1] if confidence.numel() >= k else float("-inf")
        selectable = ((confidence >= self.d.min_confidence) & (confidence > bar)).tolist()  # one read of the device
        return [i for i in frontier if selectable[i]]

    def levels_fitting(self, k: int) -> int:
        """Sampled trees: how many whole levels fit in k nodes (at least one)."""
        d, count, levels = self.d, 0, 0
        for size in [d.top_k] + [d.top_k * d.expand] * (d.depth - 1):
            if count + size > k and levels:
                break
            count += size
            levels += 1
        return levels

    def select(self, k: int) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor | None]:
        """The tree verified: tokens [B, N] (target ids), parents (node indices, -1 = the root), q [B, N, Dv]
        (sampled trees) or None. Fixed candidates: the k most confident (EAGLE-2's rerank; a child is never
        more confident than its parent, so parents come along), those reaching ``min_confidence`` only.
        Sampled: every candidate drawn. N may be 0 (a plain step)."""
        n = len(self.parent)
        if self.sampled:
            levels = self.levels_fitting(k)
            keep = [i for i in range(n) if self.level[i] < levels]
        else:
            confidence = mean_confidence(self.logp).tolist()  # [n]
            best = [i for i in sorted(range(n), key=lambda i: (-confidence[i], self.level[i], i))[:k]
                    if confidence[i] >= self.d.min_confidence]
            keep, kept = [], {-1}
            for i in sorted(best, key=lambda i: (self.level[i], i)):
                if self.parent[i] in kept:  # always, but for float ties between a parent and its child
                    keep.append(i)
                    kept.add(i)
        if not keep:
            return self.index[:, :0], (), None
        position = {i: j for j, i in enumerate(keep)}
        parents = tuple(position[self.parent[i]] if self.parent[i] >= 0 else -1 for i in keep)
        tokens = self.d.token_ids[self.index[:, keep]]
        probs = torch.stack([self.q[i] for i in keep], 1) if self.sampled else None
        return tokens, parents, probs
