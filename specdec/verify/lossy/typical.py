"""Medusa's *typical acceptance*: a LOSSY verification rule, offered only to measure what it costs.

Medusa (Cai et al. 2024) accepts a draft token x where the target's distribution p puts more than

    min(epsilon, alpha · exp(−H(p)))

on it (H the entropy of p; Medusa's defaults epsilon 0.09, alpha 0.3), keeps the longest accepted path
(ties: the one the target finds likeliest), then draws the next token from p at the path's end. Tokens the
target finds plausible are kept whatever their probability, so at temperature > 0 the output is **not**
distributed as the target's: the draft's choices leak into it. (Medusa also filters that next draw by
the same threshold; here it comes from p itself, which is the smaller departure.) At temperature 0, p is
one-hot, the threshold is min(epsilon, alpha) and only the target's argmax passes, so greedy output stays
identical to plain decoding.

specdec's exact rule (:data:`specdec.verify.EXACT`) remains the default. This one implements the same
:class:`~specdec.verify.rules.AcceptanceRule` protocol with ``lossy = True`` and runs only when a drafter is
built with ``acceptance="typical"`` (``drafter.acceptance=typical`` for Medusa); such a drafter reports
``lossy = True``, which results, reports and ``verify_dist`` carry, and
``python -m specdec.verify_dist drafter=medusa drafter.acceptance=typical sampling.temperature=1.0``
shows the departure. The two methods take the exact rule's arguments (the draft distributions are unused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from specdec.verify.sampling import sample
from specdec.verify.tree import Tree


@dataclass(frozen=True)
class TypicalAcceptance:
    lossy: ClassVar[bool] = True
    epsilon: float = 0.09  # the largest probability ever required of a draft token (a hard threshold)
    alpha: float = 0.3  # the entropy-scaled threshold's factor: alpha · exp(−H(p))

    def __post_init__(self):
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"typical acceptance: epsilon must be in (0, 1], got {self.epsilon} "
                             f"(Medusa's default 0.09; drafter.typical_epsilon)")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"typical acceptance: alpha must be in (0, 1], got {self.alpha} "
                             f"(Medusa's default 0.3; drafter.typical_alpha)")

    def passes(self, p: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # p [..., V], tokens [...] -> bool
        """Whether each token clears the threshold of the distribution it is judged by."""
        entropy = -torch.special.xlogy(p, p).sum(-1)  # [...]
        threshold = torch.clamp(self.alpha * torch.exp(-entropy), max=self.epsilon)
        return p.gather(-1, tokens[..., None])[..., 0] > threshold

    def chain(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, K] drafts, p [B, K+1, V] -> num_accepted [B], next_tokens [B] (drawn from p after the prefix)."""
        k = draft_tokens.shape[1]
        ok = self.passes(target_probs[:, :k], draft_tokens)  # [B, K]
        num_accepted = ok.long().cumprod(-1).sum(-1)
        rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
        return num_accepted, sample(target_probs[rows, num_accepted], generator)

    def tree(self, tree: Tree, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             target_probs: torch.Tensor, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :func:`specdec.verify.tree.verify_tree` returns: accepted_nodes [B, D], num_accepted, next_tokens."""
        batch, n = draft_tokens.shape
        p_parent = target_probs[:, tree.parents + 1]  # [B, N, V]: p where each node's token is judged
        ok = self.passes(p_parent, draft_tokens).to(target_probs.dtype)  # [B, N]
        ancestry = tree.mask[1:, 1:].to(target_probs.dtype)  # [N, N]: node i's path (itself and its ancestors)
        depth = tree.depths[1:]  # [N]
        path_ok = (ok @ ancestry.t()).round().long() == depth  # [B, N]: every token on the path passes
        path_logp = p_parent.gather(-1, draft_tokens[..., None])[..., 0].clamp(min=1e-30).log() @ ancestry.t()
        reach = torch.where(path_ok, depth, 0)  # [B, N]
        num_accepted = reach.amax(-1)  # [B]: the longest accepted path
        best = torch.where(path_ok & (reach == num_accepted[:, None]), path_logp, -torch.inf).argmax(-1)  # [B]
        on_path = tree.mask[1:, 1:][best] & (num_accepted > 0)[:, None]  # [B, N]
        index = torch.arange(n, device=draft_tokens.device)
        ordered = torch.where(on_path, index, n).sort(-1).values[:, : tree.max_depth]  # parents first = by depth
        accepted_nodes = torch.where(ordered < n, ordered, -1)
        rows = torch.arange(batch, device=draft_tokens.device)
        end = torch.where(num_accepted > 0, best + 1, 0)  # block position of the path's end
        return accepted_nodes, num_accepted, sample(target_probs[rows, end], generator)
