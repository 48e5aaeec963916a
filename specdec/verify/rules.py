"""The acceptance rule as one object: what the decode loop calls to verify a chain or a tree.

A rule has two methods, one per proposal shape, taking probabilities and a ``torch.Generator`` (terms as in
:mod:`specdec.verify`), and says whether it is ``lossy`` (changes the output distribution by design).
:data:`EXACT` is the default everywhere; Medusa's typical acceptance
(:class:`specdec.verify.lossy.typical.TypicalAcceptance`) is the lossy one, and the planted verifier bugs
(:mod:`specdec.exactness.planted`) are rules too, so whatever the loop verifies with reaches chains and trees alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch

from specdec.verify.chain import rejection_sample
from specdec.verify.sampling import uniforms
from specdec.verify.tree import Tree, tree_draws, verify_tree_drawn


@runtime_checkable
class AcceptanceRule(Protocol):
    lossy: bool  # True: the emitted tokens are not distributed as the target's (only greedy output is kept)

    def chain(
        self,
        draft_tokens: torch.Tensor,  # [B, K] long
        draft_probs: torch.Tensor | None,  # [B, K, V], or None for deterministic drafts (one-hot q)
        target_probs: torch.Tensor,  # [B, K+1, V]: K draft positions, then the bonus position
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] in [0, K], next_tokens [B]
        """Row b emits ``draft_tokens[b, :num_accepted[b]]``, then ``next_tokens[b]``."""

    def tree(
        self,
        tree: Tree,
        draft_tokens: torch.Tensor,  # [B, N] long
        draft_probs: torch.Tensor | None,  # [B, N, V], or None for deterministic nodes (one-hot q)
        target_probs: torch.Tensor,  # [B, N+1, V]: p at the root, then at each node
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted_nodes [B, D], num_accepted [B], next_tokens [B]
        """Row b emits the tokens of nodes ``accepted_nodes[b, :num_accepted[b]]`` (-1 past them), then
        ``next_tokens[b]``."""


@dataclass(frozen=True)
class ExactRule:
    """Rejection sampling: :func:`~specdec.verify.chain.rejection_sample` for chains,
    :func:`~specdec.verify.tree.verify_tree_drawn` for trees (:func:`~specdec.verify.tree.verify_tree`'s law; fixed
    candidates walked a level's siblings at once). Emits tokens distributed as the target's. Its uniforms are drawn
    in one op before the rule runs (:func:`~specdec.verify.sampling.uniforms`), as the decode loop draws them for the
    same rule captured in a graph: eager and graphed steps draw the same tokens from the same generator."""

    lossy: ClassVar[bool] = False

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        drawn = self.draw(draft_tokens, None, generator)
        return self.verdict(None, draft_tokens, draft_probs, target_probs, drawn)[1:]

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return self.verdict(tree, draft_tokens, draft_probs, target_probs, self.draw(draft_tokens, tree, generator))

    @staticmethod
    def draw(draft_tokens: torch.Tensor, tree: Tree | None, generator: torch.Generator | None) -> torch.Tensor:
        """The uniforms the rule reads for ``draft_tokens`` [B, K] (a chain where ``tree`` is None), in one draw:
        [B, K + 1] for a chain, [B, D·W + 1] for a tree (:func:`~specdec.verify.tree.tree_draws`)."""
        count = draft_tokens.shape[1] + 1 if tree is None else tree_draws(tree)
        return uniforms(draft_tokens.shape[0], count, generator, draft_tokens.device)

    @staticmethod
    def verdict(tree: Tree | None, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                target_probs: torch.Tensor, drawn: torch.Tensor
                ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """The verdict over uniforms :meth:`draw` drew (nothing drawn here, so a graph can capture it): a tree's
        accepted nodes [B, D] (None for a chain), num_accepted [B], next_tokens [B]."""
        if tree is None:
            return None, *rejection_sample(draft_tokens, draft_probs, target_probs, uniforms=drawn)
        return verify_tree_drawn(tree, draft_tokens, draft_probs, target_probs, drawn)


EXACT = ExactRule()
