"""The target's decode step alone on a GPU (not a test): its kernels and their time, and a graph's replay time.

For each backend (specdec's Triton kernels, torch's ops) and each width T (1: a plain step; more: a verification
step), one forward of T tokens after a prompt of --context tokens: the kernels one eager forward launches (torch's
profiler, CUDA activity), the sum of their times, and the mean time of a replayed CUDA graph of that forward
(CUDA events around 200 replays, no host work between them: the step's floor under the engine). Then a drafter's
top-k over its vocabulary alone, torch's ops against specdec's Triton kernel (:func:`top_k_rows`). Prints a table,
writes profile_step.json to --out.

    python experiments/gpu/profile_step.py --out /tmp/step             # after experiments/gpu/setup.sh
    python experiments/gpu/profile_step.py --widths --out /tmp/top_k   # the top-k table alone (seconds)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from specdec import load_target
from specdec.models import Backend, GraphedDecoder, as_decoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=200, help="committed tokens before the step")
    ap.add_argument("--widths", type=int, nargs="*", default=[1, 5, 16, 32],
                    help="the step's widths T (none: the drafters' top-k table alone)")
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="profile_step")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_step.py needs a CUDA device: it times a GPU's kernels and graph replays")
    device = torch.device("cuda")
    model, _ = load_target(dtype=args.dtype, device=device)
    rows = []
    for name, backend in (("triton kernels", Backend()), ("torch ops", Backend(gpu_kernels=False))):
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
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    entry = [e for key, e in decoder.graphs._graphs.items() if key[1][0][0] == (batch, width)]
                    graph = entry[0][0]
                    graph.replay()
                    start.record()
                    for _ in range(200):
                        graph.replay()
                    end.record()
                    end.synchronize()
                    replay_ms = start.elapsed_time(end) / 200
                row = {"backend": name, "batch": batch, "width": width, "kernels": len(kernels),
                       "kernel_ms": kernel_ms, "graph_replay_ms": replay_ms}
                rows.append(row)
                print(f"{name:15s} batch {batch} T={width:3d}: {len(kernels):4d} kernels, {kernel_ms:6.3f} ms of "
                      f"kernels, graph replay {replay_ms:6.3f} ms", flush=True)
            decoder.graphs.clear()
            decoder.graphs.kept = None
    top_k = top_k_rows(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_step.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "dtype": args.dtype,
                                                       "context": args.context, "rows": rows, "top_k": top_k},
                                                      indent=2) + "\n")


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
                graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(200):
                    graph.replay()
                end.record()
                end.synchronize()
            replay_us = start.elapsed_time(end) / 200 * 1000
            rows.append({"case": label, "backend": name, "rows": count, "width": width, "k": k,
                         "kernels": len(kernels), "graph_replay_us": replay_us})
            print(f"top-k {label:45s} {name:15s}: {len(kernels):3d} kernels, graph replay {replay_us:7.1f} us",
                  flush=True)
    return rows


if __name__ == "__main__":
    main()
