"""Training examples as packed sequences, shared by the methods that learn from whole sequences (EAGLE, the
distilled draft model), and the greedy-chain figures they report on held-out answers.

A stored sequence is its context then the target's answer, x_0 .. x_m, with the target's final hidden state
H_t (the one that predicted x_{t+1}) at each position t < m where it was recorded. :func:`sequence_pairs`
turns a stored :class:`~specdec.training.distill.store.Split` into per-sequence tuples, :func:`pack` puts many
of them into fixed-length chunks (``segment`` tells them apart), and :func:`chain_tau` turns per-depth
greedy matches into the expected τ of a chain and the acceptance α at each depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def chain_tau(match: torch.Tensor, counted: torch.Tensor) -> dict[str, list[float]]:
    """Expected τ of greedy chains of 1..depth drafts, and the conditional acceptance at each depth."""
    m = match[counted].float()  # [P, depth]
    reach = m.cumprod(-1)  # [P, depth]: drafts 1..j all accepted
    tau = (1 + reach.cumsum(-1)).mean(0)
    before = torch.cat([torch.ones_like(reach[:, :1]), reach[:, :-1]], 1)
    alpha = reach.sum(0) / before.sum(0).clamp(min=1)
    return {"tau_chain": [round(float(x), 4) for x in tau], "alpha": [round(float(x), 4) for x in alpha],
            "positions": int(m.shape[0])}
