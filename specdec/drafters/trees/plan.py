"""Tree plans: a draft tree given as priority-ordered paths of candidate ranks, laid out for drafting.

A *path* [r_0, r_1, .., r_d] names one node at depth d + 1: candidate r_0 (0 = the best) below the root,
then candidate r_1 below that, and so on. What ranks the candidates is the drafter's business: Medusa's
head d ranks the tokens of depth d + 1 (from the hidden state alone, or given the path for token-aware
heads); an EAGLE-style draft layer ranks the children of each node it expands. Paths are listed parents
first, in priority order, so the first k of them always form a tree: one number sizes it.

A :class:`TreePlan` is such a tree in the form drafting needs: the :class:`~specdec.verify.tree.Tree`
shape the verifier walks; each node's level and rank, to gather the nodes' tokens at once from candidates
ranked per level; and the tree level by level (:class:`Level`), to draft one level at a time from the
nodes above. A plan depends on the paths only, so it is built once (:class:`PlanCache`); trees that change
shape from step to step (a lookup branch merged in) are kept by parent list (:class:`TreeCache`).

Example: paths [[0], [1], [0, 0]] are the root's best two candidates and the best candidate below the first:
its plan has parents (-1, -1, 0), ranks [0, 1, 0] and levels [0, 0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdec.verify.tree import Tree


def check_paths(paths: Any, max_depth: int) -> list[list[int]]:
    """Validate a tree given as priority-ordered paths of candidate ranks (parents first, none repeated,
    at most ``max_depth`` ranks each, e.g. Medusa's number of heads); return it as plain lists."""
    paths = [[int(r) for r in p] for p in paths]
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if not p or len(p) > max_depth or min(p) < 0:
            raise ValueError(f"tree path {p} must list 1..{max_depth} non-negative ranks (one per level below the "
                             f"root; {max_depth} levels can be drafted); shorten or drop it")
        if tuple(p) in seen or (len(p) > 1 and tuple(p[:-1]) not in seen):
            raise ValueError(f"tree path {p} is repeated or listed before its parent {p[:-1]}; list each path once, "
                             f"after its parent")
        seen.add(tuple(p))
    return paths


@dataclass(frozen=True)
class Level:
    """The nodes at one depth: drafting it ranks the candidates of each parent in ``above`` (``top`` of
    them) and gives node ``nodes[i]`` candidate ``rank[i]`` of parent ``above[slot[i]]``."""

    nodes: torch.Tensor  # [n] long: the nodes at this depth (indices into the paths), ascending
    above: torch.Tensor  # [P] long: their distinct parents, as positions in the level above (the root: [0])
    slot: torch.Tensor  # [n] long: each node's parent, as a position in ``above``
    rank: torch.Tensor  # [n] long: each node's rank among its parent's candidates
    top: int  # candidates needed per parent: 1 + max(rank)

    def part(self, open_: torch.Tensor) -> Level:  # open_ [P] bool, some True
        """The nodes of this level under the open parents ``above[open_]`` only."""
        keep = open_[self.slot]  # [n]
        rank = self.rank[keep]
        return Level(self.nodes[keep], self.above[open_], (open_.cumsum(0) - 1)[self.slot[keep]], rank,
                     1 + int(rank.max()))

    def spread(
        self,
        values: torch.Tensor,  # [B, n', ...]: one entry per node of ``part``
        part: Level,  # a part of this level (see :meth:`part`)
        fill: float,
    ) -> torch.Tensor:  # [B, n, ...]: values at the part's nodes' positions in this level, ``fill`` elsewhere
        """Lay a part's values out over the whole level, where the next level looks its parents up."""
        where = torch.searchsorted(self.nodes, part.nodes)  # [n']
        return values.new_full((values.shape[0], self.nodes.numel(), *values.shape[2:]), fill).index_copy_(
            1, where, values)


@dataclass(frozen=True)
class TreePlan:
    """A tree of paths laid out for drafting (see the module docstring)."""

    tree: Tree
    level: torch.Tensor  # [N] long: each node's level, its depth - 1 (Medusa: the head that proposes it)
    rank: torch.Tensor  # [N] long: which of its level's (or its parent's) candidates it is
    top: int  # candidates needed per level: 1 + the largest rank
    levels: list[Level]  # the nodes depth by depth; node i is in levels[level[i]]


def plan_tree(paths: list[list[int]], device: torch.device | str) -> TreePlan:
    """The plan of the tree made of ``paths`` (valid as :func:`check_paths` checks them)."""
    index = {tuple(p): i for i, p in enumerate(paths)}
    parents = [index[tuple(p[:-1])] if len(p) > 1 else -1 for p in paths]
    levels, previous = [], [-1]  # the root is the level above depth 1
    for depth in range(1, max(len(p) for p in paths) + 1):
        nodes = [i for i, p in enumerate(paths) if len(p) == depth]
        above = sorted({parents[i] for i in nodes}, key=previous.index)
        levels.append(Level(*(torch.tensor(x, device=device) for x in (
            nodes, [previous.index(a) for a in above], [above.index(parents[i]) for i in nodes],
            [paths[i][-1] for i in nodes])), 1 + max(paths[i][-1] for i in nodes)))
        previous = nodes
    return TreePlan(Tree.from_parents(parents, device), torch.tensor([len(p) - 1 for p in paths], device=device),
                    torch.tensor([p[-1] for p in paths], device=device), 1 + max(p[-1] for p in paths), levels)


class PlanCache:
    """The plans of the sub-trees of one tree of paths, each built once: a dynamic tree keeps a different
    subset of the same paths from step to step."""

    def __init__(self, paths: list[list[int]]):
        self.paths = paths
        self._plans: dict[tuple[int, ...], TreePlan] = {}

    def get(self, nodes: tuple[int, ...], device: torch.device | str) -> TreePlan:
        """The plan of the tree made of these paths (indices into ``paths``, ascending, parents included)."""
        if nodes not in self._plans:
            self._plans[nodes] = plan_tree([self.paths[i] for i in nodes], device)
        return self._plans[nodes]


class TreeCache:
    """Trees by parent list, each built once; when ``size`` are kept, the next new one starts afresh."""

    def __init__(self, size: int = 1024):
        if size < 1:
            raise ValueError(f"a tree cache holds at least one tree, got size={size}")
        self.size = size
        self._trees: dict[tuple[int, ...], Tree] = {}

    def get(self, parents: tuple[int, ...], device: torch.device | str) -> Tree:
        """The tree of these parents (as :meth:`Tree.from_parents` takes them)."""
        if parents not in self._trees:
            if len(self._trees) >= self.size:
                self._trees.clear()
            self._trees[parents] = Tree.from_parents(list(parents), device)
        return self._trees[parents]
