"""Integration on the real default target (SmolLM2-135M-Instruct) with real prompts (MT-Bench, HumanEval)."""

import pytest
import torch

from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate
from specdec.jobs.data import left_pad
from specdec.models import CompactDecoder, as_decoder

pytestmark = pytest.mark.real_model
NEW = 24


@pytest.fixture(scope="module")
def model(real_target):
    return real_target[0]


@pytest.fixture(scope="module")
def reference(model, real_prompts):
    """Plain greedy decoding of each prompt alone: the reference every other path must equal."""
    return [autoregressive_generate(model, torch.tensor([p]), max_new_tokens=NEW, eos_token_id=[]).sequences[0]
            for p in real_prompts]


@torch.no_grad()
def test_compact_forward_matches_transformers(model, real_prompts):
    ids, mask = left_pad(real_prompts[:3], pad_id=2)
    decoder = as_decoder(model)
    assert isinstance(decoder, CompactDecoder)
    cache = decoder.new_cache(3, ids.shape[1], (mask == 0).sum(1))
    logits, _ = decoder(ids, cache)
    ref = model(ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    assert (logits[mask.bool()] - ref[mask.bool()]).abs().max() < 1e-3


def test_plain_decoding_equals_transformers_generate(model, real_prompts, reference):
    for prompt, ref in zip(real_prompts, reference):
        ids = torch.tensor([prompt])
        # An explicit mask: without one, generate() masks every token equal to pad_token_id, and SmolLM2's
        # pad token is <|im_end|>, which chat prompts contain.
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             eos_token_id=None, pad_token_id=2)
        assert out[0, ids.shape[1]:].tolist() == ref


def test_batched_plain_decoding_equals_per_prompt(model, real_prompts, reference):
    ids, mask = left_pad(real_prompts, pad_id=2)
    out = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences == reference


# k 1, 2, 4 and 8 of n-gram lookup and k 1 and 4 of the early-exit draft model (8 untrained layers, ~1%
# accepted: 8-20 s per k) run by default, every other k opt-in (`-m slow`); tests/drafters/test_draft_model.py covers the
# distilled draft that `drafter=draft_model` uses by default.
DEFAULT_K = {"ngram": (1, 2, 4, 8), "draft_model": (1, 4)}


@pytest.mark.parametrize("drafter,k", [(d, k) if k in DEFAULT_K[d] else pytest.param(d, k, marks=pytest.mark.slow)
                                       for d in DEFAULT_K for k in range(1, 9)])
def test_greedy_speculative_equals_plain(model, real_prompts, reference, drafter, k):
    make = {"ngram": NgramDrafter, "draft_model": lambda: DraftModelDrafter(model, num_layers=8)}[drafter]
    single = speculative_generate(model, make(), torch.tensor([real_prompts[0]]), k=k, max_new_tokens=NEW,
                                  eos_token_id=[])
    assert single.sequences[0] == reference[0]
    ids, mask = left_pad(real_prompts, pad_id=2)
    batched = speculative_generate(model, make(), ids, attention_mask=mask, k=k, max_new_tokens=NEW, eos_token_id=[])
    assert batched.sequences == reference


@pytest.mark.parametrize("name", [pytest.param("eagle", marks=pytest.mark.slow), "medusa",  # ~30 s each: one
                                  pytest.param("draft_model", marks=pytest.mark.slow),  # by default (the main
                                  pytest.param("dflash", marks=pytest.mark.slow)])  # job's emulated-graph test runs all)
def test_the_gpu_pipeline_through_emulated_graphs_equals_plain_decoding(model, real_prompts, name):
    """What the main job runs on a GPU (target.compile=auto: the target's forwards and the shipped drafter's own
    work replaying graphs), run on CPU through emulated graphs (both on Backend.emulated_gpu()): captures
    without host syncs, replays of the captured ops on the captured memory, and greedy outputs equal to plain
    decoding's on the torch path a GPU runs (batch 1, then 2 left-padded), with as many drafts accepted as the
    drafter accepts drafting eagerly."""
    from specdec.drafters.base import DRAFTERS, graph_runners
    from specdec.models import Backend, GraphedDecoder, as_decoder, target_decoder
    from specdec.run import drafter_graph_fields

    cls, backend = DRAFTERS[name], Backend.emulated_gpu()
    decoder = target_decoder(model, "auto", backend=backend)
    drafter, eager = (cls.from_config(cls.Config(), target=model, backend=backend) for _ in range(2))
    drafter.runtime.replay_graphs("auto")
    assert isinstance(decoder, GraphedDecoder)
    k = 3 if name == "draft_model" else cls.Config().k
    for prompts in (real_prompts[:1], real_prompts[1:3]):
        ids, mask = left_pad(prompts, pad_id=2)
        ref = autoregressive_generate(as_decoder(model, backend=backend), ids, attention_mask=mask, max_new_tokens=16,
                                      eos_token_id=[])
        out, unreplayed = (speculative_generate(decoder, d, ids, attention_mask=mask, k=k, max_new_tokens=16,
                                                eos_token_id=[]) for d in (drafter, eager))
        assert out.sequences == ref.sequences
        assert out.stats.mean_accepted_length == unreplayed.stats.mean_accepted_length > 1.0  # the same drafts
    runners = graph_runners(drafter)  # what the main job reports of the drafter's graphs
    assert len(runners) == 1 and runners[0].replays > 0 and decoder.replays > 0 and not graph_runners(eager)
    assert drafter_graph_fields(drafter) == {"drafter_graph_captures": runners[0].captures,
                                             "drafter_graph_capture_time_s": runners[0].capture_time_s}
    assert runners[0].captures > 0 and runners[0].capture_time_s > 0
    assert drafter_graph_fields(eager) == {"drafter_graph_captures": None, "drafter_graph_capture_time_s": None}
