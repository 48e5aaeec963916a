"""The speed of light of a decode step: the bytes it must read over the machine's read bandwidth.

A decode step at small batch is memory-bound at best: it reads every weight of the target once and the KV
cache it attends. Over the bandwidth the machine reads memory at, that gives the floor of the step's time;
``bandwidth_fraction`` = floor / measured step says how close a run came to it (1.0 = at the floor). The
bandwidth comes from a short probe (the best of a few sums over a buffer far larger than the caches), run
once per machine and cached under the converted-model cache root (``bandwidth.json``), keyed by the
machine's description (CPU model and thread count, or the GPU's name) and torch's version. A run whose
plain steps read their bytes faster than the cached figure (a probe taken on a busy moment of a shared
machine) probes again and keeps the higher of the new probe and that rate: a fraction above 1 would only
say that the probe was low.
"""

from __future__ import annotations

import json
import time

import torch

from specdec.jobs.io import write_json
from specdec.models.backend import Backend

PROBE_BYTES = {"cpu": 512 * 2**20, "cuda": 2 * 2**30}  # far beyond the caches (last-level or L2)
PROBE_REPEATS = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_read_bandwidth(device: torch.device | str = "cpu", num_bytes: int | None = None,
                         repeats: int = PROBE_REPEATS) -> float:
    """Bytes per second a sum over ``num_bytes`` of float32 reads from memory (the best of ``repeats``)."""
    device = torch.device(device)
    num_bytes = num_bytes or PROBE_BYTES.get(device.type, PROBE_BYTES["cpu"])
    x = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    x.sum()  # first touch and lazy initialisation stay out of the timing
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        x.sum()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


def read_bandwidth(device: torch.device | str = "cpu", at_least: float = 0.0) -> float:
    """This machine's read bandwidth in bytes/s: probed on first use, then read from the cache. ``at_least``:
    a rate this machine was seen to read at (a decode step's bytes over its time); a cached figure below it
    is probed again, and the higher of the probe and ``at_least`` is kept."""
    from specdec.jobs.runs import machine_description
    from specdec.models.loading import cache_root

    device = torch.device(device)
    key = machine_description(device)
    if "torch" not in key:
        key += f", torch {torch.__version__}"
    path = cache_root() / "bandwidth.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), (int, float)) and known[key] > 0 and known[key] >= at_least:
        return float(known[key])
    bandwidth = max(probe_read_bandwidth(device), at_least)
    known[key] = bandwidth
    try:
        write_json(path, known)
    except OSError:
        pass  # a read-only cache only costs a probe per run
    return bandwidth


def step_bytes(model, context: float, batch: int = 1, backend: Backend = Backend()) -> float:
    """Bytes one decode step reads: every parameter once (tied weights counted once; a weight the CPU kernel
    streams from float16 or coded panels under the model's ``backend``, as those panels' bytes) and the KV cache of
    ``context`` positions in each of ``batch`` rows."""
    params = {id(p): p for p in model.parameters()}.values()
    streamed = backend.streamed_bytes()
    weights = sum(streamed.get(id(p), p.numel() * p.element_size()) for p in params)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    itemsize = next(iter(params)).element_size()
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * itemsize
    return weights + batch * context * per_position


def speed_of_light(model, context: float, batch: int, plain_step_s: float, verify_step_s: float,
                   device: torch.device | str, backend: Backend = Backend()) -> dict[str, float]:
    """results.json's speed-of-light fields for a run whose plain and verify steps took these times (the model's
    forwards on ``backend``)."""
    num_bytes = step_bytes(model, context, batch, backend)
    bandwidth = read_bandwidth(device, at_least=num_bytes / plain_step_s if plain_step_s > 0 else 0.0)
    floor = num_bytes / bandwidth
    return {
        "step_bytes": num_bytes,
        "read_bandwidth_GBps": bandwidth / 1e9,
        "bandwidth_floor_s": floor,
        "bandwidth_fraction": floor / plain_step_s if plain_step_s > 0 else float("nan"),
        "bandwidth_fraction_verify": floor / verify_step_s if verify_step_s > 0 else float("nan"),
    }
