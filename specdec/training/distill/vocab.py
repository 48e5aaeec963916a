"""Draft vocabularies (FR-Spec, Zhao et al. 2025): a drafter that scores only the N tokens most frequent in
the target's answers pays N/V of the LM head, for training and drafting; verification stays exact."""

from __future__ import annotations

import torch

IGNORE = -100  # a label that never counts (past a sequence's end, or outside the draft vocabulary)


def draft_vocabulary(labels: torch.Tensor, vocab_size: int, size: int | None) -> torch.Tensor | None:
    """The ``size`` token ids most frequent among ``labels`` (ascending ids; ties to the lower id), or None
    (the full vocabulary) when ``size`` is None or covers it."""
    if size is None or size >= vocab_size:
        return None
    if size < 1:
        raise ValueError(f"draft_vocab must be null or >= 1, got {size}")
    counts = torch.bincount(labels[labels != IGNORE].flatten(), minlength=vocab_size).double()
    counts -= torch.arange(vocab_size, dtype=torch.double) / vocab_size  # stable tie-break: lower id first
    return counts.topk(size).indices.sort().values


def to_draft_labels(labels: torch.Tensor, token_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Token-id labels -> indices into the draft vocabulary (IGNORE where a token lies outside it)."""
    if token_ids is None:
        return labels
    index = torch.full((vocab_size + 1,), IGNORE, dtype=torch.long)  # the extra slot maps IGNORE to IGNORE
    index[token_ids] = torch.arange(token_ids.numel())
    return index[torch.where(labels == IGNORE, vocab_size, labels)]
