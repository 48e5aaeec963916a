"""Training Medusa heads through the training package on a tiny model: labels line up, the run finishes and
exports, an interrupted run resumes to exactly the weights of an uninterrupted one, checkpoints are atomic,
files of another format or configuration are refused, configs compose."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import CHAT_TEMPLATE, CONFIGS, TRAIN_WORDS, tiny_config
from safetensors.torch import load_file

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.medusa import MedusaDrafter, MedusaHeads, load_heads
from specdec.errors import CheckpointError
from specdec.training import checkpoint
from specdec.training import export as export_module
from specdec.training.checkpoint import load_checkpoint, save_checkpoint
from specdec.training.config import TrainConfig
from specdec.training.distill import prompts, store
from specdec.training.distill.prompts import magpie_prompts
from specdec.training.distill.vocab import IGNORE, draft_vocabulary, to_draft_labels
from specdec.training.export import export
from specdec.training.methods.medusa import MedusaMethodConfig
from specdec.training.methods.medusa.objective import (
    head_labels, medusa_loss, soft_targets, tree_from_ranks, with_previous_token)
from specdec.training.trainer import check_config, train


def test_head_labels_shift_by_head():
    tokens = torch.tensor([10, 11, 12, 13, 14, 20, 21, 30])  # three sequences back to back: 5, 2 and 1 tokens
    rows, labels = head_labels(tokens, torch.tensor([5, 2, 1]), num_heads=3)
    assert rows.tolist() == [0, 1, 2, 3, 5]  # each sequence's last position has no label for head 0
    assert labels.tolist() == [[11, 12, 13], [12, 13, 14], [13, 14, IGNORE], [14, IGNORE, IGNORE],
                               [21, IGNORE, IGNORE]]


def test_loss_weights_heads_and_ignores_missing_labels():
    logits = torch.zeros(2, 2, 4)
    labels = torch.tensor([[1, IGNORE], [2, IGNORE]])
    total, per_head = medusa_loss(logits, labels, head_decay=0.5)
    assert per_head[1] == 0.0 and abs(float(total) - torch.log(torch.tensor(4.0)).item()) < 1e-6


def test_tree_from_ranks_orders_paths_by_frequency_parents_first():
    ranks = torch.tensor([[0, 0, 1], [0, 0, -1], [1, 0, 0], [0, 2, 0], [-1, 0, 0]])
    labels = torch.zeros_like(ranks)
    paths, tau = tree_from_ranks(ranks, labels, num_nodes=4)
    assert paths == [[0], [0, 0], [1], [0, 2]]
    assert tau == pytest.approx([1.6, 2.0, 2.2, 2.4])  # 1 + (3, 2, 1, 1 accepted of 5) cumulated / 5


def test_training_finishes_exports_and_heads_load(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.export, cfg.export_dtype = str(tmp_path / "export"), "float16"
    metrics = train(cfg, model, tokenizer)
    assert metrics["finished"] and metrics["step"] == metrics["total_steps"] > 0
    for split in ("val", "answers_mtbench", "answers_humaneval", "text_wikipedia"):
        assert len(metrics["eval"][split]["top1"]) == 3 and metrics["eval"][split]["positions"] > 0
        assert len(metrics["eval"][split]["expected_tau_greedy"]) == len(metrics["tree"])  # the val tree, there
    assert metrics["eval"]["val"]["expected_tau_greedy"] == metrics["expected_tau_greedy"]
    heads, meta = load_heads(tmp_path / "export" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    assert meta["tree"] == metrics["tree"] and heads.num_heads == 3
    trained, _ = load_heads(tmp_path / "run" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    stored = load_file(str(tmp_path / "export" / "heads.safetensors"))
    assert stored["blocks.0.linear.weight"].dtype == torch.float16 and heads.blocks[0].linear.weight.dtype == torch.float32
    assert torch.allclose(heads.blocks[0].linear.weight, trained.blocks[0].linear.weight, atol=1e-3)
    provenance = json.loads((tmp_path / "export" / "provenance.json").read_text())
    assert {"command", "config", "git_commit", "machine", "data", "wall_time_s", "metrics", "date"} <= set(provenance)
    assert provenance["command"].startswith("python -m specdec.train") and provenance["method"]["name"] == "medusa"
    assert provenance["data"]["size"]["train"]["tokens"] > 0 and provenance["wall_time_s"]["train_s"] > 0
    assert provenance["data"]["processes"] == metrics["data_processes"] == 1  # the processes that built the data
    assert provenance["git_commit"] == metrics["git_commit"]  # the code training ran, taken when it started
    assert not any(p.suffix == ".pkl" or p.name.endswith(".pt") for p in (tmp_path / "run").rglob("*"))
    prompts = [json.loads(line) for line in (tmp_path / "run" / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == cfg.data.num_prompts and all(p["text"] for p in prompts)  # what the heads learned from


def test_draft_vocabulary_keeps_the_most_frequent_labels():
    labels = torch.tensor([[5, 5], [5, 7], [7, IGNORE], [2, 9]])
    ids = draft_vocabulary(labels, vocab_size=10, size=2)
    assert ids.tolist() == [5, 7]
    assert draft_vocabulary(labels, 10, None) is None and draft_vocabulary(labels, 10, 10) is None
    assert to_draft_labels(labels, ids, 10).tolist() == [[0, 0], [0, 1], [1, IGNORE], [IGNORE, IGNORE]]


def test_training_with_a_draft_vocabulary_decodes_exactly(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.method.draft_vocab = 12
    metrics = train(cfg, model, tokenizer)
    assert metrics["draft_vocab_size"] == 12
    assert all(0 < split["in_draft_vocab"] <= 1 for split in metrics["eval"].values())
    heads, meta = load_heads(tmp_path / "run" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    assert heads.token_ids.numel() == 12 == meta["draft_vocab_size"]
    ids = torch.tensor([[2, 3, 4, 5]])
    reference = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    drafter = MedusaDrafter(heads, model.lm_head.weight, metrics["tree"])
    out = speculative_generate(model, drafter, ids, k=len(metrics["tree"]), max_new_tokens=12, eos_token_id=[])
    assert out.sequences == reference.sequences


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_before_any_work(tiny_pair, tmp_path):
    labels = torch.tensor([[5, 5], [5, 7]])
    with pytest.raises(ValueError, match=r"method.draft_vocab=11 must be null \(the whole vocabulary\) or in "
                                         r"\[1, 10\]"):
        draft_vocabulary(labels, vocab_size=10, size=11)
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run", draft_vocab=len(TRAIN_WORDS) + 1)
    with pytest.raises(ValueError, match=r"method.draft_vocab=35 .*\[1, 34\]: the target's vocabulary has 34 tokens"):
        train(cfg, model, tokenizer)
    assert not (tmp_path / "run" / "data.safetensors").exists()


def test_interrupted_run_resumes_to_identical_weights(tiny_pair, tmp_path, monkeypatch):
    model, tokenizer = tiny_pair
    straight = train(tiny_config(tmp_path / "straight"), model, tokenizer)

    cfg = tiny_config(tmp_path / "resumed")
    cfg.stop_after_steps = 3  # "interrupted" after 3 steps, between two regular checkpoints (every 2)
    partial = train(cfg, model, tokenizer)
    assert not partial["finished"] and partial["step"] == 3
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text() == "step-3"  # saved on the way out

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the data cache should have been reused")

    monkeypatch.setattr(store, "build_splits", no_rebuild)
    state_file = tmp_path / "resumed" / "checkpoints" / "step-3" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["train_s"] == pytest.approx(partial["times_s"]["train_s"], abs=1.0)
    state["train_s"] = 1000.0  # as if the first invocation had trained for long: the resumed total must include it
    state_file.write_text(json.dumps(state))
    cfg.stop_after_steps = 2  # interrupted a second time, at step 5
    again = train(cfg, model, tokenizer)
    assert again["step"] == 5 and (tmp_path / "resumed" / "checkpoints" / "latest").read_text() == "step-5"
    assert again["times_s"]["resumed_at_step"] == 3 and again["times_s"]["train_s"] > 1000.0
    assert straight["total_steps"] > 5
    cfg.stop_after_steps = None
    resumed = train(cfg, model, tokenizer)
    assert resumed["finished"] and resumed["total_steps"] == straight["total_steps"]
    a, _ = load_heads(tmp_path / "straight" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    b, _ = load_heads(tmp_path / "resumed" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    assert resumed["eval"] == straight["eval"]
    # the times cover the whole run, not the last invocation: training time adds up over the interruption
    assert resumed["times_s"]["resumed_at_step"] == 5 and "resumed_at_step" not in straight["times_s"]
    assert resumed["times_s"]["train_s"] > again["times_s"]["train_s"] > 1000.0 and partial["times_s"]["train_s"] > 0
    assert resumed["times_s"]["data_build_s"] == partial["times_s"]["data_build_s"] > 0  # from the cache


def test_held_out_figures_after_every_epoch_survive_an_interruption(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "plain")
    plain = train(cfg, model, tokenizer)
    cfg = tiny_config(tmp_path / "every")
    cfg.eval_every_epoch, cfg.stop_after_steps = True, plain["total_steps"] // 3 + 1  # past the first epoch
    partial = train(cfg, model, tokenizer)
    assert [e["epoch"] for e in partial["per_epoch"]] == [1]
    cfg.stop_after_steps = None
    every = train(cfg, model, tokenizer)
    assert [e["epoch"] for e in every["per_epoch"]] == [1, 2, 3] and "per_epoch" not in plain
    assert every["per_epoch"][0] == partial["per_epoch"][0]  # kept in the checkpoint across the interruption
    assert every["per_epoch"][-1]["score"] == every["score"] == plain["score"]  # evaluating changes no weight
    assert every["eval"] == plain["eval"]


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    heads = MedusaHeads(8, 12, 2)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=0.1)
    heads(torch.randn(3, 8), torch.randn(12, 8)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path, 1, heads, optimizer, {})
    saved = {k: v.clone() for k, v in heads.state_dict().items()}

    def crash(*args, **kwargs):
        raise OSError("disk full")

    with torch.no_grad():
        heads.blocks[0].linear.weight.add_(1.0)
    monkeypatch.setattr(checkpoint, "save_file", crash)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, heads, optimizer, {})
    fresh = MedusaHeads(8, 12, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    assert load_checkpoint(tmp_path, fresh, fresh_opt) == 1  # the crash left step 1 intact and current
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, saved[name])
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].abs().sum() > 0


def _checkpointed_heads(directory: Path, steps: tuple[int, ...] = (1,)) -> tuple[MedusaHeads, torch.optim.Optimizer]:
    heads = MedusaHeads(8, 12, 2)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=0.1)
    heads(torch.randn(3, 8), torch.randn(12, 8)).sum().backward()
    optimizer.step()
    for step in steps:
        save_checkpoint(directory, step, heads, optimizer, {})
    return heads, optimizer


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, named", [
    (lambda step: _truncate(step / "model.safetensors"), "step-1/model.safetensors"),
    (lambda step: _truncate(step / "optimizer.safetensors"), "step-1/optimizer.safetensors"),
    (lambda step: (step / "state.json").write_text('{"format": "specdec-tr'), "step-1/state.json"),
    (lambda step: (step / "state.json").write_text("[]"), "step-1/state.json"),
    (lambda step: shutil.rmtree(step), "checkpoints/latest' names the checkpoint .*step-1"),
], ids=["model", "optimizer", "state-json", "state-not-object", "latest-to-missing"])
def test_a_damaged_checkpoint_is_named_with_a_remedy_that_works(tmp_path, damage, named):
    """save_checkpoint prunes older steps, so the remedy for the only checkpoint is to start over (the data
    kept), and doing what the error says lets the run start."""
    heads, optimizer = _checkpointed_heads(tmp_path)
    damage(tmp_path / "checkpoints" / "step-1")
    root = tmp_path / "checkpoints"
    with pytest.raises(CheckpointError, match=f"{named}.*no other checkpoint is left: delete '{re.escape(str(root))}' "
                                              f"to start the run over .*data.safetensors', is kept"):
        load_checkpoint(tmp_path, heads, optimizer)
    shutil.rmtree(root)
    assert load_checkpoint(tmp_path, heads, optimizer) == 0


def test_a_damaged_checkpoint_names_the_older_one_left_and_resumes_from_it(tmp_path):
    _checkpointed_heads(tmp_path / "old")
    heads, optimizer = _checkpointed_heads(tmp_path, steps=(2,))
    shutil.copytree(tmp_path / "old" / "checkpoints" / "step-1", tmp_path / "checkpoints" / "step-1")  # a crash
    _truncate(tmp_path / "checkpoints" / "step-2" / "model.safetensors")  # between publishing and pruning
    root = tmp_path / "checkpoints"
    remedy = (f"resume from '{root / 'step-1'}' instead, delete '{root / 'step-2'}' and write 'step-1' into "
              f"'{root / 'latest'}'")
    with pytest.raises(CheckpointError, match=re.escape(remedy)):
        load_checkpoint(tmp_path, heads, optimizer)
    shutil.rmtree(root / "step-2")
    (root / "latest").write_text("step-1")
    assert load_checkpoint(tmp_path, heads, optimizer) == 1


def test_data_cache_from_another_config_is_refused(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.stop_after_steps = 0
    train(cfg, model, tokenizer)
    cfg.data.max_new_tokens = 12
    with pytest.raises(ValueError, match="another configuration"):
        train(cfg, model, tokenizer)


def test_data_and_checkpoints_of_the_old_train_medusa_are_refused(tiny_pair, tmp_path):
    from safetensors.torch import save_file

    model, tokenizer = tiny_pair
    old = tmp_path / "old"
    old.mkdir()
    save_file({"train.hidden": torch.zeros(2, 16), "train.labels": torch.zeros(2, 3, dtype=torch.long)},
              str(old / "data.safetensors"), metadata={"fingerprint": "{}", "build_s": "1.0"})
    with pytest.raises(ValueError, match="data.safetensors.*specdec.train_medusa.*move or delete"):
        train(tiny_config(old), model, tokenizer)
    cfg = tiny_config(tmp_path / "run")
    cfg.stop_after_steps = 0
    train(cfg, model, tokenizer)  # the data only
    step = tmp_path / "run" / "checkpoints" / "step-2"
    step.mkdir(parents=True)
    (step / "state.json").write_text(json.dumps({"step": 2, "param_groups": [], "run": {}, "train_s": 1.0}))
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-2")
    with pytest.raises(ValueError, match="step-2.*specdec.train_medusa.*delete"):
        train(cfg, model, tokenizer)


def test_resuming_with_another_training_config_is_refused(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.stop_after_steps = 1
    train(cfg, model, tokenizer)
    cfg.optim.lr = 0.5
    with pytest.raises(ValueError, match="another training configuration"):
        train(cfg, model, tokenizer)
    cfg.optim.lr, cfg.method.head_decay = tiny_config(tmp_path).optim.lr, 0.5
    with pytest.raises(ValueError, match="another training configuration"):
        train(cfg, model, tokenizer)


def test_a_run_stopped_by_its_wall_limit_resumes_to_the_uninterrupted_weights(tiny_pair, tmp_path, monkeypatch):
    """stop_after_s (experiments/gpu/train.sh's budget): the run stops at a step boundary with a checkpoint there, and
    resuming it where its data had to be built again (a fresh GPU machine: data.safetensors gone) ends on the weights
    of a run never stopped; the checkpoint records the data's configuration, and data configured otherwise is
    refused."""
    from specdec.training import loop

    model, tokenizer = tiny_pair
    straight = train(tiny_config(tmp_path / "straight"), model, tokenizer)
    cfg = tiny_config(tmp_path / "run")
    cfg.stop_after_s = 0.0  # past at once: the data are built, nothing is trained
    assert train(cfg, model, tokenizer)["step"] == 0 and not (tmp_path / "run" / "checkpoints").exists()
    calls = []
    monkeypatch.setattr(loop, "_past", lambda deadline, accelerator: calls.append(deadline) or len(calls) > 3)
    cfg.stop_after_s = 60.0  # "past" after 3 steps (between two regular checkpoints, every 2)
    stopped = train(cfg, model, tokenizer)
    assert not stopped["finished"] and stopped["step"] == 3
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step-3"
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "state.json").read_text())
    assert len(state["data"]) == 16
    monkeypatch.undo()
    (tmp_path / "run" / "data.safetensors").unlink()
    other = copy.deepcopy(cfg)
    other.data.max_new_tokens += 1
    with pytest.raises(CheckpointError, match="trained on data configured otherwise"):
        train(other, model, tokenizer)
    assert not (tmp_path / "run" / "data.safetensors").exists()  # refused before the data were built
    cfg.stop_after_s = None
    resumed = train(cfg, model, tokenizer)
    assert resumed["finished"] and resumed["times_s"]["resumed_at_step"] == 3
    a, _ = load_heads(tmp_path / "straight" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    b, _ = load_heads(tmp_path / "run" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    assert resumed["eval"] == straight["eval"]


def test_training_runs_on_the_device_target_device_names(tiny_pair, tmp_path):
    """target.device decides where training runs (it was ignored: a GPU machine trained on its GPU whatever it said);
    cuda without a GPU is refused before any work; auto follows a target already loaded."""
    from specdec.training.trainer import train_device

    model, tokenizer = tiny_pair
    assert train_device("cpu") == torch.device("cpu") and train_device("auto", model) == model.device
    if not torch.cuda.is_available():
        cfg = tiny_config(tmp_path / "run")
        cfg.target.device = "cuda"
        with pytest.raises(ValueError, match="target.device='cuda' but"):
            train(cfg, model, tokenizer)
        assert not (tmp_path / "run" / "data.safetensors").exists()
    cfg = tiny_config(tmp_path / "cpu")
    cfg.target.device, cfg.optim.epochs = "cpu", 1
    assert train(cfg, model, tokenizer)["device"] == "cpu"


def test_config_composes_with_hydra():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specdec.training.config import register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["data.mode=text", "optim.epochs=1", "logger=wandb", "method.num_heads=2"])
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig) and obj.data.mode == "text" and obj.logger.mode == "offline"
    assert isinstance(obj.method, MedusaMethodConfig) and obj.method.num_heads == 2
    assert obj.output_dir == "outputs/train/medusa/smollm2-135m"


# Each is a process that imports the training stack (~14 s here): the alias is opt-in (`-m slow`).
@pytest.mark.parametrize("module", ["specdec.train", pytest.param("specdec.train_medusa", marks=pytest.mark.slow)])
def test_entry_point_and_its_alias_compose_the_same_config(module):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", module, "--cfg", "job", "--resolve", "method.num_heads=2"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    assert "name: medusa" in out and "num_heads: 2" in out and "output_dir: outputs/train/medusa/smollm2-135m" in out


def test_magpie_prompts_are_the_targets_own_user_turns(tiny_pair):
    model, tokenizer = tiny_pair
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    rows = magpie_prompts(model, chat, 5, seed=3, batch_size=16, max_tokens=32)
    texts = [r["text"] for r in rows]
    assert len(texts) == 5 and len(set(texts)) == 5 and all(r["kind"] == "chat" for r in rows)
    assert not any("<|im_end|>" in t or "<|im_start|>" in t for t in texts)  # one user turn each, cut at its end
    assert all(len(t.split()) >= 6 for t in texts)
    assert texts == [r["text"] for r in magpie_prompts(model, chat, 5, seed=3, batch_size=16, max_tokens=32)]


def test_magpie_prompts_drop_queries_overlapping_a_benchmark(tiny_pair, monkeypatch):
    model, tokenizer = tiny_pair
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    first = [r["text"] for r in magpie_prompts(model, chat, 3, seed=3, batch_size=16, max_tokens=32)]
    monkeypatch.setattr(prompts, "_ngrams", lambda text, n=8: {text})  # a whole query as its "n-gram"
    monkeypatch.setattr(prompts, "benchmark_ngrams", lambda n=8: {first[0]})  # ... found in a benchmark
    again = [r["text"] for r in magpie_prompts(model, chat, 3, seed=3, batch_size=16, max_tokens=32)]
    assert first[0] not in again and again[:2] == first[1:]


def test_magpie_prompts_need_a_chat_template(tiny_pair):
    model, tokenizer = tiny_pair
    with pytest.raises(ValueError, match="magpie_fraction=0"):
        magpie_prompts(model, tokenizer, 4, seed=0)


def test_magpie_fraction_out_of_range_is_refused(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.data.magpie_fraction = 1.5
    with pytest.raises(ValueError, match="magpie_fraction must be in"):
        train(cfg, model, tokenizer)
    assert not (tmp_path / "run" / "data.safetensors").exists()


@pytest.mark.parametrize("field, value, message", [
    ("optim.lr", -1.0, "optim.lr must be > 0, got -1.0"),
    ("optim.epochs", 0, "optim.epochs must be an integer >= 1, got 0"),
    ("optim.batch_size", 0, "optim.batch_size must be an integer >= 1"),
    ("optim.weight_decay", -0.1, "optim.weight_decay must be >= 0"),
    ("data.num_prompts", 0, "data.num_prompts must be an integer >= 1"),
    ("data.val_fraction", 1.0, r"data.val_fraction must be in \[0, 1\)"),
    ("save_every", 0, "save_every must be an integer >= 1"),
    ("stop_after_steps", -1, "stop_after_steps must be null"),
])
def test_bad_training_values_are_refused_before_any_work(tiny_pair, tmp_path, field, value, message):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    section, _, name = field.rpartition(".")
    setattr(getattr(cfg, section) if section else cfg, name, value)
    with pytest.raises(ValueError, match=message):
        train(cfg, model, tokenizer)
    assert not (tmp_path / "run").exists()


def test_bad_export_dtype_is_refused_before_any_work(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.export, cfg.export_dtype = str(tmp_path / "export"), "float17"
    with pytest.raises(ValueError, match="export_dtype='float17'"):
        train(cfg, model, tokenizer)
    assert not (tmp_path / "run" / "data.safetensors").exists() and not (tmp_path / "export").exists()


class _FileMethod:
    """What export asks of a method, writing ``model`` (a string) as its weight file."""

    name, description, reference, weights_file = "file", "a text file", "", "weights.txt"

    def save(self, model, path, target_name, metrics, dtype=None):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(model)


def test_an_export_of_another_run_is_refused_before_any_work(tiny_pair, tmp_path):
    """export= holding another run's weights + provenance.json: refused before the data are built, and again
    at export time; the same run re-exports there, and a new or unrelated directory takes an export."""
    model, tokenizer = tiny_pair
    first = tiny_config(tmp_path / "first")
    first.export = str(tmp_path / "export")
    export(Path(first.export), _FileMethod(), "first's", first, {"times_s": {}}, {})
    assert json.loads((tmp_path / "export" / "provenance.json").read_text())["output_dir"] == str(tmp_path / "first")
    second = tiny_config(tmp_path / "second")
    second.export, second.seed = first.export, 1
    message = re.escape(f"export='{tmp_path / 'export'}' already holds the export of another run (output_dir="
                        f"'{tmp_path / 'first'}', run_name='smollm2-135m')") + ".*another export= directory, or delete"
    with pytest.raises(ValueError, match=message):
        train(second, model, tokenizer)
    assert not (tmp_path / "second" / "data.safetensors").exists()
    with pytest.raises(ValueError, match=message):
        export(Path(second.export), _FileMethod(), "second's", second, {"times_s": {}}, {})
    assert (tmp_path / "export" / "weights.txt").read_text() == "first's"
    export(Path(first.export), _FileMethod(), "first's again", first, {"times_s": {}}, {})  # the same run
    assert (tmp_path / "export" / "weights.txt").read_text() == "first's again"
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "notes.txt").write_text("mine")
    for directory in ("new", "unrelated"):
        second.export = str(tmp_path / directory)
        check_config(second)
        export(Path(second.export), _FileMethod(), "second's", second, {"times_s": {}}, {})
        assert (tmp_path / directory / "weights.txt").read_text() == "second's"
    assert (tmp_path / "unrelated" / "notes.txt").read_text() == "mine"
    (tmp_path / "export" / "provenance.json").write_text('{"config": ')
    second.export = first.export
    with pytest.raises(ValueError, match="provenance.json that cannot be read"):
        check_config(second)


def test_a_failed_export_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path / "run")
    export(tmp_path / "export", _FileMethod(), "old", cfg, {"times_s": {}, "score": 1.0}, {})

    def crash(path, obj):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "write_json", crash)
    with pytest.raises(OSError, match="disk full"):
        export(tmp_path / "export", _FileMethod(), "new", cfg, {"times_s": {}, "score": 2.0}, {})
    assert (tmp_path / "export" / "weights.txt").read_text() == "old"  # weights and provenance still a pair
    assert json.loads((tmp_path / "export" / "provenance.json").read_text())["metrics"]["score"] == 1.0
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["provenance.json", "weights.txt"]


def test_soft_targets_are_the_targets_distribution_over_each_label():
    torch.manual_seed(0)
    hidden, weight = torch.randn(6, 8), torch.randn(5, 8)  # one sequence of 6 rows, 5-token vocabulary
    greedy = (hidden @ weight.t()).argmax(-1)  # row s predicted token s
    _, labels = head_labels(greedy, torch.tensor([6]), num_heads=2)  # [5, 2]: head i at row r = token r + 1 + i
    labels[2, 1] = (labels[2, 1] + 1) % 5  # a label the target did not predict: the one-hot stays
    targets = soft_targets(hidden[:5], torch.arange(5), labels, weight)
    probs = (hidden @ weight.t()).softmax(-1)
    assert torch.allclose(targets[0, 0], probs[1]) and torch.allclose(targets[0, 1], probs[2])
    assert torch.equal(targets[2, 1], torch.nn.functional.one_hot(labels[2, 1], 5).float())
    assert torch.equal(targets[4, 0], torch.nn.functional.one_hot(labels[4, 0], 5).float())  # row 5 was dropped
    assert labels[4, 1] == IGNORE and targets[4, 1].sum() == 1  # no label: ignored by the loss


def test_loss_with_one_hot_targets_is_the_cross_entropy():
    torch.manual_seed(1)
    logits, labels = torch.randn(4, 2, 6), torch.tensor([[1, 2], [3, IGNORE], [0, 5], [2, IGNORE]])
    onehot = torch.nn.functional.one_hot(labels.clamp(min=0), 6).float()
    hard, per_hard = medusa_loss(logits, labels, 0.8)
    soft, per_soft = medusa_loss(logits, labels, 0.8, onehot)
    assert torch.allclose(hard, soft) and per_hard == pytest.approx(per_soft)


def test_training_with_soft_labels_learns_other_weights(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    soft = train(tiny_config(tmp_path / "soft", soft_labels=True), model, tokenizer)
    hard = train(tiny_config(tmp_path / "hard"), model, tokenizer)
    assert soft["finished"] and hard["finished"]
    a, _ = load_heads(tmp_path / "soft" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    b, _ = load_heads(tmp_path / "hard" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    assert not torch.equal(a.blocks[0].linear.weight, b.blocks[0].linear.weight)


def test_generated_prompts_sharing_8_words_with_a_benchmark_prompt_are_caught():
    from specdec.jobs.data import load_prompts
    from specdec.training.distill.prompts import _ngrams, benchmark_ngrams

    forbidden = benchmark_ngrams()
    question = load_prompts("mtbench", limit=1)[0]["text"]
    assert forbidden & _ngrams("Sure! " + question + " Thanks.")
    assert not forbidden & _ngrams("Can you suggest a YouTube channel about sustainable food production without plastic?")


def test_with_previous_token_skips_each_answers_first_row():
    _, labels = head_labels(torch.tensor([10, 11, 12, 13, 20, 21, 22, 23]), torch.tensor([4, 4]), num_heads=2)
    h, tokens = with_previous_token(torch.arange(6, dtype=torch.float32)[:, None], labels)  # rows 0-2, 3-5
    assert h[:, 0].tolist() == [1, 2, 4, 5]  # rows 0 and 3 open an answer: their emitted token is not cached
    assert tokens.tolist() == [[11, 12, 13], [12, 13, IGNORE], [21, 22, 23], [22, 23, IGNORE]]


def test_token_aware_training_decodes_exactly(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "run")
    cfg.method.token_aware = True
    metrics = train(cfg, model, tokenizer)
    assert metrics["finished"] and metrics["eval"]["val"]["positions"] > 0
    heads, meta = load_heads(tmp_path / "run" / "heads.safetensors", hidden_size=16, vocab_size=len(TRAIN_WORDS))
    assert heads.token_aware and meta["token_aware"]
    ids = torch.tensor([[6, 7, 8, 9]])
    reference = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    tree = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]  # fixed: the tiny run's val split may leave its own tree empty
    drafter = MedusaDrafter(heads, model.lm_head.weight, tree, embed_weight=model.get_input_embeddings().weight)
    out = speculative_generate(model, drafter, ids, k=len(tree), max_new_tokens=12, eos_token_id=[])
    assert out.sequences == reference.sequences
