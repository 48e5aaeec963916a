"""The self-distillation store on a tiny model: what a method asks for beyond the final hidden states
(other layers' hidden states, the target's top-k distribution) lines up with the answers; a store built from
prompt files is the one built from the corpora."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import tiny_config

from specdec.training.distill.prompts import main as write_prompts
from specdec.training.distill.store import DataNeeds, _fingerprint, load_or_build, load_splits
from specdec.training.trainer import check_config


def test_stored_layers_and_topk_line_up_with_the_answers(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair  # one decoder layer: hidden state 1 is the final (normed) one
    cfg = tiny_config(tmp_path)
    splits = load_or_build(cfg, model, tokenizer, DataNeeds(layers=(0, 1), topk=3), tmp_path / "data.safetensors")
    assert splits.keys() == {"train", "val", "answers_mtbench", "answers_humaneval", "text_wikipedia"}
    for name, split in splits.items():
        n = split.tokens.numel()
        assert split.hidden.shape == (n, 16) and split.features.shape == (n, 2, 16) and split.topk_ids.shape == (n, 3)
        assert int(split.lengths.sum()) == n and int(split.context_lengths.sum()) == split.context.numel()
        # a teacher-forced forward gives the decode loop's recorded hidden states, and the token the target
        # emitted is a likeliest one (greedy answers; a corpus's next token need not be; ties in any order)
        assert torch.allclose(split.features[:, 1], split.hidden, atol=1e-4), name
        logprobs = model.lm_head(split.hidden).log_softmax(-1)  # [n, V]
        assert torch.allclose(logprobs.gather(1, split.topk_ids), split.topk_logprobs, atol=1e-5)
        if not name.startswith("text_"):
            emitted = logprobs.gather(1, split.tokens[:, None])[:, 0]
            assert torch.allclose(emitted, split.topk_logprobs[:, 0], atol=1e-5), name
        assert (split.topk_logprobs[:, :-1] >= split.topk_logprobs[:, 1:]).all()
    stored = load_splits(tmp_path / "data.safetensors")
    assert all(torch.equal(stored[n].features, s.features) and torch.equal(stored[n].topk_ids, s.topk_ids)
               for n, s in splits.items())


@pytest.mark.parametrize("method, layers, outside", [("eagle", [0, 5], [5]), ("eagle", [0, 1], [1]),  # 1: a
                                                     ("draft_model", [0, 3], [3])])  # hidden state, no layer
def test_layers_beyond_the_target_are_refused_before_the_store_is_built(tiny_pair, tmp_path, method, layers, outside):
    from specdec.training.methods.draft_model import DraftModelMethodConfig
    from specdec.training.methods.eagle import EagleMethodConfig
    from specdec.training.trainer import train

    model, tokenizer = tiny_pair  # one decoder layer
    cfg = tiny_config(tmp_path / "run")
    if method == "eagle":
        cfg.method, key = EagleMethodConfig(aux_layers=layers, draft_vocab=None, chunk_len=32), "method.aux_layers"
    else:
        cfg.method, key = DraftModelMethodConfig(layers=layers, chunk_len=32), "method.layers"
    with pytest.raises(ValueError, match=re.escape(f"{key}={layers} must be a non-empty list of target layer ids in "
                                                   f"[0, 0] for this 1-layer target (outside it: {outside})")):
        train(cfg, model, tokenizer)
    assert not (tmp_path / "run" / "data.safetensors").exists()


def test_a_store_built_from_prompt_files_equals_the_generated_one(tiny_pair, tmp_path):
    """data.prompts_file and file held-out sources (written by python -m specdec.training.distill.prompts, for a
    machine without the corpora): the same prompts, answers and split names as the store built from the
    corpora; a changed file is a changed configuration; too few prompts or a missing file are refused."""
    model, tokenizer = tiny_pair
    cfg = tiny_config(tmp_path / "built")
    assert "prompts_file" not in _fingerprint(cfg, DataNeeds())  # stores built before the option are still read
    built = load_or_build(cfg, model, tokenizer, DataNeeds(), tmp_path / "built.safetensors")
    files = tmp_path / "files"
    write_prompts(["--num", "6", "--out", str(files / "prompts.jsonl"), "--held-out", str(files)])
    cfg = tiny_config(tmp_path / "read")
    cfg.data.prompts_file = str(files / "prompts.jsonl")
    cfg.eval.answer_sources = [str(files / "mtbench.jsonl"), str(files / "humaneval.jsonl")]
    cfg.eval.text_sources = [str(files / "wikipedia.jsonl")]
    check_config(cfg)
    read = load_or_build(cfg, model, tokenizer, DataNeeds(), tmp_path / "read.safetensors")
    assert read.keys() == built.keys()
    for name, split in built.items():
        assert torch.equal(read[name].context, split.context) and torch.equal(read[name].tokens, split.tokens), name
    (files / "prompts.jsonl").write_text((files / "prompts.jsonl").read_text().replace("a", "b", 1))
    with pytest.raises(ValueError, match="built with another configuration"):
        load_or_build(cfg, model, tokenizer, DataNeeds(), tmp_path / "read.safetensors")
    cfg.data.num_prompts = 7
    with pytest.raises(ValueError, match=r"holds 6 prompts, fewer than data.num_prompts=7"):
        load_or_build(cfg, model, tokenizer, DataNeeds(), tmp_path / "more.safetensors")
    cfg.data.prompts_file = str(files / "missing.jsonl")
    with pytest.raises(ValueError, match="data.prompts_file=.*missing.jsonl.* is not a file.*--num 7"):
        check_config(cfg)


class Waiting(Exception):
    """A simulated process reached a barrier: it would wait for the others there."""


class FakeAccelerator:
    """Process ``index`` of ``count`` in this process. A process other than the main one stops at its first
    barrier (:class:`Waiting`): simulated in turn, the others build their shards first and the main one merges."""

    def __init__(self, index: int, count: int):
        self.process_index, self.num_processes, self.is_main_process = index, count, index == 0

    def wait_for_everyone(self) -> None:
        if not self.is_main_process:
            raise Waiting


def _equal_stores(one: dict, other: dict) -> None:
    from dataclasses import fields

    from specdec.training.distill.store import Split

    assert one.keys() == other.keys()
    for name, split in one.items():
        for f in fields(Split):
            a, b = getattr(split, f.name), getattr(other[name], f.name)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (name, f.name)


def test_processes_share_the_build_and_the_merged_store_is_one_processs(tiny_pair, tmp_path, monkeypatch):
    """Two processes (simulated in turn): each builds every other batch of answers and corpus chunk into a shard
    file; the merge equals a one-process build tensor for tensor (layers, context states, top-k too); a shard
    already built is not built again; shards that do not add up are refused."""
    from specdec.training.distill import store

    model, tokenizer = tiny_pair
    needs = DataNeeds(layers=(0, 1), topk=3, context=True)
    single = load_or_build(tiny_config(tmp_path / "one"), model, tokenizer, needs, tmp_path / "one.safetensors")
    cfg = tiny_config(tmp_path / "two")
    path = tmp_path / "two.safetensors"
    built, build_parts = {}, store.build_parts

    def recorded(cfg, target, tokenizer, needs, prompts_path=None, shard=(0, 1)):
        parts = build_parts(cfg, target, tokenizer, needs, prompts_path, shard)
        built[shard] = {name: sorted(part) for name, part in parts.items()}
        return parts

    monkeypatch.setattr(store, "build_parts", recorded)
    with pytest.raises(Waiting):
        load_or_build(cfg, model, tokenizer, needs, path, FakeAccelerator(1, 2))
    alone = store._load_shard(store._shard_path(path, 1, 2))
    with pytest.raises(ValueError, match=r"part '\w+': the shards lack sequence\(s\) \[0"):
        store.merge_parts([alone])
    with pytest.raises(ValueError, match=r"part '\w+': shards 0..1 hold sequence \d+ twice"):
        store.merge_parts([alone, alone])
    merged = load_or_build(cfg, model, tokenizer, needs, path, FakeAccelerator(0, 2))
    assert set(built) == {(0, 2), (1, 2)}
    for name in built[(0, 2)]:  # nothing twice; both worked where there were two batches (or chunks) or more
        share = built[(0, 2)][name], built[(1, 2)][name]
        assert not set(share[0]) & set(share[1]) and (share[1] or name.startswith("answers_")), name
    assert len(built[(1, 2)]["training"]) == 2  # 6 prompts, 4 a batch: process 1 answers the second batch
    _equal_stores(merged, single)
    _equal_stores(load_splits(path), single)
    assert store.build_processes(path) == 2 and not list(tmp_path.glob(".two.shard*"))  # shards gone once merged


@pytest.mark.slow  # two real processes, 45 s; the shared build with stubbed processes stays in the default tier
def test_two_processes_on_this_cpu_build_the_store_one_process_builds(tmp_path):
    """torchrun with 2 processes (what ``accelerate launch --multi_gpu --num_processes 2`` starts too): the data
    phase splits between them (the store says 2 processes built it) and the merged store equals one process's,
    tensor for tensor (both built with one thread per process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from specdec.training.distill import store

    script = Path(__file__).with_name("shard_build.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"one": [sys.executable, str(script)],
            "two": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    str(script)]}
    for name, command in runs.items():
        proc = subprocess.run([*command, str(tmp_path / name)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = tmp_path / "one" / "data.safetensors", tmp_path / "two" / "data.safetensors"
    assert (store.build_processes(one), store.build_processes(two)) == (1, 2)
    _equal_stores(load_splits(two), load_splits(one))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_stored_hidden_states_come_from_the_body_without_the_lm_head(family, monkeypatch):
    """The data phase's teacher-forced forwards read every layer from the transformer body: the same states as
    the whole model's forward, and the LM head (Gemma's 262k rows: most of a forward) never runs."""
    from helpers import tiny_family, tiny_llama

    from specdec.training.distill.answers import hidden_states

    model = tiny_family("gemma3") if family == "gemma3" else tiny_llama()
    ids = torch.randint(1, 60, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids, output_hidden_states=True).hidden_states
        monkeypatch.setattr(model.lm_head, "forward", lambda x: pytest.fail("the LM head ran"))
        found = hidden_states(model, ids)
    assert len(found) == len(expected) and all(torch.equal(a, b) for a, b in zip(found, expected))


def test_feature_layers_read_in_batches_equal_those_read_one_answer_at_a_time(tiny_pair, tmp_path):
    """data.feature_batch (a GPU's data phase): answers of different lengths padded into one forward give each one's
    layers and context states as its own forward does, to rounding; the default (1) keeps the fingerprint of stores
    built before the option."""
    from specdec.training.distill.answers import answer_sequences

    model, tokenizer = tiny_pair
    prompts = [[3, 9, 4], [5, 6, 7, 8, 2, 3], [2, 2], [7, 1, 4, 4, 9]]
    one = answer_sequences(model, prompts, max_new_tokens=6, batch_size=4, pad_id=0, layers=(0, 1), context=True)
    from specdec.training.distill import answers

    batched = answers.answer_shard(model, prompts, 6, 4, 0, (0, 1), True, feature_batch=3)
    for i, seq in enumerate(one):
        other = batched[i]
        assert torch.equal(seq.tokens, other.tokens)
        for name in ("features", "context_hidden", "context_features"):
            a, b = getattr(seq, name), getattr(other, name)
            assert a.shape == b.shape, (i, name)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    cfg = tiny_config(tmp_path)
    assert "feature_batch" not in _fingerprint(cfg, DataNeeds())
    cfg.data.feature_batch = 8
    assert "feature_batch" in _fingerprint(cfg, DataNeeds())
