"""A prompt-lookup branch in a draft tree: the n-gram continuation of the text joins the drafter's nodes.

Each step, :func:`continuations` looks up each row's continuation of its text so far with the n-gram
drafter's rule (:func:`specdec.drafters.ngram.lookup`, up to L tokens), and :func:`add_branch` adds it to
the tree a drafter built (Medusa's heads, an EAGLE layer):

- with one row the continuation is merged in like a trie (:func:`merge_trie`): down the nodes that already
  hold its tokens, the rest as a new chain below; no two siblings share a token;
- with several rows, whose continuations differ while one tree shape is verified for all, it hangs below
  the root as its own chain, tried first (:func:`branch_first`); a row with a shorter or no continuation
  fills it with its last token, and that filler is not counted as proposed.

On a GPU a fixed tree's lookup runs on the device (:func:`~specdec.drafters.ngram.device_continuations`, the same
rule in ops of fixed shapes) and its branch is always :func:`branch_first`'s chain of L nodes, filled where shorter,
so that the tree's shape is fixed and no value is read back: the drafter then drafts from the device alone
(``Traits.device_only``) and each step is read back a step late; the genuine nodes are counted on the device
(``Proposal.counted``) and read back with the step.

Lookup nodes are deterministic (one-hot q), so verification stays exact. Text that repeats (code, quoted
input) is where a learned drafter is weakest and the lookup strongest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specdec.drafters.ngram import NgramDrafter, lookup


def continuations(
    rows: list[list[int]],  # per row, its tokens so far (prompt and emitted, no padding)
    active: list[bool],  # rows still generating
    max_tokens: int,
) -> list[list[int]]:  # per row, up to max_tokens tokens ([] for a finished row or no match)
    """Each row's n-gram lookup continuation, with the n-gram drafter's default suffix lengths."""
    ngram = NgramDrafter.Config
    return [lookup(np.asarray(row, dtype=np.int64), max_tokens, ngram.max_ngram, ngram.min_ngram).tolist()
            if on else [] for row, on in zip(rows, active)]


def merge_trie(
    row: list[int],  # one row's node tokens
    parents: list[int],  # each node's parent (-1 = the root), parents first
    chain: list[int],  # tokens to add below the root
) -> tuple[list[int], list[int]]:  # the tokens and parents with the chain's missing nodes appended
    """Follow the nodes that spell ``chain`` from the root down (the first of equal siblings) and append
    the rest of it as a chain below the last one found. The inputs are left as they are."""
    row, parents = list(row), list(parents)
    children: dict[int, dict[int, int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, {}).setdefault(row[i], i)
    node = -1
    for token in chain:
        below = children.setdefault(node, {}).get(token)
        if below is None:
            row.append(token), parents.append(node)
            below = children[node][token] = len(row) - 1
        node = below
    return row, parents


def branch_first(
    tokens: torch.Tensor,  # [B, N] long: the drafter's nodes
    parents: Sequence[int],  # [N] each node's parent (-1 = the root)
    chains: list[list[int]],  # per row, its continuation (one at least non-empty)
    fill: Sequence[int],  # per row, the filler token for the rest of the branch
) -> tuple[torch.Tensor, tuple[int, ...], list[int]]:  # tokens [B, W + N], parents, filler per row
    """The rows' continuations as one chain of W (the longest) nodes below the root, before the drafter's
    nodes, which move down by W; each row's filler count is W minus its continuation's length."""
    width = max(len(chain) for chain in chains)
    padded = [chain + [fill[b]] * (width - len(chain)) for b, chain in enumerate(chains)]
    tokens = torch.cat([torch.tensor(padded, dtype=tokens.dtype, device=tokens.device), tokens], 1)
    return tokens, below_branch(parents, width), [width - len(chain) for chain in chains]


def below_branch(parents: Sequence[int], width: int) -> tuple[int, ...]:
    """The parents of a chain of ``width`` nodes below the root followed by a tree of ``parents`` (moved down by
    ``width``): :func:`branch_first`'s layout."""
    return tuple(range(-1, width - 1)) + tuple(p + width if p >= 0 else -1 for p in parents)


def add_branch(
    tokens: torch.Tensor,  # [B, N] long: the drafter's nodes (N = 0: it proposes none)
    parents: Sequence[int],  # [N] each node's parent (-1 = the root), parents first
    found: list[list[int]],  # per row, its continuation (see :func:`continuations`)
    fill: Sequence[int],  # per row, the filler token (its last token)
) -> tuple[torch.Tensor, tuple[int, ...], list[int]]:  # tokens [B, N'], parents [N'], filler nodes per row
    """Add each row's continuation to the tree: a trie merge at batch 1, a chain tried first otherwise (see
    the module docstring). Unchanged when no row has one. A row proposes N' minus its filler nodes."""
    if max(len(chain) for chain in found) == 0:
        return tokens, tuple(parents), [0] * len(found)
    if len(found) == 1:
        row, merged = merge_trie(tokens[0].tolist(), list(parents), found[0])
        return torch.tensor([row], dtype=tokens.dtype, device=tokens.device), tuple(merged), [0]
    return branch_first(tokens, parents, found, fill)
