"""Exact verification of a token *tree*: multi-candidate recursive rejection sampling.

Terms as in :mod:`specdec.verify`. A tree of N draft nodes hangs below the root (the last emitted
token); node i holds a draft token and, when drawn at random, the draft distribution q_i it was drawn
from (``None`` = chosen deterministically, i.e. one-hot q). The target scores [root, N nodes] in one
forward under a tree attention mask, which gives p at every node. The rule, from the root down:

- at the current node, with target distribution p, try its children in order. Child x (with q) is
  **accepted** with probability min(1, p(x) / q(x)); if it is rejected, p ← norm(max(0, p − q)) and the
  next sibling is tried against that residual;
- an accepted child becomes the current node (p ← the target's distribution there) and the rule repeats;
- when every child was rejected, the **recovered** token is drawn from the final residual; at a leaf, the
  **bonus** token is drawn from p there.

Why it is exact (Chen et al. 2023's lemma, applied repeatedly; SpecTr / Sequoia do the same): one step
"draw x ~ q, accept with min(1, p/q), else draw from norm(max(0, p − q))" emits a draw from p for *any* q.
Replacing "else draw from the residual" by "else try the next sibling against the residual" keeps that
true by induction over the siblings, provided each sibling was drawn from the q it reports given the
siblings before it (independent draws, draws without replacement with q renormalised, or fixed tokens
with one-hot q all qualify). Deterministic top-k candidates make the rule "accept x with probability p(x);
else remove x's mass from p and renormalise" — sampling from p by asking "is it this one?" in turn.
Greedy is again the one-hot special case: the path that follows the target's argmax is accepted.

The renormalisation after each rejected sibling matters: without it the next sibling is tested against a
sub-stochastic p and accepted too rarely (``tests/verify/test_tree_verify.py`` plants exactly that bug).

:func:`verify_tree` is the rule as written above, drawing each uniform as a sibling is tried. What the decode loop runs
(:class:`~specdec.verify.ExactRule`) is :func:`verify_tree_drawn`: the same law over uniforms drawn first in one op
(:func:`tree_draws` of them), so that a captured graph can replay it, with fixed candidates walked a level's siblings
at once from p at their tokens (:func:`onehot_walk`) instead of a [B, V] residual per sibling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec.verify.sampling import sample


@dataclass(frozen=True)
class Tree:
    """A draft-tree shape, shared by every row. Block position 0 is the root (last emitted token); node i sits at
    block position i + 1. Built from host parents (:meth:`from_parents`: a static shape) or from parents a drafter
    chose on the device (:meth:`on_device`: the node count and depth bound fixed, the shape read by nothing on the
    host unless asked, :attr:`parent_list`)."""

    parents: torch.Tensor  # [N] long: parent node of each node, -1 = the root; parents[i] < i
    depths: torch.Tensor  # [N+1] long: position offset of each block position (root 0, its children 1, ...)
    mask: torch.Tensor  # [N+1, N+1] bool: block position i attends to j iff j is i or an ancestor of i
    children: torch.Tensor  # [N+1, W] long: block positions of each block position's children, -1 = none
    known: tuple[int, ...] | None  # ``parents`` on the host (None: chosen on the device, see :attr:`parent_list`)
    max_depth: int  # levels below the root (a tree chosen on the device: at most)

    @classmethod
    def from_parents(cls, parents: list[int], device: torch.device | str = "cpu") -> "Tree":
        n = len(parents)
        if n == 0:
            raise ValueError("a draft tree needs at least one node")
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must be listed first (-1 = the root)")
        block_parent = [-1] + [p + 1 for p in parents]  # in block positions
        depths, mask = [0], torch.eye(n + 1, dtype=torch.bool)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for pos in range(1, n + 1):
            depths.append(depths[block_parent[pos]] + 1)
            mask[pos] |= mask[block_parent[pos]]
            kids[block_parent[pos]].append(pos)
        width = max(len(k) for k in kids)
        children = torch.tensor([k + [-1] * (width - len(k)) for k in kids])
        return cls(torch.tensor(parents, device=device), torch.tensor(depths, device=device), mask.to(device),
                   children.to(device), tuple(parents), max(depths))

    @classmethod
    def on_device(cls, parents: torch.Tensor, max_depth: int, width: int) -> "Tree":
        """The tree of ``parents`` [N] (long, on the device: -1 = the root, parents first), at most ``max_depth``
        levels deep and ``width`` children a node, in ops of fixed shapes: nothing is read back, so a drafter that
        chooses its tree's shape on the device (EAGLE's fixed-candidate tree) can replay it in a graph. Equal to
        :meth:`from_parents` of the same parents but for ``children``' width (-1 columns past a node's children)
        and ``max_depth`` (a bound)."""
        n, device = parents.shape[0], parents.device
        block = torch.arange(n + 1, device=device)
        block_parent = torch.cat([block[:1], parents + 1])  # [N+1]: the root is its own parent here
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device)
        depths = torch.zeros(n + 1, dtype=torch.long, device=device)
        seen = torch.ones(n + 1, dtype=torch.bool, device=device)  # a tensor, not a Python True: a graph replays it
        ancestor = block
        for _ in range(max_depth + 1):  # itself, then each ancestor up to the root
            mask.index_put_((block, ancestor), seen)
            depths += ancestor > 0  # a node at depth d counts itself and its d - 1 ancestors below the root
            ancestor = block_parent[ancestor]
        earlier = (block_parent[1:, None] == block_parent[None, 1:]) & (block[None, 1:] < block[1:, None])  # [N, N]
        rank = earlier.sum(1)  # [N]: each node's place among its siblings
        children = torch.full((n + 1, width), -1, dtype=torch.long, device=device)
        children[block_parent[1:], rank.clamp(max=width - 1)] = block[1:]
        return cls(parents, depths, mask, children, None, max_depth)

    @property
    def parent_list(self) -> tuple[int, ...]:
        """``parents`` on the host; for a tree chosen on the device this reads the device (a synchronisation: the
        decode loop never asks, replay's log and the exactness strata do)."""
        return self.known if self.known is not None else tuple(self.parents.tolist())

    @property
    def shape_key(self) -> tuple:
        """What fixes the tree's verification as a graph: its parents, or a device-chosen tree's sizes."""
        if self.known is not None:
            return self.known, self.max_depth
        return "device", self.num_nodes, self.max_depth, self.children.shape[1]

    @property
    def levels(self) -> torch.Tensor:  # [] long, on the device
        """Its levels below the root, as a tensor (a device-chosen tree's may be fewer than ``max_depth``)."""
        return self.depths.max()

    @property
    def num_nodes(self) -> int:
        return self.parents.shape[0]


def residual_after_rejection(
    p: torch.Tensor,  # [B, V] current target distribution
    q: torch.Tensor,  # [B, V] the rejected candidate's draft distribution (one-hot for a fixed token)
) -> torch.Tensor:  # [B, V] norm(max(0, p − q))
    """The distribution the next sibling is tested against. An all-zero residual only comes from float
    round-off (a rejection implies p(x) < q(x), so mass remains elsewhere); p itself is then kept."""
    residual = (p - q).clamp_(min=0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp(min=torch.finfo(p.dtype).tiny), p)


def walk_tree(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long
    draft_probs: torch.Tensor | None,  # [B, N, V] q of each node, or None for deterministic nodes (one-hot q)
    target_probs: torch.Tensor,  # [B, N+1, V]: p at the root, then at each node
    generator: torch.Generator | None = None,
    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_after_rejection,
    uniforms: torch.Tensor | None = None,  # [B, >= D·W] in [0, 1): drawn already (None: drawn here)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # accepted_nodes [B, D], num_accepted [B], end [B], next_probs [B, V]
    """The accept/reject walk of :func:`verify_tree`, without the final draw. ``end`` is the block position
    where each row's walk stopped (0 = the root); ``next_probs`` is the distribution the next token is drawn
    from there: the final residual (recovered token), or p at ``end`` when it is a leaf (bonus token).
    ``uniforms`` (a graph's): column d·W + j decides the j-th child tried at depth d (:func:`tree_draws`); None
    draws each from ``generator`` as it is tried. ``residual`` is replaceable only to plant bugs in tests."""
    batch, n = draft_tokens.shape
    if target_probs.shape[:2] != (batch, n + 1) or tree.num_nodes != n:
        raise ValueError(f"a tree of {tree.num_nodes} nodes needs draft_tokens [B, {tree.num_nodes}] and target_probs "
                         f"[B, {tree.num_nodes + 1}, V]; got {list(draft_tokens.shape)} and {list(target_probs.shape)}")
    device = draft_tokens.device
    rows = torch.arange(batch, device=device)
    depth = tree.max_depth
    node = torch.zeros(batch, dtype=torch.long, device=device)  # [B] block position of the current node
    p = target_probs[:, 0]  # [B, V]
    alive = torch.ones(batch, dtype=torch.bool, device=device)  # [B] still descending
    accepted_nodes = torch.full((batch, depth), -1, dtype=torch.long, device=device)
    for d in range(depth):
        kids = tree.children[node]  # [B, W]
        chosen = torch.full_like(node, -1)  # [B] block position of the accepted child
        for j in range(kids.shape[1]):
            kid = kids[:, j]
            trying = alive & (kid >= 0) & (chosen < 0)  # [B]
            idx = (kid - 1).clamp(min=0)  # [B] node index
            x = draft_tokens[rows, idx]  # [B]
            if draft_probs is None:
                q = torch.zeros_like(p).scatter_(-1, x[:, None], 1.0)  # [B, V] one-hot
            else:
                q = draft_probs[rows, idx]  # [B, V]
            u = (torch.rand(batch, generator=generator, device=device, dtype=p.dtype) if uniforms is None
                 else uniforms[:, d * kids.shape[1] + j])
            # u < p/q without the division: accepts with probability min(1, p/q), never when p = 0.
            ok = trying & (u * q[rows, x] < p[rows, x])
            chosen = torch.where(ok, kid, chosen)
            p = torch.where((trying & ~ok)[:, None], residual(p, q), p)
        moved = chosen >= 0
        accepted_nodes[:, d] = torch.where(moved, chosen - 1, -1)
        node = torch.where(moved, chosen, node)
        p = torch.where(moved[:, None], target_probs[rows, node], p)
        alive &= moved
    num_accepted = (accepted_nodes >= 0).sum(-1)
    return accepted_nodes, num_accepted, node, p


def tree_draws(tree: Tree) -> int:
    """The uniforms a tree's sampled verdict reads when drawn before it (:func:`verify_tree`'s ``uniforms``): one per
    child tried, depth by depth (D levels × W children a node at most), then one for the next token."""
    return tree.max_depth * tree.children.shape[1] + 1


def untried_mass(p_tried: torch.Tensor) -> torch.Tensor:  # [B, W] -> [B, W]
    """What is left of p when a node's j-th child is tried: 1 less the mass of the (distinct) siblings rejected
    before it, which the residual's renormalisation divides by (:func:`onehot_walk`). A function of its own so that
    a test can plant the missing renormalisation here too."""
    return 1 - (p_tried.cumsum(-1) - p_tried)


def onehot_walk(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long, deterministic nodes (one-hot q)
    target_probs: torch.Tensor,  # [B, N+1, V]
    uniforms: torch.Tensor,  # [B, D·W + 1] float64 in [0, 1) (:func:`tree_draws`)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted_nodes [B, D], num_accepted [B], next_tokens [B]
    """:func:`verify_tree` for deterministic nodes (one-hot q: Medusa's and EAGLE's fixed candidates, a lookup branch)
    in ops over the children alone, the siblings of a level at once: where :func:`walk_tree` builds and renormalises a
    [B, V] residual per sibling tried, this reads p at the children's tokens. With one-hot q the residual after
    rejecting x is p less x's mass, renormalised, so the j-th child x_j is accepted with probability
    p(x_j) / (1 − Σ p(x_i)) over the distinct siblings i < j before it (0 for a token a sibling before it held), and
    a level's first accepted child is the one the walk would stop at, its later uniforms unread. Where every child
    of the last node is rejected, the next token is drawn from p there less all of theirs. The same law as
    :func:`verify_tree` (tested by the same statistics); not the same draws, as its uniforms are laid out apart."""
    batch, n = draft_tokens.shape
    if target_probs.shape[:2] != (batch, n + 1) or tree.num_nodes != n:
        raise ValueError(f"a tree of {tree.num_nodes} nodes needs draft_tokens [B, {tree.num_nodes}] and target_probs "
                         f"[B, {tree.num_nodes + 1}, V]; got {list(draft_tokens.shape)} and {list(target_probs.shape)}")
    device, width = draft_tokens.device, tree.children.shape[1]
    rows = torch.arange(batch, device=device)
    block_tokens = torch.cat([torch.zeros_like(draft_tokens[:, :1]), draft_tokens], 1)  # [B, N+1], the root's unread
    node = torch.zeros(batch, dtype=torch.long, device=device)  # [B] block position
    alive = torch.ones(batch, dtype=torch.bool, device=device)  # [B] still descending
    refused = torch.zeros(batch, dtype=torch.bool, device=device)  # [B] stopped where every child was rejected
    accepted_nodes = torch.full((batch, tree.max_depth), -1, dtype=torch.long, device=device)

    def level(at: torch.Tensor):  # the children of each row's node [B]: block positions, tokens, which exist
        kids = tree.children[at]  # [B, W], -1 = none
        return kids, block_tokens.gather(1, kids.clamp(min=0)), kids >= 0

    for d in range(tree.max_depth):
        kids, tokens, real = level(node)
        p_kid = target_probs[rows[:, None], node[:, None], tokens]  # [B, W]: p at the node, at each child's token
        p_kid = torch.where(real & ~repeated_tokens(tokens, real), p_kid, 0)
        # u < p(x_j) / untried mass, without the division; never where p(x_j) = 0 (round-off may leave the mass <= 0)
        hit = (uniforms[:, d * width:(d + 1) * width] * untried_mass(p_kid) < p_kid) & (p_kid > 0)
        found = hit.any(-1)
        refused |= alive & real.any(-1) & ~found
        alive &= found
        chosen = kids[rows, hit.int().argmax(-1)]  # the first accepted child
        accepted_nodes[:, d] = torch.where(alive, chosen - 1, -1)
        node = torch.where(alive, chosen, node)
    _, tokens, real = level(node)
    residual = without_rejected(target_probs[rows, node], tokens, real & refused[:, None])
    return accepted_nodes, (accepted_nodes >= 0).sum(-1), sample(residual, uniforms=uniforms[:, -1])


def repeated_tokens(tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:  # [B, W], [B, W] -> [B, W] bool
    """Which children hold a token an earlier sibling (of those that exist, ``real``) holds: after that sibling's
    rejection the residual gives it nothing, so it is never accepted and its mass is not taken away again."""
    width = tokens.shape[1]
    before = torch.ones(width, width, dtype=torch.bool, device=tokens.device).tril(-1)  # [W, W]: i is tried before j
    return ((tokens[:, :, None] == tokens[:, None, :]) & real[:, None, :] & before).any(-1)


def without_rejected(p: torch.Tensor, tokens: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """p [B, V] less the mass of the ``rejected`` [B, W] children's ``tokens`` [B, W]: what the next token is drawn
    from (unnormalised) where every child of the walk's last node was rejected; p itself where none was (a leaf), or
    where nothing is left (round-off). :func:`onehot_walk`'s last step, apart so that a test can plant it."""
    tried = torch.zeros_like(p).scatter_add_(1, tokens, rejected.to(p.dtype))
    residual = torch.where(tried > 0, 0, p)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)


def verify_tree_drawn(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long
    draft_probs: torch.Tensor | None,  # [B, N, V], or None for deterministic nodes (one-hot q)
    target_probs: torch.Tensor,  # [B, N+1, V]
    uniforms: torch.Tensor,  # [B, D·W + 1] float64 in [0, 1) (:func:`tree_draws`)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted_nodes [B, D], num_accepted [B], next_tokens [B]
    """:func:`verify_tree` over uniforms drawn before it, as a captured graph runs it (nothing drawn inside):
    deterministic nodes by :func:`onehot_walk`, drawn ones by the general walk."""
    if draft_probs is None:
        return onehot_walk(tree, draft_tokens, target_probs, uniforms)
    nodes, num_accepted, _, next_probs = walk_tree(tree, draft_tokens, draft_probs, target_probs, uniforms=uniforms)
    return nodes, num_accepted, sample(next_probs, uniforms=uniforms[:, -1])


def accepted_path(accepted_nodes: torch.Tensor) -> torch.Tensor:  # [B, D] -> [B, D+1] long
    """The block positions a tree verdict's walk went through: the root (0), then each accepted node (past a
    row's last accepted node: stale entries, never read)."""
    return torch.cat([torch.zeros_like(accepted_nodes[:, :1]), accepted_nodes.clamp(min=0) + 1], 1)


def greedy_tree(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long
    target_tokens: torch.Tensor,  # [B, N+1] long: the target's argmax at the root, then at each node
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted_nodes [B, D], num_accepted [B], next_tokens [B]
    """:func:`verify_tree` at temperature 0, from the target's argmax tokens alone: the same three tensors,
    without a [B, N+1, V] distribution or a pass over the vocabulary per sibling tried. With one-hot p every
    residual is p again, so the walk accepts the first child (in order) whose token is the argmax at its
    parent and stops where none is; the next token is the argmax there. Whatever the drafts' q."""
    batch, n = draft_tokens.shape
    if target_tokens.shape != (batch, n + 1) or tree.num_nodes != n:
        raise ValueError(f"a tree of {tree.num_nodes} nodes needs draft_tokens [B, {tree.num_nodes}] and target_tokens "
                         f"[B, {tree.num_nodes + 1}]; got {list(draft_tokens.shape)} and {list(target_tokens.shape)}")
    rows = torch.arange(batch, device=draft_tokens.device)
    block_tokens = torch.cat([torch.full_like(draft_tokens[:, :1], -1), draft_tokens], 1)  # [B, N+1], root: none
    node = torch.zeros(batch, dtype=torch.long, device=draft_tokens.device)  # [B] block position
    alive = torch.ones(batch, dtype=torch.bool, device=draft_tokens.device)  # [B] still descending
    accepted_nodes = torch.full((batch, tree.max_depth), -1, dtype=torch.long, device=draft_tokens.device)
    for d in range(tree.max_depth):
        kids = tree.children[node]  # [B, W] block positions, -1 = none
        hit = (kids >= 0) & (block_tokens.gather(1, kids.clamp(min=0)) == target_tokens[rows, node][:, None])
        chosen = kids[rows, hit.int().argmax(-1)]  # the first hit among the siblings (argmax: the first maximum)
        alive &= hit.any(-1)
        accepted_nodes[:, d] = torch.where(alive, chosen - 1, -1)
        node = torch.where(alive, chosen, node)
    num_accepted = (accepted_nodes >= 0).sum(-1)
    return accepted_nodes, num_accepted, target_tokens[rows, node]


def verify_tree(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long
    draft_probs: torch.Tensor | None,  # [B, N, V] q of each node, or None for deterministic nodes (one-hot q)
    target_probs: torch.Tensor,  # [B, N+1, V]: p at the root, then at each node
    generator: torch.Generator | None = None,
    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_after_rejection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted_nodes [B, D], num_accepted [B], next_tokens [B]
    """Walk the tree from the root; see the module docstring. Row b emits the tokens of nodes
    ``accepted_nodes[b, :num_accepted[b]]`` (node indices; -1 past them), then ``next_tokens[b]``.
    ``residual`` is replaceable only to plant bugs in tests."""
    accepted_nodes, num_accepted, _, next_probs = walk_tree(tree, draft_tokens, draft_probs, target_probs,
                                                            generator, residual)
    return accepted_nodes, num_accepted, sample(next_probs, generator)
