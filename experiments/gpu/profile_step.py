"""The target's decode step alone on a GPU (not a test): its kernels and their time, and a graph's replay time.

For each backend (specdec's Triton kernels; the same with the RMSNorms and SiLU·up as kernels of their own, not inside
the products; torch's ops) and each width T (1: a plain step; more: a verification step), one forward of T tokens
after a prompt of --context tokens: the kernels one eager forward launches (torch's profiler, CUDA activity), the sum
of their times, and the mean time of a replayed CUDA graph of that forward (CUDA events around 200 replays, no host
work between them: the step's floor under the engine). Then a drafter's
top-k over its vocabulary alone, torch's ops against specdec's Triton kernel (:func:`top_k_rows`), and the target's
products with their RMSNorm or SiLU·up inside specdec's product kernel, by tile, against the two kernels apart
(:func:`product_rows`). Prints a table, writes profile_step.json to --out.

    python experiments/gpu/profile_step.py --out /tmp/step             # after experiments/gpu/setup.sh
    python experiments/gpu/profile_step.py --widths --out /tmp/top_k   # the top-k and products tables alone (seconds)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from specdec import load_target
from specdec.models import Backend, GraphedDecoder, as_decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.benchmarks
from experiments.benchmarks.step_costs import replayed_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=200, help="committed tokens before the step")
    ap.add_argument("--widths", type=int, nargs="*", default=[1, 5, 16, 32],
                    help="the step's widths T (none: the top-k and products tables alone)")
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="profile_step")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_step.py needs a CUDA device: it times a GPU's kernels and graph replays")
    device = torch.device("cuda")
    model, _ = load_target(dtype=args.dtype, device=device)
    rows = []
    backends = (("triton kernels", Backend()), ("triton kernels, norms apart", Backend(fused_products=False)),
                ("torch ops", Backend(gpu_kernels=False)))
    for name, backend in backends:
        decoder = GraphedDecoder(as_decoder(model, backend=backend))
        for batch in args.batch if args.widths else ():
            cache = decoder.new_cache(batch, args.context + max(args.widths) + 8, torch.zeros(batch, dtype=torch.long,
                                                                                              device=device))
            prompt = torch.randint(0, decoder.vocab_size, (batch, args.context), device=device)
            for width in args.widths:
                cache.lengths.zero_()
                with torch.no_grad():
                    decoder(prompt, cache, last_only=True)  # eager prefill
                    cache.commit(torch.full((batch,), args.context, device=device))
                    block = prompt[:, :width]
                    decoder.decoder(block, cache)  # warm (Triton's compilation)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        decoder.decoder(block, cache)
                        torch.cuda.synchronize()
                    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                    kernel_ms = sum(e.device_time for e in kernels) / 1000
                    decoder(block, cache)  # capture
                    entry = [e for key, e in decoder.graphs._graphs.items() if key[1][0][0] == (batch, width)]
                    replay_ms = replayed_ms(entry[0][0], 200)
                row = {"backend": name, "batch": batch, "width": width, "kernels": len(kernels),
                       "kernel_ms": kernel_ms, "graph_replay_ms": replay_ms}
                rows.append(row)
                print(f"{name:15s} batch {batch} T={width:3d}: {len(kernels):4d} kernels, {kernel_ms:6.3f} ms of "
                      f"kernels, graph replay {replay_ms:6.3f} ms", flush=True)
            decoder.graphs.clear()
            decoder.graphs.kept = None
    top_k = top_k_rows(device)
    products = product_rows(device, model.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_step.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "dtype": args.dtype,
                                                       "context": args.context, "rows": rows, "top_k": top_k,
                                                       "products": products}, indent=2) + "\n")


# SmolLM2-135M's products with a small op before them (name, inputs K, outputs N, what comes before), and the tiles of
# specdec's product kernel tried for them (rows, columns, inner steps a program); gpu_kernels.FUSED_TILE is the default
PRODUCT_CASES = [("q|k|v over the residual add and RMSNorm", 576, 960, "norm"),
                 ("gate|up over the residual add and RMSNorm", 576, 3072, "norm"),
                 ("down over SiLU·up", 1536, 576, "silu")]
PRODUCT_TILES = [(16, 16, 64), (16, 16, 128), (16, 32, 64), (16, 32, 128), (16, 64, 64)]
PRODUCT_ROWS = (1, 8, 32)  # a plain step at batch 1 and 8, a tree of 32
PRODUCT_REPEATS = 30  # calls in one graph, as a step's 30 layers run them back to back


def product_rows(device: torch.device, dtype: torch.dtype) -> list[dict]:
    """The norm or SiLU·up before a product, apart (``rms_norm`` or ``silu_mul``, then cuBLAS's ``F.linear``: two
    kernels) against inside specdec's product kernel (``normed_product``, ``silu_product``) in each of
    :data:`PRODUCT_TILES`: microseconds a call, from a CUDA graph of :data:`PRODUCT_REPEATS` calls back to back
    replayed 50 times. What ``gpu_kernels.FUSED_TILE`` and ``target.fused_products``' default are chosen by."""
    from specdec.models import gpu_kernels

    rows = []
    for label, k, n, before in PRODUCT_CASES:
        for m in PRODUCT_ROWS:
            x, delta = (torch.randn(m, 2 * k if before == "silu" else k, device=device, dtype=dtype) for _ in range(2))
            norm, weight = torch.randn(k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype)
            options = {"apart": (lambda: F.linear(gpu_kernels.silu_mul(x), weight)) if before == "silu" else
                       (lambda: F.linear(gpu_kernels.rms_norm(x, delta, norm, 1e-5), weight))}  # x += delta each call
            for tile in PRODUCT_TILES:
                options[f"inside {tile}"] = (functools.partial(gpu_kernels.silu_product, x, weight, tile=tile)
                                             if before == "silu" else
                                             functools.partial(gpu_kernels.normed_product, x, delta, norm, 1e-5, weight,
                                                               tile=tile))
            for option, call in options.items():
                with torch.no_grad():
                    for _ in range(3):  # Triton's compilation, the allocator's blocks
                        call()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for _ in range(PRODUCT_REPEATS):
                            call()
                us = replayed_ms(graph, 50) / PRODUCT_REPEATS * 1000
                rows.append({"case": label, "rows": m, "option": option, "us_per_call": us})
                print(f"product {label:42s} M={m:3d} {option:20s}: {us:6.2f} us a call", flush=True)
    return rows


# a drafter's candidates (rows, vocabulary, dtype, k, log-probabilities): Medusa's four heads over the shipped draft
# vocabulary and over a full one (heads trained without one), at batch 1 and 8; an EAGLE tree level (4 expanded nodes)
TOP_K_CASES = [("medusa heads, draft vocabulary", 4, 8192, torch.bfloat16, 10, False),
               ("medusa heads, draft vocabulary, log-probs", 4, 8192, torch.bfloat16, 10, True),
               ("medusa heads, full vocabulary", 4, 49152, torch.bfloat16, 10, False),
               ("medusa heads, full vocabulary, batch 8", 32, 49152, torch.bfloat16, 10, False),
               ("eagle level", 4, 8192, torch.float32, 4, True),
               ("eagle level, batch 8", 32, 8192, torch.float32, 4, True)]


def top_k_rows(device: torch.device) -> list[dict]:
    """A drafter's top-k over its vocabulary alone (``Backend.top_k``, EAGLE's ``Backend.top_log_softmax``): torch's ops
    (``float()``, ``topk`` and, for log-probabilities, ``logsumexp``; EAGLE's ``log_softmax`` then ``topk``) against
    specdec's Triton kernel, each as one eager call under the profiler (its kernels) and as a replayed CUDA graph (the
    mean of 200 replays)."""
    rows = []
    for label, count, width, dtype, k, log_probs in TOP_K_CASES:
        logits = torch.randn(count, width, device=device).to(dtype)
        for name, backend in (("triton kernels", Backend()), ("torch ops", Backend(gpu_kernels=False))):
            def call():  # EAGLE's call for its log-probabilities (log_softmax then topk in torch), Medusa's else
                return backend.top_log_softmax(logits, k) if log_probs and label.startswith("eagle") else \
                    backend.top_k(logits, k, log_probs=log_probs)

            with torch.no_grad():
                for _ in range(3):  # Triton's compilation, the allocator's blocks
                    call()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    call()
                    torch.cuda.synchronize()
                kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
            replay_us = replayed_ms(graph, 200) * 1000
            rows.append({"case": label, "backend": name, "rows": count, "width": width, "k": k,
                         "kernels": len(kernels), "graph_replay_us": replay_us})
            print(f"top-k {label:45s} {name:15s}: {len(kernels):3d} kernels, graph replay {replay_us:7.1f} us",
                  flush=True)
    return rows


if __name__ == "__main__":
    main()
