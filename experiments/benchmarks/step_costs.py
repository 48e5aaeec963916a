"""The target's step cost by the number of tokens it carries, at a real model's shape with random weights (not a test).

A synthetic target (``specdec.models.synthetic``: a preset such as ``llama-3.1-8b``, or any config.json; weights
drawn on the device, nothing transferred) runs through the same compact decoder and backend as a real one. For each
batch size and width T (1: a plain decode step; more: a verification step of a chain, or of a tree of T nodes,
which costs the same kernels with another mask), one forward of T new tokens per row after ``--context`` committed
tokens: on a GPU the replay of its captured CUDA graph (CUDA events around ``--repeats`` replays, no host sync
between them), on a CPU the median of ``--repeats`` eager forwards. Beside each: the ratio to the plain step and the
bandwidth floor (every weight and the KV cache read once at the probed read bandwidth). Writes
``step_costs_<shape>.json`` (the curve replay can read), ``.md`` and ``.png`` to --out; every output is marked
SYNTHETIC: costs only, no τ or outputs. On a CPU, ``--weight-bits 4`` rounds the weights to 4-bit codes (the
embedding and LM head to 8-bit ones) that specdec's kernels stream as such: a 4-bit GGUF's memory-bound regime.

    python experiments/benchmarks/step_costs.py --shape llama-3.1-8b --dtype bfloat16        # one H100 / H200
    python experiments/benchmarks/step_costs.py --shape llama-3.2-1b --dtype float32 --widths 1 2 4 8 16
    python experiments/benchmarks/step_costs.py --shape llama-3.1-8b --layers 2                # a short model, same width
    python experiments/benchmarks/step_costs.py --shape llama-3.2-1b --weight-bits 4 --batch 1 --repeats 10  # a CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.decode.speed_of_light import probe_read_bandwidth, step_bytes
from specdec.jobs.runs import machine_description
from specdec.models import Backend, GraphedDecoder, as_decoder
from specdec.models.synthetic import MARK, synthetic_target


def measure(decoder, batch: int, width: int, context: int, repeats: int) -> float:
    """ms of one forward of ``width`` new tokens per row after ``context`` committed ones (see the module doc)."""
    device = decoder.device
    cache = decoder.new_cache(batch, context + width + 8, torch.zeros(batch, dtype=torch.long, device=device))
    cache.lengths.zero_()
    g = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(0, decoder.vocab_size, (batch, context), generator=g).to(device)
    block = torch.randint(0, decoder.vocab_size, (batch, width), generator=g).to(device)
    with torch.no_grad():
        decoder(prompt, cache, last_only=True)  # the context (eager)
        cache.commit(torch.full((batch,), context, device=device))
        if device.type == "cuda":
            decoder(block, cache)  # captured here (a GraphedDecoder), then replayed
            graph = [entry for key, entry in decoder.graphs._graphs.items() if key[1][0][0] == (batch, width)][0][0]
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / repeats
        times = []
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            decoder(block, cache, kv_len=context + width)
            times.append(time.perf_counter() - begin)
        return statistics.median(times[1:]) * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b", help="a preset (specdec.models.synthetic.SHAPES) or a config.json")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--layers", type=int, default=None, help="keep this many layers (a shorter model, same width)")
    ap.add_argument("--widths", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--context", type=int, default=512, help="committed tokens before the step")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--gpu-kernels", type=int, default=1, help="0: torch's ops on a GPU (target.gpu_kernels=false)")
    ap.add_argument("--weight-bits", type=int, choices=(4, 8), default=None,
                    help="a CPU's float32 weights as codes of this many bits (the embedding's 8), streamed as such")
    ap.add_argument("--out", default="outputs/step_costs")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    if args.weight_bits is not None and device.type != "cpu":
        ap.error(f"--weight-bits {args.weight_bits}: codes are what the CPU kernels stream; leave it out on a GPU")
    model = synthetic_target(args.shape, dtype=dtype, device=device, weight_bits=args.weight_bits, **overrides)
    backend = Backend(weights="float" if args.weight_bits is None else "codes", gpu_kernels=bool(args.gpu_kernels))
    decoder = as_decoder(model, backend=backend)
    if device.type == "cuda":
        decoder = GraphedDecoder(decoder)
    bandwidth = probe_read_bandwidth(device)
    rows = []
    for batch in args.batch:
        plain = None
        for width in args.widths:
            ms = measure(decoder, batch, width, args.context, args.repeats)
            # after a step, which packs the panels the CPU kernels stream (codes count as their bytes)
            floor_ms = 1e3 * step_bytes(model, args.context, batch, backend) / bandwidth
            plain = ms if width == 1 else plain
            rows.append({"batch": batch, "width": width, "ms": ms, "x_plain_step": None if plain is None else ms / plain,
                         "floor_ms": floor_ms, "bandwidth_fraction": floor_ms / ms})
            print(f"batch {batch} T={width:3d}: {ms:8.3f} ms  (floor {floor_ms:.3f} ms, {floor_ms / ms:.0%})", flush=True)
        if isinstance(decoder, GraphedDecoder):
            decoder.graphs.clear()
            decoder.graphs.kept = None
    given = Path(args.shape)  # a preset's name (llama-3.1-8b, whose dots are no suffix) or a JSON file's
    name = (given.parent.name if given.name == "config.json" else given.stem) if given.suffix == ".json" else args.shape
    result = {"mark": MARK, "shape": args.shape, "layers": model.config.num_hidden_layers, "dtype": str(dtype),
              "device": machine_description(device), "torch": torch.__version__, "context": args.context,
              "read_bandwidth_GBps": bandwidth / 1e9, "parameters": sum(p.numel() for p in model.parameters()),
              "kernels": "triton" if device.type == "cuda" and args.gpu_kernels else "torch ops or the CPU's",
              "weights": "float" if args.weight_bits is None else f"{args.weight_bits}-bit codes (embedding 8-bit)",
              "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"step_costs_{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"## Step cost by width: {args.shape} ({result['layers']} layers), {MARK}",
             f"{result['device']}, {result['dtype']}, weights {result['weights']}, {args.context} committed tokens, "
             f"read bandwidth {bandwidth / 1e9:.0f} GB/s", "",
             "| batch | T | ms | x plain step | floor ms | bandwidth fraction |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['width']} | {r['ms']:.3f} | "
              f"{'—' if r['x_plain_step'] is None else format(r['x_plain_step'], '.2f')} | {r['floor_ms']:.3f} | "
              f"{r['bandwidth_fraction']:.0%} |" for r in rows]
    (out / f"step_costs_{name}.md").write_text("\n".join(lines) + "\n")
    plot(result, out / f"step_costs_{name}.png")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for batch in sorted({r["batch"] for r in result["rows"]}):
        rows = [r for r in result["rows"] if r["batch"] == batch]
        ax.plot([r["width"] for r in rows], [r["ms"] for r in rows], marker="o", label=f"batch {batch}")
        ax.axhline(rows[0]["floor_ms"], linestyle=":", color=ax.lines[-1].get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per row in the step (T)")
    ax.set_ylabel("ms per step")
    weights = "" if result.get("weights", "float") == "float" else f", {result['weights']}"
    ax.set_title(f"{result['shape']}: SYNTHETIC, costs only\n{result['device']}, {result['dtype']}{weights}",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
