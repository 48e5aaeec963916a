"""Medusa heads: storage and shape checks, greedy equality with plain decoding (chain and tree), exactness
of sampling through the engine (with a planted tree-sampler bug caught), and the shipped heads on the
real default target."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    PATHS, VOCAB, NoRenormalisation, markov_heads, random_heads, random_token_aware_heads, sample_and_score,
    tiny_llama)

import specdec.drafters.trees.drafting
from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import build_drafter
from specdec.drafters.medusa import MedusaDrafter, MedusaHeads, check_paths, default_heads_path, load_heads, save_heads
from specdec.drafters.medusa.candidates import TokenAwareHeads
from specdec.drafters.trees.plan import plan_tree
from specdec.exactness.stats import exactness_test
from specdec.jobs.data import left_pad
from specdec.verify.sampling import logits_to_probs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


# --- heads and their files -------------------------------------------------------------------------------


def test_fresh_heads_repeat_the_base_next_token_prediction(tiny_target):
    heads = MedusaHeads(32, 64, 3)
    hidden = torch.randn(5, 32)
    logits = heads(hidden, tiny_target.lm_head.weight)  # [5, 3, V]
    assert logits.shape == (5, 3, 64)
    for i in range(3):
        torch.testing.assert_close(logits[:, i], tiny_target.lm_head(hidden))


def test_own_lm_head_starts_as_the_targets(tiny_target):
    heads = MedusaHeads(32, 64, 2, own_lm_head=True)
    heads.init_lm_heads(tiny_target.lm_head.weight)
    hidden = torch.randn(4, 32)
    torch.testing.assert_close(heads(hidden, None)[:, 1], tiny_target.lm_head(hidden))


def test_save_load_roundtrip_keeps_weights_and_tree(tmp_path):
    heads = random_heads()
    save_heads(tmp_path / "heads.safetensors", heads, target="tiny", tree=PATHS)
    loaded, meta = load_heads(tmp_path, hidden_size=32, vocab_size=64)  # a directory works too
    assert meta["tree"] == PATHS and meta["target"] == "tiny" and meta["num_heads"] == 3
    for a, b in zip(heads.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed into place


def test_draft_vocabulary_scores_its_tokens_only(tiny_target, tmp_path):
    token_ids = torch.tensor([3, 9, 17, 40, 63])
    heads = random_heads(token_ids=token_ids)
    full = random_heads()  # the same blocks (same seed), full vocabulary
    hidden = torch.randn(4, 32)
    w = tiny_target.lm_head.weight
    logits = heads(hidden, w)  # [4, 3, 5]
    assert logits.shape == (4, 3, 5) and heads.draft_vocab_size == 5
    torch.testing.assert_close(logits, full(hidden, w)[..., token_ids])
    torch.testing.assert_close(heads(hidden, heads.draft_lm_head(w)), logits)  # rows sliced once, same result
    assert heads.to_token_ids(torch.tensor([0, 4])).tolist() == [3, 63]
    save_heads(tmp_path / "heads.safetensors", heads, target="tiny", tree=PATHS)
    loaded, meta = load_heads(tmp_path, hidden_size=32, vocab_size=64)
    assert meta["draft_vocab_size"] == 5 and torch.equal(loaded.token_ids, token_ids)
    torch.testing.assert_close(loaded(hidden, w), logits)


@pytest.mark.parametrize("token_ids", [[1, 64], [-1, 2], [2, 2], list(range(64)), []])
def test_bad_draft_vocabulary_is_named(token_ids):
    with pytest.raises(ValueError, match="token_ids must be fewer than 64 distinct token ids"):
        MedusaHeads(32, 64, 2, token_ids=torch.tensor(token_ids, dtype=torch.long))


@pytest.mark.parametrize("hidden, vocab", [(48, 64), (32, 100)])
def test_heads_for_another_target_fail_with_both_shapes(tmp_path, hidden, vocab):
    save_heads(tmp_path / "heads.safetensors", random_heads(), target="tiny")
    with pytest.raises(ValueError) as err:
        load_heads(tmp_path / "heads.safetensors", hidden_size=hidden, vocab_size=vocab)
    message = str(err.value)
    assert "hidden size 32 and vocabulary 64" in message and f"hidden size {hidden} and vocabulary {vocab}" in message
    assert "specdec.train method=medusa" in message


def test_mismatched_heads_fail_when_the_drafter_is_built(tmp_path):
    save_heads(tmp_path / "heads.safetensors", random_heads(hidden=48), target="other")
    cfg = MedusaDrafter.Config(path=str(tmp_path / "heads.safetensors"), tree=None)
    with pytest.raises(ValueError, match="hidden size 48 .* hidden size 32"):
        build_drafter(cfg, tiny_llama())


def test_missing_or_foreign_heads_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Medusa heads"):
        load_heads(tmp_path / "nope.safetensors", hidden_size=32, vocab_size=64)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a specdec Medusa heads file"):
        load_heads(tmp_path / "x.safetensors", hidden_size=32, vocab_size=64)


def test_corrupt_or_truncated_heads_file_is_named_with_what_to_do(tmp_path):
    from specdec.errors import CheckpointError

    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")  # what `drafter.path=/etc/passwd` reads
    with pytest.raises(CheckpointError, match=r"'.*passwd' is not a Medusa heads file .*drafter\.path="):
        load_heads(text, hidden_size=32, vocab_size=64)
    good = tmp_path / "heads.safetensors"
    save_heads(good, random_heads(), target="tiny")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])  # a copy interrupted mid-write: the header reads, the data is short
    with pytest.raises(CheckpointError, match=r"'.*cut\.safetensors' is not a Medusa heads file .*truncated"):
        load_heads(cut, hidden_size=32, vocab_size=64)


def test_tree_paths_are_validated():
    assert check_paths([[0], [0, 1]], 3) == [[0], [0, 1]]
    with pytest.raises(ValueError, match="before its parent"):
        check_paths([[0, 1], [0]], 3)
    with pytest.raises(ValueError, match="1..2 non-negative ranks"):
        check_paths([[0], [0, 0], [0, 0, 0]], 2)


def test_k_beyond_heads_or_tree_is_rejected(tiny_target):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="exceeds the 3 heads"):
        speculative_generate(tiny_target, MedusaDrafter(random_heads(), tiny_target.lm_head.weight), ids, k=4,
                             max_new_tokens=4)
    with pytest.raises(ValueError, match="only 8 paths"):
        speculative_generate(tiny_target, MedusaDrafter(random_heads(), tiny_target.lm_head.weight, PATHS), ids,
                             k=9, max_new_tokens=4)


def test_drafter_config_composes_with_hydra():
    from hydra import compose, initialize_config_dir

    import specdec.run  # noqa: F401  (registers the configs)
    import specdec.verify_dist  # noqa: F401  (stores verify_dist_schema, which nothing else here imports)

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):  # verify_dist keeps the preset's k
        cfg = compose("verify_dist", overrides=["drafter=medusa"])
    assert cfg.drafter.name == "medusa" and cfg.drafter.path == "default" and cfg.drafter.tree == "default"
    defaults = MedusaDrafter.Config()  # the YAML and the dataclass tell the same defaults
    fields = ("k", "min_confidence", "lookup", "dtype", "acceptance", "typical_epsilon", "typical_alpha")
    assert {f: cfg.drafter[f] for f in fields} == {f: getattr(defaults, f) for f in fields}
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run", overrides=["drafter=medusa", "drafter.tree=null", "drafter.lookup=0", "drafter.k=2"])
    assert cfg.drafter.tree is None and cfg.drafter.k == 2 and cfg.drafter.lookup == 0


def test_the_default_tree_is_dynamic_on_a_cpu_and_fixed_on_a_gpu(tiny_target, tmp_path):
    """drafter.min_confidence=null: 0.4 where the heads run on a CPU (a dynamic tree, read each step), 0 on a GPU (the
    fixed tree, its lookup branch found on the device: drafted from the device alone); a number given is kept."""
    from specdec.drafters.medusa.drafter import default_min_confidence

    assert MedusaDrafter.Config().min_confidence is None
    assert default_min_confidence(torch.device("cpu")) == 0.4 and default_min_confidence(torch.device("cuda")) == 0.0
    save_heads(tmp_path / "heads.safetensors", random_heads(), tree=PATHS)
    for given, expected in ((None, 0.4), (0.1, 0.1), (0.0, 0.0)):
        cfg = MedusaDrafter.Config(path=str(tmp_path), min_confidence=given, k=8, lookup=2)
        drafter = MedusaDrafter.from_config(cfg, target=tiny_target)
        assert drafter.min_confidence == expected
        assert not drafter.traits.device_only  # a CPU finds the lookup branch on the host


@pytest.mark.gpu
def test_the_default_medusa_tree_on_a_gpu_is_fixed_and_drafted_on_the_device(tmp_path):
    save_heads(tmp_path / "heads.safetensors", random_heads(), tree=PATHS)
    drafter = MedusaDrafter.from_config(MedusaDrafter.Config(path=str(tmp_path), k=8, lookup=2),
                                        target=tiny_llama(layers=1).cuda())
    assert drafter.min_confidence == 0.0 and drafter.traits.device_only


# --- greedy equality on a tiny random model ----------------------------------------------------------------


DRAFT_VOCAB = torch.arange(0, 64, 2)  # every other token: the target's greedy choice is often outside


@pytest.mark.parametrize("token_ids", [None, DRAFT_VOCAB], ids=["full-vocab", "draft-vocab"])
@pytest.mark.parametrize("paths, ks", [(None, [1, 2, 3]), (PATHS, [1, 4, 8])], ids=["chain", "tree"])
def test_greedy_medusa_equals_plain_decoding(tiny_target, paths, ks, token_ids):
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    for k in ks:
        drafter = MedusaDrafter(random_heads(token_ids=token_ids), tiny_target.lm_head.weight, paths)
        out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=30,
                                   eos_token_id=[])
        assert out.sequences == reference.sequences, f"k={k}"
        assert out.stats.target_forwards <= reference.stats.target_forwards


@pytest.mark.parametrize("paths", [PATHS, None], ids=["tree", "chain"])
@pytest.mark.parametrize("min_confidence", [0.01, 0.03, 0.9])
def test_greedy_dynamic_tree_equals_plain_decoding(tiny_target, min_confidence, paths):
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    drafter = MedusaDrafter(random_heads(scale=1.0), tiny_target.lm_head.weight, paths, min_confidence)
    k = 8 if paths else 3
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=30, eos_token_id=[])
    assert out.sequences == reference.sequences
    assert out.stats.proposed_tokens < k * out.stats.verify_steps  # some nodes were dropped
    assert out.stats.proposed_tokens > 0 or min_confidence > 0.5


def test_dynamic_tree_keeps_confident_paths_only(tiny_target):
    drafter = MedusaDrafter(random_heads(scale=1.0), tiny_target.lm_head.weight, PATHS, min_confidence=0.03)
    hidden = torch.randn(1, 32)
    state = type("S", (), {})()  # the fields propose() reads
    state.last_hidden, state.last_tokens = hidden, torch.tensor([3])
    state.sampling = type("P", (), {"greedy": True})()
    proposal = drafter.propose(state, 8)
    logp = drafter.heads(hidden, drafter.lm_head_weight).detach().log_softmax(-1)[0]  # [3, V]
    ranked = logp.sort(-1, descending=True).values  # [3, V]
    expected = [i for i, path in enumerate(PATHS)
                if sum(float(ranked[depth, rank]) for depth, rank in enumerate(path)) >= math.log(0.03)]
    assert proposal.tokens.shape[1] == len(expected)
    assert (proposal.tree is None) == (not expected)


def test_bad_min_confidence_is_named(tiny_target):
    with pytest.raises(ValueError, match="min_confidence must be in"):
        MedusaDrafter(random_heads(), tiny_target.lm_head.weight, PATHS, min_confidence=1.0)


# --- exact sampling through the engine ---------------------------------------------------------------------


MARKOV_DRAFT_VOCAB = torch.arange(48)  # a quarter of the tokens can never be drafted


@pytest.mark.parametrize("token_ids", [None, MARKOV_DRAFT_VOCAB], ids=["full-vocab", "draft-vocab"])
@pytest.mark.parametrize("paths, min_confidence", [(None, 0.0), (PATHS, 0.0), (PATHS, 0.05), (None, 0.3)],
                         ids=["chain", "tree", "dynamic-tree", "dynamic-chain"])
def test_sampling_with_medusa_is_exact(markov_target, paths, min_confidence, token_ids):
    drafter = MedusaDrafter(markov_heads(token_ids=token_ids), markov_target.lm_head.weight, paths, min_confidence)
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter, seed=1 if paths else 2)
    assert stats.mean_accepted_length > 1.3  # drafts are accepted often: the rule is really exercised
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict


def test_planted_tree_sampler_bug_is_caught_end_to_end(markov_target):
    """No renormalisation after a rejected sibling: the same test rejects it."""
    drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, PATHS)
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, seed=1, rule=NoRenormalisation())
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject, verdict


def prefix_cut_by_own_draft(logits, index, min_confidence):
    """Planted bug: a dynamic chain keeps draft i only if *its own* probability (times the earlier ones')
    reaches the threshold, so an unlikely draft is replaced by an unverified sample from p."""
    drafted = logits.log_softmax(-1).gather(-1, index[..., None])[..., 0].cumsum(-1)  # [B, k]
    keep = (drafted >= math.log(min_confidence)).long().cumprod(-1)
    return int(keep.sum(-1).max())


@pytest.mark.parametrize("planted, reject", [(False, False), (True, True)],
                         ids=["exact-rule", "planted-own-draft-rule"])
def test_dynamic_chain_rule_is_exact_and_the_value_based_cut_is_caught(markov_target, monkeypatch, planted, reject):
    """Batch 1, row by row: in a batch the cut is the longest over rows, which hides a per-row bias."""
    if planted:
        monkeypatch.setattr(specdec.drafters.trees.drafting, "confident_prefix", prefix_cut_by_own_draft)
    heads = markov_heads(num_heads=2, strength=1.5)  # head 1's drafts: ~0.64 on the likeliest token, the rest spread
    drafter = MedusaDrafter(heads, markov_target.lm_head.weight, None, min_confidence=0.4)
    g = torch.Generator().manual_seed(3)
    tokens, probs = [], []
    for prompt in torch.randint(0, VOCAB, (300, 1, 4), generator=g):
        out = speculative_generate(markov_target, drafter, prompt, k=2, max_new_tokens=6, temperature=1.0,
                                   generator=g, eos_token_id=[])
        seq = torch.cat([prompt, torch.tensor(out.sequences)], 1)  # [1, 10]
        with torch.no_grad():
            probs.append(logits_to_probs(markov_target(seq).logits[0, 3:-1], 1.0))  # [6, V]
        tokens.append(seq[0, 4:])
    tokens, probs = torch.cat(tokens).numpy(), torch.cat(probs).numpy()
    positions = np.tile(np.arange(6), 300)
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject == reject, verdict


class DraftVocabNotMapped(MedusaDrafter):
    """Planted bug: the chain's q is reported over draft-vocabulary *indices* (padded with zeros), not over
    the token ids the drafts were mapped to."""

    def propose(self, state, k):
        proposal = super().propose(state, k)
        q = proposal.probs[..., self.heads.token_ids]  # back to [B, k, V'] ...
        wrong = torch.zeros_like(proposal.probs)
        wrong[..., : q.shape[-1]] = q  # ... then laid out as if index i were token i
        return type(proposal)(tokens=proposal.tokens, probs=wrong, num_proposed=proposal.num_proposed)


def test_planted_draft_vocabulary_bug_is_caught(markov_target):
    shifted = torch.arange(16, 64)  # indices and token ids disagree everywhere
    drafter = DraftVocabNotMapped(markov_heads(token_ids=shifted), markov_target.lm_head.weight, None)
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, seed=2)
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject, verdict


# --- the shipped heads on the real default target ----------------------------------------------------------


def test_shipped_heads_exist_with_provenance():
    path = default_heads_path()
    assert path.is_file(), "shipped heads missing: run the command in their provenance.json"
    provenance = json.loads((path.parent / "provenance.json").read_text())
    for key in ("command", "data", "git_commit", "metrics", "date"):
        assert key in provenance
    heads, meta = load_heads(path, hidden_size=576, vocab_size=49152)
    assert meta["tree"] and path.stat().st_size < 10_000_000


@pytest.mark.real_model
@pytest.mark.parametrize("cfg", [MedusaDrafter.Config(k=3, tree=None, min_confidence=0.0, lookup=0),
                                 MedusaDrafter.Config(k=8, min_confidence=0.0, lookup=0),
                                 MedusaDrafter.Config()],
                         ids=["chain", "fixed-tree", "default-dynamic-tree-with-lookup"])
def test_shipped_heads_greedy_equal_plain_decoding_on_real_target(real_target, real_prompts, cfg):
    from specdec.jobs.data import left_pad as pad

    model, tokenizer = real_target
    drafter = build_drafter(cfg, model, tokenizer)
    batches = [[real_prompts[0]], [real_prompts[1], real_prompts[2]]]  # batch 1, then batch 2 (left-padded)
    tau = []
    for batch in batches:
        ids, mask = pad(batch, tokenizer.pad_token_id)
        reference = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=24)
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=cfg.k, max_new_tokens=24)
        assert out.sequences == reference.sequences
        tau.append(out.stats.mean_accepted_length)
    assert min(tau) > 1.1, tau  # trained heads are accepted (untrained ones give ~1.0)


# --- token-aware heads (Hydra-style: the emitted token and the draft path as input) -----------------------


@pytest.mark.parametrize("paths, min_confidence, ks", [(None, 0.0, [1, 3]), (PATHS, 0.0, [1, 8]), (PATHS, 0.03, [8]),
                                                      (None, 0.03, [3])],
                         ids=["chain", "tree", "dynamic-tree", "dynamic-chain"])
def test_greedy_token_aware_medusa_equals_plain_decoding(tiny_target, paths, min_confidence, ks):
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    for k in ks:
        drafter = MedusaDrafter(random_token_aware_heads(), tiny_target.lm_head.weight, paths, min_confidence,
                                embed_weight=tiny_target.get_input_embeddings().weight)
        out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=30,
                                   eos_token_id=[])
        assert out.sequences == reference.sequences, f"k={k}"


def test_token_aware_heads_need_embeddings_and_roundtrip(tiny_target, tmp_path):
    heads = random_token_aware_heads()
    with pytest.raises(ValueError, match="input embeddings"):
        MedusaDrafter(heads, tiny_target.lm_head.weight, PATHS)
    with pytest.raises(ValueError, match="known tokens"):
        heads(torch.zeros(2, 32), tiny_target.lm_head.weight)
    save_heads(tmp_path / "h.safetensors", heads, tree=PATHS)
    loaded, meta = load_heads(tmp_path / "h.safetensors", hidden_size=32, vocab_size=VOCAB)
    known = torch.randn(2, 3, 32)
    assert meta["token_aware"] and loaded.token_aware
    assert torch.equal(loaded(torch.ones(2, 32), tiny_target.lm_head.weight, known=known),
                       heads(torch.ones(2, 32), tiny_target.lm_head.weight, known=known))


def test_token_aware_tree_nodes_follow_their_own_paths(tiny_target):
    """Each node's token is its depth's head's choice given the emitted token and the node's own path (the
    exactness tests cannot see this: any tree of deterministic candidates is verified exactly)."""
    heads, embed = random_token_aware_heads(scale=1.0), torch.randn(VOCAB, 32)  # embeddings that matter
    drafter = MedusaDrafter(heads, tiny_target.lm_head.weight, PATHS, embed_weight=embed)
    hidden, emitted = torch.randn(2, 32), torch.tensor([3, 17])
    state = type("S", (), {})()  # the fields propose() reads
    state.last_hidden, state.last_tokens = hidden, emitted
    state.sampling = type("P", (), {"greedy": True})()
    proposal = drafter.propose(state, len(PATHS))
    drafted = {}
    for i, path in enumerate(PATHS):
        before = [drafted[tuple(path[:j])] for j in range(1, len(path))]  # [B] tokens of the ancestors
        known = embed[torch.stack([emitted, *before], 1)]  # [B, depth, H]
        logits = heads(hidden, drafter.lm_head_weight, num_heads=len(path), known=known, first=len(path) - 1)[:, 0]
        drafted[tuple(path)] = logits.topk(path[-1] + 1, -1).indices[:, path[-1]]
        assert torch.equal(proposal.tokens[:, i], drafted[tuple(path)]), path


@pytest.mark.parametrize("min_confidence", [0.003, 0.1, 0.5, 0.999])
def test_dynamic_token_aware_tree_drafts_only_what_it_keeps(tiny_target, min_confidence):
    """A dynamic token-aware tree drafts a level only under parents that pass the confidence test, and
    keeps exactly the nodes the full tree would keep (a path is never likelier than its parent)."""
    heads, embed = random_token_aware_heads(scale=1.0), torch.randn(VOCAB, 32)
    # rank 1 first: a pruned parent before a kept one at each level
    paths = check_paths([[1], [0], [2], [1, 0], [0, 0], [0, 1], [2, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]], 3)
    drafter = MedusaDrafter(heads, tiny_target.lm_head.weight, paths, min_confidence, embed_weight=embed)
    state = type("S", (), {})()
    state.last_hidden, state.last_tokens = 20 * torch.randn(3, 32), torch.tensor([3, 17, 40])  # confident heads
    state.sampling = type("P", (), {"greedy": True})()
    full_tokens, full_logp = drafter.drafting.candidates.tree(state, state.last_hidden, plan_tree(paths, "cpu"))
    keep = (full_logp.exp().mean(0) >= min_confidence).nonzero().flatten().tolist()  # mean over the 3 rows
    calls = []
    real_forward = heads.forward
    heads.forward = lambda *a, **kw: calls.append(kw["known"].shape[1]) or real_forward(*a, **kw)
    proposal = drafter.propose(state, len(paths))
    assert proposal.tokens.shape[1] == len(keep)
    if keep:
        assert torch.equal(proposal.tokens, full_tokens[:, keep])
        assert proposal.tree.parents.tolist() == plan_tree([paths[i] for i in keep], "cpu").tree.parents.tolist()
    # parents drafted from, level by level: only the kept nodes at the level above (the root first)
    kept = [paths[i] for i in keep]
    expected = [1] + [n for n in (sum(len(p) == d and any(q[:d] == p for q in paths if len(q) == d + 1) for p in kept)
                                  for d in (1, 2)) if n]
    assert calls == expected, (calls, kept)


def markov_token_aware_heads(num_heads: int = 3, strength: float = 20.0) -> MedusaHeads:
    """Token-aware head i copies the last known token t (the one just before the token it predicts) into
    the hidden state, so the target's LM head puts it on σ(t) and τ(t): right given the path, and
    imperfect in the same way as :func:`markov_heads` (τ(t) is drawn a fifth of the time)."""
    heads = MedusaHeads(VOCAB, VOCAB, num_heads, token_aware=True)
    a = torch.arange(VOCAB)
    with torch.no_grad():
        for i, block in enumerate(heads.blocks):
            block.linear.weight.zero_()
            block.linear.weight[a, (1 + i) * VOCAB + a] = strength  # the (i+1)-th known token's embedding e_t
    return heads.eval().requires_grad_(False)


@pytest.mark.parametrize("paths, min_confidence", [(None, 0.0), (PATHS, 0.0), (PATHS, 0.05)],
                         ids=["chain", "tree", "dynamic-tree"])
def test_sampling_with_token_aware_medusa_is_exact(markov_target, paths, min_confidence):
    drafter = MedusaDrafter(markov_token_aware_heads(), markov_target.lm_head.weight, paths, min_confidence,
                            embed_weight=markov_target.get_input_embeddings().weight)
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter, seed=3)
    assert stats.mean_accepted_length > 1.8  # the path makes the drafts good: the rule is really exercised
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict


def chain_reporting_pathless_q(self, state, hidden, k):
    """Planted bug: each chain draft is drawn given the drafts before it, but the q reported for it is the
    head's distribution with the path left out (the emitted token in every slot) — not the q it was drawn
    from."""
    logits, q, index = TokenAwareHeads.chain(self, state, hidden, k)
    pathless = self.embed_weight[state.last_tokens][:, None].expand(-1, k, -1)
    wrong = self.heads(hidden, self.lm_head_weight, num_heads=k, known=pathless)
    return logits, logits_to_probs(wrong, state.sampling.temperature), index


def test_planted_token_aware_chain_q_bug_is_caught(markov_target, monkeypatch):
    drafter = MedusaDrafter(markov_token_aware_heads(), markov_target.lm_head.weight, None,
                            embed_weight=markov_target.get_input_embeddings().weight)
    candidates = drafter.drafting.candidates
    monkeypatch.setattr(candidates, "chain", partial(chain_reporting_pathless_q, candidates))
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, seed=3)
    assert exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions).reject
