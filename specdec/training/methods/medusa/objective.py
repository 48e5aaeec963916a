"""Medusa's training objective as pure functions: labels, loss, soft targets, label ranks, tree selection.

Head i, on the hidden state that predicted token t+1, learns token t+2+i (Medusa-1). Shapes: P training
positions, h heads, V' the draft vocabulary (V without one).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
import torch.nn.functional as F

from specdec.drafters.medusa import MedusaHeads
from specdec.training.distill.vocab import IGNORE


def head_labels(tokens: torch.Tensor, lengths: torch.Tensor, num_heads: int,
                ) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [N], lengths [S] -> rows [P], labels [P, h]
    """Sequences back to back (sequence j: ``lengths[j]`` tokens): head i's label at position s is
    tokens[s + 1 + i] of the same sequence (IGNORE past its end). Positions where even head 0 has no label
    (each sequence's last) are dropped: ``rows`` are the positions kept, in order."""
    seq = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)  # [N] sequence of each position
    pos = torch.arange(tokens.numel()) - (lengths.cumsum(0) - lengths)[seq]  # [N] position within it
    rows = torch.nonzero(pos < lengths[seq] - 1).squeeze(1)  # [P]
    ahead = 1 + torch.arange(num_heads)  # [h]
    valid = pos[rows, None] + ahead < lengths[seq[rows], None]  # [P, h]
    labels = tokens[(rows[:, None] + ahead).clamp(max=max(tokens.numel() - 1, 0))]
    return rows, torch.where(valid, labels, IGNORE)


def with_previous_token(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For token-aware heads: the rows whose emitted token (tokens[s], which hidden[s] predicted) is known
    — every row but each answer's first — as (hidden, tokens [P', 1 + heads] = tokens[s], labels)."""
    prev = torch.full((labels.shape[0],), -1, dtype=torch.long)
    # row r-1 belongs to the same answer unless it was that answer's last row (no label for head 1 there)
    prev[1:] = torch.where(labels[:-1, 1] != IGNORE, labels[:-1, 0], -1) if labels.shape[1] > 1 else -1
    keep = prev >= 0
    return hidden[keep], torch.cat([prev[keep, None], labels[keep]], 1)


def known_embeddings(embed_weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [P, 1+h] -> [P, h, H]
    """What token-aware head i reads besides the hidden state: embeddings of tokens[s .. s+i] (a path token
    past the answer's end is IGNORE; its head has no label there, so any embedding will do)."""
    return embed_weight[tokens[:, :-1].clamp(min=0)]


def medusa_loss(logits: torch.Tensor, labels: torch.Tensor, head_decay: float, targets: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, list[float]]:  # logits [P, h, V], labels [P, h] -> loss, per-head CE
    """Medusa-1's loss: Σ_i head_decay^i · CE_i, CE_i against head i's labels, or against ``targets`` [P, h, V]
    (distributions, see :func:`soft_targets`) where given; positions labelled IGNORE never count."""
    if targets is None:
        losses = [F.cross_entropy(logits[:, i], labels[:, i], ignore_index=IGNORE) for i in range(labels.shape[1])]
    else:
        ce = -(targets * F.log_softmax(logits.float(), -1)).sum(-1)  # [P, h]
        valid = labels != IGNORE
        losses = [ce[:, i][valid[:, i]].mean() for i in range(labels.shape[1])]
    losses = [torch.nan_to_num(x) for x in losses]  # a batch without labels for a far head contributes 0
    total = sum(head_decay ** i * x for i, x in enumerate(losses))
    return total, [float(x.detach()) for x in losses]


@torch.no_grad()
def soft_targets(hidden: torch.Tensor, idx: torch.Tensor, labels: torch.Tensor, lm_head_weight: torch.Tensor,
                 ) -> torch.Tensor:  # -> [b, h, V'] one distribution per (position, head)
    """The target's own distribution over each label (self-distillation with soft labels, as Hydra++ and
    Medusa-2 train): head i's label at row r was predicted by the hidden state at row r + 1 + i of the same
    sequence, so its distribution over the (draft) vocabulary is free. Used where that row's prediction is
    the label — every position of a greedy answer but the last few, where the row belongs to the next
    sequence; elsewhere (and for an IGNORE label) the one-hot label.

    hidden [P, H] rows in sequence order; idx [b] rows of the batch; labels [P, h] draft-vocabulary indices."""
    device = lm_head_weight.device
    lab = labels[idx].to(device)  # [b, h]
    rows = idx[:, None].cpu() + 1 + torch.arange(lab.shape[1])  # [b, h]
    logits = hidden[rows.clamp(max=hidden.shape[0] - 1)].to(lm_head_weight) @ lm_head_weight.t()  # [b, h, V']
    agree = (rows < hidden.shape[0]).to(device) & (lab != IGNORE) & (logits.argmax(-1) == lab)
    onehot = F.one_hot(lab.clamp(min=0), logits.shape[-1]).to(logits.dtype)
    return torch.where(agree[..., None], logits.float().softmax(-1), onehot)


@torch.no_grad()
def label_ranks(heads: MedusaHeads, lm_head_weight: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
                max_rank: int, chunk: int = 512, known: Callable[[slice], torch.Tensor] | None = None,
                ) -> torch.Tensor:  # -> [P, h]: rank of each label, -1 = beyond
    """Where each label sits among its head's top ``max_rank`` tokens (-1: further down, or no label).
    ``known``: rows -> the token-aware heads' known-token embeddings [c, h, H] (the true path)."""
    out = []
    for start in range(0, hidden.shape[0], chunk):
        rows = slice(start, start + chunk)
        logits = heads(hidden[rows], lm_head_weight, known=None if known is None else known(rows))  # [c, h, V]
        top = logits.topk(max_rank, dim=-1).indices  # [c, h, r]
        hit = top == labels[start: start + chunk, :, None]  # [c, h, r]
        out.append(torch.where(hit.any(-1), hit.float().argmax(-1), -1))
    return torch.cat(out)


def accuracies(ranks: torch.Tensor, labels: torch.Tensor) -> dict[str, list[float]]:  # [P, h] each
    valid = labels != IGNORE
    n = valid.sum(0).clamp(min=1)
    return {f"top{k}": (((ranks >= 0) & (ranks < k) & valid).sum(0) / n).tolist() for k in (1, 5)}


def tree_from_ranks(ranks: torch.Tensor, labels: torch.Tensor, num_nodes: int) -> tuple[list[list[int]], list[float]]:
    """The ``num_nodes`` paths of head ranks most often followed, best first, and the expected τ of the
    tree made of the first n paths (n = 1..num_nodes) under greedy verification: 1 + Σ P(path accepted).

    At position s the accepted path is the prefix of (rank of head 0's label, rank of head 1's, ...) up to
    the first head whose label is not among its candidates. A path is accepted no more often than its
    parent, so taking paths by frequency always takes parents first and gives the best tree of each size."""
    counts: Counter[tuple[int, ...]] = Counter()
    for row in torch.where(labels == IGNORE, -1, ranks).tolist():
        for depth in range(len(row)):
            if row[depth] < 0:
                break
            counts[tuple(row[: depth + 1])] += 1
    best = [list(p) for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))[:num_nodes]]
    return best, tree_tau(ranks, labels, best)


def tree_tau(ranks: torch.Tensor, labels: torch.Tensor, paths: list[list[int]]) -> list[float]:
    """The expected τ under greedy verification of the tree made of the first n ``paths`` (n = 1..len),
    at held-out positions: 1 + the mean number of tree nodes on the accepted path."""
    index = {tuple(p): n for n, p in enumerate(paths)}
    accepted = [0] * len(paths)  # positions whose accepted path reaches path n
    for row in torch.where(labels == IGNORE, -1, ranks).tolist():
        for depth in range(len(row)):
            n = index.get(tuple(row[: depth + 1])) if row[depth] >= 0 else None
            if n is None:
                break
            accepted[n] += 1
    total, tau = max(len(labels), 1), []
    for count in accepted:
        tau.append((tau[-1] if tau else 1.0) + count / total)
    return tau
