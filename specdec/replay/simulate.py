"""Replaying, the second phase: a live greedy run's verify steps re-enacted from a log, without the target.

Standing at position j (j new tokens emitted), a step takes the logged proposal from j (a chain's first K drafts,
or the tree), and the verifier's greedy rule, the same function the decode loop calls
(:func:`~specdec.verify.greedy_chain`, :func:`~specdec.verify.greedy_tree`), compares it with the target's argmax
there, which is the logged continuation: at a chain's draft i, token j + i; at a tree node of depth d on the path
walked so far, token j + d. The step emits the accepted drafts and the next token, cut at ``max_new_tokens`` and
after an EOS as :func:`~specdec.decode.engine._emit` cuts them, and the run moves on by what it emitted. Counts go
through :meth:`DecodeStats.record_step <specdec.decode.metrics.DecodeStats.record_step>` as the loop's do, so α,
α per position and τ mean what a live run's mean (τ: tokens per verify step, bonus included; truncation does not
count against it).

With a cost model (:mod:`specdec.replay.costs`, measured on this machine) the steps are timed too: each verify step
costs the target's forward over its block (last token + drafts) and a drafting step at K; plain decoding
(:func:`plain_stats`) one width-1 forward per token. Those times feed :func:`~specdec.decode.metrics.summarize` as a
live run's measured ones do; its ``speedup`` is then a prediction, decode only (no prefill is timed).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.decode.metrics import DecodeStats, total
from specdec.replay.costs import CostModel
from specdec.replay.log import PromptLog, ReplayLog
from specdec.verify import greedy_chain, greedy_tree
from specdec.verify.tree import Tree


def replay_prompt(log: PromptLog, k: int, *, max_new_tokens: int, eos: Sequence[int],
                  trees: dict[tuple[int, ...], Tree] | None = None, costs: CostModel | None = None) -> DecodeStats:
    """One prompt's live greedy run at lookahead ``k`` (a chain's K, or the tree's size: its proposals as logged),
    re-enacted from ``log``: its :class:`DecodeStats`, with times from ``costs`` (None: counts only)."""
    trees = {} if trees is None else trees
    stop, c = set(eos), log.continuation
    stats = DecodeStats(k=k)
    stats.new_tokens = stats.prefill_tokens = 1  # the prefill's token, c[0]
    j = 1
    active = c[0] not in stop and max_new_tokens > 1
    while active:
        if j - 1 >= len(log.proposals):
            raise ValueError(f"the log holds proposals from {len(log.proposals)} positions, position {j} was reached "
                             f"(max_new_tokens={max_new_tokens}): a log written with another max_new_tokens?")
        proposed = log.proposals[j - 1]
        if proposed.parents is None:  # a chain: its first k drafts
            drafts = proposed.tokens[:k]
            width, depth = min(proposed.num_proposed, k), None
            target = torch.tensor([c[j: j + len(drafts) + 1]])  # [1, K'+1]: the argmax at each draft, then after
            accepted = int(greedy_chain(torch.tensor([drafts], dtype=torch.long).reshape(1, -1), target)[0][0])
        else:  # a tree: walked as the verifier walks it
            shape = tuple(proposed.parents)
            if shape not in trees:
                trees[shape] = Tree.from_parents(list(shape))
            shape_tree = trees[shape]
            depths = shape_tree.depths.tolist()  # [N+1]: the root, then each node
            target = torch.tensor([[c[j + d] for d in depths]])  # [1, N+1]: the argmax wherever the walk reads it
            accepted = int(greedy_tree(shape_tree, torch.tensor([proposed.tokens]), target)[1][0])
            width, depth = proposed.num_proposed, shape_tree.max_depth
        if costs is not None:
            block = 1 + (len(drafts) if proposed.parents is None else len(proposed.tokens))
            stats.target_time_s += costs.verify(block)
            stats.drafter_time_s += costs.draft(k)
        stats.record_step([width], [accepted], [True], depth)
        stats.target_forwards += 1
        kept = c[j: j + accepted + 1][: max_new_tokens - j]
        for i, token in enumerate(kept):
            if token in stop:
                kept = kept[: i + 1]
                break
        j += len(kept)
        stats.new_tokens += len(kept)
        active = not (kept[-1] in stop or j >= max_new_tokens)
    stats.wall_time_s = stats.target_time_s + stats.drafter_time_s
    return stats


def plain_stats(replayed: DecodeStats, costs: CostModel) -> DecodeStats:
    """Plain decoding of the same prompt, timed by ``costs``: the same tokens (greedy), one width-1 forward each
    after the prefill's."""
    stats = DecodeStats(k=0)
    stats.new_tokens, stats.prefill_tokens = replayed.new_tokens, replayed.prefill_tokens
    stats.target_forwards = stats.verify_steps = stats.verified_tokens = replayed.new_tokens - replayed.prefill_tokens
    stats.target_time_s = stats.wall_time_s = costs.verify(1) * stats.target_forwards
    return stats


def replay(log: ReplayLog, k: int | None = None) -> list[DecodeStats]:
    """Every prompt's live greedy run at lookahead ``k`` (None: the log's K_max, or its tree), replayed from ``log``:
    one :class:`DecodeStats` per prompt (:func:`~specdec.decode.metrics.total` sums them), timed by the log's cost
    model where it holds one. Refused (:class:`~specdec.replay.log.ReplayMismatchError`) for k beyond K_max, or
    another tree size."""
    k = log.k_max if k is None else k
    log.check(k=k)
    trees: dict[tuple[int, ...], Tree] = {}
    costs = CostModel.from_dict(log.costs) if log.costs else None
    return [replay_prompt(p, k, max_new_tokens=log.max_new_tokens, eos=log.eos, trees=trees, costs=costs)
            for p in log.prompts]


def replay_total(log: ReplayLog, k: int | None = None) -> DecodeStats:
    """:func:`replay` summed over the prompts."""
    return total(replay(log, k))
