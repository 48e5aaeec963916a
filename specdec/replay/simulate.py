"""Replaying, the second phase: a live run's verify steps re-enacted from a log, without the target.

Greedy. Standing at position j (j new tokens emitted), a step takes the logged proposal from j (a chain's first K
drafts, or the tree), and the verifier's greedy rule, the same function the decode loop calls
(:func:`~specdec.verify.greedy_chain`, :func:`~specdec.verify.greedy_tree`), compares it with the target's argmax
there, which is the logged continuation: at a chain's draft i, token j + i; at a tree node of depth d on the path
walked so far, token j + d. The step emits the accepted drafts and the next token, cut at ``max_new_tokens`` and
after an EOS as :func:`~specdec.decode.engine._emit` cuts them, and the run moves on by what it emitted. Counts go
through :meth:`DecodeStats.record_step <specdec.decode.metrics.DecodeStats.record_step>` as the loop's do, so α,
α per position and τ mean what a live run's mean (τ: tokens per verify step, bonus included; truncation does not
count against it). Exact: tests/replay.

T > 0, in expectation (:func:`expected_prompt`, the default). Along each sampled continuation c, a step from
position j accepts at least m drafts with probability P_j(n >= m) = Π_{i<=m} β_i(j) (a tree: the sum over its
nodes of depth m of the products along their paths; :func:`~specdec.replay.acceptance.at_least`), so its expected
accepted length is Σ_{m=1..K} Π_{i<=m} β_i(j). The run is walked as a distribution over the positions it stands
at: reach(1) = 1, and a step from j sends reach(j) · P_j(n = m) to j + m + 1 (none past ``max_new_tokens`` or c's
first EOS). Every count becomes its expectation (floats: verify steps Σ reach(j); verified tokens Σ reach(j) ·
(1 + E_j[n]); α per position likewise), and τ = expected verified tokens / expected verify steps, pooled over a
prompt's seeds and the prompts as a live run's counts are. What this adds to the logging pass's approximations
(:mod:`specdec.replay.log`): the walk treats where steps end as independent of c's tokens. A live run's are not: a
step ends on a recovered token, drawn from the residual that excludes the rejected draft, so the positions it
stands at are not a random sample of c's. On the tests' Markov target this reads τ ~7% high with Medusa's fixed
trees and within 1% on chains; the real target's figures are in experiments/README.md.

T > 0, the matching walk (``walk=True``; deterministic drafts only): the greedy replay above along each sampled
continuation. With one-hot drafts a draft is accepted iff the emitted token equals it (a rejected one-hot draft is
never the recovered token: the residual holds no mass there), so given the emitted tokens a run's step boundaries
are fixed, and the emitted tokens are distributed as the target's samples: τ of the walk along one continuation is
distributed exactly as a live run's τ (no approximation; one run's noise per seed).

The draft model's ``schedule: heuristic`` (its draft length +2 after a step that kept every draft, else -1, at most
K) is re-enacted: logged at K_max (:func:`~specdec.replay.log.constant_length`), each step drafts the first L of the
logged drafts, L following the steps replayed (:func:`next_length`); in expectation the walk's states are (position,
L). A batch's rows share L, as live (:func:`batched_speedup` steps them together). Exact where the chain's first L
drafts at K_max are its drafts at L; a cross-vocabulary draft re-tokenises its text, so its shorter proposals may end
in another token.

With a cost model (:mod:`specdec.replay.costs`, measured on this machine) the steps are timed too: each verify step
costs the target's forward over its block (last token + drafts), a drafting step at K and the step's host work at
K; plain decoding (:func:`plain_stats`) a width-1 forward and a plain step's host work per token. Those times feed
:func:`~specdec.decode.metrics.summarize` as a live run's measured ones do; its ``decode_speedup`` is then a
prediction (no prefill is timed), the one a replay reports, as ``predicted_speedup``
(:func:`~specdec.decode.metrics.as_replayed`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.decode.metrics import DecodeStats, total
from specdec.replay.acceptance import at_least
from specdec.replay.costs import CostModel
from specdec.replay.log import PromptLog, ReplayLog
from specdec.verify import greedy_chain, greedy_tree
from specdec.verify.tree import Tree


def next_length(schedule: str, length: int, k: int, kept_all: bool) -> int:
    """The draft length of the step after one that drafted ``length`` (of at most ``k``): ``k`` under a constant
    schedule; under the draft model's ``heuristic``, +2 after a step whose rows kept every draft (``kept_all``), else
    -1, at least 1 and at most ``k`` (:meth:`~specdec.drafters.draft_model.core.ModelDrafter.observe`)."""
    if schedule == "constant":
        return k
    return min(k, length + 2) if kept_all else max(1, length - 1)


class _Walk:
    """One prompt's live greedy run re-enacted from its log a step at a time (:func:`replay_prompt`'s; a batch's
    rows step together in :func:`batched_speedup`): ``stats`` as the loop counts them, ``active`` until it ends."""

    def __init__(self, log: PromptLog, k: int, *, max_new_tokens: int, eos: Sequence[int],
                 trees: dict[tuple[int, ...], Tree]):
        self.log, self.max_new_tokens, self.stop, self.trees = log, max_new_tokens, set(eos), trees
        self.stats = DecodeStats(k=k)
        self.stats.new_tokens = self.stats.prefill_tokens = 1  # the prefill's token, c[0]
        self.j = 1
        self.active = log.continuation[0] not in self.stop and max_new_tokens > 1

    def step(self, length: int, costs: CostModel | None = None) -> tuple[int, int, int]:
        """One verify step from where the run stands, a chain drafting ``length`` (a tree: its proposal as logged),
        timed by ``costs`` (None: counts only): its block (last token + drafts), drafts and drafts accepted."""
        j, c, stats = self.j, self.log.continuation, self.stats
        if j - 1 >= len(self.log.proposals):
            raise ValueError(f"the log holds proposals from {len(self.log.proposals)} positions, position {j} was "
                             f"reached (max_new_tokens={self.max_new_tokens}): a log written with another "
                             f"max_new_tokens?")
        proposed = self.log.proposals[j - 1]
        if proposed.parents is None:  # a chain: its first ``length`` drafts
            drafts = proposed.tokens[:length]
            width, depth, block = min(proposed.num_proposed, length), None, 1 + len(drafts)
            target = torch.tensor([c[j: j + len(drafts) + 1]])  # [1, K'+1]: the argmax at each draft, then after
            accepted = int(greedy_chain(torch.tensor([drafts], dtype=torch.long).reshape(1, -1), target)[0][0])
        else:  # a tree: walked as the verifier walks it
            shape = tuple(proposed.parents)
            if shape not in self.trees:
                self.trees[shape] = Tree.from_parents(list(shape))
            tree = self.trees[shape]
            target = torch.tensor([[c[j + d] for d in tree.depths.tolist()]])  # [1, N+1]: wherever the walk reads
            accepted = int(greedy_tree(tree, torch.tensor([proposed.tokens]), target)[1][0])
            width, depth, block = proposed.num_proposed, tree.max_depth, 1 + len(proposed.tokens)
        if costs is not None:
            stats.target_time_s += costs.verify(block)
            stats.drafter_time_s += costs.draft(length)
            stats.wall_time_s += costs.step(block, length)
        stats.record_step([width], [accepted], [True], depth)
        stats.target_forwards += 1
        kept = c[j: j + accepted + 1][: self.max_new_tokens - j]
        for i, token in enumerate(kept):
            if token in self.stop:
                kept = kept[: i + 1]
                break
        self.j += len(kept)
        stats.new_tokens += len(kept)
        self.active = not (kept[-1] in self.stop or self.j >= self.max_new_tokens)
        return block, width, accepted


def replay_prompt(log: PromptLog, k: int, *, max_new_tokens: int, eos: Sequence[int],
                  trees: dict[tuple[int, ...], Tree] | None = None, costs: CostModel | None = None,
                  schedule: str = "constant") -> DecodeStats:
    """One prompt's live greedy run at lookahead ``k`` (a chain's K, or the tree's size: its proposals as logged),
    re-enacted from ``log``: its :class:`DecodeStats`, with times from ``costs`` (None: counts only). A chain's
    draft length follows ``schedule`` (:func:`next_length`), starting at ``k``."""
    walk = _Walk(log, k, max_new_tokens=max_new_tokens, eos=eos, trees={} if trees is None else trees)
    _set_up(walk.stats, costs)
    length = k
    while walk.active:
        _, width, accepted = walk.step(length, costs)
        length = next_length(schedule, length, k, accepted >= width)
    return walk.stats


def _set_up(stats: DecodeStats, costs: CostModel | None) -> None:
    """A generation's once-only drafting (``costs.setup_s``: the drafter's start, a draft model reading the prompt)
    counted in its drafter's time and its wall time."""
    if costs is not None:
        stats.drafter_time_s += costs.setup_s
        stats.wall_time_s += costs.setup_s


def expected_prompt(log: PromptLog, k: int, *, max_new_tokens: int, eos: Sequence[int],
                    costs: CostModel | None = None, schedule: str = "constant") -> DecodeStats:
    """One prompt's sampled run at lookahead ``k``, in expectation over the verifier's draws along ``log``'s
    sampled continuation (T > 0; see the module docstring): its :class:`DecodeStats` with expected counts
    (floats), times from ``costs`` (None: counts only). A chain's draft length follows ``schedule``
    (:func:`next_length`): the walk's states are then (position, length)."""
    stop, c = set(eos), log.continuation
    end = min(max_new_tokens, next((i + 1 for i, t in enumerate(c) if t in stop), len(c)))  # tokens it emits
    stats = DecodeStats(k=k)
    stats.new_tokens = end
    stats.prefill_tokens = 1
    _set_up(stats, costs)
    reach: list[dict[int, float]] = [{} for _ in range(end + 1)]  # reach[j][L]: P(a step of length L starts at j)
    if end > 1:
        reach[1][k] = 1.0
    for j in range(1, end):
        for length, pi in sorted(reach[j].items()):
            if pi == 0.0:
                continue
            if j - 1 >= len(log.proposals) or j - 1 >= len(log.accept_probs):
                raise ValueError(f"the log holds acceptance probabilities from {len(log.accept_probs)} positions, "
                                 f"position {j} was reached (max_new_tokens={max_new_tokens}): a greedy log, or one "
                                 f"written with another max_new_tokens?")
            proposed = log.proposals[j - 1]
            if proposed.parents is None:  # a chain: its first ``length`` drafts
                reached = at_least(log.accept_probs[j - 1][:length])
                width, depth, block = min(proposed.num_proposed, length), None, 1 + len(proposed.tokens[:length])
            else:
                reached = at_least(log.accept_probs[j - 1], proposed.parents)
                width, depth, block = proposed.num_proposed, len(reached), 1 + len(proposed.tokens)
            stats.verify_steps += pi
            stats.target_forwards += pi
            stats.tree_steps += 0.0 if depth is None else pi
            stats.proposed_tokens += pi * width
            stats.verified_tokens += pi * (1.0 + sum(reached))
            for i in range(min(width if depth is None else depth, len(reached) + 1)):  # position i reached: n >= i
                stats.proposed_per_position[i] += pi * (1.0 if i == 0 else reached[i - 1])
            for i in range(min(width, len(reached)) if depth is None else len(reached)):
                stats.accepted_per_position[i] += pi * reached[i]
            for n in range(len(reached) + 1):  # the step accepts n drafts, emits n + 1 tokens
                p_n = (1.0 if n == 0 else reached[n - 1]) - (reached[n] if n < len(reached) else 0.0)
                if j + n + 1 < end:
                    after = next_length(schedule, length, k, n >= width)
                    reach[j + n + 1][after] = reach[j + n + 1].get(after, 0.0) + pi * p_n
            if costs is not None:
                stats.target_time_s += pi * costs.verify(block)
                stats.drafter_time_s += pi * costs.draft(length)
                stats.wall_time_s += pi * costs.step(block, length)
    return stats


def plain_stats(replayed: DecodeStats, costs: CostModel) -> DecodeStats:
    """Plain decoding of the same prompt, timed by ``costs``: the same tokens (greedy), one plain step each
    after the prefill's."""
    stats = DecodeStats(k=0)
    stats.new_tokens, stats.prefill_tokens = replayed.new_tokens, replayed.prefill_tokens
    stats.target_forwards = stats.verify_steps = stats.verified_tokens = replayed.new_tokens - replayed.prefill_tokens
    stats.target_time_s = costs.verify(1) * stats.target_forwards
    stats.wall_time_s = costs.plain_step() * stats.target_forwards
    return stats


def replay(log: ReplayLog, k: int | None = None, *, walk: bool = False, batch_size: int = 1) -> list[DecodeStats]:
    """Every prompt's live run at lookahead ``k`` (None: the log's K_max, or its tree), replayed from ``log``: one
    :class:`DecodeStats` per prompt (:func:`~specdec.decode.metrics.total` sums them; at T > 0 a prompt's seeds
    summed, its counts expected values), timed by the log's cost model at ``batch_size`` rows where it holds one
    (each row accepting as at batch 1: the speedup predicted for a batch of that size). ``walk`` (T > 0, a
    log of deterministic drafts only): the matching walk along each sampled continuation instead of the
    expectation (see the module docstring). Refused (:class:`~specdec.replay.log.ReplayMismatchError`) for k
    beyond K_max, or another tree size."""
    k = log.k_max if k is None else k
    log.check(k=k)
    trees: dict[tuple[int, ...], Tree] = {}
    costs = log.cost_model(batch_size)
    options = dict(max_new_tokens=log.max_new_tokens, eos=log.eos, costs=costs, schedule=log.schedule)
    if log.temperature == 0 or walk:
        if walk and not log.one_hot:
            raise ValueError("the matching walk replays deterministic drafts only; this log's drafter drew its drafts "
                             "from a distribution (replay it in expectation: walk=False)")
        runs = [replay_prompt(p, k, trees=trees, **options) for p in log.prompts]
    else:
        runs = [expected_prompt(p, k, **options) for p in log.prompts]
    return [total(runs[i: i + log.seeds]) for i in range(0, len(runs), log.seeds)]  # a prompt's seeds together


def batched_speedup(log: ReplayLog, k: int, batch_size: int, *, run_tokens: int | None = None) -> float:
    """The decode speedup over plain decoding predicted for a live run of ``log``'s prompts at lookahead ``k`` in
    batches of ``batch_size`` rows (consecutive prompts, as the live run takes its own), timed by the log's cost
    model at that batch size. A batch steps together until its last row ends (a finished row waits), and each step
    is as wide as its widest row's block, since the loop verifies every row's drafts in one forward padded to the
    widest; plain decoding takes the batch's longest row's tokens, one plain step each. So a batch pays for its
    slowest row and its longest proposal: a prompt-lookup draft in one row widens every row's forward. Greedy
    (or ``walk``-able): each row's logged steps, stepped together exactly (a heuristic schedule's one length for all
    rows). T > 0: each row's expected steps (its own schedule), a batch as many as its row with the most, each at the
    largest of its rows' mean step costs (an approximation).
    ``run_tokens``: the live run's new tokens per row (None: the log's). A run shorter than the log is replayed
    over its first ``run_tokens``; a longer one pays the drafter's once-a-generation work over more tokens than
    the log holds, so the replay counts the share of it its tokens carry (:func:`setup_share`).
    At one row and the log's length, :func:`replay`'s per-prompt times summed."""
    log.check(k=k)
    costs = log.cost_model(batch_size)
    covered = log.max_new_tokens if run_tokens is None else min(log.max_new_tokens, run_tokens)
    options = dict(max_new_tokens=covered, eos=log.eos)
    trees: dict[tuple[int, ...], Tree] = {}
    spec_s = plain_s = 0.0
    for start in range(0, len(log.prompts), batch_size):
        rows = log.prompts[start: start + batch_size]
        if log.temperature == 0:
            walks = [_Walk(p, k, trees=trees, **options) for p in rows]
            length = k
            while any(w.active for w in walks):
                steps = [w.step(length) for w in walks if w.active]
                spec_s += costs.step(max(block for block, _, _ in steps), length)
                widest = max(width for _, width, _ in steps)  # the schedule asks each row to keep the batch's widest
                length = next_length(log.schedule, length, k, all(accepted >= widest for _, _, accepted in steps))
            runs = [w.stats for w in walks]
        else:
            runs = [expected_prompt(p, k, costs=costs, schedule=log.schedule, **options) for p in rows]
            stepping = [r for r in runs if r.verify_steps > 0]
            spec_s += max((r.verify_steps for r in stepping), default=0.0) * max(
                ((r.wall_time_s - costs.setup_s) / r.verify_steps for r in stepping), default=0.0)
        spec_s += costs.setup_s * setup_share(runs, covered, run_tokens)  # the batch's once-only drafting
        plain_s += costs.plain_step() * max(r.new_tokens - r.prefill_tokens for r in runs)
    return plain_s / spec_s if spec_s > 0 else 1.0


def setup_share(runs: Sequence[DecodeStats], covered: int, run_tokens: int | None) -> float:
    """The share of a batch's once-a-generation drafting that the replay of its first ``covered`` tokens per row
    (``runs``) carries, where the live run generates up to ``run_tokens`` per row (None: ``covered``): the
    replayed tokens over those the batch's longest row is expected to reach live (a row that stopped before
    ``covered`` stops there live; one that did not runs on to ``run_tokens``). At most 1."""
    if run_tokens is None or run_tokens <= covered:
        return 1.0
    replayed = max(r.new_tokens for r in runs)
    expected = max(r.new_tokens if r.new_tokens < covered else run_tokens for r in runs)
    return min(1.0, replayed / expected) if expected > 0 else 1.0


def replay_total(log: ReplayLog, k: int | None = None, *, walk: bool = False) -> DecodeStats:
    """:func:`replay` summed over the prompts."""
    return total(replay(log, k, walk=walk))
