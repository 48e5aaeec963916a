"""What the exact rule accepts at temperature > 0, as probabilities: the floats a sampled replay log keeps per
draft, and the accepted-length distribution a step has given them. Pure functions; terms as in
:mod:`specdec.verify`.

- A chain's draft i, drawn from q_i, is accepted with probability min(1, p_i(x) / q_i(x)); averaged over the
  draw that is β_i = Σ_x min(p_i(x), q_i(x)) (1 − the total-variation distance); a deterministic draft (one-hot
  q) gives β_i = p_i(x_i). Given drafts 1..i−1 accepted, the step reaches draft i, so P(accepted ≥ k) =
  Π_{i<=k} β_i and the expected accepted length E[n] = Σ_{k=1..K} Π_{i<=k} β_i (τ of the step: E[n] + 1).
- A tree of deterministic nodes: siblings are tried in order against the residual, and with one-hot q that is
  sampling from p by asking "is it this one?" in turn (:mod:`specdec.verify.tree`), so the step accepts child x
  of an accepted node with probability p(x), p the target's distribution there (given the path to it); a token
  repeated among siblings is never accepted twice (its mass left with the first). P(accepted ≥ d) is the sum,
  over the nodes of depth d, of the product of these along the node's path.

Which p_i and q_i the β's are taken from (the drafts' own, one draw each) is the logging pass's business:
:mod:`specdec.replay.log`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.verify.tree import Tree


def chain_acceptance(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] q_i, or None for deterministic drafts (one-hot q)
    target_probs: torch.Tensor,  # [B, K+1, V] p_i at each draft, then the bonus position
) -> torch.Tensor:  # [B, K] float: β_i
    """β_i = Σ_x min(p_i(x), q_i(x)) for each draft (p_i(x_i) for a deterministic one)."""
    k = draft_tokens.shape[1]
    p = target_probs[:, :k].float()
    if draft_probs is None:
        return p.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return torch.minimum(p, draft_probs.float()).sum(-1).clamp_(max=1.0)


def tree_acceptance(
    tree: Tree,
    draft_tokens: torch.Tensor,  # [B, N] long, deterministic nodes (one-hot q)
    target_probs: torch.Tensor,  # [B, N+1, V]: p at the root, then at each node
) -> torch.Tensor:  # [B, N] float: P(node accepted | its parent accepted)
    """For each node, p(its token) at its parent's block position; 0 where an earlier sibling holds that token."""
    parents = torch.tensor(tree.parent_list, device=draft_tokens.device) + 1  # [N] block position of the parent
    p_parent = target_probs[:, parents].float()  # [B, N, V]
    probs = p_parent.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    for i, parent in enumerate(tree.parent_list):
        for j in range(i):
            if tree.parent_list[j] == parent:
                probs[:, i] = torch.where(draft_tokens[:, j] == draft_tokens[:, i], 0.0, probs[:, i])
    return probs


def at_least(accept_probs: Sequence[float], parents: Sequence[int] | None = None) -> list[float]:
    """P(accepted ≥ m) for m = 1 .. the step's depth, from one step's logged acceptance probabilities: a chain's
    β's (``parents`` None: a running product), or a tree's per-node ones (``parents``: the tree's parent list)."""
    if parents is None:
        out, running = [], 1.0
        for beta in accept_probs:
            running *= beta
            out.append(running)
        return out
    reach: list[float] = []  # P(node accepted), the product along its path
    depth: list[int] = []
    for prob, parent in zip(accept_probs, parents):
        reach.append(prob * (1.0 if parent < 0 else reach[parent]))
        depth.append(1 if parent < 0 else depth[parent] + 1)
    out = [0.0] * max(depth, default=0)
    for r, d in zip(reach, depth):
        out[d - 1] += r
    return [min(x, 1.0) for x in out]
