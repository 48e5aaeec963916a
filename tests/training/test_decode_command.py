"""A trained drafter of each method decodes with the command its training printed: ``python -m specdec.train``
(its entry function, on the tiny target) ends with ``python -m specdec.run drafter=<method> drafter.path=<what it
wrote> ...``, and the main job composed from exactly those overrides decodes greedily as plain decoding does."""

from __future__ import annotations

import shlex

import pytest
from helpers import CHAT_TEMPLATE, CONFIGS, tiny_config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import specdec.jobs.job
import specdec.run as run_job
from specdec.config import register_configs
from specdec.drafters import DRAFTERS, drafter_config
from specdec.models import loading
from specdec.training.methods import METHODS


def method_config(name: str):
    """Each method's smallest settings that train in seconds on the tiny target (34 tokens, hidden 16, 1 layer)."""
    from specdec.training.methods.dflash import DFlashMethodConfig
    from specdec.training.methods.draft_model import DraftModelMethodConfig
    from specdec.training.methods.eagle import EagleMethodConfig
    from specdec.training.methods.medusa import MedusaMethodConfig

    return {"medusa": MedusaMethodConfig(num_heads=3, tree_nodes=5, draft_vocab=None),
            "eagle": EagleMethodConfig(aux_layers=[0, 0, 0], draft_vocab=20, ttt_steps=2, chunk_len=32, eval_depth=3),
            "draft_model": DraftModelMethodConfig(layers=[0], chunk_len=32, eval_depth=3),
            "dflash": DFlashMethodConfig(aux_layers=[0, 0, 0], num_layers=1, block_size=4, draft_vocab=20, anchors=4,
                                         chunk_len=32, tree_nodes=4, max_rank=3)}[name]


def test_every_training_method_trains_a_registered_drafter():
    assert set(METHODS) <= set(DRAFTERS)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_trained_drafter_decodes_with_the_command_its_training_printed(method, tiny_pair, tmp_path, monkeypatch,
                                                                         capsys):
    from specdec.train import main as train_main

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    cfg = tiny_config(tmp_path / "run")
    cfg.method, cfg.optim.epochs, cfg.export = method_config(method), 1, str(tmp_path / "export")
    monkeypatch.setattr(loading, "load_target", lambda name, **_: (model, tokenizer))  # the trainer's target
    train_main(OmegaConf.structured(cfg))
    printed = capsys.readouterr().out
    command = shlex.split(printed.split("decode with what this run wrote:\n")[1].splitlines()[0])
    assert command[:3] == ["python", "-m", "specdec.run"]
    assert f"drafter={method}" in command and f"drafter.path={tmp_path / 'export'}" in command
    assert "target.name=tiny" in command  # the run's target, which is not the default

    def load_tiny(name, **_):
        assert name == "tiny"
        return model, tokenizer

    monkeypatch.setattr(specdec.jobs.job, "load_target", load_tiny)  # the main job's target
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):  # the printed overrides, then a budget
        # a fixed k (no k=auto calibration): the one the command names (a trained tree's size), else the preset's
        named = any(o.startswith("drafter.k=") for o in command[3:])
        preset = [] if named else [f"drafter.k={drafter_config(method).k}"]
        run_cfg = compose("run", overrides=[*command[3:], "data.sources=[mtbench]", "data.limit_per_source=2",
                                            "data.max_new_tokens=8", "warmup=false", *preset])
    results = run_job.run(run_cfg)
    assert results["drafter"] == method and results["greedy_mismatches"] == 0 and results["drafter_forwards"] > 0


def test_the_command_names_the_targets_preset_and_completion_prompts_for_a_base_model():
    """Gemma-3-270M (a base model) decodes as ``target=gemma3 data=code_text``: its preset, and prompts it can take
    (chat sources refuse a tokenizer without a chat template); a target without a preset keeps its name."""
    from types import SimpleNamespace

    from specdec.training.trainer import decode_command

    method = SimpleNamespace(name="eagle", decode_overrides=lambda metrics: [])
    run = lambda name: SimpleNamespace(export="out", output_dir="o", target=SimpleNamespace(name=name))  # noqa: E731
    assert decode_command(run("gemma3-270m"), method, {}, chat=False).split()[3:] == [
        "drafter=eagle", "drafter.path=out", "target=gemma3", "data=code_text"]
    assert decode_command(run("my/model"), method, {}).split()[5:] == ["target.name=my/model"]
    assert decode_command(run("smollm2-135m"), method, {}).split()[5:] == []
