"""Sampled tree candidates: the children of a node drawn from the draft distribution *without replacement*.

A tree's candidates keep multi-candidate rejection sampling (:mod:`specdec.verify.tree`) exact only if each is
reported with the law it was actually drawn from, given the siblings drawn before it. For draws without
replacement that is q with the earlier siblings' mass removed and renormalised (:func:`without`); the first
sibling's law is q itself. Both parts — the draw and the report — live in :class:`SiblingDraws`, which every
drafter that samples tree candidates draws through (EAGLE's tree today). The planted drafter-side tree bugs
(:mod:`specdec.exactness.planted`) are subclasses that report the law wrongly while drawing rightly.
"""

from __future__ import annotations

import torch

from specdec.verify.sampling import sample


def without(q: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:  # q [..., V], drawn [..., n] -> [..., V]
    """q with the ``drawn`` tokens' mass removed, renormalised (the law of the next draw without replacement)."""
    left = q.scatter(-1, drawn, 0.0)
    total = left.sum(-1, keepdim=True)
    return torch.where(total > 0, left / total.clamp(min=torch.finfo(q.dtype).tiny), q)


class SiblingDraws:
    """Draws a node's children from q without replacement, and reports each with the law it was drawn from."""

    def draw(self, q: torch.Tensor, logits: torch.Tensor, count: int,
             generator: torch.Generator | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        # q [B, V] the processed draft distribution at the node, logits [B, V] the ones it came from
        # -> tokens [B, count], reported laws: count x [B, V]
        """``count`` children of one node per row, in draw order, and the q reported for each."""
        tokens: list[torch.Tensor] = []
        reported = []
        for _ in range(count):
            law = q if not tokens else without(q, torch.stack(tokens, 1))
            reported.append(self.report(law, q, logits, tokens))
            tokens.append(sample(law, generator))
        return torch.stack(tokens, 1), reported

    def report(self, law: torch.Tensor, q: torch.Tensor, logits: torch.Tensor,
               drawn: list[torch.Tensor]) -> torch.Tensor:  # -> [B, V]
        """The q reported for a child drawn from ``law`` after the siblings ``drawn``: that law itself. Planted
        bugs override it (``q``: the node's processed distribution, ``logits``: the unprocessed logits)."""
        return law


EXACT_SIBLINGS = SiblingDraws()
