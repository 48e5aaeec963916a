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
from specdec.drafters.ngram import device_continuations
from specdec.drafters.trees.plan import TreeCache
from specdec.verify.tree import Tree

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


class DeviceGrowth:
    """:class:`TreeGrowth`'s fixed-candidate tree grown in ops of fixed shapes, nothing read back, so that a step's
    drafting is one function of the draft layer's output at the newest position, replayed as one graph where the
    drafter's work replays graphs, and the decode loop may read each step a step late (``Traits.device_only``).

    Each level expands its ``expand`` most confident candidates, pruning none (:class:`TreeGrowth` with ``prune``
    off: the same candidates, drafted in the same batches); the ``n`` most confident candidates then form the tree,
    ties to the shallower and then the earlier (a stable sort over the candidates in draw order, which is
    :meth:`TreeGrowth.select`'s order). A candidate's confidence is capped at its parent's, so the kept ones always
    include their parents (:meth:`TreeGrowth.select` drops a child in the float ties where they would not: the only
    case where the two trees differ). With ``lookup`` > 0 each row's prompt-lookup continuation, found on the device
    (:func:`~specdec.drafters.ngram.device_continuations`), is a chain of that many nodes below the
    root before the tree, filled with the row's last token where shorter (its genuine nodes counted there)."""

    def __init__(self, drafter: EagleDrafter, n: int, lookup: int = 0):
        d = drafter
        self.d, self.lookup = d, lookup
        self.sizes = [d.top_k] + [d.expand * d.top_k] * (d.depth - 1)  # candidates drafted at each level
        self.n = min(n, sum(self.sizes))  # the tree's nodes (the lookup chain's come on top)
        self.max_depth = max(min(d.depth, self.n), lookup)  # a bound: a path holds one node a level

    def propose(self, state: DecodeState, hidden: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None, Tree]:  # hidden [B, H]
        """The tree's tokens [B, N] (target ids), each row's genuine nodes ([B]: the lookup chain's filler left out;
        None without one: every node is) and its shape, chosen on the device."""
        d = self.d
        graphed = d.runtime.graphs is not None
        kv_len = None if graphed else state.max_seq_len + 1  # graphs attend over the whole cache (see run)
        inputs = (hidden, state.seq, state.seq_lens, state.pad) if self.lookup else (hidden,)
        tokens, found, *shape = d.runtime.call(lambda *inputs: self.run(kv_len, *inputs), inputs,
                                               key=("device_tree", self.n, self.lookup))
        d.runtime.forwards += d.depth - 1
        return tokens, found + self.n if self.lookup else None, Tree(*shape, None, self.max_depth)

    def run(self, kv_len: int | None, hidden: torch.Tensor, *lookup_inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The growth, the selection and the tree's tensors (:meth:`Tree.on_device`): tokens [B, N], each row's genuine
        lookup nodes [B], then the tree's parents, depths, mask and children. The draft cache's entries it writes are
        committed while it grows and rolled back at its end, so running it again (a graph's warm-up) rewrites the
        same. ``kv_len``: eager, the slots the newest committed entry can reach (a level's forward attends over those
        and the step's entries)."""
        d, cache = self.d, self.d.cache
        kernels = d.backend.step_kernels(hidden.device)
        if kernels is not None:
            return self.run_on_kernels(kernels, kv_len, hidden, *lookup_inputs)
        top_k, expand = d.top_k, d.expand
        committed = cache.lengths.clone()
        values, index = d.backend.top_log_softmax(d.model.logits(hidden[:, None]), top_k)  # [B, 1, top_k]
        logp = (hidden.new_zeros(hidden.shape[0], 1, dtype=torch.float32)[..., None] + values).flatten(1)
        index = index.flatten(1)  # [B, C]: draft-vocabulary ids of the candidates so far, in draw order
        parent = torch.full((top_k,), -1, dtype=torch.long, device=hidden.device)  # [C], -1 = the root
        eye = torch.eye(expand, dtype=torch.bool, device=hidden.device)
        start, outputs, seen = 0, hidden[:, None].expand(-1, expand, -1).contiguous(), eye  # seen: entries' ancestry
        for level in range(1, d.depth):
            size = self.sizes[level - 1]
            chosen = start + mean_confidence(logp[:, start:start + size]).topk(expand).indices.sort().values  # [E]
            drafted = expand * (level - 1)
            if level == 1:
                inputs, mask = outputs, eye  # the root's children: each sees itself among the step's entries
            else:  # the parents' entries: the level before wrote ``expand``, each the parent of top_k candidates
                entry = drafted - expand + (chosen - start) // top_k  # [E]
                inputs = outputs[:, entry]
                mask = torch.cat([seen[entry], eye], 1)  # [E, drafted + E]: its ancestors' entries, itself
                seen = torch.cat([torch.cat([seen, seen.new_zeros(drafted, expand)], 1), mask], 0)
            first = cache.lengths - drafted - cache.pad
            positions = (first + level - 1)[:, None].expand(-1, expand)
            out = d.model.step(inputs, d.token_ids[index[:, chosen]], cache, positions,
                               None if kv_len is None else min(kv_len + drafted + expand, cache.capacity),
                               mask, drafted)  # [B, E, H]
            cache.lengths += expand
            outputs = out if level == 1 else torch.cat([outputs, out], 1)
            values, children = d.backend.top_log_softmax(d.model.logits(out), top_k)  # [B, E, top_k]
            logp = torch.cat([logp, (logp[:, chosen][..., None] + values).flatten(1)], 1)
            index = torch.cat([index, children.flatten(1)], 1)
            parent = torch.cat([parent, chosen[:, None].expand(-1, top_k).flatten()])  # no host read: a graph's
            start += size
        cache.lengths.copy_(committed)
        return self.select(logp, index, parent, *lookup_inputs)

    def run_on_kernels(self, kernels, kv_len: int | None, hidden: torch.Tensor, *lookup_inputs: torch.Tensor
                       ) -> tuple[torch.Tensor, ...]:
        """:meth:`run` on the step kernels (a GPU's): the candidates, the draft-layer outputs and the entries' ancestry
        in buffers of the whole tree's size, each level's bookkeeping before and after its forward one kernel each
        (:func:`~specdec.models.gpu_kernels.grow_level`, :func:`~specdec.models.gpu_kernels.grown_level`) where
        :meth:`run`'s torch ops are ~25; the confidences by the same ops, so the same levels grow (but where a level's
        confidences tie at the cut: the earlier candidate here, torch's ``topk``'s choice there)."""
        d, cache = self.d, self.d.cache
        top_k, expand, (batch, width) = d.top_k, d.expand, hidden.shape
        candidates, entries = sum(self.sizes), max(1, expand * (d.depth - 1))
        committed = cache.lengths.clone()
        logp = torch.empty(batch, candidates, dtype=torch.float32, device=hidden.device)
        index = torch.empty(batch, candidates, dtype=torch.long, device=hidden.device)
        parent = torch.empty(candidates, dtype=torch.long, device=hidden.device)
        outputs = hidden.new_empty(batch, entries, width)  # the draft layer's output at each entry
        seen = torch.empty(entries, entries, dtype=torch.int8, device=hidden.device)  # entries' ancestry
        values, children = d.backend.top_log_softmax(d.model.logits(hidden[:, None]), top_k)  # [B, 1, top_k]
        kernels.grown_level(values, children, None, None, logp, index, parent, outputs, cache.lengths, 0, 0, expand,
                            top_k)
        start = 0
        for level in range(1, d.depth):
            size, drafted = self.sizes[level - 1], expand * (level - 1)
            chosen, tokens, inputs, mask, positions = kernels.grow_level(
                mean_confidence(logp[:, start:start + size]), index, d.token_ids, outputs, hidden, seen, cache.lengths,
                cache.pad, start, drafted, level, expand, top_k)
            out, logits = d.model.step_logits(inputs, tokens, cache, positions,
                                              None if kv_len is None else min(kv_len + drafted + expand,
                                                                              cache.capacity), mask, drafted)
            values, children = d.backend.top_log_softmax(logits, top_k)  # [B, E, top_k]
            start += size
            kernels.grown_level(values, children, chosen, out, logp, index, parent, outputs, cache.lengths, start,
                                drafted, expand, top_k)
        cache.lengths.copy_(committed)
        return self.select(logp, index, parent, *lookup_inputs)

    def select(self, logp: torch.Tensor, index: torch.Tensor, parent: torch.Tensor, *lookup_inputs: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        """The ``n`` most confident candidates (``logp`` [B, C] path log-confidences, ``index`` [B, C], ``parent``
        [C]) as a tree, after the lookup chain where there is one: tokens [B, N'], the chain's genuine nodes [B] (0:
        none), then :meth:`Tree.on_device`'s. On the step kernels' devices (a GPU's) the choice and the tree's
        tensors are one kernel (:func:`~specdec.models.gpu_kernels.device_tree`) where :meth:`chosen`'s ops are ~65."""
        d = self.d
        confidence = mean_confidence(logp)  # [C]
        width = d.top_k + (1 if self.lookup else 0)  # the root's first child is the chain's
        kernels = d.backend.step_kernels(logp.device)
        if kernels is not None:
            tokens, *tree = kernels.device_tree(confidence, parent, index, d.token_ids, self.n, d.depth, width,
                                                self.lookup)
        else:
            tokens, *tree = self.chosen(confidence, index, parent, width)
        found = torch.zeros_like(index[:, 0])
        if self.lookup:
            branch, found = device_continuations(*lookup_inputs, self.lookup, kernels=kernels)  # [B, L], [B]
            tokens = torch.cat([branch, tokens], 1)
        return tokens, found, *tree

    def chosen(self, confidence: torch.Tensor, index: torch.Tensor, parent: torch.Tensor, width: int
               ) -> tuple[torch.Tensor, ...]:
        """:meth:`select`'s choice in torch's ops: the tree nodes' tokens [B, n], then the parents, depths, mask and
        children of the tree below the lookup chain's ``self.lookup`` nodes (``width`` children a node)."""
        d = self.d
        start = d.top_k
        for size in self.sizes[1:]:  # capped at the parent's, level by level (a parent's is capped already)
            level = slice(start, start + size)
            confidence[level] = torch.minimum(confidence[level], confidence[parent[level]])
            start += size
        keep = confidence.sort(descending=True, stable=True).indices[:self.n].sort().values  # [N], in draw order
        place = torch.full_like(parent, -1)
        place[keep] = torch.arange(self.n, device=keep.device)
        above = parent[keep]
        parents = torch.where(above >= 0, place[above.clamp(min=0)], -1)  # [N] in the tree's nodes
        if self.lookup:
            chain = torch.arange(-1, self.lookup - 1, device=keep.device)
            parents = torch.cat([chain, torch.where(parents >= 0, parents + self.lookup, -1)])
        tree = Tree.on_device(parents, self.max_depth, width)
        return d.token_ids[index[:, keep]], tree.parents, tree.depths, tree.mask, tree.children
