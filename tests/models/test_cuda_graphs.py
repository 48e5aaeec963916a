"""The same guarantees on the CUDA path (skipped where no GPU is present). The CUDA-graph tests (``graph_device``)
also run on CPU through emulated graphs (``Backend.emulated_gpu()``, the models' backend there: each capture records its
ops and refuses host syncs, each replay must dispatch the same ops on the same memory), so CI checks the graphed
code where it has no GPU."""

from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_llama

from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate
from specdec.drafters.base import graph_runners
from specdec.jobs.data import left_pad
from specdec.models import Backend, GraphedDecoder, as_decoder

PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6], [12, 13, 14, 15, 12, 13]]


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu), "cpu"], ids=["cuda", "cpu-emulated"])
def graph_device(request):
    """Where a graph test runs: the GPU, or the CPU with emulated graphs (each model there on
    ``Backend.emulated_gpu()``: :func:`_backend`)."""
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_speculative_equals_plain_on_cuda(dtype):
    model = tiny_llama(layers=3).to("cuda", dtype)
    ids, mask = left_pad(PROMPTS)
    ids, mask = ids.cuda(), mask.cuda()
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=32, eos_token_id=[])
    for drafter in (NgramDrafter(), DraftModelDrafter(model, num_layers=1)):
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=4, max_new_tokens=32, eos_token_id=[])
        assert out.sequences == ref.sequences


@pytest.mark.gpu
def test_sampling_on_cuda_is_seeded():
    model = tiny_llama(layers=2).cuda()
    ids = torch.tensor([PROMPTS[0]], device="cuda")
    runs = [speculative_generate(model, DraftModelDrafter(model, num_layers=1), ids, k=3, max_new_tokens=20,
                                 temperature=1.0, generator=torch.Generator("cuda").manual_seed(1),
                                 eos_token_id=[]).sequences for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("min_confidence", [0.0, 0.05])
def test_greedy_medusa_with_lookup_and_auto_dtype_equals_plain_on_cuda(min_confidence, device="cuda"):
    """The default Medusa setting on CUDA: bf16 heads (dtype auto) over a float32 target, a dynamic or fixed
    tree, and the prompt-lookup branch (merged at batch 1, its own chain at batch 3)."""
    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=3, seed=0).to(device)
    heads = random_heads(scale=1.0).to(device)
    for batch in (PROMPTS[:1], PROMPTS):
        ids, mask = (t.to(device) for t in left_pad(batch))
        ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=32, eos_token_id=[])
        drafter = MedusaDrafter(heads, model.lm_head.weight, PATHS, min_confidence, lookup=4, dtype="auto")
        assert device == "cpu" or drafter.dtype == torch.bfloat16
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=len(PATHS) + 4, max_new_tokens=32,
                                   eos_token_id=[])
        assert out.sequences == ref.sequences


def _backend(model) -> Backend:
    """What a graph test's model runs on: the default backend on a GPU (where graphs replay), the torch ops a GPU
    runs with graphs emulated on the CPU."""
    return Backend.emulated_gpu() if model.device.type == "cpu" else Backend()


def _eager(model):
    return as_decoder(model, backend=_backend(model))


def _graphed(model):
    return GraphedDecoder(_eager(model))


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_other_families_replay_graphs_as_they_decode_eagerly(family, graph_device):
    """Qwen3 and Gemma-3 (tiny, sliding windows of 4 tokens binding) through the graphed compact decoder: greedy
    plain, n-gram and Medusa-tree decoding at batch 3 equal the eager outputs."""
    from helpers import PATHS, random_heads, tiny_family

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_family(family).to(graph_device)
    graphed = _graphed(model)
    ids, mask = (t.to(graph_device) for t in left_pad(PROMPTS))
    ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    heads = random_heads(scale=1.0).to(graph_device)
    medusa = MedusaDrafter(heads, model.lm_head.weight, PATHS, 0.05, backend=_backend(model))
    for drafter, k in ((None, 0), (NgramDrafter(), 4), (medusa, len(PATHS))):
        out = (autoregressive_generate(graphed, ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
               if drafter is None else speculative_generate(graphed, drafter, ids, attention_mask=mask, k=k,
                                                            max_new_tokens=16, eos_token_id=[]))
        assert out.sequences == ref.sequences, drafter
    assert graphed.captures > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_give_the_eager_outputs_and_capture_each_width_once(dtype, graph_device):
    """Replayed graphs equal eager forwards (greedy, chain and tree drafters, batch 1 and 3), across several
    generations of different lengths on one reused cache; a width is captured once, then only replayed."""
    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=3, seed=0).to(graph_device, dtype)
    graphed = _graphed(model)
    heads = random_heads(scale=1.0).to(graph_device)
    for batch in (PROMPTS[:1], PROMPTS, PROMPTS[1:2]):
        ids, mask = (t.to(graph_device) for t in left_pad(batch))
        ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        plain = autoregressive_generate(graphed, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        assert plain.sequences == ref.sequences
        for drafter, k in ((NgramDrafter(), 4), (DraftModelDrafter(model, num_layers=1, backend=_backend(model)), 3),
                           (MedusaDrafter(heads, model.lm_head.weight, PATHS, 0.05, lookup=4,
                                          backend=_backend(model)), len(PATHS) + 4)):
            out = speculative_generate(graphed, drafter, ids, attention_mask=mask, k=k, max_new_tokens=24,
                                       eos_token_id=[])
            assert out.sequences == ref.sequences
    captures = graphed.captures
    assert 0 < captures <= graphed.replays
    ids, mask = (t.to(graph_device) for t in left_pad(PROMPTS[1:2]))
    autoregressive_generate(graphed, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    speculative_generate(graphed, NgramDrafter(), ids, attention_mask=mask, k=4, max_new_tokens=24, eos_token_id=[])
    assert graphed.captures == captures  # nothing new to capture for widths already seen


@pytest.mark.parametrize("confidence", [0.0, 0.02], ids=["one-graph-a-step", "a-graph-a-forward"])
def test_a_draft_models_forwards_replay_graphs_and_draft_as_eager_ones(confidence, graph_device):
    """drafter.runtime.replay_graphs where graphs replay: a step's whole chain (a fixed draft length), or with a
    confidence floor the draft's [B, 2] and [B, 1] forwards, are captured once (then only replayed, across generations
    of one batch size); the greedy outputs stay plain decoding's, with a full or a restricted draft head, at batch 1
    and 3; at T=1 the graphed draft draws what the eager one draws, a step's chain in one replay."""
    model = tiny_llama(layers=3, seed=0).to(graph_device)
    graphed = _graphed(model)
    half = torch.arange(0, model.config.vocab_size, 2, device=graph_device)
    for vocab_ids in (None, half):
        drafter = DraftModelDrafter(model, num_layers=1, vocab_ids=vocab_ids, confidence=confidence,
                                    backend=_backend(model))
        drafter.runtime.replay_graphs("auto")
        assert isinstance(drafter.decoder, GraphedDecoder)
        for n, batch in enumerate((PROMPTS[:1], PROMPTS[1:2], PROMPTS)):
            ids, mask = (t.to(graph_device) for t in left_pad(batch))
            ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
            out = speculative_generate(graphed, drafter, ids, attention_mask=mask, k=3, max_new_tokens=24,
                                       eos_token_id=[])
            assert out.sequences == ref.sequences
            if n == 1:  # two generations at batch 1: the chain's one graph (or two forwards') captured, then replayed
                steps = out.stats.target_forwards
                assert drafter.decoder.captures == (2 if confidence else 1) and drafter.decoder.replays > steps
    ids = torch.tensor([PROMPTS[0]], device=graph_device)
    runs = []
    for mode in ("none", "auto"):
        drafter = DraftModelDrafter(model, num_layers=1, confidence=confidence, backend=_backend(model))
        drafter.runtime.replay_graphs(mode)
        runs.append(speculative_generate(graphed, drafter, ids, k=3, max_new_tokens=20, temperature=1.0,
                                         generator=torch.Generator(graph_device).manual_seed(1), eos_token_id=[]))
    assert runs[0].sequences == runs[1].sequences
    assert runs[0].stats.acceptance_rate == runs[1].stats.acceptance_rate
    graphs = drafter.runtime.graphs
    assert confidence or graphs.replays == runs[1].stats.verify_steps  # every step's chain: one replay


@pytest.mark.parametrize("token_aware", [False, True], ids=["independent", "token-aware"])
def test_medusa_trees_drafted_by_replayed_graphs_equal_eager_ones(token_aware, graph_device):
    """MedusaDrafter's runtime.replay_graphs: a fixed tree is drafted by one graph, a dynamic one by a graph per level (the
    lookup branch merged in, batch 1 and 3, through the graphed target). The greedy outputs are plain decoding's
    and the drafts the eager drafter's (the same acceptance); graphs are captured once per batch size (per level
    of a dynamic token-aware tree), then only replayed; at T=1 the graphed drafter samples what the eager one does."""
    from helpers import PATHS, random_heads, random_token_aware_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=3, seed=0).to(graph_device)
    heads = (random_token_aware_heads(scale=1.0) if token_aware else random_heads(scale=1.0)).to(graph_device)
    embed = model.get_input_embeddings().weight if token_aware else None
    graphed = _graphed(model)
    levels = max(len(p) for p in PATHS)
    for min_confidence in (0.0, 0.05):
        drafters = [MedusaDrafter(heads, model.lm_head.weight, PATHS, min_confidence, embed, lookup=4,
                                  backend=_backend(model)) for _ in range(2)]
        drafters[1].runtime.replay_graphs("auto")
        drafters[0].runtime.replay_graphs("none")
        graphs = drafters[1].drafting.candidates.graphs
        assert graphs is not None and drafters[0].drafting.candidates.graphs is None
        for batch in (PROMPTS[:1], PROMPTS, PROMPTS[:1]):
            ids, mask = (t.to(graph_device) for t in left_pad(batch))
            ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
            runs = [speculative_generate(graphed, drafter, ids, attention_mask=mask, k=len(PATHS) + 4,
                                         max_new_tokens=24, eos_token_id=[]) for drafter in drafters]
            assert runs[0].sequences == runs[1].sequences == ref.sequences
            assert runs[0].stats.acceptance_rate == runs[1].stats.acceptance_rate
            assert runs[1].stats.mean_accepted_length > 1.0
        per_batch = levels if token_aware and min_confidence else 1
        assert 2 <= graphs.captures <= 2 * per_batch and graphs.replays > 3 * graphs.captures
    eager, replayed = (drafter.drafting.candidates for drafter in drafters)  # the drafts themselves, call by call
    plan = drafters[1].drafting.plans.get(tuple(range(len(PATHS))), graph_device)
    generator = torch.Generator().manual_seed(0)
    for scale in (0.5, 1.0, 2.0, 4.0) * 3:  # confident levels, cut ones, none
        state = SimpleNamespace(last_tokens=torch.randint(0, 64, (3,), generator=generator).to(graph_device))
        hidden = (scale * torch.randn(3, heads.hidden_size, generator=generator)).to(graph_device)
        for min_confidence in (None, 0.05, 0.2):
            with torch.no_grad():  # as the drafter calls them
                a, b = (c.tree(state, hidden, plan, min_confidence) for c in (eager, replayed))
            assert torch.equal(a[0], b[0]) and (a[1] is None and b[1] is None or torch.equal(a[1], b[1]))
    ids = torch.tensor([PROMPTS[0]], device=graph_device)
    runs = [speculative_generate(graphed, drafter, ids, k=len(PATHS) + 4, max_new_tokens=20, temperature=1.0,
                                 generator=torch.Generator(graph_device).manual_seed(1), eos_token_id=[]).sequences
            for drafter in drafters]
    assert runs[0] == runs[1]


class _Twins:
    """A drafter proposing what ``eager`` proposes while ``graphed`` (the same drafter replaying graphs, on its own
    cache) drafts alongside: every step both must propose the same tokens, tree and q (greedy: sampled drafts
    would each take their own draws from the shared generator)."""

    def __init__(self, eager, graphed):
        self.eager, self.graphed, self.steps = eager, graphed, 0
        self.config, self.traits, self.runtime = eager.config, eager.traits, graphed.runtime  # graphed's graphs counted

    def start(self, state):
        self.eager.start(state), self.graphed.start(state)

    def propose(self, state, k):
        a, b = self.eager.propose(state, k), self.graphed.propose(state, k)
        assert torch.equal(a.tokens, b.tokens) and a.num_proposed == b.num_proposed, self.steps
        assert (a.tree is None) == (b.tree is None) and (a.tree is None or a.tree.parent_list == b.tree.parent_list)
        assert (a.probs is None) == (b.probs is None) and (a.probs is None or torch.equal(a.probs, b.probs))
        self.steps += 1
        return a

    def observe(self, state):
        self.eager.observe(state), self.graphed.observe(state)


def test_a_device_only_medusa_tree_read_a_step_late_on_graphs_equals_plain(graph_device, monkeypatch):
    """Medusa's fixed tree without the lookup branch drafts from the device alone, so on a GPU each step is read back
    after the next is launched (engine._pipelined_steps): through the graphed target and the heads' graph, batch 1
    and 3, with and without an EOS, the outputs are plain decoding's and the counts those of the loop that reads
    every step."""
    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=3, seed=0).to(graph_device)
    drafter = MedusaDrafter(random_heads(scale=1.0).to(graph_device), model.lm_head.weight, PATHS,
                            backend=_backend(model))
    drafter.runtime.replay_graphs("auto")
    assert drafter.traits.device_only
    assert min(_read_late_on_graphs(monkeypatch, model, drafter, len(PATHS))) > 0  # drafts accepted


def _read_late_on_graphs(monkeypatch, model, drafter, k: int) -> list[int]:
    """``drafter`` through the graphed ``model``, read a step late and read each step, batch 1 and 3, with and without
    an EOS: the outputs are plain decoding's and the counts the same; each run's accepted drafts."""
    from specdec.decode import engine

    graphed, accepted = _graphed(model), []
    for batch in (PROMPTS[:1], PROMPTS):
        ids, mask = (t.to(model.device) for t in left_pad(batch))
        free = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        for eos in ([], [free.sequences[0][9]]):
            ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24,
                                          eos_token_id=eos)
            runs = []
            for devices in ((), ("cpu", "cuda")):
                monkeypatch.setattr(engine, "PIPELINED_DEVICES", devices)
                out = speculative_generate(graphed, drafter, ids, attention_mask=mask, k=k, max_new_tokens=24,
                                           eos_token_id=eos)
                runs.append((out.sequences, out.stats.target_forwards, out.stats.accepted_tokens))
            assert runs[0] == runs[1] and runs[0][0] == ref.sequences
            accepted.append(runs[0][2])
    return accepted


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu),
                                    pytest.param("cpu", marks=pytest.mark.slow)])  # ~1 min here
def test_an_eagle_tree_grown_on_the_device_read_a_step_late_on_graphs_equals_plain(device, monkeypatch):
    """EAGLE's fixed tree grown and chosen on the device (DeviceGrowth, one graph a step), its lookup branch found
    there: through the graphed target and the drafter's graphs, read a step late, batch 1 and 3, with and without an
    EOS, plain decoding's outputs and the counts of the loop that reads every step."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter

    model = tiny_llama(layers=4, seed=0).to(device)
    drafter = EagleDrafter(random_eagle(model).to(device), lookup=3, lookup_on_device=True, grow_on_device=True,
                           backend=_backend(model))
    drafter.runtime.replay_graphs("auto")
    assert drafter.traits.device_only
    _read_late_on_graphs(monkeypatch, model, drafter, 16)
    assert drafter.runtime.graphs.captures > 0


def test_a_drafters_graphs_are_captured_once_for_prompts_of_any_length(graph_device):
    """A drafter's graphs do not depend on the prompt's length. ``DecodeState.seq`` is as wide as the graphed target's
    kept cache, so a graph that reads it (n-gram lookup on the device; EAGLE's device tree with its lookup branch) is
    captured for the first prompt and replayed for prompts of other lengths; the prompt's catch-up (EAGLE's, the
    block drafter's) runs eagerly, so only a step's catch-ups (at most k + 1 positions) are captured. Plain decoding's
    outputs throughout. Planted, each fails: ``seq`` as wide as each generation's capacity (a capture per prompt
    length), the prompt's catch-up replayed (a capture per prompt length of at most 16 tokens)."""
    from helpers import random_eagle

    from specdec.decode import engine
    from specdec.drafters import base
    from specdec.drafters.eagle import EagleDrafter, drafter as eagle_module

    model = tiny_llama(layers=4, seed=0).to(graph_device)
    graphed = _graphed(model)
    prompts = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6] * 4, [12, 13, 14, 15, 12, 13] * 2 + [7], [7, 8, 9] * 5]

    def captured(drafter):  # -> lookup graphs, device-tree graphs, the widest catch-up captured
        drafter.runtime.replay_graphs("auto")
        for prompt in prompts:
            ids = torch.tensor([prompt], device=graph_device)
            ref = autoregressive_generate(_eager(model), ids, max_new_tokens=4, eos_token_id=[])
            out = speculative_generate(graphed, drafter, ids, k=8, max_new_tokens=4, eos_token_id=[])
            assert out.sequences == ref.sequences
        keys = list(drafter.runtime.graphs._graphs)
        return (sum(key == ("lookup", 8, 3, 2) for key, *_ in keys),
                sum(isinstance(key, tuple) and key[0] == "device_tree" for key, *_ in keys),
                max((shapes[0][0][1] for key, shapes, _ in keys if key == "catch_up"), default=0))

    def lookup():
        return NgramDrafter(on_device=True, device=graph_device, backend=_backend(model))

    def eagle():
        return EagleDrafter(random_eagle(model).to(graph_device), depth=3, top_k=2, expand=2, lookup=3,
                            lookup_on_device=True, grow_on_device=True, backend=_backend(model))

    assert captured(lookup())[0] == 1
    _, trees, widest = captured(eagle())
    assert trees == 1 and 0 < widest <= 8 + 1 < min(map(len, prompts))
    with pytest.MonkeyPatch.context() as patch:  # planted: seq as wide as each generation's capacity
        initial_state = engine._initial_state
        patch.setattr(engine, "_initial_state", lambda decoder, request, width, *rest: initial_state(
            decoder, request, request.capacity, *rest))
        assert captured(lookup())[0] == len(prompts)
    with pytest.MonkeyPatch.context() as patch:  # planted: the prompt's catch-up replayed too
        patch.setattr(eagle_module, "replays_catch_up", lambda runtime, state: (
            runtime.graphs is not None and state.features.shape[1] <= base.GRAPHED_CATCH_UP))
        assert captured(eagle())[2] == max(map(len, prompts))


@pytest.mark.parametrize("options, k", [(dict(tree=False), 4), (dict(tree=True, min_confidence=0.0), 12),
                                        (dict(tree=True, min_confidence=0.0, grow_on_device=True), 12),
                                        (dict(tree=True, depth=3, top_k=2, expand=2, min_confidence=0.01), 8)],
                         ids=["chain", "tree", "tree-grown-on-the-device", "dynamic-tree"])
def test_eagle_drafts_by_replayed_graphs_as_eagerly(options, k, graph_device):
    """EagleDrafter's runtime.replay_graphs: the draft layer's forwards and logits replay graphs over a draft cache kept across
    generations. Step by step the graphed drafter proposes what the eager one does (a random draft layer, whose
    outputs depend on all it attends: batch 1, 3, then 1 twice), the outputs stay plain decoding's, and a second
    generation of a batch size already seen captures nothing; at T=1 both draw the same from the same seed."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter

    model = tiny_llama(layers=4, seed=0).to(graph_device)
    graphed = _graphed(model)
    layer = random_eagle(model).to(graph_device)
    drafters = [EagleDrafter(layer, **options, backend=_backend(model)) for _ in range(2)]
    drafters[1].runtime.replay_graphs("auto")
    drafters[0].runtime.replay_graphs("none")
    graphs = drafters[1].runtime.graphs
    assert graphs is not None and drafters[0].runtime.graphs is None
    twins = _Twins(*drafters)
    for n, batch in enumerate((PROMPTS[:1], PROMPTS, PROMPTS[:1], PROMPTS[:1])):
        ids, mask = (t.to(graph_device) for t in left_pad(batch))
        ref = autoregressive_generate(_eager(model), ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        out = speculative_generate(graphed, twins, ids, attention_mask=mask, k=k, max_new_tokens=24, eos_token_id=[])
        assert out.sequences == ref.sequences
        if n == 2:
            captures = graphs.captures
    assert graphs.captures == captures and graphs.replays > 2 * captures > 0 and twins.steps > 40
    ids = torch.tensor([PROMPTS[0]], device=graph_device)  # T=1: each drafter on its own, from the same seed
    runs = [speculative_generate(graphed, drafter, ids, k=k, max_new_tokens=20, temperature=1.0,
                                 generator=torch.Generator(graph_device).manual_seed(1), eos_token_id=[])
            for drafter in drafters]
    assert runs[0].sequences == runs[1].sequences
    assert runs[0].stats.acceptance_rate == runs[1].stats.acceptance_rate


@pytest.mark.parametrize("tree", [False, True], ids=["chain-q", "tree-one-hot"])
def test_cuda_graphs_sample_as_eager_does(graph_device, tree):
    """At T=1 the graphed target's sampled verdict replays with its forward, over uniforms drawn before the replay as
    the eager rule draws them: the same tokens from the same seed as the eager target (a sampled draft model's chain
    with its q; a Medusa tree of fixed candidates), and one graph a step."""
    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=2).to(graph_device)
    graphed = _graphed(model)
    ids = torch.tensor([PROMPTS[0]], device=graph_device)

    def run(target):
        drafter = (MedusaDrafter(random_heads(scale=1.0).to(graph_device), model.lm_head.weight, PATHS, 0.0,
                                 backend=_backend(model)) if tree
                   else DraftModelDrafter(model, num_layers=1, backend=_backend(model)))
        out = speculative_generate(target, drafter, ids, k=len(PATHS) if tree else 3, max_new_tokens=20,
                                   temperature=1.0, generator=torch.Generator(graph_device).manual_seed(1),
                                   eos_token_id=[])
        return out.sequences, out.stats.target_forwards

    tokens, steps = run(graphed)
    assert graphed.replays >= steps  # every step's forward and verdict: one replay
    assert any("'sampled'" in repr(key[0][1]) for key in graphed.graphs._graphs)  # the verdict's key (read a step
    # late, with the commit's: engine._DeviceCommit)
    assert run(_eager(model)) == (tokens, steps)


def test_graph_captures_are_left_out_of_the_decode_times(graph_device):
    """A generation's graph captures (the target's and the drafter's) are one-off costs: their seconds are in
    ``capture_time_s``, out of the wall, target and drafter times, which then hold only the decoding; a
    generation that captures nothing new counts none."""
    import time

    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter

    model = tiny_llama(layers=2, seed=0).to(graph_device)
    graphed = _graphed(model)
    drafter = MedusaDrafter(random_heads(scale=1.0).to(graph_device), model.lm_head.weight, PATHS, 0.0,
                            backend=_backend(model))
    drafter.runtime.replay_graphs("auto")
    ids = torch.tensor([PROMPTS[0]], device=graph_device)
    runs = []
    for first in (True, False):
        before = graphed.capture_time_s + graph_runners(drafter)[0].capture_time_s
        start = time.perf_counter()
        stats = speculative_generate(graphed, drafter, ids, k=len(PATHS), max_new_tokens=12, eos_token_id=[]).stats
        outside = time.perf_counter() - start
        captured = graphed.capture_time_s + graph_runners(drafter)[0].capture_time_s - before
        assert stats.capture_time_s == pytest.approx(captured) and (captured > 0) == first
        assert 0 < stats.wall_time_s <= outside - captured
        assert 0 < stats.target_time_s + stats.drafter_time_s + stats.prefill_time_s <= stats.wall_time_s
        runs.append(stats)
    assert runs[0].merge(runs[1]).capture_time_s == runs[0].capture_time_s > 0


def test_target_compile_auto_replays_graphs_on_cuda(graph_device):
    from specdec.models import target_decoder

    model = tiny_llama(layers=1).to(graph_device)
    assert isinstance(target_decoder(model, "auto", backend=_backend(model)), GraphedDecoder)
    assert not isinstance(target_decoder(model, "none", backend=_backend(model)), GraphedDecoder)


@pytest.mark.gpu
def test_compiled_graphs_give_the_eager_outputs_and_compile_each_shape_once():
    """target.compile=compiled_graphs: each captured forward compiled by torch.compile first. Greedy plain and
    n-gram outputs equal the eager ones (fp32, batch 3) while acceptance varies step by step; every captured
    shape is compiled exactly once, and generating again compiles and captures nothing."""
    from torch._dynamo.utils import counters

    from specdec.models import target_decoder

    model = tiny_llama(layers=2, seed=0).cuda()
    graphed = target_decoder(model, "compiled_graphs")
    assert isinstance(graphed, GraphedDecoder) and graphed.compile
    ids, mask = (t.cuda() for t in left_pad(PROMPTS))
    kwargs = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    ref = autoregressive_generate(_eager(model), ids, **kwargs).sequences
    before = counters["stats"]["unique_graphs"]
    for _ in range(2):
        assert autoregressive_generate(graphed, ids, **kwargs).sequences == ref
        out = speculative_generate(graphed, NgramDrafter(), ids, k=4, **kwargs)
        assert out.sequences == ref
        if _ == 0:
            compiled, captures = counters["stats"]["unique_graphs"] - before, graphed.captures
    assert out.stats.mean_accepted_length > 1.0  # some drafts accepted, so the widths varied
    assert 1 < captures == compiled  # one compilation per captured shape, none per step
    assert graphed.captures == captures and counters["stats"]["unique_graphs"] - before == compiled


@pytest.mark.parametrize("planted", [False, True], ids=["exact", "planted-no-renormalisation"])
def test_sampling_through_cuda_graphs_is_distributed_as_the_target(planted, graph_device):
    """T=1 through the graphed target: a Medusa tree over the bigram Llama of test_medusa, 800 rows x 8
    tokens. The tokens pass the exactness test against the target's own conditionals; with the planted sampler
    bug (a rejected sibling's residual not renormalised) the same test rejects."""
    import numpy as np
    from helpers import PATHS, NoRenormalisation, make_markov_target, markov_heads, random_prompts

    from specdec.drafters.medusa import MedusaDrafter
    from specdec.exactness.stats import exactness_test
    from specdec.verify.sampling import logits_to_probs

    target = make_markov_target().to(graph_device)
    graphed = _graphed(target)
    drafter = MedusaDrafter(markov_heads().to(graph_device), target.lm_head.weight, PATHS, 0.0,
                            backend=_backend(target))
    ids = random_prompts(800, torch.Generator().manual_seed(1)).to(graph_device)
    new = 8
    out = speculative_generate(graphed, drafter, ids, attention_mask=torch.ones_like(ids), k=len(PATHS),
                               max_new_tokens=new, temperature=1.0, generator=torch.Generator(graph_device).manual_seed(1),
                               eos_token_id=[], rule=NoRenormalisation() if planted else None)
    assert graphed.replays > 0 and out.stats.mean_accepted_length > 1.3
    seqs = torch.cat([ids, torch.tensor(out.sequences, device=graph_device)], 1)
    with torch.no_grad():
        probs = logits_to_probs(target(seqs).logits[:, ids.shape[1] - 1: -1].float(), 1.0)
    tokens = seqs[:, ids.shape[1]:].reshape(-1).cpu().numpy()
    verdict = exactness_test(probs.reshape(-1, probs.shape[-1]).cpu().numpy(), tokens, rng=np.random.default_rng(0),
                             alpha=0.01, positions=np.tile(np.arange(new), len(ids)))
    assert verdict.reject == planted, verdict


def test_distillation_answers_replay_cuda_graphs_and_equal_the_eager_ones(monkeypatch, graph_device):
    """Where graphs replay, the target answers the self-distillation prompts through them (one wrapper for every
    batch, batches of different sizes and lengths): the answers and recorded hidden states are the eager
    decoder's."""
    import specdec.models
    from specdec.training.distill.answers import answer_sequences

    model = tiny_llama(layers=2, seed=0).to(graph_device)
    prompts = PROMPTS + [[7, 8, 9, 10], [3] * 20]
    used = []
    graphed_decoder = specdec.models.target_decoder
    monkeypatch.setattr(specdec.models, "target_decoder",
                        lambda m: used.append(graphed_decoder(m, backend=_backend(m))) or used[-1])
    graphed = answer_sequences(model, prompts, max_new_tokens=12, batch_size=2, pad_id=0)
    assert isinstance(used[0], GraphedDecoder) and used[0].replays > 0
    monkeypatch.setattr(specdec.models, "target_decoder", _eager)
    eager = answer_sequences(model, prompts, max_new_tokens=12, batch_size=2, pad_id=0)
    for a, b in zip(graphed, eager):
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.hidden, b.hidden)
