"""Draft vocabularies (FR-Spec, Zhao et al. 2025): a drafter that scores only the N tokens most frequent in
the target's answers pays N/V of the LM head, for training and drafting; verification stays exact."""

from __future__ import annotations

import torch

IGNORE = -100  # a label that never counts (past a sequence's end, or outside the draft vocabulary)


def check_draft_vocab(size: int | None, vocab_size: int) -> None:
    """Refuse a ``method.draft_vocab`` outside [1, ``vocab_size``] (None: the whole vocabulary); a larger one
    is a mistake, not a request for everything."""
    if size is not None and not 1 <= size <= vocab_size:
        raise ValueError(f"method.draft_vocab={size} must be null (the whole vocabulary) or in [1, {vocab_size}]: "
                         f"the target's vocabulary has {vocab_size} tokens")


def draft_vocabulary(labels: torch.Tensor, vocab_size: int, size: int | None) -> torch.Tensor | None:
    """The ``size`` token ids most frequent among ``labels`` (ascending ids; ties to the lower id), or None
    (the full vocabulary) when ``size`` is None or ``vocab_size``; sizes as :func:`check_draft_vocab` allows."""
    check_draft_vocab(size, vocab_size)
    if size is None or size == vocab_size:
        return None
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
