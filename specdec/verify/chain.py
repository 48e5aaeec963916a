"""Exact verification of a chain of draft tokens: rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

Terms as in :mod:`specdec.verify`. Each draft token x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection n the recovered token is drawn from
norm(max(0, p_n − q_n)), and when all K drafts are accepted the bonus token is drawn from p_K. Together
this emits tokens distributed exactly as sampling from the target alone, whatever q is, provided p and q
went through the same sampling processing (:func:`specdec.verify.sampling.logits_to_probs`). Greedy decoding is
the one-hot special case: a draft is accepted iff it is the target's argmax.

Everything here is a pure function of probabilities and a ``torch.Generator``; there is no host sync.
"""

from __future__ import annotations

import torch

from specdec.verify.sampling import sample


def accept_drafts(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None (one-hot q)
    target_probs: torch.Tensor,  # [B, K+1, V]
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,  # [B, K] in [0, 1): drawn already (None: drawn here)
) -> torch.Tensor:  # num_accepted [B] in [0, K]
    """Accept draft i with probability min(1, p_i(x_i) / q_i(x_i)); keep the prefix before the first rejection."""
    batch, k = draft_tokens.shape
    if target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(
            f"target_probs must be [B, K+1, V] = [{batch}, {k + 1}, V], got {list(target_probs.shape)}"
        )
    p_draft = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    u = (torch.rand(p_draft.shape, generator=generator, device=p_draft.device, dtype=p_draft.dtype)
         if uniforms is None else uniforms)
    # u < p/q written without the division: accepts with probability min(1, p/q), never when p = 0.
    accepted = u * q_draft < p_draft  # [B, K]
    return accepted.long().cumprod(-1).sum(-1)


def next_token_probs(
    num_accepted: torch.Tensor,  # [B]
    draft_tokens: torch.Tensor,  # [B, K]
    draft_probs: torch.Tensor | None,  # [B, K, V] or None (one-hot q)
    target_probs: torch.Tensor,  # [B, K+1, V]
) -> torch.Tensor:  # [B, V], unnormalised
    """The distribution of the token after the accepted drafts: the residual max(0, p_n − q_n) at the
    first rejection n (recovered token), or p_K when all K were accepted (bonus token)."""
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    p_next = target_probs[rows, num_accepted]  # [B, V]
    if k == 0:
        return p_next
    at = num_accepted.clamp(max=k - 1)
    if draft_probs is None:
        q_next = torch.zeros_like(p_next).scatter_(-1, draft_tokens[rows, at].unsqueeze(-1), 1.0)
    else:
        q_next = draft_probs[rows, at]  # [B, V]
    residual = (p_next - q_next).clamp_(min=0)
    # A rejection implies p(x) < q(x) at the draft token, hence positive residual mass elsewhere;
    # an all-zero residual only comes from float round-off, where p itself is the right fallback.
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p_next, residual)
    return torch.where((num_accepted == k).unsqueeze(-1), p_next, residual)


def rejection_sample(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V], or None for deterministic drafts (one-hot q)
    target_probs: torch.Tensor,  # [B, K+1, V]: K draft positions, then the bonus position
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,  # [B, K+1] float64 in [0, 1): drawn already (None: drawn here)
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] in [0, K], next_tokens [B]
    """Verify a chain of K draft tokens per row.

    Row b emits ``draft_tokens[b, :num_accepted[b]]`` then ``next_tokens[b]``: the recovered token
    if a draft was rejected, else the bonus token. ``uniforms`` (a graph's, drawn before it replays): column i < K
    decides draft i, column K draws the next token; None draws them from ``generator`` here.
    """
    k = draft_tokens.shape[1]
    num_accepted = accept_drafts(draft_tokens, draft_probs, target_probs, generator,
                                 None if uniforms is None else uniforms[:, :k])
    next_probs = next_token_probs(num_accepted, draft_tokens, draft_probs, target_probs)
    # sample() normalises by the row total
    return num_accepted, sample(next_probs, generator, None if uniforms is None else uniforms[:, k])


def greedy_chain(
    draft_tokens: torch.Tensor,  # [B, K] long
    target_tokens: torch.Tensor,  # [B, K+1] long: the target's argmax at the K draft positions, then the bonus one
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] in [0, K], next_tokens [B]
    """:func:`rejection_sample` at temperature 0, from the target's argmax tokens alone (no [B, K+1, V]
    distribution): the drafts are kept while they equal the argmax, the next token is the argmax after them."""
    batch, k = draft_tokens.shape
    if target_tokens.shape != (batch, k + 1):
        raise ValueError(f"target_tokens must be [B, K+1] = [{batch}, {k + 1}], got {list(target_tokens.shape)}")
    num_accepted = (draft_tokens == target_tokens[:, :k]).long().cumprod(-1).sum(-1)
    return num_accepted, target_tokens.gather(1, num_accepted[:, None])[:, 0]


def emitted_tokens(
    drafted: torch.Tensor,  # [B, D] long: the drafts in the order they would be emitted (a chain, a tree's path)
    num_accepted: torch.Tensor,  # [B] long in [0, D]
    next_tokens: torch.Tensor,  # [B] long
) -> torch.Tensor:  # [B, D+1] long
    """What each row of a verify step emits: ``drafted[b, :num_accepted[b]]``, then ``next_tokens[b]``
    (entries past it are stale)."""
    emitted = torch.cat([drafted, next_tokens[:, None]], 1)
    emitted.scatter_(1, num_accepted[:, None], next_tokens[:, None])
    return emitted
