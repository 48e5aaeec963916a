r"""The target's step cost by the number of tokens it carries, at a real model's shape with random weights (not a test).

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

``--drafters`` adds the drafters' own steps at the shape's width, their weights random too (:func:`drafter_steps`):
one level of EAGLE's tree (``fc``, its layer and draft LM head over ``w`` nodes a row), Medusa's heads over the target's
LM head, the block drafter's block (its context written, its layers, its draft LM head), each as the shipped drafter
is built (``--draft-vocab``, ``--block-layers``, ``--block-size`` change that; with ``--weight-bits`` EAGLE's and the
block drafter's weights are 4-bit codes, as the shipped ones' are on a CPU), timed as the target's steps are; and
``draft_model``: a draft model's forward over ``w`` tokens at ``--draft-shape`` (a preset or a config.json; its LM head
cut to ``--draft-model-vocab`` tokens as ``drafter.draft_vocab`` cuts the shipped draft's). Replay's
``costs=<this JSON>`` builds each drafting step from these rows (:func:`specdec.replay.cost_model.drafting_ms`): its
figures are then predictions (the loop's host work left out), not bounds. ``--into <curve>`` writes a curve measured
before (same shape, settings and machine) with this run's drafters' rows: one file for replay.

    python experiments/benchmarks/step_costs.py --shape llama-3.1-8b --dtype bfloat16        # one H100 / H200
    python experiments/benchmarks/step_costs.py --shape llama-3.1-8b --drafters eagle medusa dflash draft_model \
        --draft-shape llama-3.2-1b --widths 1 --into outputs/step_costs/step_costs_llama-3.1-8b.json \
        --out outputs/drafts
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
            return replayed_ms(graph, repeats)
        return eager_ms(lambda: decoder(block, cache, kv_len=context + width), repeats)


def replayed_ms(graph: torch.cuda.CUDAGraph, repeats: int) -> float:
    """ms of one replay of ``graph``: CUDA events around ``repeats`` replays after a first, no host sync between."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def eager_ms(step, repeats: int) -> float:
    """ms of ``step()``: the median of ``repeats`` calls after a first."""
    times = []
    for _ in range(repeats + 1):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[1:]) * 1e3


DRAFTERS = ("eagle", "medusa", "dflash", "draft_model")
EAGLE_WIDTHS = (1, 4, 8)  # nodes a row in one level of EAGLE's tree (a chain's 1, its default tree's 4), or tokens
# a catch-up carries (τ); a draft model's forward too


def timed(step, device: torch.device, repeats: int) -> float:
    """ms of ``step()``: on a GPU the replay of its captured CUDA graph (CUDA events around ``repeats`` replays, no
    host sync between them), on a CPU the median of ``repeats`` calls after a first."""
    with torch.no_grad():
        if device.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # compiles the Triton kernels, allocates outside the capture
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            return replayed_ms(graph, repeats)
        return eager_ms(step, repeats)


def drafter_steps(model, backend: Backend, args) -> list[dict]:
    """The drafters' own steps at ``model``'s width (see the module doc), at each batch size, after
    ``args.context`` committed entries in their caches; each drafter built once, on the device, in the target's
    dtype. A drafter that raises gives a row naming the error and costs no other row."""
    from specdec.drafters.base import round_weights
    from specdec.drafters.dflash.model import DFlashConfig, DFlashModel
    from specdec.drafters.eagle.model import EagleConfig, EagleModel, default_aux_layers
    from specdec.drafters.medusa.heads import MedusaHeads

    config, device, dtype = model.config, model.device, model.dtype
    embed = model.get_input_embeddings().weight
    lm_head = model.get_output_embeddings().weight
    vocab, hidden = config.vocab_size, config.hidden_size
    aux = default_aux_layers(config.num_hidden_layers)  # the fc's input width is what the timing needs of them
    g = torch.Generator(device="cpu").manual_seed(0)
    built: dict[str, object] = {}
    rows = []

    def draft(name: str):
        """The drafter ``name`` at this width, random weights (built on first use)."""
        if name not in built:
            with torch.device(device):
                if name == "eagle":
                    cfg = EagleConfig.for_target(config, draft_vocab_size=args.draft_vocab, aux_layers=aux)
                    built[name] = EagleModel(cfg, backend=backend).to(dtype).eval().attach(embed)
                    round_weights(built[name], args.weight_bits, keep=(embed,), what="EAGLE drafter")
                elif name == "dflash":
                    cfg = DFlashConfig.for_target(config, num_layers=args.block_layers, block_size=args.block_size,
                                                  mask_token_id=0, aux_layers=aux, draft_vocab_size=args.draft_vocab)
                    built[name] = block = DFlashModel(cfg, backend=backend).to(dtype).eval().attach(embed)
                    round_weights(block, args.weight_bits, keep=(embed, block.fc.weight), what="block drafter")
                elif name == "draft_model":  # its weights as trained (the shipped draft's drafter.weight_bits: null)
                    cut = {"vocab_size": args.draft_model_vocab} if args.draft_model_vocab else {}
                    small = synthetic_target(args.draft_shape, dtype=dtype, device=device, **cut)
                    decoder = as_decoder(small, backend=Backend(gpu_kernels=backend.gpu_kernels))
                    built[name] = GraphedDecoder(decoder) if device.type == "cuda" else decoder
                else:
                    ids = torch.randperm(vocab, generator=g)[:args.draft_vocab].sort().values.to(device)  # vocabulary
                    heads = MedusaHeads(hidden, vocab, 4, token_ids=ids).to(dtype).eval()
                    heads.backend = backend
                    built[name] = heads
        return built[name]

    def run(name: str, what: str, batch: int, build, width: int | None = None) -> None:
        row = {"drafter": name, "what": what, "batch": batch, "width": width}  # width: nodes or tokens a row
        try:
            ms = (measure(draft(name), batch, width, args.context, args.repeats) if name == "draft_model"
                  else timed(build(), device, args.repeats))
            rows.append({**row, "ms": ms})
        except Exception as exc:  # noqa: BLE001 -- a drafter that fails on this device costs its own row only
            rows.append({**row, "error": f"{type(exc).__name__}: {exc}"})
        print(f"{name} {what}, batch {batch}: " + (f"{rows[-1]['ms']:.3f} ms" if "ms" in rows[-1]
                                                   else rows[-1]["error"]), flush=True)

    def cache_for(drafter, batch: int, extra: int):
        cache = drafter.new_cache(batch, args.context + extra + 8, torch.zeros(batch, dtype=torch.long, device=device))
        cache.lengths.zero_()
        cache.commit(torch.full((batch,), args.context, device=device))
        return cache

    def tokens(batch: int, width: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, width), generator=g).to(device)

    def features(batch: int, width: int) -> torch.Tensor:
        return torch.randn(batch, width, len(aux) * hidden, generator=g).to(device, dtype)

    def eagle(batch: int, width: int):
        drafter = draft("eagle")
        cache, toks, feats = cache_for(drafter, batch, width), tokens(batch, width), features(batch, width)
        positions = cache.positions(torch.arange(width, device=device))
        return lambda: drafter.logits(drafter.step(drafter.fuse(feats), toks, cache, positions))

    def medusa(batch: int):
        heads = draft("medusa")
        rows_of_head = heads.draft_lm_head(lm_head)
        state = torch.randn(batch, 1, hidden, generator=g).to(device, dtype)
        return lambda: heads(state, rows_of_head)

    def dflash(batch: int):
        drafter = draft("dflash")
        cache, feats = cache_for(drafter, batch, args.block_size + 1), features(batch, 1)
        anchors = tokens(batch, 1)[:, 0]
        return lambda: drafter.logits(drafter.draft_block(anchors, drafter.write_context(feats, cache)[:, -1], cache))

    for batch in args.batch:
        if "eagle" in args.drafters:
            for width in EAGLE_WIDTHS:
                run("eagle", f"a tree level of {width} node{'s' if width > 1 else ''}", batch,
                    lambda width=width, batch=batch: eagle(batch, width), width)
        if "medusa" in args.drafters:
            run("medusa", "4 heads over the target's LM head rows", batch, lambda batch=batch: medusa(batch))
        if "dflash" in args.drafters:
            run("dflash", f"a block of {args.block_size} ({args.block_layers} layers)", batch,
                lambda batch=batch: dflash(batch))
        if "draft_model" in args.drafters:
            for width in EAGLE_WIDTHS:
                run("draft_model", f"{args.draft_shape} over {width} token{'s' if width > 1 else ''}", batch, None,
                    width)
    return rows


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
    ap.add_argument("--drafters", nargs="*", default=[], choices=DRAFTERS, help="the drafters' steps at this width too")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="the drafters' draft vocabulary (the shipped ones')")
    ap.add_argument("--block-layers", type=int, default=2, help="the block drafter's layers (the shipped one's)")
    ap.add_argument("--block-size", type=int, default=8, help="the block drafter's block (the shipped one's)")
    ap.add_argument("--draft-shape", default=None, help="--drafters draft_model: the draft model's shape (a preset or "
                                                          "a config.json), e.g. llama-3.2-1b for llama-3.1-8b")
    ap.add_argument("--weight-bits", type=int, choices=(4, 8), default=None,
                    help="a CPU's float32 weights as codes of this many bits (the embedding's 8), streamed as such")
    ap.add_argument("--draft-model-vocab", type=int, default=0, help="the draft model's LM head over this many "
                                                                    "tokens (drafter.draft_vocab; the shipped 8192); "
                                                                    "0: its shape's vocabulary")
    ap.add_argument("--into", default=None, help="a curve this script wrote for the same shape, dtype and machine: "
                                                 "written out again with this run's drafters' rows, so replay reads "
                                                 "one file (the curve measured in one step, the drafters in another)")
    ap.add_argument("--out", default="outputs/step_costs")
    args = ap.parse_args(argv)
    into = None
    if args.into is not None:
        try:
            into = json.loads(Path(args.into).read_text())
            into["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"--into {args.into!r} is not a curve this script wrote ({exc}): give its step_costs_<shape>.json")
        if not args.drafters:
            ap.error("--into adds the drafters' rows to a curve: name them (--drafters eagle medusa dflash ...)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    if "draft_model" in args.drafters and args.draft_shape is None:
        ap.error("--drafters draft_model times a draft model of another shape: name it, e.g. "
                 "--draft-shape llama-3.2-1b")
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
    drafter_rows = drafter_steps(model, backend, args) if args.drafters else []
    given = Path(args.shape)  # a preset's name (llama-3.1-8b, whose dots are no suffix) or a JSON file's
    name = (given.parent.name if given.name == "config.json" else given.stem) if given.suffix == ".json" else args.shape
    result = {"mark": MARK, "shape": args.shape, "layers": model.config.num_hidden_layers, "dtype": str(dtype),
              "device": machine_description(device), "torch": torch.__version__, "context": args.context,
              "read_bandwidth_GBps": bandwidth / 1e9, "parameters": sum(p.numel() for p in model.parameters()),
              "kernels": "triton" if device.type == "cuda" and args.gpu_kernels else "torch ops or the CPU's",
              "weights": "float" if args.weight_bits is None else f"{args.weight_bits}-bit codes (embedding 8-bit)",
              "rows": rows, "drafter_rows": drafter_rows}
    if into is not None:
        fields = ("shape", "layers", "dtype", "device", "context", "weights")
        differ = {f: (into.get(f), result[f]) for f in fields if into.get(f) != result[f]}
        if differ:
            raise SystemExit(f"--into {args.into!r} was measured otherwise than this run (field: curve's, this run's): "
                             f"{differ}; measure the drafters with the curve's settings")
        result = {**into, "drafter_rows": drafter_rows, "drafters_torch": torch.__version__}
        rows = result["rows"]
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
    if drafter_rows:
        plain_ms = {r["batch"]: r["ms"] for r in rows if r["width"] == 1}
        lines += ["", f"Drafters' steps at this width (random weights, draft vocabulary {args.draft_vocab}):", "",
                  "| drafter | what | batch | ms | x plain step |", "|---|---|---|---|---|"]
        lines += [f"| {r['drafter']} | {r['what']} | {r['batch']} | "
                  + (f"{r['ms']:.3f} | {r['ms'] / plain_ms[r['batch']]:.2f} |" if plain_ms.get(r["batch"]) and "ms" in r
                     else f"failed: {r.get('error', '')[:80]} | — |") for r in drafter_rows]
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
