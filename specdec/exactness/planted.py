"""Planted bugs: realistic mistakes in a speculative decoder, for proving that the statistical tests
catch them (:mod:`specdec.verify_dist`, tests). Never used unless asked for by name.

Where a mistake has to sit to bias the output
---------------------------------------------
Rejection sampling is exact for *any* draft distribution q, provided (1) q is the distribution each draft
token was actually drawn from and (2) p is the target's conditional processed with the requested
sampling settings. So a draft-side mistake applied consistently — to the draws and to the reported q
alike — costs acceptance, never exactness: a drafter that ignores temperature everywhere, or a *draft*
KV cache that is not rolled back after a rejection (its drafts get worse, their q stays honest). So does
dropping the bonus token altogether (emitting only the accepted drafts): it wastes a token per fully
accepted step, and the next step draws that token from the same p_K. A biasing mistake breaks the rule
itself or one of the two premises:

================================  ============================================================  ===========
name                              what is wrong                                                 breaks
================================  ============================================================  ===========
``recovered_from_target``         the recovered token is drawn from p_n, not norm(max(0, p_n −  the rule
                                  q_n)): a rejected draft can come straight back. Its bias is
                                  ½ Σ |min(p, q) − β·p| ≤ β = Σ min(p, q), the acceptance
                                  probability: small when drafts are nearly always rejected.
                                  In a tree: once every child of a node is rejected, the
                                  recovered token is drawn from p at that node, not from the
                                  residual left after all of them
``bonus_from_wrong_position``     off by one: the bonus token is drawn from p_{K−1}, not p_K.   the rule
                                  In a tree: the bonus token after a leaf is drawn from p at
                                  the leaf's parent (as p_{K−1} is p at the parent of a
                                  chain's leaf)
``top_p_draft_only``              the sampling settings reach the drafter, but the target's p    (2)
                                  is computed without top-p: the output follows the untruncated
                                  target
``temperature_ignored_by_draft``  the draft model samples from its raw logits (temperature 1)     (1)
                                  but reports the temperature-processed q to the verifier
``target_cache_not_rolled_back``  the *target's* KV cache keeps every slot a verify forward       (2)
                                  wrote, rejected drafts included (an uncropped dynamic cache):
                                  later tokens attend to text that was never emitted, at shifted
                                  positions
``sibling_q_not_renormalised``    a sampled tree's children are drawn without replacement, but   (1)
                                  each child after the first is reported with the node's q, not
                                  q renormalised without the siblings drawn before it: later
                                  siblings are accepted too often, once an earlier one was
                                  rejected
``sibling_q_before_processing``   the same draws, but each child after the first is reported     (1)
                                  with the *unprocessed* law (softmax of the draft logits, before
                                  temperature / top-k / top-p) renormalised without the earlier
                                  siblings
``cross_vocab_wrong_set``         a cross-vocabulary draft is drawn from the shared tokens,      (1)
                                  renormalised, but reported with its law over the draft's
                                  whole vocabulary (not renormalised over the shared tokens)
``cross_vocab_neighbour``         a draft token the target cannot spell is mapped to the         (1)
                                  target token spelling its text stripped of whitespace, and q
                                  is written by assignment: where two draft tokens land on one
                                  target token, the verifier hears one's mass
================================  ============================================================  ===========

The two tree bugs act only where a node's first child was rejected and a later sibling tried, which is
what the sibling-match test (:mod:`specdec.exactness.strata`) looks at; they plant into any drafter that
samples tree candidates (:meth:`~specdec.drafters.base.Traits.samples_siblings`: EAGLE's sampled tree today).

:func:`plant` applies one of them to what the decode loop is called with (a :class:`Setup`) and refuses
settings under which the bug cannot bias anything (e.g. ``top_p_draft_only`` without top-p), so a
planted run that passes always means the test lacked power, never that nothing was planted. The two
verifier bugs are acceptance rules (:class:`specdec.verify.AcceptanceRule`, :data:`VERIFIER_BUGS`)
covering chains and trees, so they reach every drafter; each reuses the exact rule's accept/reject steps
and changes only the distribution the next token is drawn from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Callable, ClassVar

import torch
from torch import nn

from specdec.drafters.base import DecodeState, Drafter, DrafterWrapper, Proposal
from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.drafters.draft_model.drafter import DraftModelDrafter
from specdec.drafters.trees.siblings import SiblingDraws, without
from specdec.models.cache import KVCache
from specdec.models.compact import CompactDecoder, supports
from specdec.verify import AcceptanceRule, accept_drafts, next_token_probs
from specdec.verify.sampling import SamplingParams, logits_to_probs, sample
from specdec.verify.tree import walk_tree

# --- the verifier: acceptance rules for chains and trees (arguments and results: specdec.verify.AcceptanceRule)


@dataclass(frozen=True)
class RecoveredFromTarget:
    """Bug: after a rejection the next token is drawn from the target's p where the rejection happened,
    not from the residual: norm(max(0, p_n − q_n)) in a chain, what is left of p once every child of the
    node was rejected in a tree."""

    lossy: ClassVar[bool] = False  # it claims exactness, as a real bug would

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        num_accepted = accept_drafts(draft_tokens, draft_probs, target_probs, generator)
        rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
        return num_accepted, sample(target_probs[rows, num_accepted], generator)

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        nodes, num_accepted, end, _ = walk_tree(tree, draft_tokens, draft_probs, target_probs, generator)
        rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
        return nodes, num_accepted, sample(target_probs[rows, end], generator)


@dataclass(frozen=True)
class BonusFromWrongPosition:
    """Bug (off by one): the bonus token is drawn from p one position too early: p_{K−1}, not p_K, when
    all K drafts of a chain are accepted; p at the leaf's parent, not at the leaf, when a tree's walk
    accepts a whole path to a leaf (a chain is the tree whose one leaf is draft K, with parent K−1)."""

    lossy: ClassVar[bool] = False  # it claims exactness, as a real bug would

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        k = draft_tokens.shape[1]
        shifted = target_probs.clone()
        shifted[:, k] = target_probs[:, max(k - 1, 0)]
        num_accepted = accept_drafts(draft_tokens, draft_probs, target_probs, generator)
        return num_accepted, sample(next_token_probs(num_accepted, draft_tokens, draft_probs, shifted), generator)

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        nodes, num_accepted, end, next_probs = walk_tree(tree, draft_tokens, draft_probs, target_probs, generator)
        rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
        at_leaf = (end > 0) & (tree.children[end, 0] < 0)  # [B]: the walk accepted a path to a leaf
        parent = tree.parents[(end - 1).clamp(min=0)] + 1  # [B] block position of end's parent
        next_probs = torch.where(at_leaf[:, None], target_probs[rows, parent], next_probs)
        return nodes, num_accepted, sample(next_probs, generator)


VERIFIER_BUGS: dict[str, AcceptanceRule] = {
    "recovered_from_target": RecoveredFromTarget(),
    "bonus_from_wrong_position": BonusFromWrongPosition(),
}


# --- the drafter ------------------------------------------------------------------------------------------


class DraftOnlySampling(DrafterWrapper):
    """Bug (``top_p_draft_only``, drafter half): ``inner`` drafts under ``sampling`` (q honestly reported),
    while the decode loop — hence the target's p and the verifier — runs under other settings. The rest (the
    inner drafter's rule, a lossy one staying lossy; its feature layers, forwards and graphs) is ``inner``'s."""

    def __init__(self, inner: Drafter, sampling: SamplingParams):
        super().__init__(inner)
        self.sampling = sampling

    def start(self, state: DecodeState) -> None:
        self.inner.start(replace(state, sampling=self.sampling))

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return self.inner.propose(replace(state, sampling=self.sampling), k)

    def observe(self, state: DecodeState) -> None:
        self.inner.observe(replace(state, sampling=self.sampling))


class TemperatureIgnoredDraftModel(DraftModelDrafter):
    """Bug: draft tokens are drawn from the draft model's logits at temperature 1 (top-k / top-p still
    applied), but the q reported to the verifier is the one processed with the requested temperature."""

    def draw(self, logits, params, u):  # logits [B, V], uniforms [B] -> token [B], q [B, V]
        reported = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)
        drawn_from = logits_to_probs(logits, 1.0, params.top_k, params.top_p)
        return self.widen(sample(drawn_from, uniforms=u), reported, params)


class CrossVocabWrongSet(CrossVocabDrafter):
    """Bug (``cross_vocab_wrong_set``): a cross-vocabulary draft drawn from the draft's law over the tokens both
    vocabularies share, renormalised there, but reported with the law over the draft's *whole* vocabulary (the
    shared tokens' share of it, not renormalised): every draft is reported less likely than it was drawn."""

    def laws(self, logits, params):
        law, _ = super().laws(logits, params)
        return law, logits_to_probs(logits, params.temperature, params.top_k, params.top_p)


class CrossVocabNeighbour(CrossVocabDrafter):
    """Bug (``cross_vocab_neighbour``): a draft token the target cannot spell is mapped to the target token that
    spells its text without the surrounding whitespace (a neighbouring string: SmolLM2's "Ġfoo" onto Gemma's
    "foo" where Gemma has no "▁foo"), and q is written over the target's vocabulary by assignment, so of two
    draft tokens on one target token the verifier hears one's mass. (Summed, the draft would stay exact but
    propose text it did not write; the map's own check refuses such a map: VocabMap.check.)"""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.remap()

    def remap(self) -> None:
        """Pair each draft token without a counterpart with its whitespace-stripped neighbour."""
        neighbours = copy.copy(self.map)
        by_bytes = {spelled: i for i, spelled in enumerate(neighbours.target_bytes) if spelled}
        pairs = neighbours.draft_to_target.clone()
        for draft_id, spelled in enumerate(neighbours.draft_bytes[: len(pairs)]):
            if pairs[draft_id] < 0 and spelled and spelled.strip() in by_bytes:
                pairs[draft_id] = by_bytes[spelled.strip()]
        neighbours.draft_to_target, neighbours.shared = pairs, pairs >= 0
        neighbours.shared_ids = neighbours.shared.nonzero()[:, 0]
        self.use_map(neighbours)

    def over_target(self, q, vocab):
        index = self.map.draft_to_target[self.shared_ids].expand(q.shape[0], -1)
        return q.new_zeros(q.shape[0], vocab).scatter_(1, index, q[:, self.shared_ids])


class SiblingNotRenormalised(SiblingDraws):
    """Bug: each child after the first is reported with the node's q (the law before any draw), while drawn
    from q without the siblings drawn before it."""

    def report(self, law, q, logits, drawn):
        return q


class SiblingBeforeProcessing(SiblingDraws):
    """Bug: each child after the first is reported with the unprocessed law (softmax of the logits, before
    temperature / top-k / top-p) without the siblings drawn before it, while drawn from the processed one."""

    def report(self, law, q, logits, drawn):
        return law if not drawn else without(torch.softmax(logits.float(), -1).to(q.dtype), torch.stack(drawn, 1))


# --- the target -------------------------------------------------------------------------------------------


@dataclass
class CacheKeepingRejected(KVCache):
    """Bug: :meth:`commit` keeps every slot the last forward wrote, rejected drafts included, like a
    dynamic cache that is never cropped. Grows on demand (see :meth:`reserve`), since it fills faster
    than the decode loop's capacity plans for."""

    written: int = 0  # tokens the last forward wrote per row

    def reserve(self, num_new: int) -> None:
        """Called before each forward of ``num_new`` tokens: remember it, and grow to fit it."""
        self.written = num_new
        needed = int(self.lengths.max()) + num_new
        if needed > self.capacity:
            extra = max(needed, 2 * self.capacity) - self.capacity
            for store in (self.keys, self.values):
                for i, t in enumerate(store):
                    store[i] = torch.cat([t, t.new_zeros(*t.shape[:2], extra, t.shape[3])], 2)

    def commit(self, num_tokens: torch.Tensor) -> None:  # num_tokens [B] long
        self.lengths += torch.where(num_tokens > 0, self.written, 0)  # rows that stopped stay put


class TargetCacheNotRolledBack(CompactDecoder):
    """The target's forward over a :class:`CacheKeepingRejected`: after a rejection it attends to the
    rejected drafts' keys/values, at positions shifted by their number."""

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> CacheKeepingRejected:
        cache = super().new_cache(batch_size, capacity, pad)
        return CacheKeepingRejected(keys=cache.keys, values=cache.values, lengths=cache.lengths, pad=cache.pad)

    def forward(self, input_ids, cache, *, kv_len=None, tree_mask=None, depths=None, last_only=False, capture=()):
        cache.reserve(input_ids.shape[1])
        # The loop's kv_len bound assumes its own (correct) lengths; the grown cache lies beyond it.
        return super().forward(input_ids, cache, kv_len=None, tree_mask=tree_mask, depths=depths, last_only=last_only,
                               capture=capture)


# --- planting ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What the decode loop is called with."""

    target: nn.Module  # a transformers causal LM or a decoder
    drafter: Drafter
    rule: AcceptanceRule | None  # None: the drafter's own, else the exact rule (as speculative_generate)
    sampling: SamplingParams  # the settings the target side (prefill, target probs) runs with


def _needs_sampling(bug: str, s: Setup) -> None:
    if s.sampling.greedy:
        raise ValueError(f"planted bug {bug!r} cannot bias greedy decoding; set sampling.temperature > 0")


def _plant_verifier(bug: str) -> Callable[[Setup], Setup]:
    def plant_it(s: Setup) -> Setup:
        _needs_sampling(bug, s)
        return replace(s, rule=VERIFIER_BUGS[bug])

    return plant_it


def _plant_top_p_draft_only(s: Setup) -> Setup:
    _needs_sampling("top_p_draft_only", s)
    if s.sampling.top_p >= 1.0:
        raise ValueError("planted bug 'top_p_draft_only' drops top-p on the target side, which changes nothing "
                         "without top-p; set sampling.top_p < 1 (e.g. 0.8)")
    return replace(s, drafter=DraftOnlySampling(s.drafter, s.sampling), sampling=replace(s.sampling, top_p=1.0))


def _plant_temperature_ignored_by_draft(s: Setup) -> Setup:
    if not isinstance(s.drafter, DraftModelDrafter):
        raise ValueError("planted bug 'temperature_ignored_by_draft' lives in the draft model's sampling; "
                         f"use drafter=draft_model (got {type(s.drafter).__name__}, whose drafts carry no q)")
    if s.sampling.greedy or s.sampling.temperature == 1.0:
        raise ValueError("planted bug 'temperature_ignored_by_draft' changes nothing at temperature "
                         f"{s.sampling.temperature}; use a temperature other than 0 and 1 (e.g. 0.7)")
    bugged = copy.copy(s.drafter)  # the same drafter and options (draft length, draft vocabulary), the bug's draw
    bugged.__class__ = TemperatureIgnoredDraftModel
    return replace(s, drafter=bugged)


def _plant_siblings(bug: str, draws: SiblingDraws) -> Callable[[Setup], Setup]:
    def plant_it(s: Setup) -> Setup:
        if not s.drafter.traits.samples_siblings(s.sampling):
            raise ValueError(f"planted bug {bug!r} lives in a tree's sampled children, which "
                             f"{type(s.drafter).__name__} does not draw under these settings; use drafter=eagle "
                             "(tree) with drafter.lookup=0 and sampling.temperature > 0")
        if bug == "sibling_q_before_processing" and (s.sampling.temperature == 1.0 and s.sampling.top_k == 0
                                                     and s.sampling.top_p >= 1.0):
            raise ValueError(f"planted bug {bug!r} changes nothing without sampling processing (temperature 1, "
                             "no top-k or top-p); set sampling.top_p < 1 (e.g. 0.8), sampling.top_k or a temperature "
                             "other than 1")
        bugged = copy.copy(s.drafter)  # the same drafter and options, the bug's reports
        bugged.traits = replace(bugged.traits, siblings=draws)
        return replace(s, drafter=bugged)

    return plant_it


def _plant_target_cache_not_rolled_back(s: Setup) -> Setup:
    _needs_sampling("target_cache_not_rolled_back", s)
    if not supports(s.target):
        raise ValueError("planted bug 'target_cache_not_rolled_back' needs a transformers target of a family the "
                         "compact static-cache path covers (specdec.models.compact.FAMILIES), got "
                         f"{type(s.target).__name__}")
    return replace(s, target=TargetCacheNotRolledBack(s.target))


def _plant_cross_vocab(bug: str, kind: type[CrossVocabDrafter]) -> Callable[[Setup], Setup]:
    def plant_it(s: Setup) -> Setup:
        _needs_sampling(bug, s)
        if not isinstance(s.drafter, CrossVocabDrafter):
            raise ValueError(f"planted bug {bug!r} lives in cross-vocabulary drafting; use a draft model with another "
                             f"tokenizer than the target's (drafter=cross_vocab), got {type(s.drafter).__name__}")
        bugged = copy.copy(s.drafter)  # the same draft, map and options, the bug's reports
        bugged.__class__ = kind
        if kind is CrossVocabNeighbour:
            bugged.remap()
        return replace(s, drafter=bugged)

    return plant_it


BUGS: dict[str, Callable[[Setup], Setup]] = {
    "recovered_from_target": _plant_verifier("recovered_from_target"),
    "bonus_from_wrong_position": _plant_verifier("bonus_from_wrong_position"),
    "top_p_draft_only": _plant_top_p_draft_only,
    "temperature_ignored_by_draft": _plant_temperature_ignored_by_draft,
    "target_cache_not_rolled_back": _plant_target_cache_not_rolled_back,
    "sibling_q_not_renormalised": _plant_siblings("sibling_q_not_renormalised", SiblingNotRenormalised()),
    "sibling_q_before_processing": _plant_siblings("sibling_q_before_processing", SiblingBeforeProcessing()),
    "cross_vocab_wrong_set": _plant_cross_vocab("cross_vocab_wrong_set", CrossVocabWrongSet),
    "cross_vocab_neighbour": _plant_cross_vocab("cross_vocab_neighbour", CrossVocabNeighbour),
}


def plant(bug: str | None, setup: Setup) -> Setup:
    """``setup`` with the bug named ``bug`` planted (None: unchanged). Raises ValueError for an unknown
    name, or for settings under which the bug cannot change the output distribution."""
    if bug is None:
        return setup
    if bug not in BUGS:
        raise ValueError(f"unknown planted bug {bug!r}; choose one of {sorted(BUGS)} (or null for none)")
    return BUGS[bug](setup)
