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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.drafters.eagle.model import EagleModel


@dataclass
class Packed:
    """Pairs of many sequences packed into chunks of T positions; ``segment`` -1 marks padding."""

    features: torch.Tensor  # [C, T, F] the target's feature layers at each position
    tokens: torch.Tensor  # [C, T] long: x_{t+1}, the token after each position
    next_token: torch.Tensor  # [C, T] long: x_{t+2} (-1 where the sequence ends first)
    target_hidden: torch.Tensor  # [C, T, H]: H_{t+1}, the final hidden state that predicts x_{t+2}
    positions: torch.Tensor  # [C, T] long: position within its sequence
    segment: torch.Tensor  # [C, T] long: which sequence (per chunk), -1 = padding
    answer: torch.Tensor  # [C, T] bool: x_{t+2} is an answer token (the target's greedy choice)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def rows(self, idx: torch.Tensor, device: torch.device) -> "Packed":
        return Packed(*(getattr(self, f)[idx].to(device) for f in self.__dataclass_fields__))


def sequence_pairs(split, context: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """Per sequence of a stored split: (features [m, F], tokens x_1..x_m [m], final hidden [m, H], answer [m]
    bool), m = context + answer - 1 pairs (context positions left out when ``context`` is False)."""
    out = []
    c_off = f_off = t_off = 0
    for c, n in zip(split.context_lengths.tolist(), split.lengths.tolist()):
        ctx = split.context[c_off: c_off + c]
        toks = split.tokens[t_off: t_off + n]
        feats = split.features[t_off: t_off + n].flatten(1)
        hid = split.hidden[t_off: t_off + n]
        if context and split.context_features is not None and c > 1:
            feats = torch.cat([split.context_features[f_off: f_off + c - 1].flatten(1), feats])
            hid = torch.cat([split.context_hidden[f_off: f_off + c - 1], hid])
            x = torch.cat([ctx, toks])  # x_0 .. x_m
        else:
            x = torch.cat([ctx[-1:], toks])
        answer = torch.zeros(x.numel(), dtype=torch.bool)
        answer[x.numel() - n:] = True
        out.append((feats, x[1:], hid, answer[1:]))
        c_off, f_off, t_off = c_off + c, f_off + max(c - 1, 0), t_off + n
    return out


def pack(pairs: list[tuple[torch.Tensor, ...]], chunk_len: int) -> Packed:
    """Sequences into chunks of ``chunk_len`` positions, whole where they fit (longer ones are cut)."""
    chunks: list[list[tuple]] = [[]]
    used = 0
    for feats, toks, hid, answer in pairs:
        for start in range(0, toks.numel(), chunk_len):
            piece = (feats[start: start + chunk_len], toks[start: start + chunk_len], hid[start: start + chunk_len],
                     answer[start: start + chunk_len], start)
            if used + piece[1].numel() > chunk_len:
                chunks.append([])
                used = 0
            chunks[-1].append(piece)
            used += piece[1].numel()
    c, width, hidden = len(chunks), pairs[0][0].shape[1], pairs[0][2].shape[1]
    out = Packed(torch.zeros(c, chunk_len, width), torch.zeros(c, chunk_len, dtype=torch.long),
                 torch.full((c, chunk_len), -1, dtype=torch.long), torch.zeros(c, chunk_len, hidden),
                 torch.zeros(c, chunk_len, dtype=torch.long), torch.full((c, chunk_len), -1, dtype=torch.long),
                 torch.zeros(c, chunk_len, dtype=torch.bool))
    for i, chunk in enumerate(chunks):
        at = 0
        for s, (feats, toks, hid, answer, start) in enumerate(chunk):
            n = toks.numel()
            span = slice(at, at + n)
            out.features[i, span], out.tokens[i, span] = feats, toks
            out.next_token[i, at: at + n - 1] = toks[1:]
            out.target_hidden[i, at: at + n - 1] = hid[1:]
            out.answer[i, at: at + n - 1] = answer[1:]
            out.positions[i, span] = start + torch.arange(n)
            out.segment[i, span] = s
            at += n
    return out


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


def chain_tau(match: torch.Tensor, counted: torch.Tensor) -> dict[str, list[float]]:
    """Expected τ of greedy chains of 1..depth drafts, and the conditional acceptance at each depth."""
    m = match[counted].float()  # [P, depth]
    reach = m.cumprod(-1)  # [P, depth]: drafts 1..j all accepted
    tau = (1 + reach.cumsum(-1)).mean(0)
    before = torch.cat([torch.ones_like(reach[:, :1]), reach[:, :-1]], 1)
    alpha = reach.sum(0) / before.sum(0).clamp(min=1)
    return {"tau_chain": [round(float(x), 4) for x in tau], "alpha": [round(float(x), 4) for x in alpha],
            "positions": int(m.shape[0])}
