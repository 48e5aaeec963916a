"""What the drafter did before each emitted token, and the exactness tests that condition on it
(:mod:`specdec.verify_dist`).

Why: a mistake in the verify rule acts only where a draft was verified. With a drafter that proposes at
a minority of positions (prompt lookup at T=1), a bias there is diluted by the undrafted majority when
tokens are pooled, and split L ways per position. So the tests also run on **strata** of tokens by what
the drafter had done *before* the token was drawn:

- ``drafted``: a draft was proposed at this position (chain position / tree depth d ≥ 1); with ``depth=d``
  for each depth, when several depths have enough tokens;
- ``undrafted``: none was (a plain step, the prefill's token, the bonus position);
- ``bonus``: none was, after at least one accepted draft in the same verify step (the bonus token; in a
  batch, also where a row's own proposals ran out and only filler followed).

Why that conditioning is valid: the stratum of token t is fixed before token t is drawn (the drafts of
its verify step and the accepted drafts before it), so under exactness u_t is Uniform(0, 1) given it,
and the tokens of one stratum are a predictably selected subsequence: still i.i.d. uniform (optional
skipping). Conditioning on anything the token itself decides (e.g. "was rejected", "is a recovered token")
would bias the PIT even for an exact verifier, and is never done.

**The draft-match test** is directional: rules of the recovered-token family push mass toward (or away
from) the draft token, and a drafter that draws its drafts from another law than the q it reports moves
the rate at which drafts come out. For a deterministic draft x (q one-hot) an exact verifier emits x
with probability p(x), and at a tree node with deterministic children the emitted token is one of them
with probability Σ p(child), p from the teacher-forced target. For a sampled chain draft at position j the
law is taken *before* the draft is drawn: given the drafts before it (accepted, since j was reached), x_j
is drawn from its reported q_j, so an exact verifier emits it with probability β_j = Σ_x min(q_j(x), p_j(x))
(accepts x with probability min(1, p_j(x) / q_j(x))), with p_j the one the verifier was given, read by
:class:`MatchWatch` around the acceptance rule. Whether j is reached is fixed before x_j is drawn (it rests
on the earlier drafts and coins), so the test is valid there. Conditioning on the drawn x instead
(min(1, p(x) / q(x)), the verifier's own formula) would give it no power against a misreported q: it
would compute what the verifier computes from the same wrong q. So the number of matches is tested against
the sum of those probabilities (:func:`specdec.exactness.stats.hit_rate_test`). Sampled tree nodes are left
out of it (their law is not one probability): the sibling-match test covers them.

**The sibling-match test** covers tree candidates *drawn* from q (without replacement: EAGLE's sampled tree).
Their exactness rests on the q the drafter reports for each child — the law of that draw given the siblings
drawn before it — and a wrong report (not renormalised after the earlier draws, taken before the sampling
processing) biases the output only where an earlier sibling was rejected, where pooled tests are weakest.
At a reached node with target distribution p, child j is *tried* when its earlier siblings were rejected;
the residual r is then what is left of p after them (r = p for the first child). Given everything before
child j was drawn, child j is drawn from its reported q_j, so an exact verifier emits it with probability
β_j = Σ_x min(q_j(x), r(x)) (accepts x with probability min(1, r(x) / q_j(x)); a rejected token keeps no
residual mass, so it is never emitted later). Whether a child is tried is fixed before it is drawn, so
Σ (hit_j − β_j) over the tried children is a martingale: :func:`specdec.exactness.stats.hit_rate_test` again,
one event per tried child. A drafter that draws from another law than it reports moves the hit rate (the
planted tree bugs do, a later sibling's one way or the other), and so does a verifier bug that emits a
rejected child (the recovered token drawn from p). p is the one the verifier was given (the target's
processed distribution of the verify forward), read by :class:`MatchWatch` around the acceptance rule:
the test is of the drafter's reports and the sibling walk; the target's own mistakes are the PIT tests'.

Recording needs no change to the decode loop: :class:`DraftRecorder` wraps the drafter and reads each
proposal and, after each verify step, the tokens the step appended (host-side); it reads the proposal's
tokens after the loop's own sync of that step. For sampled drafts, :meth:`DraftRecorder.watch` wraps the
acceptance rule too, to compute each sampled chain draft's and each tried child's β where p and the q's are
at hand; without it, sampled drafts have no match law.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from specdec.drafters.base import DecodeState, Drafter, DrafterWrapper, Proposal
from specdec.exactness import stats
from specdec.exactness.stats import TokenScores, Verdict
from specdec.verify.chain import emitted_tokens
from specdec.verify.rules import AcceptanceRule
from specdec.verify.tree import Tree, accepted_path, residual_after_rejection

PLAN_POWER = 0.9  # the power the budget planner plans for
_Sibling = tuple[float, bool]  # a tried sampled child: (β, whether it was emitted)


class _Entry(NamedTuple):  # one emitted token's record (:class:`DraftRecord`)
    depth: int
    accepted_before: int
    candidates: tuple[int, ...]
    deterministic: bool = False  # the drafts are not drawn: their match law is read from the target
    beta: float = math.nan  # a sampled chain draft's match law, Σ min(q, p) (module docstring); nan: none known
    siblings: tuple[_Sibling, ...] = ()


_UNDRAFTED = _Entry(0, 0, ())


# --- recording ----------------------------------------------------------------------------------------------


@dataclass
class DraftRecord:
    """Per emitted token [R, L], what the drafter had done before it was drawn."""

    depth: np.ndarray  # [R, L] int64: chain position / tree depth of a draft at this position; 0 = none
    accepted_before: np.ndarray  # [R, L] int64: drafts accepted earlier in the same verify step
    candidates: np.ndarray  # [R, L, W] int64: the draft token(s) at this position (tree: the node's children); -1 pads
    deterministic: np.ndarray  # [R, L] bool: the draft(s) at this position were not drawn (q one-hot)
    draft_beta: np.ndarray  # [R, L] float64: a sampled chain draft's Σ min(q, p); nan: not one, or not watched
    # [R, L, S] sampled tree children tried at this position, in order (module docstring): β, nan pads
    sibling_beta: np.ndarray
    sibling_hit: np.ndarray  # [R, L, S] bool: whether the emitted token is that child

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[_Entry]], length: int) -> DraftRecord:
        if any(len(row) != length for row in rows):
            raise RuntimeError(f"the draft record has {sorted({len(r) for r in rows})} entries per row, not {length}: "
                               "it lost track of the emitted tokens")
        width = max((len(e.candidates) for row in rows for e in row), default=0)
        tried = max((len(e.siblings) for row in rows for e in row), default=0)
        candidates = np.full((len(rows), length, width), -1, dtype=np.int64)
        beta = np.full((len(rows), length, tried), np.nan)
        hit = np.zeros((len(rows), length, tried), dtype=bool)
        for r, row in enumerate(rows):
            for t, entry in enumerate(row):
                candidates[r, t, :len(entry.candidates)] = entry.candidates
                for j, (b, h) in enumerate(entry.siblings):
                    beta[r, t, j], hit[r, t, j] = b, h
        field = lambda name, dtype: np.array([[getattr(e, name) for e in row] for row in rows],  # noqa: E731
                                             dtype=dtype).reshape(len(rows), length)
        return cls(field("depth", np.int64), field("accepted_before", np.int64), candidates,
                   field("deterministic", bool), field("beta", np.float64), beta, hit)

    @staticmethod
    def concat(parts: Sequence[DraftRecord]) -> DraftRecord:
        def cat(name: str, fill) -> np.ndarray:  # along rows, the last axis padded to the widest part
            arrays = [getattr(p, name) for p in parts]
            if arrays[0].ndim == 2:
                return np.concatenate(arrays)
            width = max(a.shape[2] for a in arrays)
            return np.concatenate([np.pad(a, ((0, 0), (0, 0), (0, width - a.shape[2])), constant_values=fill)
                                   for a in arrays])

        return DraftRecord(cat("depth", 0), cat("accepted_before", 0), cat("candidates", -1),
                           cat("deterministic", False), cat("draft_beta", np.nan),
                           cat("sibling_beta", np.nan), cat("sibling_hit", False))


@functools.lru_cache(maxsize=64)
def _children(parents: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:  # per block position (root 0): child nodes
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        kids[parent + 1].append(node)
    return tuple(tuple(k) for k in kids)


def _chain_entries(tokens: list[int], sampled: bool, beta: list[float] | None, proposed: int,
                   count: int) -> list[_Entry]:
    """The j-th token a chain step appended was drawn where draft j stood, if the drafter proposed it; a sampled
    draft's match law is ``beta[j]`` where the verdict was watched (:class:`MatchWatch`)."""
    return [_Entry(j + 1, j, (tokens[j],), not sampled, math.nan if beta is None else beta[j]) if j < proposed
            else _Entry(0, j, ()) for j in range(count)]


def _tree_entries(parents: tuple[int, ...], tokens: list[int], new: list[int], sampled: bool,
                  siblings: list[tuple[_Sibling, ...]] | None = None) -> list[_Entry]:
    """Follow the step's tokens down the tree: token j was drawn at the node its first j tokens reached, with
    that node's children as drafts (and, sampled, ``siblings[j]``: the children tried there). The accepted child
    is the *first* child holding the emitted token: once a child is rejected, the residual has no mass at its
    token, so no later sibling with it can be accepted."""
    kids, node, out = _children(parents), -1, []
    for j, token in enumerate(new):
        below = kids[node + 1]
        if below:
            out.append(_Entry(j + 1, j, tuple(dict.fromkeys(tokens[i] for i in below)), not sampled,
                              siblings=() if siblings is None else siblings[j]))
        else:
            out.append(_Entry(0, j, ()))
        if j < len(new) - 1:  # token j was accepted: move to its node
            node = next((i for i in below if tokens[i] == token), None)
            if node is None:
                raise RuntimeError(f"emitted token {token} is no child of the tree node reached: the verify step and "
                                   "the tree disagree")
    return out


def tried_siblings(tree: Tree, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   accepted_nodes: torch.Tensor, num_accepted: torch.Tensor,
                   next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # beta, hit [B, D+1, W]
    """For each row's walk (a tree verdict: ``accepted_nodes`` [B, D], ``num_accepted`` [B], ``next_tokens``
    [B]) and each depth d it reached, the children of the node at depth d it tried, in order (module
    docstring): β = Σ min(q_j, r), nan where not tried; and whether the token emitted there is that child.
    Arguments as :func:`specdec.verify.tree.verify_tree`'s, q of every node given."""
    batch, depth = accepted_nodes.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    path = accepted_path(accepted_nodes)  # [B, D+1] block positions
    emitted = emitted_tokens(draft_tokens.gather(1, accepted_nodes.clamp(min=0)), num_accepted, next_tokens)
    width = tree.children.shape[1]
    beta = torch.full((batch, depth + 1, width), math.nan, dtype=torch.float64, device=draft_tokens.device)
    hit = torch.zeros(batch, depth + 1, width, dtype=torch.bool, device=draft_tokens.device)
    for d in range(depth + 1):
        node = path[:, d]  # [B] block position
        trying = d <= num_accepted  # [B]: the walk reached depth d, and no child was accepted there yet
        residual = target_probs[rows, node]  # [B, V]
        for j in range(width):
            kid = tree.children[node, j]  # [B] block position, -1 = none
            tried = trying & (kid >= 0)
            idx = (kid - 1).clamp(min=0)
            q = draft_probs[rows, idx]  # [B, V]
            match = tried & (draft_tokens[rows, idx] == emitted[:, d])
            beta[:, d, j] = torch.where(tried, torch.minimum(q, residual).sum(-1).double(), math.nan)
            hit[:, d, j] = match
            residual = torch.where((tried & ~match)[:, None], residual_after_rejection(residual, q), residual)
            trying &= ~match
    return beta, hit


def chain_match_laws(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:  # -> [B, K] float64
    """β_j = Σ_x min(q_j(x), p_j(x)) at each chain position (module docstring): the probability that an exact
    verifier emits draft j, given the drafts before it and that position j is reached. ``draft_probs`` [B, K, V],
    ``target_probs`` [B, K+1, V]."""
    k = draft_probs.shape[1]
    return torch.minimum(draft_probs, target_probs[:, :k]).double().sum(-1)


@dataclass(frozen=True)
class MatchWatch:
    """An acceptance rule around ``inner`` (whose verdicts it returns unchanged) that hands ``recorder`` the match
    laws of each sampled chain (:func:`chain_match_laws`) and the tried children of each sampled tree
    (:func:`tried_siblings`) it verifies."""

    inner: AcceptanceRule
    recorder: DraftRecorder

    @property
    def lossy(self) -> bool:
        return self.inner.lossy

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        if draft_probs is not None:
            self.recorder.chain_beta = chain_match_laws(draft_probs, target_probs)  # read after the step's sync
        return self.inner.chain(draft_tokens, draft_probs, target_probs, generator)

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        verdict = self.inner.tree(tree, draft_tokens, draft_probs, target_probs, generator)
        if draft_probs is not None:
            beta, hit = tried_siblings(tree, draft_tokens, draft_probs, target_probs, *verdict)
            beta, hit = beta.tolist(), hit.tolist()  # [B][depth][child]
            self.recorder.tried = [[tuple((b, h) for b, h in zip(bs, hs) if not math.isnan(b)) for bs, hs in zip(*row)]
                                   for row in zip(beta, hit)]
        return verdict


class DraftRecorder(DrafterWrapper):
    """Wraps ``inner`` and records, for every token a generation emits, its :class:`DraftRecord` entry:
    :meth:`take` returns them per row after the generation. Drafts and the verdicts are ``inner``'s (its rule,
    feature layers, forwards and graphs too); to record the match laws of sampled drafts (chains' β, trees'
    tried children), verify with :meth:`watch`'s rule."""

    reads_host = True  # the host's tokens, each step

    def __init__(self, inner: Drafter):
        super().__init__(inner)
        self.rows: list[list[_Entry]] = []
        self._seen: list[int] = []  # per row, host tokens already recorded
        self._proposal: Proposal | None = None
        self.chain_beta: torch.Tensor | None = None  # [B, K]: the last sampled chain verdict's match laws
        self.tried: list[list[tuple[_Sibling, ...]]] | None = None  # [B][depth]: the last tree verdict's tried children

    def watch(self, rule: AcceptanceRule) -> MatchWatch:
        """``rule``, recording the match laws of sampled chains and trees into this recorder."""
        return MatchWatch(rule, self)

    def start(self, state: DecodeState) -> None:
        self.inner.start(state)
        self.rows = [[_UNDRAFTED] for _ in state.tokens]  # the prefill's token: drawn before any draft
        self._seen = [len(row) for row in state.tokens]

    def propose(self, state: DecodeState, k: int) -> Proposal:
        proposal = self.inner.propose(state, k)
        self._proposal, self.tried, self.chain_beta = proposal, None, None
        return proposal

    def observe(self, state: DecodeState) -> None:
        proposal = self._proposal
        tokens, sampled = proposal.tokens.tolist(), proposal.probs is not None
        beta = None if self.chain_beta is None else self.chain_beta.tolist()
        proposed = proposal.genuine()
        for b, row in enumerate(state.tokens):
            new, self._seen[b] = row[self._seen[b]:], len(row)
            if proposal.tree is None:
                self.rows[b] += _chain_entries(tokens[b], sampled, None if beta is None else beta[b], proposed[b],
                                               len(new))
            else:
                self.rows[b] += _tree_entries(proposal.tree.parent_list, tokens[b], new, sampled,
                                              None if self.tried is None else self.tried[b])
        self.inner.observe(state)

    def take(self, length: int) -> DraftRecord:
        """The record of the generation that just ended (rows of ``length`` tokens)."""
        return DraftRecord.from_rows(self.rows, length)


# --- the tests ----------------------------------------------------------------------------------------------


def strata(record: DraftRecord, min_rows: int) -> list[tuple[str, np.ndarray]]:  # (label, [R·L] bool mask)
    """The strata (module docstring) with at least ``min_rows`` tokens, rows in [R, L] order."""
    depth, before = record.depth.ravel(), record.accepted_before.ravel()
    depths = [d for d in np.unique(depth[depth > 0]) if (depth == d).sum() >= min_rows]
    groups = [("drafted", depth > 0)]
    if len(depths) > 1:
        groups += [(f"depth={d}", depth == d) for d in depths]
    groups += [("undrafted", depth == 0), ("bonus", (depth == 0) & (before > 0))]
    return [(label, mask) for label, mask in groups if mask.sum() >= min_rows]


def match_probabilities(record: DraftRecord, p_candidates: np.ndarray) -> np.ndarray:  # [R·L, W] -> [R·L]
    """P(the emitted token is one of the drafts) under exactness (module docstring): Σ p over deterministic
    drafts (one, or a node's children), a sampled chain draft's recorded β; nan where no draft or no law."""
    p = np.where(record.candidates.reshape(p_candidates.shape) >= 0, p_candidates, 0.0).sum(1)
    return np.minimum(1.0, np.where(record.deterministic.ravel(), p, record.draft_beta.ravel()))  # rounding: ≤ 1


def matches(record: DraftRecord, tokens: np.ndarray) -> np.ndarray:  # tokens [R, L] -> [R·L] bool
    return (record.candidates == tokens[..., None]).any(-1).ravel()


def sibling_events(record: DraftRecord, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # mask [R·L]
    """The tried sampled children at the tokens of ``mask``: their β and hits, flat."""
    beta = record.sibling_beta.reshape(mask.size, -1)[mask].ravel()
    hit = record.sibling_hit.reshape(mask.size, -1)[mask].ravel()
    tried = np.isfinite(beta)
    return beta[tried], hit[tried]


def stratified_tests(pit: np.ndarray, scores: TokenScores, record: DraftRecord, p_candidates: np.ndarray,
                     tokens: np.ndarray, *, alpha: float, bins: int,
                     min_rows: int) -> list[Verdict]:  # pit, tokens [R, L]; p_candidates [R·L, W]
    """Per stratum: PIT KS, PIT chi-square on ``bins`` cells, surprisal; and in drafted strata the
    draft-match test over the positions whose match law is known, and the sibling-match test over the
    sampled tree children tried there. Each at ``alpha`` (the caller corrects)."""
    u, pi, hit = pit.ravel(), match_probabilities(record, p_candidates), matches(record, tokens)
    out = []
    for label, mask in strata(record, min_rows):
        name = f"stratum={label}"
        out += [stats.uniformity_ks(u[mask], alpha=alpha, name=f"pit_ks[{name}]"),
                stats.uniformity_chi2(u[mask], alpha=alpha, bins=bins, name=f"pit_chi2[{name}]"),
                stats.surprisal_test_from_scores(scores.subset(mask), alpha=alpha, name=f"surprisal[{name}]")]
        if label in ("undrafted", "bonus"):
            continue
        known = mask & np.isfinite(pi)
        if known.sum() >= min_rows:
            out.append(stats.hit_rate_test(hit[known], pi[known], alpha=alpha, name=f"draft_match[{name}]"))
        beta, emitted = sibling_events(record, mask)
        if beta.size >= min_rows:
            out.append(stats.hit_rate_test(emitted, beta, alpha=alpha, name=f"sibling_match[{name}]"))
    return out


def _rate_summary(hits: np.ndarray, probs: np.ndarray, level: float, power: float) -> dict[str, Any] | None:
    """Observed and expected rates of events, and the smallest shift of the rate their test detects."""
    if probs.size == 0:
        return None
    variance = float((probs * (1 - probs)).mean())
    return {"n": int(probs.size), "observed_rate": float(hits.mean()), "expected_rate": float(probs.mean()),
            "mean_variance": variance, "power": power,
            "detectable_tv": None if variance == 0 else stats.hit_rate_detectable_shift(probs.size, variance, level,
                                                                                          power)}


def match_summary(record: DraftRecord, p_candidates: np.ndarray, tokens: np.ndarray, mask: np.ndarray, *,
                  level: float, power: float) -> dict[str, Any] | None:
    """The draft-match test's rates in a stratum (:func:`_rate_summary`); None without a known match law."""
    pi = match_probabilities(record, p_candidates)
    known = mask & np.isfinite(pi)
    return _rate_summary(matches(record, tokens)[known], pi[known], level, power)


def sibling_summary(record: DraftRecord, mask: np.ndarray, *, level: float,
                    power: float) -> dict[str, Any] | None:
    """The sibling-match test's rates in a stratum (:func:`_rate_summary`); None without tried sampled children."""
    beta, hit = sibling_events(record, mask)
    return _rate_summary(hit, beta, level, power)


# --- the budget planner -------------------------------------------------------------------------------------


def continuations_needed(delta: float, *, drafted_share: float, length: int, level: float, bins: int,
                         power: float = PLAN_POWER) -> int:
    """Continuations (all prompts together) for the ``drafted`` stratum's PIT chi-square to detect a TV bias
    ``delta`` at drafted positions with ``power`` at ``level``, whatever its shape: the drafted tokens
    :func:`specdec.exactness.stats.samples_needed` asks for, of which a continuation of ``length`` tokens gives
    ``drafted_share`` · ``length`` on average (``drafted_share``: the drafter's measured proposal rate, the
    share of emitted tokens drawn at a drafted position)."""
    if not 0.0 < drafted_share <= 1.0:
        raise ValueError(f"drafted_share must lie in (0, 1], got {drafted_share!r}: a drafter that never drafts "
                         "leaves no drafted positions to test")
    return math.ceil(stats.samples_needed(delta, level, power, num_categories=bins) / (drafted_share * length))


def match_continuations_needed(delta: float, *, events_per_token: float, length: int, level: float,
                               mean_variance: float, power: float = PLAN_POWER) -> int:
    """The same for a hit-rate test (draft match, sibling match), against a bias that moves TV ``delta`` toward
    (or away from) the drafts at every event; ``events_per_token``: the measured events per emitted token
    (positions with a match law; tried sampled children), ``mean_variance``: the measured mean of π(1 − π)."""
    if not events_per_token > 0.0:
        raise ValueError(f"events_per_token must be > 0, got {events_per_token!r}")
    return math.ceil(stats.hit_rate_samples_needed(delta, mean_variance, level, power) / (events_per_token * length))


def budget(record: DraftRecord, p_candidates: np.ndarray, *, level: float, bins: int, power: float = PLAN_POWER,
           tvs: Sequence[float] = (0.02, 0.05, 0.1)) -> dict[str, Any] | None:
    """Continuations (all prompts together) a run with this drafter needs to detect a TV bias of each size in
    ``tvs`` at drafted positions with ``power`` at ``level``, from the proposal rate, match probabilities and
    tried sampled children measured in ``record``: with the ``drafted`` stratum's PIT chi-square (any shape of
    bias), the draft-match test and the sibling-match test (a bias toward or away from the drafts; None where
    the run had no such events). None when nothing was drafted."""
    rows, length = record.depth.shape
    share = float((record.depth > 0).mean())
    if share == 0.0:
        return None

    def hit_rate_budget(probs: np.ndarray) -> dict[str, int] | None:
        variance = float((probs * (1 - probs)).mean()) if probs.size else 0.0
        if variance == 0.0:
            return None
        per_token = probs.size / (rows * length)
        return {str(d): match_continuations_needed(d, events_per_token=per_token, length=length, level=level,
                                                   mean_variance=variance, power=power) for d in tvs}

    pi = match_probabilities(record, p_candidates)
    beta, _ = sibling_events(record, np.ones(rows * length, dtype=bool))
    return {
        "power": power, "level": level, "drafted_share": share,
        "pit_chi2": {str(d): continuations_needed(d, drafted_share=share, length=length, level=level, bins=bins,
                                                  power=power) for d in tvs},
        "draft_match": hit_rate_budget(pi[np.isfinite(pi)]),
        "sibling_match": hit_rate_budget(beta),
    }


def plan_samples_per_prompt(pilot: DraftRecord, pilot_time_s: float, detect_tv: float, *, num_prompts: int,
                            alpha: float, bins: int, max_samples_per_prompt: int) -> tuple[int, dict[str, Any]]:
    """Continuations per prompt for the ``drafted`` stratum's PIT chi-square to detect a TV bias ``detect_tv``
    at drafted positions with power 0.9 (:func:`continuations_needed`), from the proposal rate measured on
    a pilot sample (``pilot``, then discarded: N must not depend on the sample it is tested on). The level
    counts every test the family could hold (each per-position and stratum test qualifying), so the plan
    errs on the safe side. Returns N and the plan, for the report."""
    rows, length = pilot.depth.shape
    share = float((pilot.depth > 0).mean())
    num_tests = 3 * length + 4 + 5 * len(strata(pilot, 1))  # per stratum: KS, chi-square, surprisal, 2 matches
    level = alpha / num_tests
    n = max(1, math.ceil(continuations_needed(detect_tv, drafted_share=share, length=length, level=level,
                                              bins=bins) / num_prompts))
    minutes = pilot_time_s * n * num_prompts / rows / 60
    if n > max_samples_per_prompt:
        raise ValueError(f"detecting TV {detect_tv} at drafted positions ({share:.1%} of tokens in the pilot) needs "
                         f"samples_per_prompt={n} (~{minutes:.0f} min of sampling at the pilot's pace), more than "
                         f"max_samples_per_prompt={max_samples_per_prompt}; ask for a larger detect_tv or raise the cap")
    return n, {"detect_tv": detect_tv, "power": PLAN_POWER, "level": level, "pilot_continuations": rows,
               "drafted_share": share, "samples_per_prompt": n, "estimated_sampling_min": minutes}


# --- the summary ------------------------------------------------------------------------------------------


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The strata, the draft- and sibling-match tests, the plan and the budget of a verify.json, for the console."""
    lines = []
    power = report["detectable_tv"]["power"]
    plan = report["plan"]
    if plan:
        lines.append(f"samples_per_prompt {plan['samples_per_prompt']} planned for detect_tv {plan['detect_tv']} "
                     f"(power {plan['power']}, drafted share {plan['drafted_share']:.1%} in a pilot of "
                     f"{plan['pilot_continuations']})")
    for s in report["strata"]:
        line = (f"stratum {s['stratum']}: {s['n']} tokens ({s['share']:.1%}), detectable TV {s['detectable_tv']:.3f} "
                f"(power {power}), "
                f"min Holm p {min(s[k]['p_holm'] for k in ('pit_ks', 'pit_chi2', 'surprisal')):.3g}")
        for key, what in (("draft_match", "draft match"), ("sibling_match", "sibling match")):
            match = s.get(key)
            if match and match["test"]:
                line += (f"; {what} {match['observed_rate']:.3f} vs {match['expected_rate']:.3f} expected over "
                         f"{match['n']} (z {match['test']['statistic']:.2f}, Holm p {match['test']['p_holm']:.3g}, "
                         f"detectable shift {match['detectable_tv']:.3f} at power {match['power']})")
        lines.append(line)
    budget = report["budget"]
    if budget:
        prompts = report["num_prompts"]

        def need(test: str) -> str:  # per TV: the continuations over all prompts, and the samples_per_prompt for them
            return ", ".join(f"{n} (samples_per_prompt={math.ceil(n / prompts)}) for TV {d}"
                             for d, n in budget[test].items())

        lines.append(f"continuations needed over all {prompts} prompts for power {budget['power']} at drafted "
                     f"positions ({budget['drafted_share']:.1%} of tokens), with the samples_per_prompt that gives "
                     f"them: PIT chi-square {need('pit_chi2')}"
                     + (f"; draft match {need('draft_match')}" if budget["draft_match"] else "")
                     + (f"; sibling match {need('sibling_match')}" if budget.get("sibling_match") else ""))
    return lines
