"""One name for where a drafter's weights are: ``drafter.path`` (EAGLE's, Medusa's heads, the draft model), on the
command line without a ``+`` and from Python; the old names (Medusa's ``heads``, the draft model's ``model``) still
work, with a note, and read as ``path``."""

from __future__ import annotations

import logging

import pytest
from helpers import CONFIGS, random_heads, tiny_llama
from hydra import compose, initialize_config_dir

from specdec import drafter_config, load_drafter
from specdec.config import register_configs
from specdec.drafters import DraftModelDrafter, MedusaDrafter
from specdec.drafters.medusa import save_heads


def test_path_says_where_the_weights_are_and_the_old_names_still_work(tmp_path, caplog):
    target = tiny_llama()
    save_heads(tmp_path / "heads.safetensors", random_heads(), target="tiny", tree=[[0], [1], [0, 0]])
    settings = dict(k=3, lookup=0, min_confidence=0.0)
    with caplog.at_level(logging.WARNING):
        for where in (tmp_path, tmp_path / "heads.safetensors"):  # the directory training wrote, or the file in it
            assert isinstance(load_drafter("medusa", target, path=str(where), **settings), MedusaDrafter)
        assert not caplog.records
        old = load_drafter("medusa", target, heads=str(tmp_path), **settings)
    assert isinstance(old, MedusaDrafter) and "drafter.heads is the old name of drafter.path" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        early_exit = load_drafter("draft_model", target, model="target", draft_vocab=0)
    assert isinstance(early_exit, DraftModelDrafter) and "use drafter.path=target" in caplog.text
    with pytest.raises(ValueError, match=r"drafter.path='target' and drafter.model='x' \(its old name\) name "):
        load_drafter("draft_model", target, path="target", model="x", draft_vocab=0)
    assert drafter_config("medusa", path="somewhere").heads == "somewhere"  # code reading the old name finds it


@pytest.mark.parametrize("override", ["drafter.path", "drafter.heads"])
def test_the_cli_takes_path_and_the_old_name_without_a_plus(override):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run", overrides=["drafter=medusa", f"{override}=outputs/train/medusa/mine"])
    assert cfg.drafter[override.split(".")[1]] == "outputs/train/medusa/mine"
