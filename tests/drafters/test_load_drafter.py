"""Drafters from Python as the CLI composes them: ``load_drafter(name, target, tokenizer)`` gives every registered
drafter with its shipped defaults in one call, ``drafter_config`` composes what ``python -m specdec.run
drafter=<name>`` does, and errors name what to pass."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import CONFIGS
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import specdec
from specdec import autoregressive_generate, drafter_config, load_drafter, speculative_generate
from specdec.config import register_configs
from specdec.drafters import DRAFTERS, NgramDrafter, build_drafter


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_drafter_config_composes_as_the_cli_does(name):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cli = OmegaConf.to_container(compose("run", overrides=[f"drafter={name}"]).drafter)
    preset = OmegaConf.to_container(drafter_config(name))
    assert cli.pop("k") == "auto" and isinstance(preset.pop("k"), int)  # the main job chooses its lookahead
    assert preset == cli
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cli = compose("run", overrides=[f"drafter={name}", "drafter.k=3"]).drafter
    assert OmegaConf.to_container(drafter_config(name, k=3)) == OmegaConf.to_container(cli)


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_every_registered_drafter_loads_in_one_call_and_decodes_as_plain_decoding(name, real_target, real_prompts):
    """The shipped EAGLE, Medusa, block and draft-model drafters (and n-gram lookup) from the target and tokenizer alone;
    speculative_generate then drafts with the config's k."""
    model, tokenizer = real_target
    drafter = load_drafter(name, model, tokenizer)
    assert type(drafter) is DRAFTERS[name] and drafter.config.k == drafter_config(name).k
    ids = torch.tensor([real_prompts[0]])
    reference = autoregressive_generate(model, ids, max_new_tokens=12)
    assert speculative_generate(model, drafter, ids, max_new_tokens=12).sequences == reference.sequences


def test_an_unknown_drafter_or_setting_is_named_with_what_to_pass(tiny_target):
    with pytest.raises(ValueError, match="unknown drafter 'eagel'; registered drafters: dflash, draft_model, eagle, "
                                         "medusa"):
        load_drafter("eagel", tiny_target)
    with pytest.raises(ValueError, match=r"drafter 'ngram': the settings \['kk'\] do not fit .*its settings: k"):
        load_drafter("ngram", tiny_target, kk=3)
    with pytest.raises(ValueError, match=r"drafter 'ngram': k='four' in the settings \['k'\]; k is the lookahead, an "
                                         r"integer >= 1 \(draft tokens per target forward\), or 'auto'"):
        drafter_config("ngram", k="four")
    with pytest.raises(ValueError, match=r"k \(lookahead: draft tokens per target forward\) is needed"):
        speculative_generate(tiny_target, NgramDrafter(), torch.tensor([[1, 2, 3]]), max_new_tokens=2)


def test_build_drafter_fills_what_a_config_leaves_out_with_the_shipped_defaults(tiny_target):
    drafter = build_drafter(OmegaConf.create({"name": "ngram"}), tiny_target)
    assert isinstance(drafter, NgramDrafter) and drafter.config == drafter_config("ngram")
    drafter = build_drafter({"name": "ngram", "k": 2}, tiny_target)  # a plain mapping, part of the config
    assert drafter.config == drafter_config("ngram", k=2)
    with pytest.raises(ValueError, match=r"drafter 'ngram': the given settings do not fit .*its settings: k"):
        build_drafter({"name": "ngram", "kk": 2}, tiny_target)


def test_the_package_lists_its_public_api():
    assert dir(specdec) == sorted(specdec.__all__)
    assert {"load_target", "load_drafter", "speculative_generate", "autoregressive_generate", "GenerationOutput",
            "compare"} <= set(specdec.__all__)
    assert all(getattr(specdec, name) is not None for name in specdec.__all__)
    assert all(re.search(rf"\b{name}\b", specdec.__doc__) for name in specdec.__all__)  # help(specdec) names each
    # every registered drafter by name and class (the block drafter, cross-vocabulary drafting too), and replay
    assert all(f'"{name}"' in specdec.__doc__ for name in specdec.DRAFTERS)
    assert {cls.__name__ for cls in specdec.DRAFTERS.values()} | {"CrossVocabDrafter"} <= set(specdec.__all__)
    assert "``specdec.replay``" in specdec.__doc__
    assert "``sequences``" in specdec.GenerationOutput.__doc__
