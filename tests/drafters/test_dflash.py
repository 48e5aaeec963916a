"""The block drafter (DFlash-style): one forward drafts a block; chains and trees from its per-position candidates,
exact under greedy decoding and sampling; the decode-time forward over the cache is the training forward; the
checkpoint format round-trips and refuses another target's or a damaged file."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import (exact_verdict, feature_batch, fused_backend, markov_blocks, random_dflash, read_late_and_each_step,
                     tiny_llama)

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.base import graph_runners
from specdec.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashModel, load_dflash, save_dflash
from specdec.errors import CheckpointError
from specdec.models import cpu_kernels
from specdec.models.backend import Backend


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=4, seed=0)


PROMPTS = torch.tensor([[1, 5, 7, 9, 3, 2, 8], [0, 0, 0, 4, 8, 6, 11]])
MASK = (torch.arange(7) >= torch.tensor([[0], [3]])).long()


TREE = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("options", [dict(), dict(paths=TREE), dict(paths=TREE, min_confidence=0.05),
                                     dict(paths=TREE, lookup=3)], ids=["chain", "tree", "dynamic", "lookup"])
def test_greedy_output_equals_plain_decoding(target, options):
    ref = autoregressive_generate(target, PROMPTS, max_new_tokens=24, attention_mask=MASK, eos_token_id=[])
    drafter = DFlashDrafter(random_dflash(target, draft_vocab=40), **options)
    k = 4 if "paths" not in options else len(TREE) + options.get("lookup", 0)
    out = speculative_generate(target, drafter, PROMPTS, k=k, max_new_tokens=24, attention_mask=MASK, eos_token_id=[])
    assert out.sequences == ref.sequences
    one = speculative_generate(target, drafter, PROMPTS[:1], k=k, max_new_tokens=24, eos_token_id=[])
    assert one.sequences == ref.sequences[:1]


@pytest.mark.parametrize("paths", [None, TREE], ids=["chain", "tree"])
def test_a_fixed_block_draft_read_a_step_late_equals_the_loop_that_reads_each_step(target, monkeypatch, paths):
    """The block drafter's chain or fixed tree without the lookup branch drafts on the device alone
    (``traits.device_only``), so on a GPU each step is read back after the next is launched: the outputs and counts
    of the loop that reads every step, greedy (plain decoding's output), with an EOS, and sampled."""
    drafter = DFlashDrafter(random_dflash(target, draft_vocab=40), paths)
    assert drafter.traits.device_only
    assert not DFlashDrafter(random_dflash(target), TREE, lookup=3).traits.device_only
    assert not DFlashDrafter(random_dflash(target), TREE, min_confidence=0.05).traits.device_only
    k = 4 if paths is None else len(TREE)
    free = autoregressive_generate(target, PROMPTS, max_new_tokens=12, attention_mask=MASK, eos_token_id=[])
    for eos, sampling in (([], {}), ([free.sequences[0][5]], {}), ([], {"temperature": 1.0})):
        each_step, read_late = read_late_and_each_step(monkeypatch, target, drafter, PROMPTS, MASK, k, eos, **sampling)
        assert read_late == each_step, (eos, sampling)
        if not eos and not sampling:
            assert each_step[0] == free.sequences


@pytest.mark.parametrize("paths, kernels", [(None, "torch"), (TREE, "torch"),
                                            pytest.param(None, "triton", marks=pytest.mark.slow)],  # ~2.5 min here
                         ids=["chain", "tree", "chain-triton"])
def test_graphs_replay_what_the_drafter_drafts_eagerly(target, paths, kernels):
    """With graphs (emulated on CPU: they fail where a CUDA graph would), the catch-ups and block forwards (and a
    tree's candidates) replay captured graphs over the kept cache: plain decoding's greedy output, batch 1 then 2
    left-padded, with the drafts the eager drafter drafts (the same τ); on torch's ops, and on the Triton kernels
    (under the interpreter here)."""
    backend = Backend.emulated_gpu() if kernels == "torch" else fused_backend("triton")
    graphed, eager = (DFlashDrafter(random_dflash(target, draft_vocab=40), paths, backend=backend) for _ in range(2))
    graphed.runtime.replay_graphs("auto")
    drafts = {id(graphed): [], id(eager): []}
    for d in (graphed, eager):
        def recording(state, k, d=d, propose=d.propose):
            proposal = propose(state, k)
            drafts[id(d)].append(proposal.tokens.clone())
            return proposal
        d.propose = recording
    k = 4 if paths is None else len(TREE)
    for ids, mask in ((PROMPTS[:1], None), (PROMPTS, MASK)):
        ref = autoregressive_generate(target, ids, max_new_tokens=20, attention_mask=mask, eos_token_id=[])
        out, unreplayed = (speculative_generate(target, d, ids, k=k, max_new_tokens=20, attention_mask=mask,
                                                eos_token_id=[]) for d in (graphed, eager))
        assert out.sequences == unreplayed.sequences == ref.sequences
    mine, theirs = drafts[id(graphed)], drafts[id(eager)]  # the same drafts every step
    assert len(mine) == len(theirs) > 10 and all(torch.equal(a, b) for a, b in zip(mine, theirs))
    runners = graph_runners(graphed)
    assert len(runners) == 1 and runners[0].captures >= 2 and runners[0].replays > runners[0].captures
    assert paths is None or graphed.drafting.candidates.graphs is runners[0]  # a tree's candidates replay too
    assert not graph_runners(eager)


def test_one_forward_drafts_the_whole_block(target):
    """k drafts from one draft forward a step, however large k is."""
    drafter = DFlashDrafter(random_dflash(target, block_size=6))
    out = speculative_generate(target, drafter, PROMPTS[:1], k=5, max_new_tokens=12, eos_token_id=[])
    assert out.stats.drafter_forwards == out.stats.verify_steps > 0


@torch.no_grad()
def test_each_block_reads_the_newest_committed_context(target):
    """A block's ``last`` input is the fused context of the position just before its anchor (the newest one the
    target committed): at every step of a generation, against the target's own hidden states of the whole
    sequence. Greedy exactness cannot notice another entry (the drafts would only get worse)."""
    from specdec.training.distill.answers import hidden_states

    model = random_dflash(target)
    drafter = DFlashDrafter(model)
    seen, propose, draft_block = [], drafter.propose, model.draft_block

    def recording_propose(state, k):
        seen.append([state.seq[0, : int(state.seq_lens[0])].clone()])
        return propose(state, k)

    def recording_block(anchors, last, cache, kv_len=None):
        seen[-1].append(last[0].clone())
        return draft_block(anchors, last, cache, kv_len)

    drafter.propose, model.draft_block = recording_propose, recording_block
    speculative_generate(target, drafter, PROMPTS[:1], k=3, max_new_tokens=20, eos_token_id=[])
    assert len(seen) > 5
    for seq, last in seen:
        states = hidden_states(target, seq[None, :-1])
        features = torch.cat([states[layer] for layer in model.cfg.aux_layers], -1)
        assert torch.allclose(last, model.context(features)[0, -1], atol=1e-5), len(seq)


def test_decode_blocks_are_the_training_blocks():
    """A block drafted over the cache (context written as the target commits, then one block forward) is the one
    training computes for the same anchor with many blocks side by side (the mask keeps them apart)."""
    from specdec.training.distill.packing import Packed
    from specdec.training.methods.dflash.objective import block_hidden

    torch.manual_seed(0)
    target = tiny_llama(layers=4, seed=0)
    model = random_dflash(target, block_size=4)
    width = 3 * target.config.hidden_size
    t = 12
    features = torch.randn(2, t, width)
    tokens = torch.randint(0, 60, (2, t))
    segment = torch.tensor([[0] * 7 + [1] * 5, [0] * 12])
    positions = torch.tensor([list(range(7)) + list(range(5)), list(range(12))])
    batch = Packed(features, tokens, tokens.roll(-1, 1), torch.randn(2, t, target.config.hidden_size), positions,
                   segment, torch.ones(2, t, dtype=torch.bool))
    anchors = torch.tensor([[3, 6, 9], [0, 5, 11]])
    trained = block_hidden(model, batch, anchors)  # [2, 3, B, H]
    with torch.no_grad():
        for row in range(2):
            for a in range(3):
                j = int(anchors[row, a])
                start = j - int(positions[row, j])  # the sequence's first index in the chunk
                cache = model.new_cache(1, 64, torch.zeros(1, dtype=torch.long))
                context = model.write_context(features[row: row + 1, start: j + 1], cache)
                cache.commit(torch.tensor([j + 1 - start]))
                decoded = model.draft_block(tokens[row, j: j + 1], context[:, -1], cache)[0]
                assert torch.allclose(decoded, trained[row, a], atol=1e-5), (row, a)


def _block_steps(model: DFlashModel) -> list[torch.Tensor]:
    """Context of 6 positions written, a block drafted, 3 more positions committed, another block, on a batch of 2
    rows (one left-padded): the contexts, the blocks, their logits and the cache's committed entries."""
    cache, feats, tokens = feature_batch(model, 9, 2, 40)
    first = model.write_context(feats[:, :6], cache, 20)
    cache.commit(torch.tensor([6, 6]))
    block = model.draft_block(tokens[:, 0], first[:, -1], cache, 20)
    second = model.write_context(feats[:, 6:], cache, 20)
    cache.commit(torch.tensor([3, 3]))
    again = model.draft_block(tokens[:, 1], second[:, -1], cache, 20)
    return [first, block, model.logits(block[:, 1:]), second, again, model.logits(again[:, 1:]),
            *(entries[i][:, :, :9] for entries in (cache.keys, cache.values) for i in range(model.cfg.num_layers))]


@pytest.mark.parametrize("kernels", ["cpu", "triton"])
@torch.no_grad()
def test_the_fused_block_forward_matches_the_torch_ops(target, kernels):
    """The context write and the block forward through specdec's CPU kernels (norms, q/k norms per head, rotary,
    cache write + attention with the whole block visible, SiLU, products over float16 panels), or its Triton kernels
    (under the interpreter here), equal the torch ops'; after an in-place weight update too (the plan is rebuilt)."""
    kernels_backend = fused_backend(kernels)
    model = random_dflash(target, draft_vocab=40)
    for p in model.parameters():
        p.data = p.data.half().float()  # float16 values: float16 panels, as a drafter stored in float16
    for update in (False, True):
        if update:
            model.layers[1].mlp.down_proj.weight.mul_(0.5)
            model.lm_head.weight.add_(0.25)
            model.fc.weight.mul_(0.5)
        results = {}
        for on in (True, False):
            model.backend = kernels_backend if on else Backend(kernels=False)
            results[on] = _block_steps(model)
        for fused, plain in zip(results[True], results[False]):
            assert fused.shape == plain.shape
            assert torch.allclose(fused, plain, atol=1e-5, rtol=1e-5), (fused - plain).abs().max()


def test_anchors_come_from_answers_then_real_positions():
    """Anchors are drawn among answer positions; a chunk without any among its real positions, one without real
    positions (all padding) anywhere; with replacement only where a chunk has fewer than asked."""
    from specdec.training.distill.packing import Packed
    from specdec.training.methods.dflash.objective import sample_anchors

    t = 10
    segment = torch.tensor([[0] * 6 + [-1] * 4, [0] * 4 + [-1] * 6, [-1] * 10])
    answer = torch.zeros(3, t, dtype=torch.bool)
    answer[0, 2:5] = True
    answer[0, 8] = True  # padding: never drawn
    zeros = torch.zeros(3, t, dtype=torch.long)
    batch = Packed(torch.zeros(3, t, 1), zeros, zeros, torch.zeros(3, t, 1), zeros, segment, answer)
    for seed in range(5):
        anchors = sample_anchors(batch, 3, torch.Generator().manual_seed(seed))
        assert sorted(anchors[0].tolist()) == [2, 3, 4]
        assert set(anchors[1].tolist()) <= {0, 1, 2, 3}
        assert anchors.shape == (3, 3)
    wide = sample_anchors(batch, 5, torch.Generator().manual_seed(0))  # chunk 0 has 3 answers: replacement
    assert set(wide[0].tolist()) <= {2, 3, 4}


def test_checkpoint_round_trip_and_refusals(target, tmp_path):
    model = random_dflash(target, draft_vocab=40)
    save_dflash(tmp_path / "d", model, verifier="tiny", extra={"tree": TREE})
    loaded = load_dflash(tmp_path / "d", target_config=target.config).attach(target.get_input_embeddings().weight)
    assert torch.equal(loaded.token_ids, model.token_ids) and loaded.cfg.extra["tree"] == TREE
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    other = tiny_llama(layers=4, hidden=48, seed=1)
    with pytest.raises(CheckpointError, match="trained for a target with hidden size 32"):
        load_dflash(tmp_path / "d", target_config=other.config)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    del config["dflash_config"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a block"):
        load_dflash(tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="no block drafter"):
        load_dflash(tmp_path / "missing")


def test_weight_bits_round_the_layers_and_head_but_not_fc(target, tmp_path):
    """``drafter.weight_bits`` rounds the draft layers and the LM head to codes, never ``fc`` (its columns for a
    target's massive channels are tiny beside their block's others) nor the target's embeddings."""
    model = random_dflash(target, draft_vocab=40)
    save_dflash(tmp_path / "d", model, extra={"tree": TREE})
    drafter = DFlashDrafter.from_config(DFlashDrafter.Config(path=str(tmp_path / "d"), weight_bits=4), target=target)
    loaded = drafter.model
    assert torch.equal(loaded.fc.weight, model.fc.weight)
    assert not torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(loaded.layers[0].mlp.down_proj.weight, model.layers[0].mlp.down_proj.weight)
    assert torch.equal(target.get_input_embeddings().weight, model.embed_weight)


def test_a_target_it_was_not_trained_for_is_named(target):
    """Another vocabulary, or feature layers of another width, are refused when a generation starts, naming both."""
    from specdec.errors import VocabMismatchError

    drafter = DFlashDrafter(random_dflash(target))
    with pytest.raises(VocabMismatchError, match="block drafter was trained for a vocabulary of 64 tokens, the target "
                                                 "has 80"):
        speculative_generate(tiny_llama(vocab_size=80, layers=4, seed=1), drafter, PROMPTS[:1], k=3, max_new_tokens=4,
                             eos_token_id=[])
    with pytest.raises(ValueError, match=r"reads 96 target features per position \(layers \[1, 2, 3\] x 32\), the "
                                         r"decode loop gave 144"):
        speculative_generate(tiny_llama(hidden=48, layers=4, seed=1), drafter, PROMPTS[:1], k=3, max_new_tokens=4,
                             eos_token_id=[])


def test_bad_settings_are_named(target):
    model = random_dflash(target)
    with pytest.raises(ValueError, match="min_confidence"):
        DFlashDrafter(model, TREE, min_confidence=1.5)
    with pytest.raises(ValueError, match="lookup"):
        DFlashDrafter(model, TREE, lookup=-1)
    assert DFlashDrafter(model, None, lookup=8).lookup == 0  # a chain ignores the lookup branch, as EAGLE's does
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        DFlashModel(DFlashConfig.for_target(target.config, num_layers=1, block_size=1, mask_token_id=0, aux_layers=(1,)))


# --- exactness at temperature 1 on the bigram ("Markov") target ------------------------------------------

MARKOV_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2], [0, 0, 0, 0]]


@pytest.mark.parametrize("paths, k", [(None, 4), (MARKOV_TREE, 8)], ids=["chain", "tree"])
@pytest.mark.parametrize("draft_vocab", [None, torch.arange(48)], ids=["full-vocab", "draft-vocab"])
def test_sampling_with_blocks_is_exact(markov_target, paths, k, draft_vocab):
    drafter = DFlashDrafter(markov_blocks(markov_target, draft_vocab), paths)
    verdict, stats = exact_verdict(markov_target, drafter, k)
    assert stats.mean_accepted_length > 1.3  # drafts are accepted often: the rule is really exercised
    assert not verdict.reject, verdict


@pytest.mark.parametrize("bug", ["recovered_from_target", "bonus_from_wrong_position"])
@pytest.mark.parametrize("paths, k", [(None, 2), (MARKOV_TREE, 8)], ids=["chain", "tree"])
def test_planted_verifier_bugs_are_caught(markov_target, bug, paths, k):
    """The suite's planted verifier bugs under block drafting (a chain of 2, so that a bonus token is common)."""
    from specdec.exactness.planted import VERIFIER_BUGS

    drafter = DFlashDrafter(markov_blocks(markov_target), paths)
    verdict, _ = exact_verdict(markov_target, drafter, k, rule=VERIFIER_BUGS[bug])
    assert verdict.reject, verdict


# --- training -----------------------------------------------------------------------------------------------

def test_training_runs_end_to_end_and_the_drafter_loads(tmp_path, tiny_pair):
    """python -m specdec.train method=dflash on a tiny target: EAGLE's data, blocks at sampled anchors, held-out τ
    per epoch and a tree chosen on val, an export the drafter loads (tree included) and decodes exactly with."""
    from helpers import CHAT_TEMPLATE, tiny_config

    from specdec.training.methods.dflash import DFlashMethodConfig
    from specdec.training.trainer import train

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    cfg = tiny_config(tmp_path / "run")
    cfg.method = DFlashMethodConfig(aux_layers=[0, 0, 0], num_layers=1, block_size=4, draft_vocab=20, anchors=4,
                                    chunk_len=32, tree_nodes=6, max_rank=3)
    cfg.eval_every_epoch = True
    cfg.optim.lr = 3e-3
    cfg.export = str(tmp_path / "export")
    metrics = train(cfg, target=model, tokenizer=tokenizer)
    assert metrics["finished"] and len(metrics["per_epoch"]) == cfg.optim.epochs
    assert set(metrics["eval"]) >= {"val", "answers_mtbench"}
    assert len(metrics["eval"]["val"]["tau_chain"]) == 3 and 1 <= len(metrics["tree"]) <= 6
    provenance = json.loads((tmp_path / "export" / "provenance.json").read_text())
    assert provenance["method"]["name"] == "dflash" and provenance["data"]["size"]["train"]["tokens"] > 0
    loaded = load_dflash(tmp_path / "export", target_config=model.config).attach(model.get_input_embeddings().weight)
    assert loaded.cfg.extra["tree"] == metrics["tree"]
    ids = torch.tensor([[2, 4, 6, 7, 3, 2, 5]])
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    for paths, k in ((None, 3), (loaded.cfg.extra["tree"], len(metrics["tree"]))):
        drafter = DFlashDrafter(loaded, paths)
        assert speculative_generate(model, drafter, ids, k=k, max_new_tokens=12, eos_token_id=[]).sequences == ref.sequences


def test_feature_channels_train_scaled_and_save_as_the_format_reads_them(tmp_path):
    """Each feature channel trains at RMS 1 (a target's residual stream has channels thousands of times larger than
    the rest), and the saved drafter folds the scales into fc: it fuses raw features as the trained one fused
    scaled ones. The draft layers get their own learning-rate scale."""
    from specdec.training.distill.store import Split
    from specdec.training.methods.dflash import DFlashMethodConfig
    from specdec.training.methods.dflash.method import DFlashMethod

    target = tiny_llama(layers=4)
    hidden, n = target.config.hidden_size, 12
    size = torch.ones(3, hidden)
    size[1, 5] = 3000.0  # a massive channel
    features = torch.randn(n, 3, hidden) * size
    train = Split(torch.tensor([1, 2]), torch.tensor([2]), torch.arange(3, 3 + n), torch.tensor([n]),
                  torch.randn(n, hidden), features, context_hidden=torch.randn(1, hidden),
                  context_features=torch.randn(1, 3, hidden) * size)
    method = DFlashMethod(DFlashMethodConfig(aux_layers=[1, 2, 3], draft_vocab=None, chunk_len=16, block_size=4))
    model = method.setup(target, {"train": train}, torch.device("cpu"))
    used = method.examples.features[method.examples.segment >= 0]  # what fc trains on
    assert used.abs().max() < 10 and torch.allclose(used.pow(2).mean(0).sqrt(), torch.ones(3 * hidden), rtol=0.5)
    method.save(model, tmp_path / "model.safetensors", "tiny", {"tree": [[0]]})
    saved = load_dflash(tmp_path, target_config=target.config)
    raw = features.flatten(1)[None]
    assert torch.allclose(saved.context(raw), model.context(raw * method.feature_scale), rtol=1e-4, atol=1e-4)
    groups = method.param_groups(model)
    assert [g["lr_scale"] for g in groups] == [method.cfg.layer_lr_scale, 1.0] == [0.3, 1.0]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in model.layers.parameters()}


# --- the shipped drafter on the real default target ---------------------------------------------------------

def test_shipped_drafter_exists_lean_with_provenance():
    from specdec.drafters.dflash.model import default_dflash_path

    path = default_dflash_path()
    assert (path / "model.safetensors").is_file(), "shipped block drafter missing: run the command in provenance.json"
    provenance = json.loads((path / "provenance.json").read_text())
    for key in ("command", "data", "git_commit", "metrics", "date", "wall_time_s"):
        assert key in provenance
    assert provenance["metrics"]["per_epoch"], "held-out τ per epoch"
    assert (path / "model.safetensors").stat().st_size < 27_000_000  # float16; the GPU kit's transfer has room for it
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["target_hidden_size"] == 576
    assert config["specdec"]["tree"], "the tree chosen on held-out data"


@pytest.mark.real_model
@pytest.mark.parametrize("cfg", [DFlashDrafter.Config(k=3, tree=None), DFlashDrafter.Config(),
                                 DFlashDrafter.Config(weight_bits=None)],
                         ids=["chain", "default-tree", "trained-weights"])
def test_shipped_drafter_greedy_equals_plain_decoding_on_real_target(real_target, real_prompts, cfg):
    from helpers import shipped_drafter_taus

    tau = shipped_drafter_taus(real_target, real_prompts, cfg)
    assert min(tau) > 1.15, tau  # a trained drafter is accepted (a random one gives ~1.0)


def test_a_missing_shipped_drafter_says_what_to_do(target, tmp_path, monkeypatch):
    import specdec.drafters.dflash.drafter as module

    monkeypatch.setattr(module, "default_dflash_path", lambda: tmp_path / "assets")
    with pytest.raises(FileNotFoundError, match="shipped block drafter is not at .* method=dflash .* drafter.path"):
        DFlashDrafter.from_config(DFlashDrafter.Config(), target=target)
