"""EAGLE-3's training objective as pure functions: packed examples, the training-time test, loss, chain τ.

Notation: a sequence x_0 .. x_{m} (context, then the target's answer) with the target's features F_t (its
feature layers, concatenated) and final hidden state H_t at each position t < m. The draft layer's *pair*
at position t is (F_t, embedding of x_{t+1}); its output there predicts x_{t+2}, whose law under the target
is p_{t+1} = softmax(LM head(H_{t+1})).

**Training-time test** (EAGLE-3): the draft layer is unrolled for S steps over a packed chunk. Step 0 reads
the target's features; step i > 0 at position t reads the layer's own step-(i-1) output at t-1 instead,
exactly what drafting depth i+1 from the committed position t-i sees at decode time. Its query attends to
step 0's entries at positions <= t-i (the committed cache) and to step j's entry at t-i+j for 1 <= j <= i
(the drafts before it): :func:`ttt_mask`. Each step learns p_{t+1} over the draft vocabulary (soft cross-
entropy, step i weighted ``step_decay ** i``), so the drafter learns from its own features, not only the
target's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.drafters.eagle.model import EagleModel
from specdec.training.distill.packing import Packed


def ttt_mask(segment: torch.Tensor, step: int) -> torch.Tensor:  # [b, T] -> [b, 1, T, (step+1) T] bool
    """Which entries the query of ``step`` at position t attends to (see the module docstring)."""
    b, t = segment.shape
    pos = torch.arange(t, device=segment.device)
    same = (segment[:, :, None] == segment[:, None, :]) & (segment[:, :, None] >= 0)  # [b, T, T]
    blocks = [same & (pos[None, None, :] <= pos[None, :, None] - step)]
    for j in range(1, step + 1):
        blocks.append(same & (pos[None, None, :] == pos[None, :, None] - step + j))
    mask = torch.cat(blocks, -1)
    mask[:, :, step * t:] |= torch.eye(t, dtype=torch.bool, device=segment.device)  # itself, always
    return mask[:, None]


def unroll(model: EagleModel, batch: Packed, steps: int) -> list[torch.Tensor]:  # -> steps x [b, T, H]
    """The draft layer's outputs at every position for steps 0 .. steps-1 (the training-time test)."""
    layer = model.layer
    hidden = model.fuse(batch.features)
    embeds = model.embed(batch.tokens)
    cos, sin = model.rope(batch.positions, hidden.dtype)
    keys, values, outs = [], [], []
    for step in range(steps):
        q, k, v = layer.project(hidden, embeds, cos, sin)
        keys.append(k)
        values.append(v)
        attended = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                                  attn_mask=ttt_mask(batch.segment, step), enable_gqa=True)
        out = layer.finish(hidden, attended)
        outs.append(out)
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)  # position t reads t-1's output
    return outs


def step_valid(batch: Packed, step: int) -> torch.Tensor:  # [b, T] bool
    """Positions where step ``step`` has a label and a committed position t-step in the same sequence."""
    seg = batch.segment
    back = torch.full_like(seg, -2)
    back[:, step:] = seg[:, : seg.shape[1] - step]
    return (batch.next_token >= 0) & (back == seg)


@torch.no_grad()
def target_probs(batch: Packed, lm_head_rows: torch.Tensor) -> torch.Tensor:  # -> [b, T, Dv]
    """p_{t+1} over the draft vocabulary (the target's logits on those rows, renormalised)."""
    return (batch.target_hidden.to(lm_head_rows) @ lm_head_rows.t()).float().softmax(-1)


def eagle_loss(model: EagleModel, batch: Packed, lm_head_rows: torch.Tensor, steps: int, step_decay: float,
               ) -> tuple[torch.Tensor, list[float], list[float]]:  # loss, per-step CE, per-step top-1 agreement
    """Σ_i step_decay^i · soft CE(p_{t+1}, q_i) over the valid positions of each step."""
    p = target_probs(batch, lm_head_rows)
    best = p.argmax(-1)
    total, losses, agree = 0.0, [], []
    for i, out in enumerate(unroll(model, batch, steps)):
        valid = step_valid(batch, i)
        logq = model.logits(out[valid]).log_softmax(-1)  # [P, Dv]
        ce = -(p[valid] * logq).sum(-1).mean()
        ce = torch.nan_to_num(ce)
        total = total + step_decay ** i * ce
        losses.append(float(ce.detach()))
        agree.append(float((logq.argmax(-1) == best[valid]).float().mean().nan_to_num()))
    return total, losses, agree


@torch.no_grad()
def chain_matches(model: EagleModel, batch: Packed, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain drafting replayed on the target's own answers: ``match`` [b, T, depth] — whether draft j+1
    from committed position t (drawn at step j, position t+j) is the target's token x_{t+j+2} — and
    ``counted`` [b, T]: committed positions whose first draft lands in an answer. A draft past the answer's
    end counts as a miss (the chain stops there)."""
    outs = unroll(model, batch, depth)
    token_ids = model.token_ids
    b, t = batch.tokens.shape
    match = torch.zeros(b, t, depth, dtype=torch.bool, device=batch.tokens.device)
    for j, out in enumerate(outs):
        drafted = token_ids[model.logits(out).argmax(-1)]  # [b, T] at position t+j
        hit = (drafted == batch.next_token) & batch.answer & step_valid(batch, j)  # [b, T] at position t+j
        match[:, : t - j, j] = hit[:, j:]
    counted = batch.answer & (batch.segment >= 0)
    return match, counted
