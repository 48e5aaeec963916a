"""Planted bugs: realistic mistakes in a speculative decoder, for proving that the statistical tests
catch them (:mod:`specdec.verify_dist`, tests). Never used unless asked for by name.

Each verifier here has the signature of :func:`specdec.verify.rejection_sample` and is wrong in one way.
(Dropping the bonus token altogether — emitting only accepted drafts — is *not* among them: it wastes
a token per fully accepted step but leaves the distribution exact. Drawing it from the wrong position is.)
"""

from __future__ import annotations

import torch

from specdec.sampling import sample
from specdec.verify import accept_drafts, next_token_probs


def recovered_from_target(draft_tokens, draft_probs, target_probs, generator=None):
    """Bug: the recovered token is drawn from p_n instead of the residual norm(max(0, p_n − q_n))."""
    num_accepted = accept_drafts(draft_tokens, draft_probs, target_probs, generator)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    return num_accepted, sample(target_probs[rows, num_accepted], generator)


def bonus_from_wrong_position(draft_tokens, draft_probs, target_probs, generator=None):
    """Bug (off by one): when all K drafts are accepted, the bonus token is drawn from p_{K-1}, not p_K."""
    k = draft_tokens.shape[1]
    shifted = target_probs.clone()
    shifted[:, k] = target_probs[:, max(k - 1, 0)]
    num_accepted = accept_drafts(draft_tokens, draft_probs, target_probs, generator)
    return num_accepted, sample(next_token_probs(num_accepted, draft_tokens, draft_probs, shifted), generator)


VERIFIER_BUGS = {
    "recovered_from_target": recovered_from_target,
    "bonus_from_wrong_position": bonus_from_wrong_position,
}
