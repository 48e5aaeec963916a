"""CUDA-graph replay of the target's decode and verify forwards.

A small model's decode step on a GPU is launch-bound: SmolLM2-135M's forward is ~600 small kernels, each
costing a launch from Python. :class:`GraphedDecoder` captures the forward of a
:class:`~specdec.models.compact.CompactDecoder` once per input shape (batch, width, chain or tree, captured
feature layers) and replays it: one launch per step. What makes that possible is already in the cache's
design (:mod:`specdec.models.cache`): every piece of bookkeeping is an on-device tensor of fixed shape, updated in
place. A graphed forward attends over the cache's whole capacity (the slots past each row's block are
masked out) instead of a host-side ``kv_len``.

The wrapper owns one cache, reused by every generation whose batch size and length fit it (the graphs read
its tensors by address): one generation at a time per wrapper. Prefill (a once-per-generation, variable-
length forward) and every forward on CPU run eagerly, unchanged. Widths are captured on first use and kept
(at most ``k + 1`` per drafter setting); ``capture_time_s`` says what that cost, apart from decoding.

Capturing, replaying, timing and keeping the cache live in one place, :class:`Graphs`, which the target's wrapper
and the drafters' own graphs (:meth:`specdec.drafters.base.DraftRuntime.replay_graphs`) share.

Use: ``speculative_generate(GraphedDecoder(as_decoder(model)), drafter, ...)``, the wrapper built once and
reused across prompts so captures amortise; drafters that read the target's weights see through it.

Without a GPU (CI, this project's CPU machines) a decoder on :meth:`Backend.emulated_gpu()
<specdec.models.backend.Backend.emulated_gpu>` (``Graphs(device, emulate=True)`` for a function of one's own) lets
tests run the graphed path on CPU, with the torch ops a GPU runs: each capture records the forward's aten ops (:class:`EmulatedGraph`) and fails where a real capture would
(a host sync such as ``.item()``, an op whose output shape depends on the data), and each replay runs the
same recorded function again and fails unless it dispatches the same ops on the same shapes and reads the
same outside tensors (the cache, the weights, the static inputs) as the capture did: what a CUDA graph, which
replays the recorded kernels on the recorded addresses, would silently get wrong.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.models.backend import Backend
from specdec.models.cache import KVCache
from specdec.models.compact import CompactDecoder

CAPACITY_STEP = 256  # the reused cache grows in steps of this many slots
MAX_COMPILED_SHAPES = 64  # compile=True: shapes torch.compile may specialise the forward for (dynamo's default: 8)


class GraphCaptureError(RuntimeError):
    """An emulated capture or replay did what a CUDA graph cannot (see :class:`EmulatedGraph`)."""


# aten ops that read a tensor's values on the host (a sync, not allowed while a CUDA stream captures) or whose
# output shape depends on the values (likewise)
_HOST_READS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2", "aten.unique_dim",
               "aten.unique_consecutive", "aten.repeat_interleave.Tensor", "aten.equal", "aten.is_nonzero"}


def _describe(value: Any, storages: set[int]) -> Any:
    """What a replay must repeat of an op's argument: a tensor's shape and dtype (and, for a tensor made outside
    the recorded function, the address of its memory, which a CUDA graph reads); a plain value as it is."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage().data_ptr()
        return ("tensor", tuple(value.shape), value.dtype, None if storage in storages else storage)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v, storages) for v in value)
    if isinstance(value, dict):
        return tuple((k, _describe(v, storages)) for k, v in sorted(value.items()))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return value
    return type(value).__name__


class _Recorder(TorchDispatchMode):
    """Records every aten op run under it (:func:`_describe` of its arguments); refuses host reads."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.storages: set[int] = set()  # memory made by the recorded ops (not read from outside)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked = str(func.overloadpacket) in ("aten.index", "aten.index_put", "aten.index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])  # x[mask]: nonzero inside
        if masked or str(func.overloadpacket) in _HOST_READS or str(func) in _HOST_READS:
            raise GraphCaptureError(f"{func} reads a tensor's values on the host (or makes a shape out of them) inside "
                                    f"a graphed function: a CUDA graph cannot capture that; keep the work on device")
        self.ops.append((str(func), _describe(args, self.storages), _describe(kwargs, self.storages)))
        out = func(*args, **kwargs)
        for tensor in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(tensor, torch.Tensor):
                self.storages.add(tensor.untyped_storage().data_ptr())
        return out


class EmulatedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph`` on CPU, for tests (``Backend.emulated_gpu()``). :meth:`capture` runs
    ``run`` once, recording its ops; :meth:`replay` runs it again, checks it dispatched the same ops on the same
    shapes and outside memory, and copies its outputs into the captured ones (a CUDA graph writes its outputs
    into the tensors of the capture). Raises :class:`GraphCaptureError` where a real capture would fail or a
    replay would compute something else than the function."""

    def __init__(self):
        self.run: Callable[[], Any] | None = None
        self.ops: list[tuple] = []
        self.outputs: Any = None

    def capture(self, run: Callable[[], Any]) -> Any:
        recorder = _Recorder()
        with recorder:
            self.outputs = run()
        self.run, self.ops = run, recorder.ops
        return self.outputs

    def replay(self) -> None:
        recorder = _Recorder()
        with recorder:
            fresh = self.run()
        if recorder.ops != self.ops:
            first = next((i for i, (a, b) in enumerate(zip(recorder.ops, self.ops)) if a != b),
                         min(len(recorder.ops), len(self.ops)))
            seen = recorder.ops[first] if first < len(recorder.ops) else "nothing"
            wanted = self.ops[first] if first < len(self.ops) else "nothing"
            raise GraphCaptureError(f"a replay ran other ops than its capture (op {first}: {seen} where the capture ran "
                                    f"{wanted}): a CUDA graph would replay the captured ones, on the captured memory")
        self.written(fresh)

    def written(self, fresh: Any) -> None:
        """A replay's outputs copied into the capture's: where a CUDA graph's kernels write them (no kernels of
        their own, which is why a count of a step's kernels leaves these copies out)."""
        for out, new in zip(_tensors(self.outputs), _tensors(fresh)):
            out.copy_(new)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def record_graph(run: Callable[[], Any], device: torch.device, *, warmups: int = 2, pool: Any = None,
                 reset: Callable[[], None] = lambda: None) -> tuple[Any, Any]:
    """``run`` (a function of static tensors) warmed up, then captured as a graph on ``device``: (the graph, its
    outputs). CUDA: warm-up on a side stream (lazy library initialisation must not happen inside a capture),
    capture into the memory ``pool`` (:func:`graph_pool`). Elsewhere (the CPU, graphs emulated): an
    :class:`EmulatedGraph`. Either replays with ``graph.replay()``, which rewrites the outputs in place.
    ``reset`` runs after each warm-up and after the capture (which runs ``run`` where graphs are emulated): it
    undoes what ``run`` advances, so that only the replays advance it."""
    if device.type != "cuda":
        for _ in range(warmups):
            run()
            reset()
        graph = EmulatedGraph()
        outputs = graph.capture(run)
        reset()
        return graph, outputs
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
            reset()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    torch.cuda.synchronize(device)  # a capture runs nothing: nothing to reset
    return graph, outputs


def graph_pool(device: torch.device) -> Any:
    """A memory pool graphs captured on ``device`` can share (None off CUDA)."""
    return torch.cuda.graph_pool_handle() if device.type == "cuda" else None


class Graphs:
    """Functions of a few tensors replayed as graphs where graphs replay (a CUDA device, or the CPU with
    ``emulate``, for tests: :class:`EmulatedGraph`), eagerly elsewhere: the one place graphs are captured,
    replayed and timed, for the target's forwards (:class:`GraphedDecoder`) and a drafter's own work alike.

    ``graphs(fn, inputs, key=...)`` returns ``fn(*inputs)`` (a tuple of tensors, fresh): captured on the first
    call with that ``key`` and those inputs' shapes and dtypes, replayed on the next ones with the new inputs
    copied into the captured ones. The caller promises that ``key`` fixes everything else ``fn`` depends on (the
    Python values it closes over); ``hold`` is kept alive with the graph (e.g. the object whose ``id`` is in the
    key, so the id is not reused). ``fn`` runs more than once while it is captured (warm-up), so what it changes
    beyond its outputs must be what running it again rewrites the same (cache slots past the committed ones), or
    tensors it ``advances`` (a commit's lengths): those are put back after each warm-up, so that each call advances
    them once. A graph reads and advances them where they were at its capture: keep them (:meth:`keep`).

    A graph reads the memory it was captured on, so the cache it attends over is kept across generations
    (:meth:`cache`); reallocating it drops every graph. ``captures``, ``replays`` and ``capture_time_s`` count
    what happened (the capture time is a one-off cost, reported apart from decoding). ``fresh=False`` returns the
    graph's own outputs, which its next replay rewrites: for a caller that is done with them by then (saves a copy
    of each)."""

    def __init__(self, device: torch.device | str, *, emulate: bool = False):
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda" or (emulate and self.device.type == "cpu")
        self._graphs: dict[tuple, tuple[Any, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], Any]] = {}
        self._pool = None
        self.kept: KVCache | None = None  # :meth:`cache`
        self._kept_tensors: dict[str, torch.Tensor] = {}  # :meth:`keep`
        self.captures = 0
        self.replays = 0
        self.capture_time_s = 0.0

    def clear(self) -> None:
        """Drop every graph (e.g. when the memory they read, a cache, is reallocated) and their memory pool."""
        self._graphs.clear()
        self._pool = None

    def cache(self, make: Callable[[int, int, torch.Tensor], KVCache], batch_size: int, capacity: int,
              pad: torch.Tensor, *, limit: int | None = None) -> KVCache:  # pad [B]
        """The kept cache for a generation, emptied and given this batch's padding. ``make(batch_size,
        capacity, pad)`` reallocates it (and every graph is dropped) only when the batch size changes or the
        generation needs more slots than it has, rounded up to :data:`CAPACITY_STEP` slots so that slightly
        longer generations reuse it (but not past ``limit``, e.g. the model's positions)."""
        kept = self.kept
        if kept is None or kept.keys[0].shape[0] != batch_size or kept.capacity < capacity:
            rounded = -(-capacity // CAPACITY_STEP) * CAPACITY_STEP
            self.clear()
            self.kept = kept = make(batch_size, rounded if limit is None or rounded <= limit else capacity, pad)
        else:
            kept.lengths.zero_()
            kept.pad.copy_(pad)
        return kept

    def keep(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """A tensor kept under ``name`` across calls, holding ``value``'s contents: memory a graph reads or
        ``advances`` generation after generation. Reallocated only when ``value``'s shape or dtype differ from the
        last one's, which drops every graph (as reallocating the kept cache does: they read the old memory)."""
        kept = self._kept_tensors.get(name)
        if kept is None or kept.shape != value.shape or kept.dtype != value.dtype:
            if kept is not None:
                self.clear()
            kept = self._kept_tensors[name] = torch.empty_like(value)
        return kept.copy_(value)

    def __call__(self, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...], *, key: Any,
                 hold: Any = None, warmups: int = 2, advances: tuple[torch.Tensor, ...] = (),
                 fresh: bool = True) -> tuple[torch.Tensor, ...]:
        if not self.enabled:
            return fn(*inputs)
        full = (key, tuple((tuple(t.shape), t.dtype) for t in inputs), tuple(id(t) for t in advances))
        entry = self._graphs.get(full)
        if entry is None:
            start = time.perf_counter()
            static = tuple(t.clone() for t in inputs)
            if self._pool is None:
                self._pool = graph_pool(self.device)
            before = tuple(t.clone() for t in advances)

            def reset() -> None:
                for tensor, value in zip(advances, before):
                    tensor.copy_(value)

            graph, outputs = record_graph(lambda: fn(*static), self.device, warmups=warmups, pool=self._pool,
                                          reset=reset)
            entry = self._graphs[full] = (graph, static, tuple(outputs), (hold, advances))
            self.captures += 1
            self.capture_time_s += time.perf_counter() - start
        else:
            for target, value in zip(entry[1], inputs):
                target.copy_(value)
        entry[0].replay()
        self.replays += 1
        return tuple(out.clone() for out in entry[2]) if fresh else entry[2]


class GraphedDecoder:
    """A :class:`CompactDecoder` whose fixed-shape forwards replay CUDA graphs (eager on CPU: a no-op there).

    ``compile=True`` also runs each captured forward through ``torch.compile`` first (fused kernels, one
    compilation per captured shape, ~9 s each for SmolLM2-135M on an H100, then a step ~1.9x faster than graphs
    of the eager forward), which costs compile time up front; the number of shapes dynamo may compile one
    function for is raised to :data:`MAX_COMPILED_SHAPES` (a tree drafter captures up to ~k + 1 widths).
    ``graphs`` (a :class:`Graphs`, made here unless given: a drafter passes its own; emulated on CPU where the
    decoder's backend says so) captures, replays and keeps the cache; ``captures``, ``replays`` and ``capture_time_s`` are its counts.
    """

    def __init__(self, decoder: CompactDecoder, *, compile: bool = False, graphs: Graphs | None = None):
        if not isinstance(decoder, CompactDecoder):
            raise TypeError(f"GraphedDecoder wraps a CompactDecoder (specdec.models.as_decoder of a model of "
                            f"specdec.models.compact.FAMILIES), got {type(decoder).__name__}")
        self.decoder = decoder
        self.graphs = Graphs(decoder.device, emulate=decoder.backend.emulate_graphs) if graphs is None else graphs
        self.enabled = self.graphs.enabled
        self.compile = compile
        self._forward = decoder.forward
        if compile:
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, MAX_COMPILED_SHAPES)
            self._forward = torch.compile(decoder.forward, fullgraph=True, dynamic=False)

    def __getattr__(self, name: str):  # device, dtype, vocab_size, config, layers, lm_head, ...: the decoder's
        try:
            decoder = self.__dict__["decoder"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(decoder, name)

    @property
    def captures(self) -> int:
        return self.graphs.captures

    @property
    def replays(self) -> int:
        return self.graphs.replays

    @property
    def capture_time_s(self) -> float:
        return self.graphs.capture_time_s

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> KVCache:
        """The wrapper's cache (:meth:`Graphs.cache`: reused across generations that fit it); a new one where
        graphs do not replay."""
        if not self.enabled:
            return self.decoder.new_cache(batch_size, capacity, pad)
        return self.graphs.cache(self.decoder.new_cache, batch_size, capacity, pad, limit=self.decoder.max_positions)

    def __call__(self, input_ids: torch.Tensor, cache: KVCache, *, kv_len: int | None = None,
                 tree_mask: torch.Tensor | None = None, depths: torch.Tensor | None = None, last_only: bool = False,
                 capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        """As :meth:`CompactDecoder.forward`; the outputs are fresh tensors (safe to keep across steps). Forwards on
        the kept cache replay a graph per input shape; warm-up and capture write only uncommitted cache slots,
        which the replay that follows overwrites."""
        if last_only:  # a prefill: once per generation, eager
            return self.decoder(input_ids, cache, kv_len=kv_len, tree_mask=tree_mask, depths=depths, last_only=True,
                                capture=capture)
        return self.forward_then(_outputs, "forward", input_ids, cache, kv_len=kv_len, tree_mask=tree_mask,
                                 depths=depths, capture=capture)

    @property
    def captured_forward(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The forward this wrapper captures (compiled where it compiles), for a function of one's own captured whole
        around several forwards (a draft model's chain of drafts): call it inside that graph, on the kept cache, with
        no ``kv_len`` (a graphed forward attends over the cache's whole capacity)."""
        return self._forward

    def replaying(self, cache: KVCache) -> bool:
        """Whether forwards on ``cache`` replay graphs: graphs replay here, and it is the kept cache."""
        return self.enabled and cache is self.graphs.kept

    def forward_then(self, then: Callable[..., tuple[torch.Tensor, ...]], key: Any, input_ids: torch.Tensor,
                     cache: KVCache, *, kv_len: int | None = None, extra: tuple[torch.Tensor, ...] = (),
                     tree_mask: torch.Tensor | None = None, depths: torch.Tensor | None = None,
                     capture: tuple[int, ...] = (), advances: tuple[torch.Tensor, ...] = (),
                     fresh: bool = True) -> tuple[torch.Tensor, ...]:
        """:func:`forward_then` on this decoder: the forward and ``then`` captured together, one graph replay a step
        (the kept cache, graphs replaying); else the forward, then ``then``, eagerly. ``advances``, ``fresh``: as
        :class:`Graphs`'."""
        if not self.replaying(cache):
            return then(input_ids, *extra, *self.decoder(input_ids, cache, kv_len=kv_len, tree_mask=tree_mask,
                                                           depths=depths, capture=capture))
        capture = tuple(capture)
        masked, offset = tree_mask is not None, depths is not None

        def run(ids, *rest):
            mask = rest[0] if masked else None
            offsets = rest[int(masked)] if offset else None
            outputs = self._forward(ids, cache, tree_mask=mask, depths=offsets, capture=capture)
            return then(ids, *rest[int(masked) + int(offset):], *outputs)

        inputs = (input_ids,) + ((tree_mask,) if masked else ()) + ((depths,) if offset else ()) + tuple(extra)
        return self.graphs(run, inputs, key=("forward then", key, masked, offset, capture),
                           warmups=3 if self.compile else 2, advances=advances, fresh=fresh)


def _outputs(input_ids: torch.Tensor, *outputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The forward's own outputs (:meth:`GraphedDecoder.__call__`: nothing computed after it)."""
    return outputs


def forward_then(decoder, then: Callable[..., tuple[torch.Tensor, ...]], key: Any, input_ids: torch.Tensor,
                 cache: KVCache, *, kv_len: int | None = None, extra: tuple[torch.Tensor, ...] = (),
                 tree_mask: torch.Tensor | None = None, depths: torch.Tensor | None = None,
                 capture: tuple[int, ...] = (), advances: tuple[torch.Tensor, ...] = (),
                 fresh: bool = True) -> tuple[torch.Tensor, ...]:
    """``then(input_ids, *extra, *decoder(input_ids, cache, ...))``: a forward and what is computed from its outputs
    (a verification's verdict, and where ``then`` commits it, the tensors it ``advances``), a tuple of tensors. On a
    :class:`GraphedDecoder` replaying graphs both are one captured graph, keyed by ``key`` (which must fix everything
    ``then`` depends on beside its tensor arguments; ``extra`` are copied in as inputs each step), so the small ops
    after the forward cost no launches from the host; ``fresh=False``: the graph's own outputs (:class:`Graphs`)."""
    if isinstance(decoder, GraphedDecoder):
        return decoder.forward_then(then, key, input_ids, cache, kv_len=kv_len, extra=extra, tree_mask=tree_mask,
                                    depths=depths, capture=capture, advances=advances, fresh=fresh)
    return then(input_ids, *extra, *decoder(input_ids, cache, kv_len=kv_len, tree_mask=tree_mask, depths=depths,
                                            capture=capture))


def replays_graphs(decoder, cache: KVCache) -> bool:
    """Whether ``decoder``'s forwards on ``cache`` (and :func:`forward_then`'s work after them) replay graphs."""
    return isinstance(decoder, GraphedDecoder) and decoder.replaying(cache)


COMPILE_MODES = ("auto", "none", "cuda_graphs", "compiled_graphs")


def check_compile_mode(mode: str) -> str:
    if mode not in COMPILE_MODES:
        raise ValueError(f"target.compile={mode!r} is not a mode; use one of {list(COMPILE_MODES)} (auto: CUDA graphs "
                         f"on a GPU, eager on CPU)")
    return mode


def target_decoder(model, mode: str = "auto", *, backend: Backend | None = None):
    """The decoder a job runs the target through (``target.compile``), on ``backend`` (``as_decoder``'s): a
    :class:`GraphedDecoder` on a GPU (or where the backend emulates graphs) unless ``mode`` is ``"none"``, else the
    eager decoder; ``"compiled_graphs"`` also compiles each captured forward (``GraphedDecoder(compile=True)``).
    ``"cuda_graphs"`` or ``"compiled_graphs"`` where graphs cannot run is an error."""
    from specdec.models import as_decoder

    decoder = as_decoder(model, backend=backend)
    graphable = isinstance(decoder, CompactDecoder) and decoder.backend.replays_graphs(decoder.device)
    if check_compile_mode(mode) in ("cuda_graphs", "compiled_graphs") and not graphable:
        where = (decoder.device if isinstance(decoder, CompactDecoder)
                 else f"the generic path ({type(decoder).__name__})")
        raise ValueError(f"target.compile={mode} needs a target on the compact path (specdec.models.compact.FAMILIES) "
                         f"on a CUDA device, got {where}; set target.device=cuda on a GPU machine, or "
                         f"target.compile=auto")
    if not graphable or mode == "none":
        return decoder
    return GraphedDecoder(decoder, compile=mode == "compiled_graphs")
