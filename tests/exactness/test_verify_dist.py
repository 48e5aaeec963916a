"""``specdec.verify_dist``: the exact decoder passes, every planted bug is rejected, the false-rejection rate
is at most nominal, and the CLI's exit status gates on the verdict.

Models: tiny random Llamas with a *peaked*, context-dependent target (vocabulary 64, logits scaled so the
entropy is ~1 nat and changing an early token moves the next-token law by TV ~0.5; conftest's tiny models
are near-uniform, where every bias is invisible), a close draft (the target with 5% weight noise: high
acceptance, so bonus tokens are frequent) and a far one (an independent model: mostly rejections, so
recovered tokens are frequent). Each check samples thousands of continuations in about a second.

Exact-path checks come in families: each family's cases share α = 0.01 by Bonferroni, so a family fails
spuriously with probability ≤ 0.01 (and, being seeded, reproducibly). The full grid is ``-m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats as sps
from helpers import cross_draft_tokenizer, cross_target_tokenizer, cross_vocab_draft, noisy_copy
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.decode.engine import speculative_generate
from specdec.drafters import DRAFTERS, DraftModelDrafter, MedusaDrafter, NgramDrafter
from specdec.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashModel
from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.drafters.eagle import EagleConfig, EagleDrafter, EagleModel
from specdec.drafters.medusa import MedusaHeads
from specdec.exactness import planted, stats, strata
from specdec.exactness.shared_prefill import SharedPrefillLlama
from specdec.models import as_decoder
from specdec.verify import ExactRule, Tree, rejection_sample, verify_tree
from specdec.verify.sampling import SamplingParams
from specdec.verify_dist import EXIT_REJECTED, significance_level, verify_distribution

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64
PROMPTS = [[5, 17, 33], [8, 2, 40, 51, 9], [60, 12, 7, 7, 30, 22, 3, 14], [1, 44, 19, 6]]  # ragged: left padding
TREE = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]


def peaked_llama(hidden=32, layers=2, heads=4, kv_heads=2, seed=0, init=0.1, head_std=0.8) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=2 * hidden, max_position_embeddings=512,
                         eos_token_id=None, bos_token_id=None, pad_token_id=0, initializer_range=init)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, head_std, generator=torch.Generator().manual_seed(seed + 100))
    return model


def random_heads(num_heads=4, seed=1, scale=0.3) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(32, VOCAB, num_heads)
    for block in heads.blocks:
        torch.nn.init.normal_(block.linear.weight, std=scale)
    return heads.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def models():
    target = peaked_llama()
    return {"target": target, "close": noisy_copy(target),
            "far": peaked_llama(hidden=16, layers=1, heads=2, kv_heads=1, seed=7)}


# Every registered drafter builds here; a new one (EAGLE, ...) adds itself or test_every_drafter_is_covered fails.
FACTORIES = {
    "draft_model": lambda m: DraftModelDrafter(m["close"]),
    "draft_model_far": lambda m: DraftModelDrafter(m["far"]),
    "ngram": lambda m: NgramDrafter(),
    "medusa": lambda m: MedusaDrafter(random_heads(), m["target"].lm_head.weight),  # chain
    "medusa_tree": lambda m: MedusaDrafter(random_heads(num_heads=3), m["target"].lm_head.weight, TREE),
    "medusa_dynamic_tree": lambda m: MedusaDrafter(random_heads(num_heads=3), m["target"].lm_head.weight, TREE,
                                                   min_confidence=0.02),
    "eagle": lambda m: EagleDrafter(random_eagle(m["target"]), tree=False),  # chain
    "eagle_tree": lambda m: EagleDrafter(random_eagle(m["target"]), depth=3, top_k=2, expand=2),  # sampled at T > 0
    # a peaked draft (the head scaled 3x): the first child holds much of q, which the planted tree bugs misreport
    "eagle_sampled_tree": lambda m: EagleDrafter(random_eagle(m["target"], head_scale=3.0), depth=3, top_k=2, expand=2),
    # the close draft over another tokenizer's ids (tests/helpers.py), drafting through the shared tokens
    "cross_vocab": lambda m: cross_vocab(m["close"]),
    "dflash": lambda m: DFlashDrafter(random_dflash(m["target"])),  # chain: independent draws per position
    "dflash_tree": lambda m: DFlashDrafter(random_dflash(m["target"]), TREE),
}


def random_dflash(target, seed=3) -> DFlashModel:
    """A random block drafter (2 layers, blocks of 5) over the target's layers (0, 1, 1), its LM head the target's."""
    model = DFlashModel(DFlashConfig.for_target(target.config, num_layers=2, block_size=5, mask_token_id=VOCAB - 1,
                                                aux_layers=(0, 1, 1)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        model.lm_head.weight.copy_(target.lm_head.weight)
        model.norm.weight.fill_(1.0)
    return model.attach(target.get_input_embeddings().weight)


def cross_vocab(model) -> CrossVocabDrafter:
    draft_tokenizer = cross_draft_tokenizer()
    return CrossVocabDrafter(cross_vocab_draft(model, draft_tokenizer), draft_tokenizer, cross_target_tokenizer(),
                             rule="intersection")


def random_eagle(target, seed=2, head_scale=1.0) -> EagleModel:
    """A random EAGLE draft layer over the target's layers (0, 1, 1), drafting through the target's LM head
    (times ``head_scale``)."""
    model = EagleModel(EagleConfig.for_target(target.config, None, (0, 1, 1)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        model.lm_head.weight.copy_(target.lm_head.weight * head_scale)
    return model.attach(target.get_input_embeddings().weight)


def check(models, drafter, *, k=4, temperature=1.0, top_k=0, top_p=1.0, n=250, length=8, seed=0, significance=0.01,
          bug=None, batch_size=256, joint_tokens=2):
    drafter = FACTORIES[drafter](models) if isinstance(drafter, str) else drafter
    return verify_distribution(models["target"], drafter, PROMPTS, k=k, length=length, samples_per_prompt=n,
                               sampling=SamplingParams(temperature, top_k, top_p), batch_size=batch_size, seed=seed,
                               significance=significance, planted_bug=bug, joint_tokens=joint_tokens)


def test_every_drafter_is_covered():
    assert set(DRAFTERS) <= set(FACTORIES), f"add a factory for {sorted(set(DRAFTERS) - set(FACTORIES))}"


# --- the exact path passes ---------------------------------------------------------------------------------

# (drafter, K, temperature, top_k, top_p): every drafter, T ∈ {0.7, 1.0}, top-k and top-p, K from 1 to 8.
FAST_CASES = [
    ("draft_model", 4, 1.0, 0, 1.0),
    ("draft_model", 8, 0.7, 0, 0.9),
    ("draft_model_far", 2, 0.7, 10, 1.0),
    ("ngram", 3, 1.0, 0, 1.0),
    ("ngram", 1, 0.7, 10, 1.0),
    ("ngram", 6, 0.7, 0, 0.8),
    ("medusa", 3, 1.0, 0, 0.9),
    ("medusa_tree", 8, 0.7, 0, 1.0),
    ("medusa_dynamic_tree", 8, 1.0, 0, 1.0),
    ("eagle", 4, 1.0, 0, 1.0),
    ("eagle_tree", 8, 0.7, 10, 0.9),
    ("eagle_sampled_tree", 8, 1.0, 0, 1.0),
    ("cross_vocab", 4, 1.0, 0, 1.0),
    ("cross_vocab", 6, 0.7, 10, 0.9),
    ("dflash", 4, 1.0, 0, 1.0),
    ("dflash_tree", 8, 0.7, 10, 0.9),
]


@pytest.mark.parametrize("drafter, k, temperature, top_k, top_p", FAST_CASES)
def test_exact_decoder_passes(models, drafter, k, temperature, top_k, top_p):
    result = check(models, drafter, k=k, temperature=temperature, top_k=top_k, top_p=top_p, n=500,
                   significance=0.01 / len(FAST_CASES))
    report = result.report
    assert not result.reject, (report["p_value"], [t for t in report["tests"] if t["reject"]])
    assert report["impossible_tokens"] == 0 and report["num_tokens"] == 2000 * 8
    assert report["mean_accepted_length"] > 1.0  # drafts really were accepted (and so verified)
    assert report["strata"][0]["stratum"] == "drafted"
    # the draft-match test has no law for sampled tree nodes (specdec/exactness/strata.py): the sibling-match test does
    sampled = drafter.startswith("eagle_") and "tree" in drafter
    assert bool(report["strata"][0]["draft_match"]) != sampled
    assert bool(report["strata"][0]["sibling_match"]) == sampled
    if sampled:
        assert report["strata"][0]["sibling_match"]["test"]["n"] >= 1000


SLOW_CASES = [(d, k, t, tk, tp) for d in ("draft_model", "draft_model_far", "ngram") for k in range(1, 9)
              for t in (0.7, 1.0) for tk, tp in ((0, 1.0), (10, 1.0), (0, 0.8))]


@pytest.mark.slow
@pytest.mark.parametrize("drafter, k, temperature, top_k, top_p", SLOW_CASES)
def test_exact_decoder_passes_full_grid(models, drafter, k, temperature, top_k, top_p):
    result = check(models, drafter, k=k, temperature=temperature, top_k=top_k, top_p=top_p, n=500,
                   significance=0.01 / len(SLOW_CASES), seed=k)
    assert not result.reject, result.report["p_value"]


def test_ragged_batches_and_a_single_position(models):
    """Batches that split prompts unevenly (7 rows), and L = 1 (only the prefill's token is tested)."""
    assert not check(models, "draft_model", batch_size=7, n=60, significance=0.005).reject
    result = check(models, "ngram", length=1, joint_tokens=1, n=250, significance=0.005)
    assert not result.reject and result.report["num_tokens"] == 1000


class BonusSkipped(ExactRule):
    """Not a bug: when all K drafts of a chain are accepted, emit the K-th draft as the last token and no bonus."""

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        num_accepted, next_tokens = super().chain(draft_tokens, draft_probs, target_probs, generator)
        k = draft_tokens.shape[1]
        full = num_accepted == k
        if k == 0:
            return num_accepted, next_tokens
        return torch.where(full, k - 1, num_accepted), torch.where(full, draft_tokens[:, -1], next_tokens)


def test_harmless_change_passes(models, monkeypatch):
    """Skipping the bonus token costs speed, not exactness: the test must not reject it."""
    monkeypatch.setitem(planted.VERIFIER_BUGS, "recovered_from_target", BonusSkipped())
    result = check(models, "draft_model", bug="recovered_from_target", n=500, significance=0.01)
    assert not result.reject, result.report["p_value"]


# --- every planted bug is caught ---------------------------------------------------------------------------

# (bug, drafter, K, temperature, top_k, top_p): settings under which the bug can bias (plant() refuses others).
# recovered_from_target biases by ½ Σ |min(p, q) − β·p| (β = Σ min(p, q)), which vanishes as q → p: with the
# close draft its power at this budget is only ~0.75, so it is shown with the far one. Every bug that can live
# outside a draft model is also planted under the Medusa tree (the verifier bugs through the rule's tree method).
BUG_CASES = [
    ("recovered_from_target", "draft_model_far", 4, 1.0, 0, 1.0),
    ("recovered_from_target", "ngram", 3, 0.7, 0, 1.0),
    ("bonus_from_wrong_position", "draft_model", 4, 1.0, 0, 1.0),
    ("bonus_from_wrong_position", "ngram", 2, 1.0, 10, 1.0),
    ("top_p_draft_only", "draft_model", 4, 1.0, 0, 0.8),
    ("top_p_draft_only", "ngram", 4, 0.7, 0, 0.9),
    ("temperature_ignored_by_draft", "draft_model", 4, 0.7, 0, 1.0),
    ("target_cache_not_rolled_back", "draft_model", 4, 1.0, 0, 1.0),
    ("target_cache_not_rolled_back", "ngram", 4, 1.0, 0, 1.0),
    ("recovered_from_target", "medusa_tree", 8, 1.0, 0, 1.0),
    ("bonus_from_wrong_position", "medusa_tree", 8, 0.7, 0, 1.0),
    ("top_p_draft_only", "medusa_tree", 8, 1.0, 0, 0.8),
    ("target_cache_not_rolled_back", "medusa_tree", 8, 1.0, 0, 1.0),
    ("sibling_q_not_renormalised", "eagle_sampled_tree", 8, 1.0, 0, 1.0),
    ("sibling_q_before_processing", "eagle_sampled_tree", 8, 1.0, 0, 0.8),
    ("cross_vocab_wrong_set", "cross_vocab", 4, 1.0, 0, 1.0),
    ("cross_vocab_neighbour", "cross_vocab", 4, 0.7, 0, 0.9),
]
SAMPLED_TREE_BUGS = {"sibling_q_not_renormalised", "sibling_q_before_processing"}
CROSS_VOCAB_BUGS = {"cross_vocab_wrong_set", "cross_vocab_neighbour"}


def test_every_planted_bug_has_a_case():
    assert {case[0] for case in BUG_CASES} == set(planted.BUGS)
    tree_bugs = {case[0] for case in BUG_CASES if case[1] == "medusa_tree"}
    # the draft model's sampling, a tree's sampled children and cross-vocabulary drafting only
    assert set(planted.BUGS) - tree_bugs == {"temperature_ignored_by_draft"} | SAMPLED_TREE_BUGS | CROSS_VOCAB_BUGS


@pytest.mark.parametrize("bug, drafter, k, temperature, top_k, top_p", BUG_CASES)
def test_planted_bug_is_caught(models, bug, drafter, k, temperature, top_k, top_p):
    result = check(models, drafter, bug=bug, k=k, temperature=temperature, top_k=top_k, top_p=top_p, n=1000)
    assert result.reject, f"planted bug {bug} with {drafter} went undetected (p = {result.report['p_value']})"
    assert result.report["planted_bug"] == bug and bug in result.report["WARNING"]


@pytest.mark.slow
@pytest.mark.parametrize("bug, drafter, k, temperature, top_k, top_p", BUG_CASES)
def test_planted_bug_power_over_seeds(models, bug, drafter, k, temperature, top_k, top_p):
    """Power at the default-tier budget (n = 1000 per prompt, L = 8, α = 0.01): ≥ 9 of 10 seeds reject."""
    caught = sum(check(models, drafter, bug=bug, k=k, temperature=temperature, top_k=top_k, top_p=top_p, n=1000,
                       seed=100 + s).reject for s in range(10))
    assert caught >= 9, f"{bug}: caught {caught}/10"


@pytest.mark.slow
def test_sampled_tree_bugs_over_20_seeds(models):
    """At the planted-bug tests' default size (n = 1000 per prompt, L = 8, α = 0.01), over 20 seeds: each
    drafter-side tree bug is rejected in ≥ 19, the exact sampled tree passes in ≥ 19 (at T = 1, and at T = 0.7
    with top-k and top-p)."""
    settings = {"sibling_q_not_renormalised": (1.0, 0, 1.0), "sibling_q_before_processing": (1.0, 0, 0.8),
                None: (1.0, 0, 1.0), "exact, processed": (0.7, 10, 0.9)}
    for bug, (t, tk, tp) in settings.items():
        rejected = [check(models, "eagle_sampled_tree", bug=bug if bug in planted.BUGS else None, k=8, temperature=t,
                          top_k=tk, top_p=tp, n=1000, seed=100 + s).reject for s in range(20)]
        if bug in planted.BUGS:
            assert sum(rejected) >= 19, f"{bug}: caught {sum(rejected)}/20"
        else:
            assert sum(rejected) <= 1, f"exact sampled tree at T={t}: {sum(rejected)}/20 false rejections"


def test_a_sampled_tree_bug_is_seen_by_the_sibling_match_test(models):
    """The sibling-match test decides: later siblings accepted more often than their reported q allows."""
    result = check(models, "eagle_sampled_tree", bug="sibling_q_not_renormalised", k=8, n=250)
    match = result.report["strata"][0]["sibling_match"]
    assert result.reject and match["test"]["reject"] and match["observed_rate"] > match["expected_rate"]
    assert min(result.report["tests"], key=lambda t: t["p_value"])["name"].startswith("sibling_match")
    budget = [line for line in strata.summary_lines(result.report) if line.startswith("continuations needed")]
    assert "; sibling match " in budget[0] and result.report["budget"]["sibling_match"]["0.05"] > 0


def test_tried_siblings_follow_the_walk():
    """β of each tried child is Σ min(q_j, r), r what is left of p after the earlier siblings; children after
    the accepted one are not tried; the token emitted at a node is a tried child or none of them."""
    tree = Tree.from_parents([-1, -1, -1, 0])  # three children of the root, one grandchild below the first
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).expand(1, 5, 4).clone()
    q = torch.tensor([[[0.7, 0.1, 0.1, 0.1], [0.0, 0.5, 0.25, 0.25], [0.0, 0.0, 0.5, 0.5], [0.25] * 4]])
    tokens = torch.tensor([[0, 1, 2, 3]])
    # the walk rejected children 0 and 1, accepted child 2 (token 2), which is a leaf: the bonus token 3
    beta, hit = strata.tried_siblings(tree, tokens, q, p, torch.tensor([[2, -1]]), torch.tensor([1]),
                                      torch.tensor([3]))
    r1 = torch.tensor([0.0, 0.1, 0.2, 0.3]) / 0.6  # norm(max(0, p − q_0)): p after rejecting child 0
    r2 = torch.tensor([0.0, 0.0, 1 / 3 - 0.25, 0.5 - 0.25]) / (1 / 3)  # and after child 1
    expected = [float(torch.minimum(q[0, 0], p[0, 0]).sum()), float(torch.minimum(q[0, 1], r1).sum()),
                float(torch.minimum(q[0, 2], r2).sum())]
    assert beta[0, 0].tolist() == pytest.approx(expected) and hit[0, 0].tolist() == [False, False, True]
    assert torch.isnan(beta[0, 1]).all() and not hit[0, 1].any()  # node 2 is a leaf: nothing tried below it
    # a walk that rejected every child: all three tried, none emitted
    beta, hit = strata.tried_siblings(tree, tokens, q, p, torch.tensor([[-1, -1]]), torch.tensor([0]),
                                      torch.tensor([3]))
    assert not torch.isnan(beta[0, 0]).any() and not hit.any()


def test_bugs_that_cannot_bias_are_refused(models):
    with pytest.raises(ValueError, match="sampling.top_p < 1"):
        check(models, "ngram", bug="top_p_draft_only")
    with pytest.raises(ValueError, match="use drafter=draft_model"):
        check(models, "ngram", bug="temperature_ignored_by_draft", temperature=0.7)
    with pytest.raises(ValueError, match="temperature 1.0"):
        check(models, "draft_model", bug="temperature_ignored_by_draft")
    with pytest.raises(ValueError, match="greedy"):
        check(models, "draft_model", bug="recovered_from_target", temperature=0.0)
    for bug in SAMPLED_TREE_BUGS:  # no sampled tree children: fixed candidates, a chain
        with pytest.raises(ValueError, match="drafter.lookup=0"):
            check(models, "medusa_tree", bug=bug, top_p=0.8)
        with pytest.raises(ValueError, match="drafter.lookup=0"):
            check(models, "eagle", bug=bug, top_p=0.8)
    with pytest.raises(ValueError, match="sampling.top_p < 1"):
        check(models, "eagle_sampled_tree", bug="sibling_q_before_processing")


def test_greedy_is_refused_with_the_check_that_applies(models):
    with pytest.raises(ValueError, match=r"sampling.temperature > 0 \(got 0, greedy\).*specdec.run"):
        check(models, "ngram", temperature=0.0)
    with pytest.raises(ValueError, match="unknown planted bug 'typo'.*recovered_from_target"):
        check(models, "draft_model", bug="typo")


def test_cache_bug_keeps_rejected_slots(models):
    """The planted target cache commits every slot a forward wrote; the correct one only what was kept."""
    buggy = planted.TargetCacheNotRolledBack(models["target"])
    ids = torch.tensor([[3, 4, 5]])
    cache = buggy.new_cache(1, 8, torch.zeros(1, dtype=torch.long))
    buggy(ids, cache, kv_len=3)
    cache.commit(torch.tensor([3]))
    buggy(torch.tensor([[6, 7, 8, 9]]), cache, kv_len=7)  # last token + 3 drafts
    cache.commit(torch.tensor([2]))  # one draft accepted, plus the recovered token
    assert cache.lengths.tolist() == [7]  # all four kept (a correct cache: 5)
    buggy(torch.tensor([[1, 2, 3, 4, 5]]), cache)  # grows past the planned capacity of 8
    assert cache.capacity >= 12


# --- the false-rejection rate ------------------------------------------------------------------------------


def test_false_rejection_rate_is_at_most_nominal(models):
    """30 seeds of the exact decoder at α = 0.1 (drafters and settings cycled): the number of rejections
    must be consistent with a rate ≤ 0.1 (Binomial(30, 0.1) exceeds 9 with probability < 0.002)."""
    alpha, reps = 0.1, 30
    settings = [("draft_model", 4, 1.0, 0, 1.0), ("ngram", 3, 0.7, 0, 0.9), ("draft_model_far", 2, 0.7, 10, 1.0)]
    rejected = 0
    for s in range(reps):
        drafter, k, t, tk, tp = settings[s % len(settings)]
        rejected += check(models, drafter, k=k, temperature=t, top_k=tk, top_p=tp, n=100, length=6, seed=1000 + s,
                          significance=alpha).reject
    assert sps.binom.sf(9, reps, alpha) < 0.002
    assert rejected <= 9, f"{rejected}/{reps} rejections at α = {alpha}"


# --- strata: what the drafter did before each token ---------------------------------------------------------


def record_of(models, drafter, *, k=4, n=8, length=12, temperature=1.0):
    recorder = strata.DraftRecorder(FACTORIES[drafter](models))
    ids, mask = left_pad_prompts(PROMPTS * n)
    out = speculative_generate(models["target"], recorder, ids, attention_mask=mask, k=k, max_new_tokens=length,
                               temperature=temperature, generator=torch.Generator().manual_seed(3), eos_token_id=[],
                               rule=recorder.watch(ExactRule()))
    return recorder.take(length), np.array(out.sequences)


def left_pad_prompts(rows):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    return ids, (torch.arange(width)[None] >= torch.tensor([[width - len(r)] for r in rows])).long()


@pytest.mark.parametrize("drafter", ["draft_model", "ngram", "medusa_tree"])
def test_draft_record_follows_the_verify_steps(models, drafter):
    """Token t+1 continues token t's verify step only when token t was an accepted draft, which then sits
    among t's draft candidates; a draft at depth d follows d - 1 accepted drafts of its step."""
    record, tokens = record_of(models, drafter)
    depth, before, cands = record.depth, record.accepted_before, record.candidates
    assert (depth[:, 0] == 0).all() and (before[:, 0] == 0).all()  # the prefill's token
    drafted = depth > 0
    assert ((depth == before + 1) | ~drafted).all() and (cands[..., 0] >= 0)[drafted].all()
    assert (cands[~drafted] == -1).all()
    continued = before[:, 1:] > 0
    assert (before[:, 1:][continued] == before[:, :-1][continued] + 1).all()
    accepted = (cands[:, :-1] == tokens[:, :-1, None]).any(-1)
    assert (accepted | ~drafted[:, :-1])[continued].all()  # undrafted and accepted: a batch's filler draft
    assert drafted.mean() > 0.05 and continued.any()
    if drafter == "draft_model":  # K drafts every step: undrafted only for the prefill's and the bonus tokens
        assert ((depth == 0) == ((before == 4) | (np.arange(tokens.shape[1]) == 0))).all()
        beta = record.draft_beta[drafted]  # Σ min(q, p): in (0, 1] for a draft close to the target
        assert not record.deterministic.any() and (beta > 0).all() and (beta <= 1 + 1e-9).all()
    else:  # deterministic drafts
        assert record.deterministic[drafted].all() and np.isnan(record.draft_beta).all()


@pytest.mark.parametrize("drafter", ["medusa_tree", "eagle"])
def test_a_record_of_a_drafter_read_a_step_late_is_the_record_read_each_step(models, drafter, monkeypatch):
    """A drafter that proposes from the device alone is read a step late on a GPU; the recorder reads the host's tokens
    every step, so it is read each step whatever it wraps: the same record where the loop would pipeline (on the CPU
    here) as where it would not. (Wrapping ``traits.device_only`` as it is, the recorder read a step behind.)"""
    from specdec.decode import engine
    from specdec.replay.log import Recorder

    assert FACTORIES[drafter](models).traits.device_only
    assert not strata.DraftRecorder(FACTORIES[drafter](models)).traits.device_only
    assert not Recorder(FACTORIES[drafter](models), 4, 10, set()).traits.device_only  # replay's logging pass, alike
    records = []
    for devices in ((), ("cpu",)):
        monkeypatch.setattr(engine, "PIPELINED_DEVICES", devices)
        record, tokens = record_of(models, drafter, n=2)
        records.append((tokens.tolist(), record.depth.tolist(), record.candidates.tolist()))
    assert records[0] == records[1]


def test_recorder_verifies_with_the_drafters_rule(models):
    """The decode loop reads the acceptance rule (a lossy one, if chosen) through the recorder."""
    drafter = FACTORIES["medusa"](models)
    drafter.traits = replace(drafter.traits, acceptance=SimpleNamespace(lossy=True))  # stands in for a lossy rule
    recorder = strata.DraftRecorder(drafter)
    assert recorder.traits.acceptance is drafter.traits.acceptance and recorder.traits.lossy


def test_a_sampled_draft_is_emitted_with_probability_min_1_p_over_q():
    """What the draft-match test expects: given the draft x ~ q, the exact rule emits x with probability
    min(1, p(x)/q(x)); p(x) alone would under-predict it (an exact verifier would be rejected)."""
    g = torch.Generator().manual_seed(11)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    draft = torch.multinomial(q, n, replacement=True, generator=g)
    num_accepted, recovered = rejection_sample(draft[:, None], q.expand(n, 1, 4), p.expand(n, 2, 4), g)
    hit = ((num_accepted == 1) | (recovered == draft)).numpy()  # the token emitted where the draft stood
    expected = torch.minimum(torch.ones(4), p / q)[draft].double().numpy()
    assert not stats.hit_rate_test(hit, expected, alpha=0.001).reject
    assert stats.hit_rate_test(hit, p[draft].double().numpy(), alpha=0.001).reject  # the tempting wrong law


def test_the_marginal_match_law_sees_a_misreported_q():
    """A sampled chain draft's match law is taken before it is drawn: an exact verifier emits it with probability
    Σ min(q, p). A drafter that draws from one law and reports another moves that rate; conditioning on the drawn
    token (min(1, p(x)/q(x)) with the reported q, the verifier's own formula) cannot see it."""
    g = torch.Generator().manual_seed(12)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    reported = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    for drawn_from, exact in ((reported, True), (torch.tensor([0.4, 0.3, 0.2, 0.1]), False)):
        draft = torch.multinomial(drawn_from, n, replacement=True, generator=g)
        laws = strata.chain_match_laws(reported.expand(n, 1, 4), p.expand(n, 2, 4))[:, 0].numpy()
        num_accepted, recovered = rejection_sample(draft[:, None], reported.expand(n, 1, 4), p.expand(n, 2, 4), g)
        hit = ((num_accepted == 1) | (recovered == draft)).numpy()
        assert stats.hit_rate_test(hit, laws, alpha=0.001).reject != exact
        conditional = torch.minimum(torch.ones(4), p / reported)[draft].double().numpy()
        assert not stats.hit_rate_test(hit, conditional, alpha=0.001).reject  # blind to the misreport


def test_the_draft_match_test_sees_the_draft_models_misreported_q(models):
    """The draft model drawing at temperature 1 while reporting its T=0.7 law: the draft-match test rejects. The bug
    moves the match rate by ~0.014 (0.820 expected): 1,200 continuations a prompt give it z ~ 6 (250 gave ~3, a
    rejection or not as the draws fell)."""
    result = check(models, "draft_model", bug="temperature_ignored_by_draft", k=4, temperature=0.7, n=1200)
    match = result.report["strata"][0]["draft_match"]
    assert result.reject and match["test"]["reject"], match


def test_tree_path_is_read_from_the_emitted_tokens():
    """Siblings with the same token: only the first can be accepted (rejecting it empties the residual at
    its token), so the record follows the first child holding each emitted token."""
    parents = (-1, -1, 0, 1, 1)  # nodes 0 and 1 both hold token 7; node 1 has two children
    entries = strata._tree_entries(parents, [7, 7, 3, 4, 5], [7, 3, 9], sampled=False)
    assert [e[:3] for e in entries] == [(1, 0, (7,)), (2, 1, (3,)), (0, 2, ())]
    g = torch.Generator().manual_seed(0)
    tree = Tree.from_parents(list(parents))
    p = torch.full((2000, 6, 4), 0.25)
    nodes, _, _ = verify_tree(tree, torch.tensor([[0, 0, 1, 2, 3]]).expand(2000, 5), None, p, g)
    assert (nodes[:, 0] != 1).all()  # the duplicate sibling is never accepted


def test_draft_match_catches_the_recovered_token_bug_at_a_small_budget(models):
    """n-gram drafts at T=1 stand at ~8% of positions: the draft-match test still sees the bug clearly."""
    result = check(models, "ngram", bug="recovered_from_target", n=100)
    report = result.report
    drafted = report["strata"][0]
    assert drafted["stratum"] == "drafted" and drafted["share"] < 0.15
    match = drafted["draft_match"]
    assert match["observed_rate"] > match["expected_rate"] and match["test"]["reject"], match
    assert result.reject


def test_the_picture_shows_the_test_that_decided_a_rejection(models):
    """verify.png draws the tests with the smallest Holm-adjusted p-values: on a planted bug that only the drafted
    stratum's tests see, the deciding one is there, its bar beyond the α line."""
    from specdec.report.exactness import plot_result

    result = check(models, "ngram", bug="recovered_from_target", n=100)
    decider = min(result.report["tests"], key=lambda t: t["p_holm"])
    assert result.reject and decider["reject"] and "stratum=" in decider["name"]
    fig = plot_result(result)
    panel = [ax for ax in fig.axes if ax.get_title().startswith("deciding tests")]
    drawn = {label.get_text(): bar.get_width() for ax in panel for label, bar in zip(ax.get_yticklabels(), ax.patches)}
    assert drawn[decider["name"]] == pytest.approx(-np.log10(max(decider["p_holm"], 1e-300)))
    assert drawn[decider["name"]] > -np.log10(result.report["significance"])


def test_a_run_too_small_to_detect_any_bias_is_inconclusive_not_a_pass(models):
    """One continuation of one token per prompt: no TV shift (at most 1) is detectable, so no pass is claimed;
    the verdict says so with its own exit code and what to raise. The same drafter with power passes."""
    from specdec.verify_dist import EXIT_INCONCLUSIVE, summary_text

    small = check(models, "ngram", n=1, length=1, joint_tokens=0)
    report = small.report
    assert report["detectable_tv"]["pooled"] >= 1 and not small.reject
    assert report["verdict"] == "inconclusive" and report["exit_code"] == EXIT_INCONCLUSIVE
    assert "INCONCLUSIVE" in summary_text(report) and "raise samples_per_prompt (now 1)" in summary_text(report)
    assert check(models, "ngram", n=50, length=1, joint_tokens=0).report["verdict"] == "pass"


def test_detect_tv_plans_the_budget(models):
    """detect_tv picks N from a pilot's proposal rate: the run then detects that TV at drafted positions."""
    result = verify_distribution(models["target"], FACTORIES["draft_model"](models), PROMPTS, k=4, length=8,
                                 samples_per_prompt=1, sampling=SamplingParams(1.0, 0, 1.0), batch_size=256,
                                 detect_tv=0.15)
    report = result.report
    plan = report["plan"]
    assert plan["samples_per_prompt"] == report["samples_per_prompt"] > 1 and not result.reject
    assert report["strata"][0]["detectable_tv"] <= 0.15  # planned at power 0.9, reported at 0.8
    assert report["budget"]["pit_chi2"]["0.1"] > 0
    with pytest.raises(ValueError, match="max_samples_per_prompt=10"):
        verify_distribution(models["target"], FACTORIES["ngram"](models), PROMPTS, k=4, length=8, samples_per_prompt=1,
                            sampling=SamplingParams(1.0, 0, 1.0), detect_tv=0.01, max_samples_per_prompt=10)
    with pytest.raises(ValueError, match="detect_tv"):
        verify_distribution(models["target"], FACTORIES["ngram"](models), PROMPTS, k=4, length=8, samples_per_prompt=1,
                            sampling=SamplingParams(1.0, 0, 1.0), detect_tv=1.5)


def test_each_phase_shows_its_progress(models, capsys):
    """A progress bar per phase (a real run samples for minutes): the pilot detect_tv plans from, speculative
    sampling, plain sampling and scoring, each over its batches."""
    verify_distribution(models["target"], FACTORIES["ngram"](models), PROMPTS, k=4, length=4, samples_per_prompt=1,
                        sampling=SamplingParams(1.0, 0, 1.0), batch_size=32, detect_tv=0.5)
    err = capsys.readouterr().err
    assert "pilot (planning detect_tv): 100%|" in err and "| 2/2 [" in err  # the pilot's 64 continuations, 32 a batch
    for phase in ("speculative sampling", "plain sampling", "scoring"):
        assert f"{phase}: 100%|" in err, phase


# --- building blocks ---------------------------------------------------------------------------------------


def test_streamed_scores_give_the_same_test():
    """Scoring in chunks (what the job does) gives exactly exactness_test's p-values."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(40, 0.3), size=900)
    tokens = np.array([rng.choice(40, p=p) for p in probs])
    positions = np.tile(np.arange(3), 300)
    whole = stats.exactness_test(probs, tokens, rng=5, positions=positions)
    parts = stats.TokenScores.concat([stats.token_scores(probs[i:i + 128], tokens[i:i + 128])
                                      for i in range(0, 900, 128)])
    streamed = stats.exactness_test_from_scores(parts, rng=5, positions=positions)
    assert [p.p_value for p in streamed.parts] == [p.p_value for p in whole.parts]
    np.testing.assert_array_equal(stats.pit_from_scores(parts, 3), stats.pit_values(probs, tokens, rng=3))


def test_shared_prefill_matches_the_plain_forward(models):
    target = models["target"]
    shared, plain = SharedPrefillLlama(target), as_decoder(target)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 5, 6, 7]])
    pad = torch.tensor([2, 0, 2])
    for _ in range(2):  # the second time from the stored prefills
        c1, c2 = shared.new_cache(3, 9, pad), plain.new_cache(3, 9, pad)
        l1, h1 = shared(ids, c1, kv_len=5)
        l2, h2 = plain(ids, c2, kv_len=5)
        torch.testing.assert_close(l1[:, -1], l2[:, -1])
        torch.testing.assert_close(h1[:, -1], h2[:, -1])
        for b, p in enumerate(pad.tolist()):
            torch.testing.assert_close(c1.keys[1][b, :, p:5], c2.keys[1][b, :, p:5])
        c1.commit(torch.full((3,), 5))
        c2.commit(torch.full((3,), 5))
        nxt = torch.tensor([[9, 10], [11, 12], [9, 10]])
        torch.testing.assert_close(shared(nxt, c1, kv_len=7)[0], plain(nxt, c2, kv_len=7)[0])


def test_shared_prefill_decodes_like_the_target_greedily(models):
    target = models["target"]
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 5, 6, 7]])
    mask = (torch.arange(5)[None] >= torch.tensor([[2], [0], [2]])).long()
    args = dict(attention_mask=mask, k=3, max_new_tokens=12, eos_token_id=[])
    a = speculative_generate(SharedPrefillLlama(target), DraftModelDrafter(models["close"]), ids, **args)
    b = speculative_generate(target, DraftModelDrafter(models["close"]), ids, **args)
    assert a.sequences == b.sequences


def test_bad_arguments_are_named(models):
    with pytest.raises(ValueError, match="samples_per_prompt"):
        check(models, "ngram", n=0)
    with pytest.raises(ValueError, match="joint_tokens"):
        check(models, "ngram", length=2, joint_tokens=3)
    with pytest.raises(ValueError, match="significance"):
        check(models, "ngram", significance=1.5)


# --- the command line --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """The tiny target saved with a character-level tokenizer, and a prompt file: the CLI end to end."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    chars = "abcdefghijklmnopqrstuvwxyz .,?!"
    vocab = {"<pad>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    vocab.update({f"<extra_{i}>": i for i in range(len(vocab), VOCAB)})
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    peaked_llama().save_pretrained(root / "model")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>").save_pretrained(
        root / "model")
    prompts = ["hello there", "what is a cache?", "tell me a story", "abc"]
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "text": t, "kind": "completion"}) + "\n" for i, t in enumerate(prompts)))
    return root


def run_cli(root: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "specdec.verify_dist", f"target.name={root / 'model'}",
            f"data.sources=[{root / 'prompts.jsonl'}]", "data.limit_per_source=null", "data.max_new_tokens=8",
            "data.batch_size=256", "samples_per_prompt=250", f"hydra.run.dir={out}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_cli_passes_the_exact_decoder(tiny_model_dir, tmp_path):
    proc = run_cli(tiny_model_dir, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert report["verdict"] == "pass" and report["planted_bug"] is None and report["drafter"] == "ngram"
    assert 0 < report["detectable_tv"]["per_position"] < 0.2 and len(report["per_position"]) == 8
    assert (tmp_path / "verify.png").stat().st_size > 10_000
    assert "smallest bias it could have detected" in proc.stdout
    # α is the acceptance rate: the level is named in words, and every detectable figure states its power
    assert "significance level 0.01" in proc.stdout and report["significance"] == 0.01
    lines = proc.stdout.splitlines()
    assert all(line.count("α") == line.count("acceptance rate α") for line in lines), proc.stdout
    assert all("power" in line for line in lines if "detectable" in line or "continuations needed" in line)


def test_cli_exit_status_rejects_a_planted_bug(tiny_model_dir, tmp_path):
    proc = run_cli(tiny_model_dir, tmp_path, "planted_bug=recovered_from_target", "plot=false")
    assert proc.returncode == EXIT_REJECTED, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert report["verdict"] == "reject" and report["planted_bug"] == "recovered_from_target"
    assert "PLANTED BUG 'recovered_from_target' IS ACTIVE" in proc.stdout + proc.stderr
    assert "CAUGHT" in proc.stdout


def test_the_target_and_the_drafter_run_on_the_backend_the_config_names(tiny_model_dir, monkeypatch):
    """python -m specdec.verify_dist target.coded_weights=false target.gpu_kernels=false: the target's forwards and
    the drafter's models run on the backend those name, as the main job's do (the target ran on the default one)."""
    from hydra import compose, initialize_config_dir

    import specdec.exactness.harness as harness
    import specdec.verify_dist as verify_main
    from specdec.models import Backend

    seen = {}
    built, generate = NgramDrafter.from_config, harness.speculative_generate

    def from_config(cls, cfg, **kwargs):
        seen["drafter"] = kwargs["backend"]
        return built(cfg, **kwargs)

    def speculative(target, *args, **kwargs):
        seen["target"] = target.backend
        return generate(target, *args, **kwargs)

    monkeypatch.setattr(NgramDrafter, "from_config", classmethod(from_config))
    monkeypatch.setattr(harness, "speculative_generate", speculative)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="verify_dist", overrides=[
            f"target.name={tiny_model_dir / 'model'}", f"data.sources=[{tiny_model_dir / 'prompts.jsonl'}]",
            "data.max_new_tokens=2", "samples_per_prompt=2", "joint_tokens=0", "target.coded_weights=false",
            "target.gpu_kernels=false"])
    verify_main.run(cfg)
    backend = Backend(weights="float", gpu_kernels=False)
    assert seen == {"drafter": backend, "target": backend}


def test_config_composes_with_every_bug():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="verify_dist")
        assert cfg.planted_bug is None and cfg.sampling.temperature == 1.0 and cfg.drafter.name == "ngram"
        for bug in planted.BUGS:
            assert compose(config_name="verify_dist", overrides=[f"planted_bug={bug}"]).planted_bug == bug
        assert compose(config_name="verify_dist", overrides=["drafter=draft_model"]).drafter.path == "default"
        assert significance_level(cfg) == 0.01  # the old name still works
        assert significance_level(compose(config_name="verify_dist", overrides=["alpha=0.05"])) == 0.05


@pytest.mark.slow
@pytest.mark.real_model
def test_cli_on_the_real_default_target(tmp_path):
    """A small smoke run on SmolLM2-135M (the ~10-minute verification run is documented, not tested)."""
    args = [sys.executable, "-m", "specdec.verify_dist", "samples_per_prompt=4", "data.limit_per_source=2",
            "data.max_new_tokens=4", "data.batch_size=16", "min_rows_per_position=10", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(args, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert report["verdict"] == "pass" and report["num_tokens"] == 4 * 4 * 4 and report["impossible_tokens"] == 0
