"""The drafter protocol (specdec.drafters.base): a typed config and three calls every drafter implements, one optional
hook, and what the decode loop reads beyond them as data with defaults (Traits) or a drafter's own runtime; nothing in
the package probes a drafter for a member it may lack."""

import re
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import specdec
from specdec.drafters import DRAFTERS, Drafter, NgramDrafter
from specdec.drafters.base import DraftRuntime, DrafterWrapper, Traits, graph_runners, registered_name
from specdec.verify.sampling import SamplingParams

CONTRACT = {"Config", "from_config", "propose", "observe", "start", "config", "traits", "runtime"}


def test_a_drafter_sees_eight_members():
    """What a new drafter reads on one screen: its config type, the three calls it implements, one hook, and the
    three data members with defaults (the config it was built from, its traits, its models' runtime)."""
    public = {name for name in set(vars(Drafter)) | set(Drafter.__annotations__) if not name.startswith("_")}
    assert public == CONTRACT and len(public) <= 8


def test_a_drafter_must_implement_from_config_propose_and_observe():
    assert Drafter.__abstractmethods__ == {"from_config", "propose", "observe"}

    class ProposesOnly(Drafter):
        def propose(self, state, k):
            raise NotImplementedError

    with pytest.raises(TypeError, match="abstract"):
        ProposesOnly()
    for cls in DRAFTERS.values():
        assert not cls.__abstractmethods__ and "from_config" in vars(cls), cls


def test_a_drafter_without_a_model_gets_the_defaults():
    drafter = NgramDrafter()  # a drafter overriding no default
    traits = drafter.traits
    assert (traits.acceptance, traits.lossy, traits.feature_layers, traits.siblings) == (None, False, (), None)
    assert traits.drafts_at(1) and traits.drafts_at(40) and not traits.drafts_at(0)
    assert not traits.samples_siblings(SamplingParams(temperature=1.0))
    assert drafter.runtime is None and graph_runners(drafter) == [] and registered_name(drafter) == "ngram"
    with pytest.raises(FrozenInstanceError):
        traits.acceptance = SimpleNamespace(lossy=True)  # the shared default stays the default


def test_traits_say_the_sizes_a_tree_drafts_at_and_when_it_samples_children():
    traits = Traits(siblings=SimpleNamespace(), sizes=range(9, 32))
    assert [k for k in (8, 9, 31, 32) if traits.drafts_at(k)] == [9, 31]
    assert traits.samples_siblings(SamplingParams(temperature=0.7)) and not traits.samples_siblings(SamplingParams())


def test_a_runtime_replays_nothing_without_a_device_and_counts_forwards():
    runtime = DraftRuntime(device=lambda: torch.device("cpu"))
    runtime.replay_graphs("auto")  # the CPU backend replays no graphs
    assert runtime.graphs is None and runtime.runners() == []
    assert runtime.call(lambda x: (x + 1,), (torch.ones(1),), key="k")[0].item() == 2
    with pytest.raises(ValueError, match="target.compile='graphs' is not a mode"):
        runtime.replay_graphs("graphs")


def test_a_wrapper_is_its_inner_drafter_but_for_what_it_overrides():
    inner = NgramDrafter()
    inner.traits = Traits(acceptance=SimpleNamespace(lossy=True), feature_layers=(1, 2))  # a lossy rule's stand-in
    inner.runtime = DraftRuntime()
    wrapper = DrafterWrapper(inner)
    assert wrapper.traits is inner.traits and wrapper.traits.lossy and wrapper.traits.feature_layers == (1, 2)
    wrapper.runtime.forwards = 3
    assert inner.runtime.forwards == 3 and graph_runners(wrapper) == []
    assert registered_name(wrapper) == "DrafterWrapper"
    wrapper.traits = replace(wrapper.traits, feature_layers=())  # what a wrapper alters stays its own
    assert inner.traits.feature_layers == (1, 2)
    with pytest.raises(TypeError, match="wraps a drafter"):
        DrafterWrapper.from_config(NgramDrafter.Config(), target=torch.nn.Linear(1, 1))


def test_nothing_probes_a_drafter_for_a_member():
    """The base class declares every member, so code reads ``drafter.x``, never ``getattr(drafter, "x", default)``."""
    probe = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:self\.)?drafter\s*,\s*[\"']")
    root = Path(specdec.__file__).parent
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert not found
