"""The decode step on a GPU (not a test): eager vs CUDA graphs, plain and speculative, batch 1 and 8.

One process, the same prompts for every method; batch 1 runs each prompt through every method in turn after
an untimed warm-up (``side_by_side``), batch 8 runs groups of 8 prompts (left-padded) through each method in
turn. The target runs in bf16 on the GPU; "graphs" replays CUDA graphs of its forwards
(:class:`specdec.models.GraphedDecoder`, one wrapper per setting, reused across prompts; capture time is
reported apart), "compiled" also runs each captured forward through ``torch.compile`` first. The target's fused
forward runs on specdec's Triton kernels (:mod:`specdec.models.gpu_kernels`); a method marked "torch ops" runs the
same forward through torch's ops (``Backend(gpu_kernels=False)``), one marked "norms apart" its RMSNorms and SiLU·up as
kernels of their own before cuBLAS's products (``Backend(fused_products=False)``; by default they run inside the
products), one marked "verdict apart" a step's greedy verdict and commit through torch's ops (``Backend(fused_steps=
False)``; by default one kernel each). "transformers compiled static cache" is the peer
a reviewer runs (:class:`CompiledStaticLoop`: transformers' model, a StaticCache, torch.compile's reduce-overhead
mode; batch 1, CUDA only); "transformers prompt lookup" and "transformers assisted" are its ``generate`` with prompt
lookup and with an early-exit assistant (:class:`TransformersGenerate`, batch 1; ``--skip transformers`` leaves the
three out).

Speed of light: a plain decode step must read the target's weights once and the KV cache it attends; the
floor is those bytes over the GPU's read bandwidth, measured here by a short probe (``specdec.decode.speed_of_light``).
``bandwidth_fraction`` = floor / measured target step (plain step, or verify step: it reads the same bytes). Writes ``gpu_<source>.json`` / ``.md`` to --out.

    python experiments/benchmarks/gpu.py --prompts 24 --new 128
    python experiments/benchmarks/gpu.py --prompts 16 --new 128 --compile --skip eagle   # the slowest left out
    python experiments/benchmarks/gpu.py --prompts 4 --new 32 --skip eagle medusa draft_model   # --skip: by word
    python experiments/benchmarks/gpu.py --dump-prompts prompts.json --prompts 24   # token ids, on a CPU machine
    python experiments/benchmarks/gpu.py --prompt-file prompts.json                  # on a GPU machine without datasets
    python experiments/benchmarks/gpu.py --temperature 1 --skip eager torch   # sampled: specdec's rows only

``--temperature T`` > 0 samples every specdec row at T (the exact rule's verdict replays inside the target's graph
there; transformers' rows, greedy loops, are left out; outputs ≠ plain then differ by chance, not by numerics), with
``--top-p P`` at top-p P.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from specdec import NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.decode.speed_of_light import probe_read_bandwidth, step_bytes
from specdec.drafters import DFlashDrafter, DraftModelDrafter, EagleDrafter, MedusaDrafter
from specdec.drafters.base import NoDrafter, graph_runners
from specdec.drafters.medusa.drafter import CPU_MIN_CONFIDENCE
from specdec.jobs.data import left_pad
from specdec.jobs.runs import machine_description
from specdec.models import Backend, GraphedDecoder, as_decoder
from specdec.run import drafter_graph_fields

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side  # noqa: E402


UNBUILT = object()  # a drafter that failed to build


class EachStepRead(NoDrafter):
    """Plain decoding through the loop drafters run, every step read back before the next is launched (a subclass of
    NoDrafter is not read a step late): what plain decoding on a GPU was before, beside what it is."""


def assisted_peer(model, tokenizer, layers: int, k: int) -> TransformersGenerate:
    """transformers' assisted generation with the target's first ``layers`` layers as its assistant (shared
    weights, as specdec's early-exit draft), ``k`` drafts a step."""
    from experiments.benchmarks.vs_transformers import early_exit_hf

    assistant = early_exit_hf(model, layers)
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    return TransformersGenerate(model, tokenizer.pad_token_id, assistant_model=assistant)


def prompt_ids(args, tokenizer) -> list[list[int]]:
    if args.prompt_file:
        return json.loads(Path(args.prompt_file).read_text())[: args.prompts]
    from specdec.jobs.data import encode_prompt, load_prompt_mix, load_prompts

    if args.source == "mix":  # half MT-Bench, half HumanEval
        rows = load_prompt_mix(["mtbench", "humaneval"], limit_per_source=args.prompts // 2)
    else:
        rows = load_prompts(args.source, limit=args.prompts)
    return [encode_prompt(tokenizer, row) for row in rows]


class CompiledStaticLoop:
    """The peer a reviewer runs: transformers' own model decoded the gpt-fast way (greedy, batch 1), a
    ``StaticCache`` of ``max_cache_len`` slots, the one-token forward under ``torch.compile(mode="reduce-overhead",
    fullgraph=True)`` (CUDA graphs of Inductor's fused kernels), the argmax on the device. Stop tokens are looked for
    every ``check_every`` tokens (one host sync each), the tokens past the first one dropped. Called as the benchmark's
    methods are: a GenerationOutput whose stats count its one-token forwards and their time."""

    def __init__(self, model, max_cache_len: int = 1024, check_every: int = 8):
        from transformers import StaticCache

        self.model, self.check_every = model, check_every
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self.step = torch.compile(self._step, mode="reduce-overhead", fullgraph=True)

    def _step(self, token, position):  # [1, 1], [1] -> the next token [1, 1]
        logits = self.model(token, past_key_values=self.cache, cache_position=position, position_ids=position[None],
                            use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    @torch.no_grad()  # the warm-up call too: a graph recorded with autograd on leaves the fast path (cudagraph trees)
    def __call__(self, ids, max_new_tokens: int, eos_token_id: list[int]):
        from specdec.decode.engine import GenerationOutput
        from specdec.decode.metrics import DecodeStats

        self.cache.reset()
        n = ids.shape[1]
        start = time.perf_counter()
        logits = self.model(ids, past_key_values=self.cache, cache_position=torch.arange(n, device=ids.device),
                            use_cache=True).logits
        tokens = [logits[:, -1].argmax(-1, keepdim=True)]
        if ids.is_cuda:
            torch.cuda.synchronize()
        prefill = time.perf_counter() - start
        stops = torch.tensor([t for t in eos_token_id if t is not None], device=ids.device)
        position = torch.tensor([n], device=ids.device)
        start = time.perf_counter()
        while len(tokens) < max_new_tokens:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed (cloned)
            tokens.append(self.step(tokens[-1], position).clone())
            position += 1
            if len(tokens) % self.check_every == 0 and torch.isin(torch.cat(tokens[-self.check_every:]), stops).any():
                break
        row = torch.cat(tokens, 1)[0].tolist()  # synchronises
        elapsed = time.perf_counter() - start
        steps = len(tokens) - 1
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_token_id), len(row))
        stats = DecodeStats(target_forwards=steps, verify_steps=steps, verified_tokens=steps, target_time_s=elapsed,
                            prefill_time_s=prefill, new_tokens=cut, wall_time_s=prefill + elapsed)
        return GenerationOutput(sequences=[row[:cut]], stats=stats)


class TransformersGenerate:
    """transformers' own ``generate`` (greedy, batch 1), as its users run it: with ``prompt_lookup_num_tokens`` its
    prompt lookup, with ``assistant_model`` its assisted generation. Called as the benchmark's methods are: a
    GenerationOutput whose stats count each new token as one forward (its steps are not reported) over the wall time."""

    def __init__(self, model, pad_token_id: int, **extra):
        self.model, self.pad_token_id, self.extra = model, pad_token_id, extra

    @torch.no_grad()
    def __call__(self, ids, max_new_tokens: int, eos_token_id: list[int]):
        from specdec.decode.engine import GenerationOutput
        from specdec.decode.metrics import DecodeStats

        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, eos_token_id=eos_token_id, pad_token_id=self.pad_token_id,
                                  **self.extra)
        row = out[0, ids.shape[1]:].tolist()  # synchronises
        elapsed = time.perf_counter() - start
        row = row[: next((i + 1 for i, t in enumerate(row) if t in eos_token_id), len(row))]
        stats = DecodeStats(target_forwards=len(row), verify_steps=len(row), verified_tokens=len(row),
                            target_time_s=elapsed, new_tokens=len(row), wall_time_s=elapsed)
        return GenerationOutput(sequences=[row], stats=stats)


def write_report(args, device: torch.device, num_prompts: int, bandwidth: float, by_name: dict,
                 failed: dict) -> str:
    """Write ``gpu_<source>.json`` and ``.md`` to --out with the methods measured so far (and those that failed,
    with their tracebacks); the table as text."""
    summary = {"device": machine_description(device), "dtype": args.dtype, "prompts": num_prompts,
               "max_new_tokens": args.new, "read_bandwidth_GBps": bandwidth / 1e9,
               "torch": torch.__version__, "exact_numerics": args.exact_numerics, "temperature": args.temperature,
               "top_p": args.top_p,
               "methods": by_name, "failed": failed}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"gpu_{args.source}.json").write_text(json.dumps(summary, indent=2) + "\n")
    mode = "greedy" if not args.temperature else (f"sampled at T={args.temperature:g}"
                                                  + (f", top-p {args.top_p:g}" if args.top_p < 1 else "")
                                                  + " (outputs ≠ plain: by chance)")
    lines = [f"## Decode on {summary['device']}, {args.dtype}, {num_prompts} prompts, {args.new} new tokens, {mode}"
             + (", target.exact_numerics (specdec's rows but torch ops')" if args.exact_numerics else ""),
             f"read bandwidth {bandwidth / 1e9:.0f} GB/s (probe), torch {torch.__version__}", "",
             "| method | batch | τ | tok/s | x plain eager | x plain graphs | step ms (verify + draft) | bandwidth fraction "
             "| captures (s) | outputs ≠ plain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in by_name.items():
        tau = f"{r['tau']:.2f}" if "tau" in r else "—"
        step = f"{r['verify_step_ms']:.2f} + {r['drafter_step_ms']:.2f}" if "step_ms" in r else "—"
        frac = f"{r['bandwidth_fraction']:.1%}" if "bandwidth_fraction" in r else "—"
        cap = f"{r['captures']} ({r['capture_time_s']:.1f})" if "captures" in r else "—"
        if r.get("drafter_graph_captures") is not None:
            cap += f" + draft {r['drafter_graph_captures']} ({r['drafter_graph_capture_time_s']:.1f})"
        speed = f"{r['speedup_vs_plain_eager']:.2f}x" if "speedup_vs_plain_eager" in r else "—"
        over_graphs = f"{r['speedup_vs_plain_graphs']:.2f}x" if "speedup_vs_plain_graphs" in r else "—"
        lines.append(f"| {name} | {r['batch']} | {tau} | {r['tokens_per_second']:.1f} | {speed} | {over_graphs} | "
                     f"{step} | {frac} | {cap} | {r['mismatching_outputs']} |")
    if any(name.startswith("transformers") for name in by_name):
        lines.append("\ntransformers' rows: the step column is ms per new token (their steps are not counted).")
    lines += [f"\n**{name} failed** (left out): `{tb.strip().splitlines()[-1]}`" for name, tb in failed.items()]
    text = "\n".join(lines)
    (out_dir / f"gpu_{args.source}.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = benchmark_parser(__doc__, prompts=24, prompt_file=True, temperature=True)  # --source mix: MT-Bench, HumanEval
    ap.add_argument("--dump-prompts", default=None, help="write the prompts' token ids to this file and stop")
    ap.add_argument("--batch", type=int, default=8, help="the batched comparison's batch size (0: skip it)")
    ap.add_argument("--compile", action="store_true", help="also run plain decoding with torch.compile + graphs")
    ap.add_argument("--skip", nargs="*", default=[], metavar="WORD",
                    help="leave out the speculative methods whose name holds one of these words (eagle, medusa, ...)")
    ap.add_argument("--dtype", default="bfloat16", help="the target's dtype on a GPU (off a GPU: float32)")
    ap.add_argument("--verbose", action="store_true", help="print each generation's time as it ends")
    ap.add_argument("--top-p", type=float, default=1.0,
                    help="sampled (--temperature > 0): keep this much of p at each step (top-p; 1: all of it)")
    ap.add_argument("--exact-numerics", action="store_true",
                    help="specdec's rows with target.exact_numerics (Backend(exact_numerics=True)): outputs ≠ "
                         "plain then counts where a drafter's output differs from plain decoding's in that mode")
    args = ap.parse_args()
    if not 0 < args.top_p <= 1 or (args.top_p < 1 and not args.temperature):
        ap.error(f"--top-p {args.top_p:g}: give a value in (0, 1] with --temperature > 0 (greedy keeps the argmax)")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_target(dtype=args.dtype if device.type == "cuda" else "float32", device=device)
    args.dtype = str(model.dtype).removeprefix("torch.")  # as run (float32 off a GPU), for the report
    prompts = prompt_ids(args, tokenizer)
    if args.dump_prompts:
        Path(args.dump_prompts).write_text(json.dumps(prompts) + "\n")
        print(f"wrote {len(prompts)} prompts to {args.dump_prompts}")
        return
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    eager = as_decoder(model, backend=Backend(exact_numerics=args.exact_numerics))
    torch_ops = as_decoder(model, backend=Backend(gpu_kernels=False))  # the forward through torch's ops only
    # the Triton kernels with each RMSNorm and SiLU·up a kernel of its own, the products cuBLAS's (eight a layer)
    apart = as_decoder(model, backend=Backend(fused_products=False, exact_numerics=args.exact_numerics))
    # a step's greedy verdict and commit through torch's ops (~20-100 small kernels) instead of one kernel each
    steps_apart = as_decoder(model, backend=Backend(fused_steps=False, exact_numerics=args.exact_numerics))
    graphed = {}  # one wrapper (one cache, its graphs) per method

    def target(name: str, compiled: bool = False):
        if name not in graphed:
            decoder = (torch_ops if "torch ops" in name else apart if "norms apart" in name
                       else steps_apart if "verdict apart" in name else eager)
            graphed[name] = GraphedDecoder(decoder, compile=compiled)
        return graphed[name]

    def eagle(graphs: bool, **settings):  # the shipped EAGLE layer; its forwards and logits eager or replaying graphs
        if "eagle" in args.skip:
            return None
        drafter = EagleDrafter.from_config(EagleDrafter.Config(**settings), target=model)
        drafter.runtime.replay_graphs("cuda_graphs" if graphs else "none")
        return drafter


    def medusa(graphs: bool, **settings):  # the shipped heads; their tree drafted eagerly or by replayed graphs
        if "medusa" in args.skip:
            return None
        drafter = MedusaDrafter.from_config(MedusaDrafter.Config(**settings), target=model)
        drafter.runtime.replay_graphs("cuda_graphs" if graphs else "none")
        return drafter

    def read_each_step(drafter):  # a device-only drafter read back before each next step, as every drafter was
        if drafter is not UNBUILT and drafter is not None:
            drafter.traits = dataclasses.replace(drafter.traits, device_only=False)
        return drafter

    def draft_model(graphs: bool):  # the shipped distilled draft, 8192-token head; its own forwards eager or graphed
        if "draft_model" in args.skip:
            return None
        drafter = DraftModelDrafter.from_config(DraftModelDrafter.Config(draft_vocab=8192), target=model)
        drafter.runtime.replay_graphs("cuda_graphs" if graphs else "none")
        return drafter

    def dflash(graphs: bool, **settings):  # the shipped block drafter; its catch-up and block forward eager or graphed
        if "dflash" in args.skip:
            return None
        drafter = DFlashDrafter.from_config(DFlashDrafter.Config(**settings), target=model)
        drafter.runtime.replay_graphs("cuda_graphs" if graphs else "none")
        return drafter

    def ngram_on_device():  # the lookup on the device, replaying a graph (the main job's n-gram on a GPU)
        drafter = NgramDrafter(on_device=True, device=device)
        drafter.runtime.replay_graphs("cuda_graphs")
        return drafter

    unbuilt = {}  # drafters that failed to build (a missing asset on a GPU machine): left out, named in the report

    def built(make, *a, **kw):
        try:
            return make(*a, **kw)
        except Exception:  # noqa: BLE001 - recorded and reported; the other methods are still measured
            unbuilt[f"{make.__name__}{a}{kw or ''}"] = traceback.format_exc()
            print(unbuilt[next(reversed(unbuilt))], file=sys.stderr, flush=True)
            return UNBUILT

    eagle, medusa, draft_model, dflash = (functools.partial(built, f) for f in (eagle, medusa, draft_model, dflash))
    methods = {  # name -> (target, drafter or None, k)
        "plain eager": (eager, None, 0),
        "plain graphs": (target("plain graphs"), None, 0),
        "plain graphs, torch ops": (target("plain graphs, torch ops"), None, 0),
        "plain graphs, norms apart": (target("plain graphs, norms apart"), None, 0),
        "plain graphs, verdict apart": (target("plain graphs, verdict apart"), None, 0),
        "plain graphs, each step read before the next": (target("plain graphs"), EachStepRead(), 1),
        "transformers compiled static cache": (CompiledStaticLoop(model), "peer", 0),
        "transformers prompt lookup K=4": (TransformersGenerate(model, tokenizer.pad_token_id,
                                                                prompt_lookup_num_tokens=4), "peer", 0),
        "transformers assisted, 8-layer early exit K=3": (assisted_peer(model, tokenizer, 8, 3), "peer", 0),
        "ngram K=4 eager": (eager, NgramDrafter(), 4),
        "ngram K=4 graphs": (target("ngram graphs"), NgramDrafter(), 4),
        "ngram K=4 graphs, torch ops": (target("ngram graphs, torch ops"), NgramDrafter(), 4),
        # the lookup on the device (the main job's default on a GPU): 4 drafts every step, read a step late
        "ngram K=4 on the device, graphs": (target("ngram device graphs"), ngram_on_device(), 4),
        "ngram K=4 on the device, graphs, verdict apart": (target("ngram device graphs, verdict apart"),
                                                           ngram_on_device(), 4),
        "ngram K=8 on the device, graphs": (target("ngram device 8 graphs"), ngram_on_device(), 8),
        "eagle default graphs, draft eager": (target("eagle graphs, draft eager"), eagle(False),
                                              EagleDrafter.Config().k),
        "eagle default graphs": (target("eagle graphs"), eagle(True), EagleDrafter.Config().k),
        # EAGLE's fixed tree grown and chosen on the device (DeviceGrowth: one graph a step), its lookup branch found
        # there: read a step late; the same read each step beside it, and without the lookup branch
        "eagle fixed tree graphs": (target("eagle fixed graphs"), eagle(True, min_confidence=0.0),
                                    EagleDrafter.Config().k),
        "eagle fixed tree graphs, each step read": (target("eagle fixed graphs, each step read"),
                                                    read_each_step(eagle(True, min_confidence=0.0)),
                                                    EagleDrafter.Config().k),
        "eagle fixed tree K=16 on the device, graphs": (target("eagle device graphs"),
                                                        eagle(True, min_confidence=0.0, lookup=0), 16),
        "medusa default graphs, heads eager": (target("medusa graphs, heads eager"), medusa(False),
                                               MedusaDrafter.Config().k),
        # the default on a GPU is the fixed tree (min_confidence null: 0 there); the CPU's dynamic tree beside it
        "medusa default graphs": (target("medusa graphs"), medusa(True), MedusaDrafter.Config().k),
        "medusa dynamic tree graphs": (target("medusa dynamic graphs"), medusa(True, min_confidence=CPU_MIN_CONFIDENCE),
                                       MedusaDrafter.Config().k),
        "medusa fixed tree graphs": (target("medusa fixed graphs"), medusa(True, min_confidence=0.0),
                                     MedusaDrafter.Config().k),
        "medusa fixed tree graphs, torch ops": (target("medusa fixed graphs, torch ops"),
                                                medusa(True, min_confidence=0.0), MedusaDrafter.Config().k),
        # on a GPU a fixed tree drafts from the device alone, its lookup branch found there: read a step late
        # (engine._pipelined_steps); the same read each step beside it
        "medusa fixed tree graphs, each step read": (target("medusa fixed graphs, each step read"),
                                                     read_each_step(medusa(True, min_confidence=0.0)),
                                                     MedusaDrafter.Config().k),
        "dflash fixed tree graphs": (target("dflash fixed graphs"), dflash(True, min_confidence=0.0),
                                     DFlashDrafter.Config().k),
        "medusa fixed tree K=31 on the device, graphs": (target("medusa device graphs"),
                                                         medusa(True, min_confidence=0.0, lookup=0), 31),
        "medusa fixed tree K=31 on the device, graphs, verdict apart": (
            target("medusa device graphs, verdict apart"), medusa(True, min_confidence=0.0, lookup=0), 31),
        "medusa fixed tree K=15 on the device, graphs": (target("medusa device 15 graphs"),
                                                         medusa(True, min_confidence=0.0, lookup=0), 15),
        "medusa fixed tree K=31 on the device, graphs, each step read": (
            target("medusa device graphs, each step read"),
            read_each_step(medusa(True, min_confidence=0.0, lookup=0)), 31),
        "eagle chain K=4 on the device, graphs": (target("eagle chain device graphs"), eagle(True, tree=False), 4),
        "dflash fixed tree K=31 on the device, graphs": (target("dflash device graphs"),
                                                         dflash(True, min_confidence=0.0, lookup=0), 31),
        "dflash fixed tree K=15 on the device, graphs": (target("dflash device 15 graphs"),
                                                         dflash(True, min_confidence=0.0, lookup=0), 15),
        "draft_model K=3 graphs, draft eager": (target("draft_model graphs, draft eager"), draft_model(False), 3),
        # a fixed draft length drafts from the device alone: read a step late; the same read each step beside it
        "draft_model K=3 graphs": (target("draft_model graphs"), draft_model(True), 3),
        "draft_model K=3 graphs, each step read": (target("draft_model graphs, each step read"),
                                                   read_each_step(draft_model(True)), 3),
        "dflash default graphs, draft eager": (target("dflash graphs, draft eager"), dflash(False),
                                               DFlashDrafter.Config().k),
        "dflash default graphs": (target("dflash graphs"), dflash(True), DFlashDrafter.Config().k),
    }
    if args.compile:
        methods["plain compiled+graphs"] = (target("plain compiled", compiled=True), None, 0)
    methods = {name: spec for name, spec in methods.items() if spec[1] is not UNBUILT}
    if device.type != "cuda":  # the peer's reduce-overhead mode captures CUDA graphs
        del methods["transformers compiled static cache"]
    methods = {name: spec for name, spec in methods.items()
               if not (name.startswith("transformers") and ("transformers" in args.skip or args.temperature))}
    methods = {name: spec for name, spec in methods.items()
               if name.startswith("plain") or not any(word in name for word in args.skip)}
    by_name = {}

    def run(spec, k, ids, mask=None):
        tgt, drafter = spec
        kwargs = dict(max_new_tokens=args.new, eos_token_id=eos, attention_mask=mask, temperature=args.temperature,
                      top_p=args.top_p)
        if args.temperature:  # each method its own generator, seeded by the prompt
            kwargs["generator"] = torch.Generator(ids.device).manual_seed(int(ids.sum()))
        start = time.perf_counter()
        if drafter == "peer":
            out = tgt(ids, args.new, eos)
        elif drafter is None:
            out = autoregressive_generate(tgt, ids, **kwargs)
        else:
            out = speculative_generate(tgt, drafter, ids, k=k, **kwargs)
        if args.verbose:
            print(f"{type(drafter).__name__} {type(tgt).__name__} {list(ids.shape)}: {time.perf_counter() - start:.2f} s",
                  flush=True)
        return out

    table = {name: ((tgt, drafter), k) for name, (tgt, drafter, k) in methods.items()}
    batch1 = [torch.tensor([p], device=device) for p in prompts]
    failed = dict(unbuilt)  # a method that raises is left out, the others measured
    seconds, tokens, stats, mismatches = side_by_side(table, batch1, lambda spec, k, ids: run(spec, k, ids),
                                                      failed=failed)
    bandwidth = probe_read_bandwidth(device)
    results = {}
    for name in stats:
        s = stats[name]
        context = sum(len(p) for p in prompts) / len(prompts) + args.new / 2
        step_ms = 1000 * (s.target_time_s + s.drafter_time_s) / s.target_forwards
        results[name] = {
            "batch": 1, "tau": s.mean_accepted_length, "tokens_per_second": tokens[name] / seconds[name],
            "step_ms": step_ms, "verify_step_ms": 1000 * s.target_time_s / s.target_forwards,
            "drafter_step_ms": 1000 * s.drafter_time_s / s.target_forwards, "mismatching_outputs": mismatches[name],
            "bandwidth_floor_ms": 1000 * step_bytes(model, context) / bandwidth,
        }
        tgt, drafter = methods[name][:2]
        if isinstance(tgt, GraphedDecoder):
            results[name].update(captures=tgt.captures, capture_time_s=tgt.capture_time_s)
        if drafter not in (None, "peer") and graph_runners(drafter):
            results[name].update(drafter_graph_fields(drafter))
    for r in results.values():
        r["speedup_vs_plain_eager"] = r["tokens_per_second"] / results["plain eager"]["tokens_per_second"]
        if "plain graphs" in results:
            r["speedup_vs_plain_graphs"] = r["tokens_per_second"] / results["plain graphs"]["tokens_per_second"]
        r["bandwidth_fraction"] = r["bandwidth_floor_ms"] / r["verify_step_ms"]
    by_name.update(results)
    write_report(args, device, len(prompts), bandwidth, by_name, failed)  # batch 1 kept if what follows runs out of time
    if args.batch > len(prompts):
        print(f"--batch {args.batch}: more than the {len(prompts)} prompts; no batched rows (lower --batch or raise "
              f"--prompts)")
    elif args.batch > 1:
        groups = [prompts[i: i + args.batch] for i in range(0, len(prompts) - args.batch + 1, args.batch)]
        padded = [tuple(t.to(device) for t in left_pad(g, pad_id=tokenizer.pad_token_id)) for g in groups]
        batched = {f"{name} batch {args.batch}": methods[name] for name in
                   ("plain eager", "plain graphs", "plain graphs, each step read before the next",
                    "plain graphs, torch ops", "ngram K=4 eager", "ngram K=4 graphs",
                    "medusa fixed tree K=15 on the device, graphs", "medusa fixed tree K=31 on the device, graphs",
                    "dflash fixed tree K=15 on the device, graphs")
                   if name in stats}
        for name, (tgt, drafter, k) in batched.items():
            run((tgt, drafter), k, *padded[0])  # warm-up (captures this batch size)
        totals = dict.fromkeys(batched, 0.0)
        counts = dict.fromkeys(batched, 0)
        outputs = {}
        for ids, mask in padded:
            for name, (tgt, drafter, k) in batched.items():
                start = time.perf_counter()
                out = run((tgt, drafter), k, ids, mask)
                totals[name] += time.perf_counter() - start - out.stats.capture_time_s  # captures: one-off
                counts[name] += sum(len(s) for s in out.sequences)
                outputs.setdefault(name, []).append(out.sequences)
        reference = outputs[f"plain eager batch {args.batch}"]
        for name in batched:
            by_name[name] = {"batch": args.batch, "tokens_per_second": counts[name] / totals[name],
                             "mismatching_outputs": sum(a != b for a, b in zip(outputs[name], reference))}
    print(write_report(args, device, len(prompts), bandwidth, by_name, failed))


if __name__ == "__main__":
    main()
