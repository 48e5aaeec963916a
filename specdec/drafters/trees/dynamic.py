"""Dynamic trees and chains: keep only the drafts whose confidence pays for their verification.

A node's *confidence* is the product of the drafter's probabilities along its path from the root (its
own candidate's, times its ancestors'): EAGLE-2's estimate of how often the node is accepted (Li et al.
2024). A dynamic tree keeps the nodes whose confidence reaches ``min_confidence``; a step where none does
is a plain decode step. Where verifying a token costs a good fraction of a decode step (a CPU), unlikely
nodes cost more than they return.

Why this stays exact: the kept shape depends on the drafter's probabilities given the context, never on
the target's draws, so the verifier sees a tree it could have been given anyway. A chain is cut the same
way, before the first position whose confidence (the drafts before it, then the best probability at its
own position) falls short — never by looking at the draft being decided on, which would bias the token
emitted in its place.

A path's confidence is never above its parent's, so the kept nodes always form a tree (parents kept with
their children), and drafting level by level can skip the children of parents already pruned
(:func:`open_part`): exactly the nodes that could pass are drafted.

All log-probabilities here are natural logs; ``min_confidence`` is a probability in (0, 1).
"""

from __future__ import annotations

import math

import torch

from specdec.drafters.trees.plan import Level
from specdec.verify.tree import Tree


def path_logprobs(
    node_logp: torch.Tensor,  # [B, N]: each node's own log-probability (of its candidate, given its parent)
    tree: Tree,  # of N nodes
) -> torch.Tensor:  # [B, N]: each node's path log-probability (itself and its ancestors, summed)
    """Node log-probabilities summed along the paths (each clamped at 0, as float round-off can exceed it)."""
    ancestry = tree.mask[1:, 1:].to(node_logp.dtype)  # [N, N]: node n's path (itself, ancestors)
    return node_logp.clamp(max=0) @ ancestry.t()


def mean_confidence(
    path_logp: torch.Tensor,  # [B, N]: path log-probabilities, one row per batch row
) -> torch.Tensor:  # [N]: each node's confidence, averaged over the rows
    """The confidence a tree shared by the batch's rows ranks and keeps its nodes by (see :func:`confident`)."""
    return path_logp.exp().mean(0)


def confident(
    path_logp: torch.Tensor,  # [B, N]: path log-probabilities, one row per batch row
    min_confidence: float,
) -> torch.Tensor:  # [N] bool: the nodes kept
    """Which nodes a dynamic tree keeps: those whose confidence, averaged over the rows, reaches the
    threshold. One tree serves the whole batch and every kept node is verified in every row, so a node pays
    when the tokens it is expected to add across the rows reach ``min_confidence`` per row it costs; at
    batch 1 this is the node's own confidence. (Keeping a node confident in *any* row made the batch-4 tree
    on the real target ~4x wider.) A path's mean is never above its parent's, so pruning by parents is exact."""
    return mean_confidence(path_logp) >= min_confidence


def kept_nodes(
    path_logp: torch.Tensor,  # [B, N]: path log-probabilities of a tree's nodes, parents first
    min_confidence: float,
) -> tuple[int, ...]:  # the kept nodes, ascending (parents included); () = a plain decode step
    """The nodes of a dynamic tree (:func:`confident`), on the host: the key of the kept sub-tree's plan."""
    return tuple(confident(path_logp, min_confidence).nonzero().flatten().tolist())


def open_part(
    level: Level,
    parent_logp: torch.Tensor,  # [B, P]: path log-probabilities of the level's parents (``level.above``)
    min_confidence: float,
) -> Level | None:  # the level's nodes below confident parents; None when no parent is
    """The part of ``level`` worth drafting: the nodes below parents that a dynamic tree keeps. A child is
    never more confident than its parent, so the others could not be kept. ``level`` itself when all its
    parents are open (see :meth:`Level.spread` to lay a part's results out over the level)."""
    open_ = confident(parent_logp, min_confidence)  # [P]
    if not bool(open_.any()):
        return None
    return level if bool(open_.all()) else level.part(open_)


def confident_prefix(
    logits: torch.Tensor,  # [B, k, V]: the drafter's scores at each chain position
    index: torch.Tensor,  # [B, k] long: the draft at each position (an index into V)
    min_confidence: float,
) -> int:  # how many chain drafts to keep, 0..k
    """The longest prefix (in any row) over which the confidence of position i — P(drafts before i) ·
    max q_i, the drafter's probabilities — reaches ``min_confidence``. Whether draft i is kept never
    depends on draft i itself: dropping a draft *because of its value* would bias the token emitted in its
    place; a stop after it is a plain bonus position. In a batch the rows share one length, the longest:
    a row's drafts past its own cut are verified like any others."""
    logp = logits.log_softmax(-1)  # [B, k, V]
    drafted = logp.gather(-1, index[..., None])[..., 0]  # [B, k]
    confidence = drafted.cumsum(-1) - drafted + logp.amax(-1)  # [B, k]: drafts before i, then q_i's best
    keep = (confidence >= math.log(min_confidence)).long().cumprod(-1)  # [B, k]: a prefix per row
    return int(keep.sum(-1).max())
