"""The distilled draft model: its losses on hand-made distributions, the student's initialisation and packed
forward, the store's hidden states (the target's logits come from them), the lean file and the HF export
round trips, exact greedy decoding with the loaded student, a student for another target refused, and a
tiny training run through the trainer (on-policy samples included)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import check_export_force, markov_draft, shipped_drafter_taus, tiny_llama

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import DraftModelDrafter
from specdec.drafters.draft_model.student import export_hf, init_student, load_student, save_student
from specdec.errors import CheckpointError, VocabMismatchError
from specdec.models import cpu_kernels
from specdec.training.distill.packing import pack
from specdec.training.distill.store import Split
from specdec.training.methods.draft_model.objective import (
    acceptance, chain_matches, divergence, packed_hidden, student_pairs)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=4, seed=0)


def trained_like(student, seed=1, scale=0.05):
    """The student with its trainable weights moved off the target's (as training would)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in student.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
    return student.eval()


def test_losses_on_hand_made_distributions():
    p = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    logp, logq = p.log(), q.log()
    fkl = 0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.3) + 0.1 * math.log(0.1 / 0.5)
    rkl = 0.2 * math.log(0.2 / 0.7) + 0.3 * math.log(0.3 / 0.2) + 0.5 * math.log(0.5 / 0.1)
    assert torch.allclose(divergence(logp, logq, "fkl"), torch.tensor([fkl, math.log(3)]))
    assert torch.allclose(divergence(logp[:1], logq[:1], "rkl"), torch.tensor([rkl]))
    assert torch.isinf(divergence(logp[1:], logq[1:], "rkl")).all()  # q puts mass where p has none
    assert torch.allclose(divergence(logp, logq, "tv"), torch.tensor([0.5, 2 / 3]))
    assert torch.allclose(acceptance(p, q), torch.tensor([0.5, 1 / 3]))
    assert torch.allclose(divergence(logp, logq, "tv"), 1 - acceptance(p, q))  # TV = 1 - acceptance at T=1
    assert torch.allclose(divergence(logp, logp, "fkl"), torch.zeros(2))
    with pytest.raises(ValueError, match="fkl"):
        divergence(logp, logq, "js")


def test_student_init_copies_the_chosen_layers_and_shares_embeddings(target):
    student = init_student(target, [0, 3])
    assert student.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    for mine, i in zip(student.model.layers, [0, 3]):
        for (name, a), b in zip(mine.state_dict().items(), target.model.layers[i].state_dict().values()):
            assert torch.equal(a, b), name
    assert torch.equal(student.model.norm.weight, target.model.norm.weight)
    assert student.model.embed_tokens.weight is target.model.embed_tokens.weight  # shared, not copied
    assert not student.model.embed_tokens.weight.requires_grad and not student.lm_head.weight.requires_grad
    assert init_student(target, [1], dtype=torch.float64).model.embed_tokens.weight.dtype == torch.float64
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        init_student(target, [0, 4])


def test_packed_forward_equals_the_model_on_each_sequence(target):
    student = trained_like(init_student(target, [1, 2]))
    a, b = torch.tensor([3, 9, 4, 12, 7]), torch.tensor([5, 2, 11])
    pairs = [(torch.zeros(x.numel(), 0), x, torch.zeros(x.numel(), 32), torch.ones(x.numel(), dtype=torch.bool))
             for x in (a, b)]
    batch = pack(pairs, 10)
    with torch.no_grad():
        hidden = packed_hidden(student, batch.tokens, batch.positions, batch.segment)
        for span, x in ((slice(0, 5), a), (slice(5, 8), b)):
            ref = student.model(x[None]).last_hidden_state[0]
            assert torch.allclose(hidden[0, span], ref, atol=1e-5)


def test_student_pairs_read_as_a_language_model_batch():
    """x_t in, x_{t+1} and the target's H_t out; the prompt's positions trained on only when asked."""
    h = torch.arange(10.0)[:, None].repeat(1, 2)  # hidden state k = [k, k]
    split = Split(context=torch.tensor([1, 2, 3]), context_lengths=torch.tensor([3]), tokens=torch.tensor([4, 5]),
                  lengths=torch.tensor([2]), hidden=h[2:4], context_hidden=h[0:2])
    batch = pack(student_pairs(split), 8)
    assert batch.tokens[0, :5].tolist() == [1, 2, 3, 4, 5]
    assert batch.next_token[0, :5].tolist() == [2, 3, 4, 5, -1]
    assert batch.answer[0, :5].tolist() == [False, False, True, True, False]
    assert batch.target_hidden[0, 2:4, 0].tolist() == [2.0, 3.0]  # H_2 predicted x_3 = 4
    with_prompt = pack(student_pairs(split, with_prompt=True), 8)
    assert with_prompt.answer[0, :5].tolist() == [True, True, True, True, False]
    assert with_prompt.target_hidden[0, :4, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_stored_hidden_states_give_the_targets_logits(target):
    """The store's hidden states are final-normed: the LM head alone gives the target's logits, at the answer
    and (with context=True, no feature layers) at the prompt's positions."""
    from specdec.training.distill.answers import answer_sequences

    seq = answer_sequences(target, [[3, 9, 4, 12, 7]], max_new_tokens=5, batch_size=1, pad_id=0, context=True)[0]
    assert seq.features is None and seq.context_hidden.shape == (4, 32)
    ids = torch.cat([seq.context, seq.tokens[:-1]])[None]
    with torch.no_grad():
        logits = target(ids).logits[0]
        mine = target.lm_head(torch.cat([seq.context_hidden, seq.hidden]))
    assert torch.allclose(mine, logits, atol=1e-4)


def test_chain_matches_replay_greedy_chains():
    """A student that is the target (p = q) drafts every answer token: τ = 1 + depth, α = 1, acceptance 1."""
    from specdec.training.distill.packing import chain_tau

    model = tiny_llama(layers=2, seed=3)
    from specdec.training.distill.answers import answer_sequences

    seqs = answer_sequences(model, [[3, 9, 4], [5, 6, 7, 8]], max_new_tokens=6, batch_size=2, pad_id=0)
    batch = pack(student_pairs(Split.of(seqs)), 16)
    match, counted, accept = chain_matches(model, batch, 3)
    result = chain_tau(match, counted)
    assert counted.sum() == 12 and result["alpha"][0] == 1.0
    assert result["tau_chain"][0] == 2.0  # a chain of one draft: always accepted (and the bonus)
    assert result["tau_chain"][2] < 4.0  # depth 3 runs past the answers' ends near them: a miss there
    assert torch.allclose(accept[counted], torch.ones(12))


def tied_llama():
    """A tiny target whose LM head is its embeddings (as SmolLM2's)."""
    model = tiny_llama(layers=4, seed=2)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


@pytest.mark.parametrize("kind", ["fkl", "rkl", "tv"])
def test_each_loss_raises_the_acceptance_it_is_trained_on(kind):
    """A one-layer student of a four-layer target (its LM head scaled up: peaked distributions, unlike a
    random tiny model's), a few dozen steps on the target's answers: the expected acceptance Σ min(p, q)
    there rises, whichever loss."""
    from specdec.training.distill.answers import answer_sequences
    from specdec.training.methods.draft_model.objective import distill_loss

    target = tiny_llama(layers=4, seed=7)
    with torch.no_grad():
        target.lm_head.weight.mul_(30)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 64, (5,), generator=g).tolist() for _ in range(8)]
    seqs = answer_sequences(target, prompts, max_new_tokens=8, batch_size=8, pad_id=0)
    batch = pack(student_pairs(Split.of(seqs)), 64)
    student = init_student(target, [3], dtype=torch.float32)
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=3e-3)
    before = distill_loss(student, batch, kind)[1]["accept_t1"]
    for _ in range(30):
        loss, _ = distill_loss(student, batch, kind)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = distill_loss(student, batch, kind)[1]["accept_t1"]
    assert after > before + 0.3, (before, after)  # 0.41 -> 0.91..0.94 here


def test_chain_replay_counts_what_greedy_drafting_would_accept(target):
    """From every committed answer position, the drafts accepted in a row by the replay are those the student
    accepted drafting greedily from that prefix (a draft past the answer's end is a miss)."""
    from specdec.training.distill.answers import answer_sequences

    student = trained_like(init_student(target, [0, 1, 2, 3]), seed=5, scale=0.003)
    seq = answer_sequences(target, [[3, 9, 4, 12]], max_new_tokens=10, batch_size=1, pad_id=0)[0]
    batch = pack(student_pairs(Split.of([seq])), 16)
    match, counted, _ = chain_matches(student, batch, 3)
    x = torch.cat([seq.context, seq.tokens])
    replayed, drafted = [], []
    for t in range(seq.context.numel() - 1, x.numel() - 1):  # committed x_0 .. x_t, the next token an answer's
        replayed.append(int(match[0, t].long().cumprod(0).sum()))
        drafts = autoregressive_generate(student, x[None, : t + 1], max_new_tokens=3, eos_token_id=[]).sequences[0]
        truth = x[t + 1: t + 4].tolist()
        drafted.append(next((j for j in range(3) if j >= len(truth) or drafts[j] != truth[j]), 3))
        assert counted[0, t]
    assert replayed == drafted and set(drafted) == {0, 1, 2, 3}  # chains stopped at every depth


@pytest.mark.parametrize("tied", [False, True])
def test_lean_save_load_and_hf_export_give_identical_logits(target, tmp_path, tied):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    target = tied_llama() if tied else target
    student = trained_like(init_student(target, [0, 2]))
    assert (student.lm_head.weight is student.model.embed_tokens.weight) == tied
    save_student(tmp_path / "lean", student, target_name="tiny", layers=[0, 2])
    stored = load_file(str(tmp_path / "lean" / "model.safetensors"))
    assert not any("embed_tokens" in k or "lm_head" in k for k in stored) and "model.norm.weight" in stored
    config = json.loads((tmp_path / "lean" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["specdec"]["target_layers"] == [0, 2]
    ids = torch.tensor([[3, 9, 4, 12, 7, 5]])
    with torch.no_grad():
        ref = student(ids).logits
        back = load_student(tmp_path / "lean", target)
        assert torch.equal(back(ids).logits, ref)
        assert back.model.embed_tokens.weight is target.model.embed_tokens.weight
        export_hf(tmp_path / "hf", back)
        export_hf(tmp_path / "hf", back)  # over an earlier export
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        assert torch.equal(hf(ids).logits, ref)
    assert not list(tmp_path.glob(".hf.*"))  # no temporary directories left


def test_a_failed_export_leaves_the_earlier_one(tmp_path):
    from specdec.jobs.io import atomic_dir

    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "a.txt").write_text("second")
            raise RuntimeError("interrupted")
    assert (tmp_path / "out" / "a.txt").read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_checkpoint_of_a_tied_student_round_trips(tmp_path):
    """Training checkpoints store a tensor under two names (tied embeddings and LM head) once."""
    from specdec.training.checkpoint import load_checkpoint, save_checkpoint

    target = tied_llama()
    student = trained_like(init_student(target, [1, 3]))
    optimizer = torch.optim.AdamW(student.parameters())
    save_checkpoint(tmp_path, 3, student, optimizer, {})
    fresh = init_student(target, [1, 3])
    assert load_checkpoint(tmp_path, fresh, torch.optim.AdamW(fresh.parameters())) == 3
    for (name, a), b in zip(student.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight is target.model.embed_tokens.weight


def test_greedy_decoding_with_the_loaded_student_equals_plain_decoding(target, tmp_path):
    save_student(tmp_path, trained_like(init_student(target, [0, 3])), layers=[0, 3])
    prompts = torch.tensor([[1, 5, 7, 9, 3, 2, 8], [0, 0, 0, 4, 8, 6, 11]])
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    ref = autoregressive_generate(target, prompts, max_new_tokens=20, attention_mask=mask, eos_token_id=[])
    drafter = DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path)), target=target)
    assert len(drafter.decoder.layers) == 2  # the student's own layers
    out = speculative_generate(target, drafter, prompts, k=4, max_new_tokens=20, attention_mask=mask, eos_token_id=[])
    assert out.sequences == ref.sequences
    with pytest.raises(ValueError, match="drafter.num_layers=1 does not apply to a distilled student"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path), num_layers=1), target=target)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_students_weights_rounded_to_codes_leave_the_target_and_the_output(target, tmp_path, bits):
    """``drafter.weight_bits``: the student's own layers become codes; the target's embeddings and LM head,
    stitched in and shared, stay as they are; greedy output equals plain decoding's. The early exit, whose
    weights are the target's, refuses it."""
    save_student(tmp_path, trained_like(init_student(target, [0, 3])), layers=[0, 3])
    before = {name: p.detach().clone() for name, p in target.named_parameters()}
    drafter = DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path), weight_bits=bits),
                                            target=target)
    assert all(torch.equal(p, before[name]) for name, p in target.named_parameters())
    own = [layer.weight for layer in drafter.decoder.layers.modules() if isinstance(layer, torch.nn.Linear)]
    assert len(own) == 14 and all(cpu_kernels.pack_codes(w.detach()) is not None for w in own)
    prompts = torch.tensor([[1, 5, 7, 9, 3, 2, 8], [0, 0, 0, 4, 8, 6, 11]])
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    ref = autoregressive_generate(target, prompts, max_new_tokens=20, attention_mask=mask, eos_token_id=[])
    out = speculative_generate(target, drafter, prompts, k=4, max_new_tokens=20, attention_mask=mask, eos_token_id=[])
    assert out.sequences == ref.sequences
    with pytest.raises(ValueError, match=r"drafter.weight_bits=4 rounds the draft's own weights.*the target's"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path="target", weight_bits=4), target=target)


def test_num_layers_cuts_the_target_only_by_default(target, monkeypatch):
    """path=target drafts with the target's first 8 layers (all 4 of this one) unless told otherwise; another
    model runs all of its layers unless num_layers is given."""
    def layers(**cfg):
        return len(DraftModelDrafter.from_config(DraftModelDrafter.Config(**cfg), target=target).decoder.layers)

    big = tiny_llama(layers=10, seed=1)
    assert layers(path="target") == 4 and layers(path="target", num_layers=1) == 1
    assert len(DraftModelDrafter.from_config(DraftModelDrafter.Config(path="target"), target=big).decoder.layers) == 8
    monkeypatch.setattr("specdec.models.loading.load_target", lambda name, **kwargs: (big, None))
    assert layers(path="another/model") == 10 and layers(path="another/model", num_layers=3) == 3


def test_a_student_for_another_target_is_refused(target, tmp_path, monkeypatch):
    save_student(tmp_path, init_student(target, [0]), layers=[0])
    with pytest.raises(VocabMismatchError, match=r"hidden size 32 and vocabulary 64.*hidden size 32 and vocabulary 80"):
        load_student(tmp_path, tiny_llama(vocab_size=80, layers=2, seed=1))
    with pytest.raises(CheckpointError, match=r"hidden size 32 .*hidden size 16"):
        load_student(tmp_path, tiny_llama(hidden=16, heads=2, kv_heads=1, layers=2, seed=1))
    with pytest.raises(CheckpointError, match="no distilled draft model"):
        load_student(tmp_path / "nowhere", target)
    with pytest.raises(VocabMismatchError, match="drafter.path=target"):  # the shipped default is SmolLM2's
        DraftModelDrafter.from_config(DraftModelDrafter.Config(), target=target)
    monkeypatch.setattr("specdec.drafters.draft_model.student.default_student_path", lambda: tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="the shipped distilled draft model is missing"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path="default"), target=target)


# --- bad student directories, and what the export command may replace --------------------------------------


def test_a_student_whose_config_disagrees_with_its_weights_is_named(target, tmp_path):
    """A config.json whose shapes are not the weights' (intermediate_size edited) is named with the tensor and
    both shapes, for the run and the export command alike, not transformers' raw size-mismatch error."""
    save_student(tmp_path, init_student(target, [0, 3]), layers=[0, 3])
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    named = (r"model.safetensors': model.layers.0.mlp.(gate|up|down)_proj.weight has shape \[(64, 32|32, 64)\], its "
             r"config \(.*config.json'\) implies \[(48, 32|32, 48)\].*restore the config.json")
    with pytest.raises(CheckpointError, match=named):
        load_student(tmp_path, target)
    with pytest.raises(CheckpointError, match=named):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path)), target=target)


@pytest.mark.parametrize("text", ['{"architectures": ["LlamaForCausalLM"], "hidden_si', "[1, 2]", "\xff\xfe"])
def test_a_student_whose_config_cannot_be_read_is_named(target, tmp_path, text):
    """A truncated or garbage config.json is reported as such, whatever drafter.draft_vocab asks of the directory
    (not as a model directory without token counts)."""
    save_student(tmp_path, init_student(target, [0]), layers=[0])
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    for draft_vocab in (8, 0):
        with pytest.raises(CheckpointError, match=r"config.json' (is not readable JSON|holds a JSON list).*restore it"):
            DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path), draft_vocab=draft_vocab),
                                          target=target)
    with pytest.raises(CheckpointError, match="restore it"):
        load_student(tmp_path, target)


def test_export_force_replaces_only_an_earlier_export(tmp_path, tiny_pair, capsys):
    """--force replaces a directory the export command wrote (config.json's specdec.exported_from), never a full
    model directory that merely has a config.json, nor the --model directory itself; a student whose config does
    not match its weights is named, and nothing is written."""
    from specdec.export import main

    model, tokenizer = tiny_pair
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    save_student(tmp_path / "student", trained_like(init_student(model, [0])), layers=[0])
    args = check_export_force("draft_model", tmp_path / "student", tmp_path, capsys)
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    (tmp_path / "student" / "config.json").write_text(json.dumps({**config, "intermediate_size": 24}))
    capsys.readouterr()
    assert main(args + [str(tmp_path / "new")]) == 2 and not (tmp_path / "new").exists()
    assert "has shape" in capsys.readouterr().err


def test_the_train_command_composes_and_runs_from_a_model_directory(tmp_path, tiny_pair):
    """What ``python -m specdec.train method=draft_model ...`` runs: the composed config (the method's YAML
    over its schema), the target loaded from a model directory, a few steps, the lean student."""
    from pathlib import Path

    from helpers import CHAT_TEMPLATE
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specdec.drafters.draft_model.student import is_student_dir
    from specdec.training.config import register_train_configs
    from specdec.training.trainer import train

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    register_train_configs()
    configs = Path(__file__).resolve().parents[2] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=[
            "method=draft_model", "method.layers=[0]", "method.loss=rkl", "method.chunk_len=32",
            f"target.name={tmp_path / 'target'}", f"output_dir={tmp_path / 'run'}", "data.num_prompts=4",
            "data.max_new_tokens=6", "data.batch_size=4", "eval.limit_per_source=1", "eval.max_new_tokens=4",
            "eval.text_sources=[]", "optim.epochs=1", "optim.batch_size=4", "optim.warmup_steps=1", "optim.lr=1e-3"]))
    assert cfg.method.name == "draft_model" and cfg.method.loss == "rkl" and cfg.method.eval_depth == 6
    assert cfg.target.name == str(tmp_path / "target")
    metrics = train(cfg)
    assert metrics["finished"] and metrics["score"] == metrics["eval"]["val"]["tau_chain"][-1]
    assert is_student_dir(tmp_path / "run") and (tmp_path / "run" / "metrics.json").is_file()


def test_training_runs_end_to_end_and_the_student_loads(tmp_path, tiny_pair):
    """python -m specdec.train method=draft_model on a tiny target: prompt positions and on-policy samples in
    the loss, held-out τ and acceptance per epoch, a lean student the drafter decodes exactly with."""
    from helpers import CHAT_TEMPLATE, tiny_config

    from specdec.training.methods.draft_model import DraftModelMethodConfig
    from specdec.training.trainer import train

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    cfg = tiny_config(tmp_path / "run")
    cfg.method = DraftModelMethodConfig(layers=[0], loss="tv", prompt_loss=True, chunk_len=32, on_policy_fraction=0.5,
                                        on_policy_tokens=4, eval_depth=3)
    cfg.eval_every_epoch = True
    cfg.optim.lr = 3e-3
    cfg.optim.epochs = 2
    cfg.export = str(tmp_path / "export")
    metrics = train(cfg, target=model, tokenizer=tokenizer)
    assert metrics["finished"] and len(metrics["per_epoch"]) == cfg.optim.epochs
    assert set(metrics["eval"]) >= {"val", "answers_mtbench"}
    assert len(metrics["eval"]["val"]["tau_chain"]) == 3 and 0 <= metrics["eval"]["val"]["accept_t1"] <= 1
    provenance = json.loads((tmp_path / "export" / "provenance.json").read_text())
    assert provenance["method"]["name"] == "draft_model"
    student = load_student(tmp_path / "export", model)
    drafter = DraftModelDrafter(student)
    ids = torch.tensor([[2, 4, 6, 7, 3, 2, 5]])
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    assert speculative_generate(model, drafter, ids, k=3, max_new_tokens=12, eos_token_id=[]).sequences == ref.sequences
    narrow = DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path / "export"), draft_vocab=16),
                                           target=model)  # the run wrote its token counts beside the student
    assert speculative_generate(model, narrow, ids, k=3, max_new_tokens=12, eos_token_id=[]).sequences == ref.sequences
    # the same student as a standalone transformers model: transformers' assisted generation takes it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export_hf(tmp_path / "hf", student, tokenizer)
    assistant = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").get_vocab() == tokenizer.get_vocab()
    plain = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0)
    assisted = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0,
                              assistant_model=assistant)
    assert torch.equal(assisted, plain) and plain[0, 7:].tolist() == ref.sequences[0]


def test_on_policy_examples_are_the_students_samples_scored_by_the_target(target):
    """on_policy_fraction=1: the whole batch is the student's continuations of training prompts, and its loss
    (against the target's distributions there, from one target forward) trains the student's layers."""
    from specdec.training.distill.answers import answer_sequences
    from specdec.training.methods.draft_model import DraftModelMethod, DraftModelMethodConfig
    from specdec.training.methods.draft_model.objective import sample_continuations, scored_pairs

    seqs = answer_sequences(target, [[3, 9, 4], [5, 6, 7, 8], [2, 2]], max_new_tokens=4, batch_size=3, pad_id=0)
    method = DraftModelMethod(DraftModelMethodConfig(layers=[0, 3], on_policy_fraction=1.0, on_policy_tokens=3,
                                                     chunk_len=16))
    student = method.setup(target, {"train": Split.of(seqs)}, torch.device("cpu"))
    loss, logged = method.loss(student, torch.tensor([0, 1]))
    assert set(logged) == {"on_policy_accept_t1", "on_policy_top1", "on_policy_positions"}
    assert logged["on_policy_positions"] == 2 * 3  # every sampled token is trained on (H_2 predicts the first)
    loss.backward()
    assert student.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    # the samples: the prompt then new tokens; the target's hidden state at each position, shifted by one
    sample = sample_continuations(student, [torch.tensor([3, 9, 4])], 3, torch.Generator().manual_seed(0))[0]
    assert sample[:3].tolist() == [3, 9, 4] and sample.numel() == 6
    _, x, hid, trained = scored_pairs(target, [sample], [3])[0]
    with torch.no_grad():
        assert torch.allclose(target.lm_head(hid[1:]), target(x[None, :-1]).logits[0], atol=1e-4)
    assert trained.tolist() == [False, False, False, True, True, True]


# --- draft length (confidence stop, heuristic schedule) and the restricted draft vocabulary -------------------


@pytest.mark.parametrize("options", [dict(confidence=0.9), dict(schedule="heuristic"),
                                     dict(vocab_ids=torch.arange(48)),
                                     dict(confidence=0.3, schedule="heuristic", vocab_ids=torch.arange(40, 64))],
                         ids=["confidence", "heuristic", "draft-vocab", "all"])
def test_adaptive_and_restricted_drafting_keep_greedy_output(target, options):
    student = trained_like(init_student(target, [0, 3]))
    prompts = torch.tensor([[1, 5, 7, 9, 3, 2, 8], [0, 0, 0, 4, 8, 6, 11]])
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    ref = autoregressive_generate(target, prompts, max_new_tokens=24, attention_mask=mask, eos_token_id=[])
    drafter = DraftModelDrafter(student, **options)
    out = speculative_generate(target, drafter, prompts, k=5, max_new_tokens=24, attention_mask=mask, eos_token_id=[])
    assert out.sequences == ref.sequences


@pytest.mark.parametrize("options", [dict(confidence=0.6), dict(schedule="heuristic"),
                                     dict(vocab_ids=torch.arange(48)),
                                     dict(confidence=0.5, schedule="heuristic", vocab_ids=torch.arange(16, 64))],
                         ids=["confidence", "heuristic", "draft-vocab", "all"])
def test_sampling_with_adaptive_and_restricted_drafting_is_exact(markov_target, options):
    from helpers import exact_verdict

    drafter = DraftModelDrafter(markov_draft(markov_target), **options)
    verdict, stats = exact_verdict(markov_target, drafter, 4)
    assert stats.mean_accepted_length > 1.3  # drafts are accepted often: the rule is really exercised
    assert not verdict.reject, verdict


def test_a_restricted_draft_that_misreports_q_is_caught(markov_target):
    """Power for the restricted head: a draft that samples from its N tokens but tells the verifier the whole
    vocabulary's softmax (the zeros off the N tokens forgotten) is rejected by the same test."""
    from helpers import exact_verdict

    from specdec.verify.sampling import logits_to_probs, sample

    class Misreported(DraftModelDrafter):
        def draw(self, logits, params, u):
            q = logits_to_probs(logits, params.temperature)
            full = logits_to_probs(self.full_head(self.last_hidden), params.temperature)
            return self.vocab_ids[sample(q, uniforms=u)], full

    draft = markov_draft(markov_target)
    drafter = Misreported(draft, vocab_ids=torch.arange(32))
    drafter.full_head = draft.lm_head
    decoder_forward = drafter.decoder.forward

    def forward(*args, **kwargs):  # keep the last hidden state for the misreported q
        logits, hidden = decoder_forward(*args, **kwargs)
        drafter.last_hidden = hidden[:, -1]
        return logits, hidden

    drafter.decoder.forward = forward
    verdict, _ = exact_verdict(markov_target, drafter, 4)
    assert verdict.reject, verdict


def test_confidence_stops_drafting_and_the_heuristic_moves_k(target):
    from types import SimpleNamespace

    student = trained_like(init_student(target, [0]), scale=0.3)
    ids = torch.tensor([[1, 5, 7, 9, 3, 2, 8]])
    eager = speculative_generate(target, DraftModelDrafter(student), ids, k=6, max_new_tokens=30, eos_token_id=[])
    sure = speculative_generate(target, DraftModelDrafter(student, confidence=0.99), ids, k=6, max_new_tokens=30,
                                eos_token_id=[])
    assert sure.sequences == eager.sequences
    assert sure.stats.proposed_tokens < eager.stats.proposed_tokens  # low-confidence drafts were not made
    drafter = DraftModelDrafter(student, schedule="heuristic")
    drafter.length, drafter.proposed = 4, 4
    drafter.observe(SimpleNamespace(num_accepted=torch.tensor([4, 1]), active=[True, False]))
    assert drafter.length == 6  # every active row kept every draft: +2 (capped at k when proposing)
    drafter.proposed = 6
    drafter.observe(SimpleNamespace(num_accepted=torch.tensor([5, 6]), active=[True, True]))
    assert drafter.length == 5
    for bad, match in [(dict(confidence=1.0), "drafter.confidence"), (dict(schedule="dynamic"), "drafter.schedule")]:
        with pytest.raises(ValueError, match=match):
            DraftModelDrafter(student, **bad)


def test_token_counts_give_the_draft_vocabulary(target, tmp_path):
    from specdec.drafters.draft_model.student import frequent_tokens, save_token_counts

    save_student(tmp_path, trained_like(init_student(target, [0, 3])), layers=[0, 3])
    cfg = DraftModelDrafter.Config(path=str(tmp_path), draft_vocab=8)
    with pytest.raises(CheckpointError, match="token counts"):
        DraftModelDrafter.from_config(cfg, target=target)
    counts = torch.zeros(64, dtype=torch.long)
    counts[[5, 9, 2, 40]] = torch.tensor([10, 30, 10, 1])
    save_token_counts(tmp_path, counts)
    assert frequent_tokens(tmp_path, 4).tolist() == [9, 2, 5, 40]  # by count, ties by id
    drafter = DraftModelDrafter.from_config(cfg, target=target)
    assert drafter.decoder.lm_head.out_features == 8 and drafter.vocab_ids[:4].tolist() == [9, 2, 5, 40]
    assert target.lm_head.out_features == 64  # the target's own head is untouched
    with pytest.raises(ValueError, match=r"draft_vocab=65 must be in \[1, 64\]"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(tmp_path), draft_vocab=65), target=target)
    with pytest.raises(ValueError, match="needs a distilled student's token counts"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path="target", draft_vocab=8), target=target)
    missing = tmp_path / "no-such-student"  # named as missing, not as a model without token counts
    with pytest.raises(FileNotFoundError, match=f"drafter.path='{missing}': no such directory"):
        DraftModelDrafter.from_config(DraftModelDrafter.Config(path=str(missing), draft_vocab=8), target=target)


def test_the_export_command_writes_a_transformers_directory_and_keeps_what_is_there(tmp_path, tiny_pair, capsys):
    from transformers import AutoModelForCausalLM

    from specdec.export import main

    model, tokenizer = tiny_pair
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    save_student(tmp_path / "student", trained_like(init_student(model, [0])), layers=[0])
    args = ["draft_model", "--model", str(tmp_path / "student"), "--target", str(tmp_path / "target"),
            "--out", str(tmp_path / "hf")]
    assert main(args) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([[3, 9, 4, 12]])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, load_student(tmp_path / "student", model)(ids).logits)
    assert main(args) == 2  # exists: refused without --force
    assert main(args + ["--force"]) == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    assert main(args[:-1] + [str(tmp_path / "notes"), "--force"]) == 2  # not an export: left alone
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"
    assert main(["draft_model", "--model", str(tmp_path / "nowhere"), "--target", str(tmp_path / "target"),
                 "--out", str(tmp_path / "x")]) == 2 and not (tmp_path / "x").exists()
    capsys.readouterr()
    assert main(["draft_model", "--model", str(tmp_path / "target"), "--target", str(tmp_path / "target"),
                 "--out", str(tmp_path / "x")]) == 2 and not (tmp_path / "x").exists()  # a directory of another kind
    error = capsys.readouterr().err
    assert "holds no distilled draft model" in error and "pass --model a directory written by" in error, error


# --- the shipped student on the real default target ---------------------------------------------------------


def test_shipped_student_exists_lean_with_provenance():
    from specdec.drafters.draft_model.student import default_student_path, is_student_dir

    path = default_student_path()
    assert is_student_dir(path), "shipped draft model missing: run the command in its provenance.json"
    provenance = json.loads((path / "provenance.json").read_text())
    for key in ("command", "data", "git_commit", "metrics", "date", "wall_time_s"):
        assert key in provenance
    assert provenance["metrics"]["per_epoch"], "held-out τ per epoch"
    assert (path / "model.safetensors").stat().st_size < 40_000_000 and (path / "token_counts.safetensors").is_file()
    assert json.loads((path / "config.json").read_text())["specdec"]["target_vocab_size"] == 49152


@pytest.mark.real_model
@pytest.mark.parametrize("cfg", [DraftModelDrafter.Config(k=3), DraftModelDrafter.Config(k=4, draft_vocab=8192),
                                 DraftModelDrafter.Config(k=6, confidence=0.4, schedule="heuristic")],
                         ids=["default", "draft-vocab", "adaptive"])
def test_shipped_student_greedy_equals_plain_decoding_on_real_target(real_target, real_prompts, cfg):
    tau = shipped_drafter_taus(real_target, real_prompts, cfg)
    assert min(tau) > 1.1, tau  # a trained draft is accepted (the untrained early exit gives ~1.0)


def test_a_draft_model_at_a_fixed_length_read_a_step_late_equals_the_loop_that_reads_each_step(target, monkeypatch):
    """A draft model drafting k tokens every step (no confidence floor, no schedule) proposes from the device alone
    (``traits.device_only``), so on a GPU each step is read back after the next is launched: the outputs and counts of
    the loop that reads every step, greedy (plain decoding's output), with an EOS, and sampled, batch 2 left-padded."""
    from helpers import check_read_late_as_each_step

    drafter = DraftModelDrafter(target, num_layers=1)
    assert drafter.traits.device_only
    assert not DraftModelDrafter(target, num_layers=1, confidence=0.3).traits.device_only
    assert not DraftModelDrafter(target, num_layers=1, schedule="heuristic").traits.device_only
    prompts = torch.tensor([[1, 5, 7, 9, 3, 2, 8], [0, 0, 0, 4, 8, 6, 11]])
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    check_read_late_as_each_step(monkeypatch, target, drafter, prompts, mask, 3)
