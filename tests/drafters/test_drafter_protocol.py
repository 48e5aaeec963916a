"""The drafter protocol (specdec.drafters.base): three members every drafter implements, the rest hooks with
defaults declared on the base class, and nothing in the package probing a drafter for a member it may lack."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import specdec
from specdec.drafters import DRAFTERS, Drafter, NgramDrafter
from specdec.drafters.base import DrafterWrapper

HOOKS = ("name", "Config", "acceptance", "forwards", "feature_layers", "graphs", "lossy", "start", "reset",
         "graph_device", "use_graphs", "replay_graphs", "graph_runners")


def test_a_drafter_must_implement_from_config_propose_and_observe():
    assert Drafter.__abstractmethods__ == {"from_config", "propose", "observe"}

    class ProposesOnly(Drafter):
        def propose(self, state, k):
            raise NotImplementedError

    with pytest.raises(TypeError, match="abstract"):
        ProposesOnly()
    for cls in DRAFTERS.values():
        assert not cls.__abstractmethods__ and "from_config" in vars(cls), cls


def test_every_hook_is_declared_on_the_base_class_with_a_default():
    for hook in HOOKS:
        assert hook in vars(Drafter) or hook in Drafter.__annotations__, hook
    callables = [getattr(Drafter, h) for h in HOOKS if callable(getattr(Drafter, h, None)) and h != "Config"]
    assert all(f.__doc__ and "\n" not in f.__doc__.strip() for f in callables)
    drafter = NgramDrafter()  # a drafter overriding no hook gets the defaults
    assert (drafter.acceptance, drafter.lossy, drafter.feature_layers, drafter.graphs) == (None, False, (), None)
    assert drafter.graph_device() is None and drafter.graph_runners() == []
    drafter.replay_graphs("auto")
    assert drafter.graphs is None


def test_a_wrapper_is_its_inner_drafter_but_for_what_it_overrides():
    inner = NgramDrafter()
    inner.acceptance = SimpleNamespace(lossy=True)  # stands in for a lossy rule
    inner.feature_layers = (1, 2)
    wrapper = DrafterWrapper(inner)
    assert wrapper.acceptance is inner.acceptance and wrapper.lossy and wrapper.feature_layers == (1, 2)
    wrapper.forwards = 3
    assert inner.forwards == 3 and wrapper.graph_runners() == []
    with pytest.raises(TypeError, match="wraps a drafter"):
        DrafterWrapper.from_config(NgramDrafter.Config(), target=torch.nn.Linear(1, 1))


def test_nothing_probes_a_drafter_for_a_member():
    """The base class declares every member, so code reads ``drafter.x``, never ``getattr(drafter, "x", default)``."""
    probe = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:self\.)?drafter\s*,\s*[\"']")
    root = Path(specdec.__file__).parent
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert not found
