"""The block drafter's training objective as pure functions: anchors, the blocks' attention mask, the loss, and
the held-out chain τ and label ranks.

Notation as :mod:`specdec.training.methods.eagle.objective`'s: a packed chunk holds at index t the target's
features F_t (position t), the token after it x_{t+1} (``tokens[t]``) and the final hidden state H_{t+1}
(``target_hidden[t]``) whose LM head gives p_{t+1}, the target's law of x_{t+2}.

**A block at anchor index j** (DFlash's training, one forward for many blocks): its anchor is x_{j+1} at
position t_j + 1 (the newest token, whose features the target has not computed yet), its context the features
F_0 .. F_j of its own sequence, and its masked position i (1 .. B-1, position t_j + 1 + i) learns x_{j+1+i}
under p_{j+i} (``target_hidden[j + i - 1]``): exactly what a decode step sees after committing position j.
Many anchors per chunk run together; each block's queries see their context and their own block only
(:func:`block_mask`), so the blocks are independent as at decode time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.drafters.dflash.model import DFlashModel
from specdec.training.distill.packing import Packed


def label_index(anchors: torch.Tensor, block_size: int) -> torch.Tensor:  # [b, A] -> [b, A, B-1]
    """The chunk index whose ``tokens`` entry is each masked position's label (j + i for i = 1 .. B-1)."""
    return anchors[..., None] + torch.arange(1, block_size, device=anchors.device)


def labels_valid(batch: Packed, anchors: torch.Tensor, block_size: int) -> torch.Tensor:  # -> [b, A, B-1] bool
    """Masked positions whose label lies in the anchor's sequence, with the target's law there recorded."""
    t = batch.tokens.shape[1]
    index = label_index(anchors, block_size)
    inside = index < t
    index = index.clamp(max=t - 1)
    segment = batch.segment.gather(1, anchors)  # [b, A]
    same = batch.segment.gather(1, index.flatten(1)).view_as(index) == segment[..., None]
    recorded = batch.next_token.gather(1, (index - 1).flatten(1)).view_as(index) >= 0  # p_{j+i} exists
    return inside & same & recorded & (segment[..., None] >= 0)


def sample_anchors(batch: Packed, count: int, generator: torch.Generator | None = None) -> torch.Tensor:  # [b, A]
    """``count`` anchors per chunk, drawn without replacement among the indices whose first label is an answer
    token (the target's own continuation); chunks with fewer take some twice (their loss counts them twice)."""
    real = batch.segment >= 0
    answers = batch.answer & real  # answer[j]: x_{j+2}, the first label, is an answer's
    # a chunk without answer positions draws among its real ones, one without those among all
    weights = torch.where(answers.any(1, keepdim=True), answers, real | ~real.any(1, keepdim=True)).float()
    return torch.multinomial(weights.cpu(), count, replacement=bool((weights > 0).sum(1).min() < count),
                             generator=generator).to(batch.tokens.device)


def block_mask(batch: Packed, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, 1, A·B, T + A·B] bool: block a's queries see the context indices <= anchors[a] of its own sequence,
    then the B entries of their own block (bidirectionally), nothing of the other blocks."""
    b, t = batch.segment.shape
    a = anchors.shape[1]
    device = anchors.device
    index = torch.arange(t, device=device)
    segment = batch.segment.gather(1, anchors)  # [b, A]
    context = (index[None, None] <= anchors[..., None]) & (batch.segment[:, None] == segment[..., None])  # [b, A, T]
    context = context & (segment[..., None] >= 0)
    own = torch.eye(a, dtype=torch.bool, device=device)  # [A, A]
    own = own.repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)  # [A·B, A·B]
    context = context.repeat_interleave(block_size, 1)  # [b, A·B, T]
    return torch.cat([context, own[None].expand(b, -1, -1)], -1)[:, None]


def block_hidden(model: DFlashModel, batch: Packed, anchors: torch.Tensor) -> torch.Tensor:  # -> [b, A, B, H]
    """The draft layers' outputs (before the final norm) over the blocks at ``anchors`` [b, A] of ``batch``."""
    size = model.cfg.block_size
    b, a = anchors.shape
    fused, context = model.context_kv(batch.features, batch.positions)  # [b, T, H], per layer (k, v)
    mask = block_mask(batch, anchors, size)
    start = batch.positions.gather(1, anchors) + 1  # [b, A]: the anchor's position
    positions = (start[..., None] + torch.arange(size, device=anchors.device)).view(b, a * size)

    def attend(i, q, k, v):
        keys, values = torch.cat([context[i][0], k], 2), torch.cat([context[i][1], v], 2)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

    last = fused.gather(1, anchors[..., None].expand(-1, -1, fused.shape[-1])).flatten(0, 1)  # [b·A, H]
    x = model.block_inputs(batch.tokens.gather(1, anchors).flatten(), last).view(b, a * size, -1)  # side by side
    x = model.blocks(x, positions, attend)
    return x.view(b, a, size, -1)


@torch.no_grad()
def target_probs(batch: Packed, anchors: torch.Tensor, block_size: int,
                 lm_head_rows: torch.Tensor) -> torch.Tensor:  # -> [b, A, B-1, Dv]
    """p_{j+i} over the draft vocabulary at each masked position (the target's logits on those rows)."""
    index = (label_index(anchors, block_size) - 1).clamp(max=batch.tokens.shape[1] - 1)
    hidden = batch.target_hidden.gather(1, index.flatten(1)[..., None].expand(-1, -1, batch.target_hidden.shape[-1]))
    return (hidden.to(lm_head_rows) @ lm_head_rows.t()).float().softmax(-1).view(*index.shape, -1)


def dflash_loss(model: DFlashModel, batch: Packed, anchors: torch.Tensor, lm_head_rows: torch.Tensor,
                position_decay: float) -> tuple[torch.Tensor, list[float], list[float]]:
    """Σ_i w_i · soft CE(p_{j+i}, q_i) / Σ_i w_i over the valid masked positions (w_i = decay^(i-1)); with the
    per-position CE and top-1 agreement with the target's likeliest token, for the log."""
    size = model.cfg.block_size
    hidden = block_hidden(model, batch, anchors)[:, :, 1:]  # [b, A, B-1, H]
    valid = labels_valid(batch, anchors, size)  # [b, A, B-1]
    p = target_probs(batch, anchors, size, lm_head_rows)
    logq = model.logits(hidden[valid]).log_softmax(-1)  # [P, Dv]
    ce = -(p[valid] * logq).sum(-1)  # [P]
    which = torch.arange(1, size, device=anchors.device).expand_as(valid)[valid]  # [P]: i of each
    weight = position_decay ** (which - 1).float()
    loss = (weight * ce).sum() / weight.sum().clamp(min=1e-9)
    agree = (logq.argmax(-1) == p[valid].argmax(-1)).float()
    counts = torch.bincount(which - 1, minlength=size - 1).clamp(min=1)  # a position without labels logs 0
    per_ce, per_agree = (torch.stack([torch.bincount(which - 1, weights=values, minlength=size - 1)
                                      for values in (ce.detach(), agree)]) / counts).nan_to_num().tolist()
    return loss, per_ce, per_agree


@torch.no_grad()
def block_ranks(model: DFlashModel, batch: Packed, anchors: torch.Tensor, max_rank: int
                ) -> tuple[torch.Tensor, torch.Tensor]:  # ranks [P, B-1] (-1 beyond), labels valid [P, B-1]
    """Held-out: at every anchor whose first label is an answer token, the rank of each masked position's label
    (the target's greedy token: its answer) among that position's top ``max_rank`` drafts; -1 where it is further
    down, outside the draft vocabulary or past the sequence (a miss). Rows: the anchors kept."""
    size = model.cfg.block_size
    logits = model.logits(block_hidden(model, batch, anchors)[:, :, 1:])  # [b, A, B-1, Dv]
    top = model.token_ids[logits.topk(max_rank, dim=-1).indices]  # [b, A, B-1, r] target ids
    index = label_index(anchors, size).clamp(max=batch.tokens.shape[1] - 1)
    labels = batch.tokens.gather(1, index.flatten(1)).view_as(index)
    valid = labels_valid(batch, anchors, size)
    hit = (top == labels[..., None]) & valid[..., None]
    ranks = torch.where(hit.any(-1), hit.float().argmax(-1), -1)
    keep = batch.answer.gather(1, anchors) & (batch.segment.gather(1, anchors) >= 0)  # [b, A]
    return ranks[keep], valid[keep]
