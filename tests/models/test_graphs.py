"""The CUDA-graph wrapper of the target's decoder (specdec.models.graphs) where it runs in CI: on CPU it is the
eager decoder. Its CUDA behaviour is tested in test_cuda_graphs.py."""

import functools

import pytest
import torch
from helpers import tiny_llama

from specdec import DraftModelDrafter, NgramDrafter, speculative_generate
from specdec.models import GraphedDecoder, as_decoder


def test_graphed_decoder_is_the_eager_decoder_on_cpu():
    """On CPU the wrapper runs the decoder eagerly: same outputs, nothing captured."""
    model = tiny_llama(layers=2, seed=0)
    graphed = GraphedDecoder(as_decoder(model))
    assert as_decoder(graphed) is graphed and graphed.vocab_size == model.config.vocab_size
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]])
    ref = speculative_generate(model, NgramDrafter(), ids, k=3, max_new_tokens=16, eos_token_id=[])
    out = speculative_generate(graphed, NgramDrafter(), ids, k=3, max_new_tokens=16, eos_token_id=[])
    assert out.sequences == ref.sequences and graphed.captures == 0


def test_graphed_decoder_wraps_the_compact_decoder_only():
    with pytest.raises(TypeError, match="CompactDecoder"):
        GraphedDecoder(tiny_llama(layers=1))


def test_target_compile_modes():
    """target.compile: auto and none run eagerly on CPU; cuda_graphs or compiled_graphs without a GPU, or a mode
    that does not exist, fail naming the value and what to set."""
    from specdec.models import CompactDecoder, target_decoder

    model = tiny_llama(layers=1)
    assert type(target_decoder(model, "auto")) is CompactDecoder
    assert type(target_decoder(model, "none")) is CompactDecoder
    with pytest.raises(ValueError, match="target.compile=cuda_graphs needs .* CUDA device.*target.device=cuda"):
        target_decoder(model, "cuda_graphs")
    with pytest.raises(ValueError, match="target.compile=compiled_graphs needs .* CUDA device.*target.device=cuda"):
        target_decoder(model, "compiled_graphs")
    with pytest.raises(ValueError, match="target.compile='graphs' is not a mode.*auto"):
        target_decoder(model, "graphs")


def test_target_exact_numerics_reaches_the_backend():
    """target.exact_numerics builds the job's backend with the Triton kernels' ordered arithmetic; without those
    kernels (target.gpu_kernels=false) it is refused, naming both settings. On CPU it changes nothing."""
    from omegaconf import OmegaConf

    from specdec.config import TargetConfig
    from specdec.jobs.job import target_backend
    from specdec.models import Backend

    target = OmegaConf.structured(TargetConfig)
    assert not target_backend(target).exact_numerics
    target.exact_numerics = True
    assert target_backend(target).exact_numerics
    assert Backend(exact_numerics=True).exact_kernels(torch.zeros(2, 4)) is None  # CPU tensors: the CPU kernels'
    target.gpu_kernels = False
    with pytest.raises(ValueError, match="target.exact_numerics.*target.gpu_kernels=true"):
        target_backend(target)


def test_target_fused_products_reaches_the_backend():
    """target.fused_products (on by default) builds the job's backend with the norms and SiLU·up inside the Triton
    kernels' products; false keeps them apart."""
    from omegaconf import OmegaConf

    from specdec.config import TargetConfig
    from specdec.jobs.job import target_backend

    target = OmegaConf.structured(TargetConfig)
    assert target_backend(target).fused_products
    target.fused_products = False
    assert not target_backend(target).fused_products


def test_target_fused_steps_reaches_the_backend():
    """target.fused_steps (on by default) builds the job's backend with a step's greedy verdict and commit in one
    Triton kernel each where those kernels run; false keeps torch's ops."""
    from omegaconf import OmegaConf

    from specdec.config import TargetConfig
    from specdec.jobs.job import target_backend
    from specdec.models import Backend

    target = OmegaConf.structured(TargetConfig)
    assert target_backend(target).fused_steps
    target.fused_steps = False
    assert not target_backend(target).fused_steps
    assert Backend(fused_steps=False).step_kernels(torch.device("cuda")) is None
    assert Backend().step_kernels(torch.device("cpu")) is None  # the CPU's loop: torch's ops


def test_a_draft_models_forwards_stay_eager_on_cpu():
    """drafter.runtime.replay_graphs (the target's target.compile, for the draft's own forwards): on CPU the draft's
    decoder stays the eager one in every mode, the drafts unchanged; a mode that does not exist is refused."""
    from specdec.models import CompactDecoder

    model = tiny_llama(layers=2, seed=0)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]])
    ref = speculative_generate(model, DraftModelDrafter(model, num_layers=1), ids, k=3, max_new_tokens=16,
                               eos_token_id=[])
    drafter = DraftModelDrafter(model, num_layers=1)
    for mode in ("auto", "none", "cuda_graphs", "compiled_graphs"):
        drafter.runtime.replay_graphs(mode)
        assert type(drafter.decoder) is CompactDecoder
    out = speculative_generate(model, drafter, ids, k=3, max_new_tokens=16, eos_token_id=[])
    assert out.sequences == ref.sequences and out.stats.acceptance_rate == ref.stats.acceptance_rate
    with pytest.raises(ValueError, match="target.compile='graphs' is not a mode"):
        drafter.runtime.replay_graphs("graphs")
    assert NgramDrafter().runtime is None  # drafters without a model of their own: nothing to replay


def test_emulated_graphs_fail_where_a_cuda_graph_would():
    """Emulated graphs (the CPU stand-in the graph tests of test_cuda_graphs.py run on): graphs replay on CPU for
    Backend.emulated_gpu() only; a capture refuses a host sync or a shape made from values; a replay rewrites the
    captured outputs in place, and refuses a function that now reads other memory (a CUDA graph would read the
    captured addresses) or runs other ops."""
    from specdec.models import Backend
    from specdec.models.graphs import EmulatedGraph, GraphCaptureError, record_graph

    cpu = torch.device("cpu")
    assert Backend.emulated_gpu().replays_graphs(cpu) and not Backend().replays_graphs(cpu)
    assert all(backend.replays_graphs(torch.device("cuda")) for backend in (Backend(), Backend.emulated_gpu()))
    with pytest.raises(ValueError, match="emulated_gpu"):
        Backend(emulate_graphs=True)
    x = torch.arange(4.0)
    for sync in (lambda: x * x.sum().item(), lambda: x.nonzero(), lambda: x[x > 1]):
        with pytest.raises(GraphCaptureError, match="on the host"):
            record_graph(sync, x.device, warmups=0)
    graph, out = record_graph(lambda: x * 2, x.device)
    x.copy_(torch.tensor([1.0, 1.0, 1.0, 1.0]))
    graph.replay()
    assert out.tolist() == [2.0] * 4  # the captured output, rewritten
    held = {"x": x}
    graph = EmulatedGraph()
    graph.capture(lambda: held["x"] + 1)
    held["x"] = torch.ones(4)
    with pytest.raises(GraphCaptureError, match="captured memory"):
        graph.replay()
    held["x"] = x
    graph.replay()
    held["x"] = x[:2]
    with pytest.raises(GraphCaptureError, match="other ops"):
        graph.replay()


def test_graphs_capture_once_per_key_and_shape_and_keep_their_cache():
    """Graphs, the one capture/replay primitive (the target's wrapper and every drafter's graphs): a function is
    captured once per key and input shapes, then replayed on the new inputs copied into the captured ones; the
    kept cache is reused by a generation that fits it, and reallocating it drops the graphs."""
    from specdec.models.cache import KVCache
    from specdec.models.graphs import CAPACITY_STEP, Graphs

    def double(x):
        return (x * 2,)

    def make(batch, capacity, pad):
        return KVCache.allocate(1, batch, 1, capacity, 2, pad, dtype=torch.float32, device="cpu")

    graphs = Graphs("cpu", emulate=True)
    pad = torch.zeros(2, dtype=torch.long)
    cache = graphs.cache(make, 2, 10, pad)
    for x in (torch.arange(3.0), torch.ones(3), torch.arange(4.0), torch.full((3,), 5.0)):
        assert torch.equal(graphs(double, (x,), key="double")[0], x * 2)
    assert (graphs.captures, graphs.replays) == (2, 4) and graphs.capture_time_s > 0
    graphs(double, (torch.ones(3),), key="other")
    assert graphs.captures == 3
    assert cache.capacity == CAPACITY_STEP and graphs.cache(make, 2, CAPACITY_STEP, pad + 1) is cache
    assert cache.pad.tolist() == [1, 1] and graphs.cache(make, 2, 10, pad, limit=5) is cache
    graphs(double, (torch.ones(3),), key="double")
    assert graphs.captures == 3  # a generation that fits the kept cache keeps its graphs
    assert graphs.cache(make, 3, 10, pad.new_zeros(3)) is not cache
    graphs(double, (torch.ones(3),), key="double")
    assert graphs.captures == 4  # reallocated: captured again
    assert graphs.cache(make, 3, CAPACITY_STEP + 1, pad.new_zeros(3), limit=300).capacity == CAPACITY_STEP + 1
    eager = Graphs("cpu")  # no graphs replay here: the function runs as it is
    assert torch.equal(eager(double, (torch.ones(3),), key="double")[0], torch.full((3,), 2.0)) and not eager.captures


def test_a_graph_that_advances_tensors_moves_them_once_a_call(monkeypatch):
    """A function captured with tensors it ``advances`` in place (a step's commit: the cache's and the rows' lengths)
    runs three times while it is captured (two warm-ups, the capture); each call still moves them once, as an eager
    call does, and a kept tensor holds its values across calls until a shape change, which drops the graphs. Planted:
    nothing put back after the warm-ups, the first call moves them three more times."""
    from specdec.models import graphs as graphs_module
    from specdec.models.graphs import Graphs

    def step(x, lengths):
        lengths += x
        return (lengths * 10,)

    def run(graphs):
        lengths = graphs.keep("lengths", torch.tensor([0, 5]))
        seen = [graphs(functools.partial(step, lengths=lengths), (torch.tensor([i, 1]),), key="step",
                       advances=(lengths,))[0].tolist() for i in (1, 2, 3)]
        return seen, lengths.tolist()

    graphs = Graphs("cpu", emulate=True)
    assert run(graphs) == ([[10, 60], [30, 70], [60, 80]], [6, 8]) == run(Graphs("cpu"))
    assert graphs.captures == 1 and run(graphs)[1] == [6, 8] and graphs.captures == 1  # kept: the same graph
    graphs.keep("lengths", torch.zeros(3, dtype=torch.long))
    assert not graphs._graphs  # reallocated: the graphs that read the old memory are gone
    record = graphs_module.record_graph
    monkeypatch.setattr(graphs_module, "record_graph", lambda *a, reset, **kw: record(*a, **kw))
    assert run(Graphs("cpu", emulate=True))[1] == [9, 11]  # the first call: 4 moves, not 1
