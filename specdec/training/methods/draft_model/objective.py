"""The distilled draft model's objective as pure functions: packed token sequences, the student's forward
over them, the distillation losses, and the held-out acceptance figures.

Notation: a stored sequence x_0 .. x_m (context, then the target's answer); p_t = softmax(LM head(H_t)) is
the target's next-token distribution at position t (H_t its final hidden state there, recorded in the
store; it predicted x_{t+1}), q_t the student's after reading x_0 .. x_t. Temperature 1 throughout.

**Losses** (per position, averaged over the positions trained on):

- ``fkl``: forward KL, KL(p || q) = Σ p (log p - log q): mass-covering, the usual KD;
- ``rkl``: reverse KL, KL(q || p): mode-seeking;
- ``tv``: total variation, ½ Σ |p - q| = 1 - Σ min(p, q), i.e. one minus the probability that a draft
  sampled from q is accepted at T=1 (speculative sampling's α); DistillSpec's recommended target.

**Held-out figures.** The target's answers are its greedy choices, so a greedy chain of drafts from position t
is accepted up to depth j exactly when the student's argmax at t, t+1, .., t+j-1 (given the true prefix)
matches x_{t+1} .., x_{t+j}: every accepted draft *is* the true token, so teacher forcing replays the chain
exactly. :func:`chain_matches` gives those matches; :func:`~specdec.training.distill.packing.chain_tau` the
expected τ and α per depth. On corpus text (the ``text_*`` splits) the prefix is not the target's, so only
depth 1 is exact there (deeper drafts are scored on the corpus's prefix). At T=1 the expected acceptance of
one draft is Σ min(p, q) (:func:`acceptance`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.training.distill.answers import hidden_states
from specdec.training.distill.packing import Packed

LOSSES = ("fkl", "rkl", "tv")


def divergence(logp: torch.Tensor, logq: torch.Tensor, kind: str) -> torch.Tensor:  # [P, V], [P, V] -> [P]
    """The per-position loss ``kind`` (fkl, rkl or tv; see the module docstring) between the target's
    log-probabilities ``logp`` and the student's ``logq``."""
    p, q = logp.exp(), logq.exp()
    if kind == "fkl":
        return torch.where(p > 0, p * (logp - logq), 0.0).sum(-1)
    if kind == "rkl":
        return torch.where(q > 0, q * (logq - logp), 0.0).sum(-1)
    if kind == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    raise ValueError(f"method.loss must be one of {LOSSES}, got {kind!r}")


def acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [P, V], [P, V] -> [P]
    """Σ min(p, q): the probability that one draft sampled from q is accepted by speculative sampling at T=1."""
    return torch.minimum(p, q).sum(-1)


def student_pairs(split, with_prompt: bool = False) -> list[tuple[torch.Tensor, ...]]:
    """Per sequence of a stored split, the tuple :func:`~specdec.training.distill.packing.pack` takes, laid out
    so that a packed chunk reads as a language-model batch: ``tokens`` x_t, ``next_token`` x_{t+1},
    ``target_hidden`` H_t, ``positions`` t from 0, and ``answer`` marking the positions trained on: those
    whose next token is the answer's, plus the prompt's where its hidden states were stored and
    ``with_prompt`` asks for them."""
    out = []
    c_off = f_off = t_off = 0
    width = split.hidden.shape[1]
    for c, n in zip(split.context_lengths.tolist(), split.lengths.tolist()):
        x = torch.cat([split.context[c_off: c_off + c], split.tokens[t_off: t_off + n]])  # x_0 .. x_m, m = c+n-1
        hid = torch.zeros(x.numel(), width)  # hid[t + 1] = H_t (pack shifts it back by one)
        hid[c:] = split.hidden[t_off: t_off + n]
        trained = torch.zeros(x.numel(), dtype=torch.bool)  # trained[t + 1]: x_{t+1} is trained on
        trained[c:] = True
        if with_prompt and split.context_hidden is not None and c > 1:
            hid[1:c] = split.context_hidden[f_off: f_off + c - 1]
            trained[1:c] = True
        out.append((torch.zeros(x.numel(), 0), x, hid, trained))
        c_off, f_off, t_off = c_off + c, f_off + max(c - 1, 0), t_off + n
    return out


def packed_hidden(student, tokens: torch.Tensor, positions: torch.Tensor,  # [b, T] each
                  segment: torch.Tensor) -> torch.Tensor:  # [b, T] -> [b, T, H], final-normed
    """The student's final hidden states over packed chunks: its own (HF) submodules, attention causal
    within each sequence (``segment``), rotary positions restarting at each sequence's start."""
    inner = student.model
    b, t = tokens.shape
    heads, kv_heads = student.config.num_attention_heads, student.config.num_key_value_heads
    head_dim = getattr(student.config, "head_dim", None) or student.config.hidden_size // heads
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    mask = ((segment[:, :, None] == segment[:, None, :]) & causal)[:, None]  # [b, 1, T, T]; the diagonal always
    x = inner.embed_tokens(tokens)
    cos, sin = inner.rotary_emb(x, positions)
    cos, sin = cos[:, None], sin[:, None]  # [b, 1, T, D]
    for layer in inner.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(b, t, heads, head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, kv_heads, head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return inner.norm(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def distill_loss(student, batch: Packed, kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean loss ``kind`` over the positions trained on (``answer`` with a next token), and what to log:
    the mean acceptance Σ min(p, q) and the top-1 agreement with the target there."""
    valid = batch.answer & (batch.next_token >= 0)  # [b, T]
    hidden = packed_hidden(student, batch.tokens, batch.positions, batch.segment)[valid]  # [P, H]
    lm_head = student.lm_head.weight
    logq = (hidden @ lm_head.t()).float().log_softmax(-1)  # [P, V]
    with torch.no_grad():
        logp = (batch.target_hidden[valid].to(lm_head) @ lm_head.t()).float().log_softmax(-1)
    loss = torch.nan_to_num(divergence(logp, logq, kind).mean())
    with torch.no_grad():
        accept = acceptance(logp.exp(), logq.exp()).mean().nan_to_num()
        agree = (logq.argmax(-1) == logp.argmax(-1)).float().mean().nan_to_num()
    return loss, {"accept_t1": float(accept), "top1": float(agree), "positions": float(valid.sum())}


@torch.no_grad()
def chain_matches(student, batch: Packed, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy chains replayed on the target's answers (see the module docstring): ``match`` [b, T, depth] —
    whether draft j+1 from committed position t is the target's greedy token there (the answer's x_{t+j+1})
    — ``counted`` [b, T]: positions whose first
    draft lands in an answer, and ``accept`` [b, T]: Σ min(p, q) at each position (T=1)."""
    hidden = packed_hidden(student, batch.tokens, batch.positions, batch.segment)
    lm_head = student.lm_head.weight
    logq = (hidden @ lm_head.t()).float().log_softmax(-1)  # [b, T, V]
    logp = (batch.target_hidden.to(lm_head) @ lm_head.t()).float().log_softmax(-1)
    counted = batch.answer & (batch.next_token >= 0)
    hit = (logq.argmax(-1) == logp.argmax(-1)) & counted  # [b, T]: the target's greedy choice (its answer's token)
    b, t = hit.shape
    match = torch.zeros(b, t, depth, dtype=torch.bool, device=hit.device)
    for j in range(depth):
        match[:, : t - j, j] = hit[:, j:] & (batch.segment[:, j:] == batch.segment[:, : t - j])
    return match, counted, acceptance(logp.exp(), logq.exp())


@torch.no_grad()
def sample_continuations(student, prompts: list[torch.Tensor], new_tokens: int,
                         generator: torch.Generator) -> list[torch.Tensor]:  # prompts [c] each -> [c + n] each
    """Each prompt followed by ``new_tokens`` tokens the student samples at T=1 (on-policy data)."""
    out = []
    for prompt in prompts:
        seq = prompt.to(student.device)
        for _ in range(new_tokens):
            last = student.model(seq[None]).last_hidden_state[0, -1]  # [H]
            probs = (student.lm_head(last)).float().softmax(-1)
            seq = torch.cat([seq, torch.multinomial(probs.cpu(), 1, generator=generator).to(seq)])
        out.append(seq.cpu())
    return out


@torch.no_grad()
def scored_pairs(target, sequences: list[torch.Tensor], context_lengths: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """:func:`student_pairs`' tuples for sequences the target has not answered (the student's samples): the
    target's final hidden states from one forward each; trained on the positions after the context."""
    out = []
    for x, c in zip(sequences, context_lengths):
        states = hidden_states(target, x[None, :-1].to(target.device))[-1][0]
        hid = torch.zeros(x.numel(), states.shape[-1])
        hid[1:] = states.float().cpu()
        trained = torch.zeros(x.numel(), dtype=torch.bool)
        trained[c:] = True
        out.append((torch.zeros(x.numel(), 0), x, hid, trained))
    return out
