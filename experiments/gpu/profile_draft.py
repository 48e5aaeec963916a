"""Where a drafter's step spends its time: per prompt, then under the profiler (not a test).

On an H100 EAGLE's draft step took 74.6 ms (its draft layer eager, the target graphed), where ~219 aten ops a
step at ~27 us of host time each explain ~6 ms and a 16-token profile counted ~13 ms of host time a step
(experiments/README.md, 2026-11-24/25). This script separates what can explain that: the drafter's time per
step prompt by prompt (a one-off cost shows as a slow first prompt), then one generation under
``torch.profiler`` (CPU and, on a GPU, CUDA activities) with the drafter's calls and the verify steps marked
(``draft.propose``, ``draft.observe``, ``verify``): the ops by self time on host and device, and how many
synchronising copies and synchronisations a step makes. Per prompt it also gives the drafter's proposal time by
tens of steps (a cost growing with the text shows there) and, on a GPU, the caching allocator's device
allocations and retries during the generation. Writes ``profile_<drafter>.txt`` (and the trace with
``--trace``) to --out.

    python3 experiments/gpu/profile_draft.py --prompt-file .gpu/prompts.json --drafter eagle --out $OUT
    SPECDEC_CPU_KERNEL=0 python experiments/gpu/profile_draft.py --drafter eagle --prompts 2 --new 16   # CPU
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import DraftModelDrafter, EagleDrafter, MedusaDrafter
from specdec.drafters.base import NoDrafter
from specdec.models import GraphedDecoder, as_decoder
from specdec.models.loading import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser  # noqa: E402

DRAFTERS = {"eagle": EagleDrafter, "medusa": MedusaDrafter, "draft_model": DraftModelDrafter,
            "none": NoDrafter}  # none: plain decoding (the loop's own host work, each step read a step late)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy", "aten::item",
         "aten::_local_scalar_dense")


def mark(drafter) -> None:
    """Wrap the drafter's calls and the engine's verify step in profiler ranges (in place, for this process)."""
    import specdec.decode.engine as engine

    for name in ("propose", "observe"):
        inner = getattr(drafter, name)

        def call(*args, inner=inner, label=f"draft.{name}", **kwargs):
            with record_function(label):
                return inner(*args, **kwargs)

        setattr(drafter, name, call)
    step = engine.verify_step

    def verify(*args, **kwargs):
        with record_function("verify"):
            return step(*args, **kwargs)

    engine.verify_step = verify


def time_proposals(drafter, device: torch.device) -> list[float]:
    """Wrap ``drafter.propose`` (in place) to append the seconds each call takes, the device synchronised before
    and after, to the list returned."""
    timed, inner = [], drafter.propose

    def propose(*args, **kwargs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timed.append(time.perf_counter() - start)

    drafter.propose = propose
    return timed


def allocator_counts(cuda: bool) -> dict[str, int]:
    """The caching allocator's device allocations and retries (a retry frees cached blocks and synchronises)."""
    if not cuda:
        return {}
    stats = torch.cuda.memory_stats()
    return {key: stats.get(key, 0) for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def main() -> None:
    ap = benchmark_parser(__doc__, prompts=4, new=64, prompt_file=True)
    ap.add_argument("--drafter", choices=sorted(DRAFTERS), default="eagle")
    ap.add_argument("--dtype", default="bfloat16", help="on a GPU (CPU: float32)")
    ap.add_argument("--eager-target", action="store_true", help="no CUDA graphs for the target")
    ap.add_argument("--eager-draft", action="store_true", help="no CUDA graphs for the drafter's own work (the draft "
                    "model's forwards, Medusa's tree; as the main job's target.compile=auto, it replays them by default)")
    ap.add_argument("--trace", action="store_true", help="also write the Chrome trace")
    ap.add_argument("--fixed-tree", action="store_true", help="Medusa's or EAGLE's full tree every step "
                    "(drafter.min_confidence=0), as the GPU benchmark's fixed-tree rows")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model, tokenizer = load_target(dtype=args.dtype if cuda else "float32", device=device)
    if args.prompt_file:
        prompts = json.loads(Path(args.prompt_file).read_text())[: args.prompts]
    else:
        from specdec.jobs.data import encode_prompt, load_prompts
        prompts = [encode_prompt(tokenizer, row) for row in load_prompts(args.source, limit=args.prompts)]
    prompts = [torch.tensor([p], device=device) for p in prompts]
    cls = DRAFTERS[args.drafter]
    if cls is NoDrafter:
        drafter, k = NoDrafter(), 0
    else:
        settings = {"min_confidence": 0.0} if args.fixed_tree else {}
        cfg = cls.Config(draft_vocab=8192) if cls is DraftModelDrafter else cls.Config(**settings)
        k = 3 if cls is DraftModelDrafter else cfg.k
        drafter = cls.from_config(cfg, target=model)
        drafter.runtime.replay_graphs("none" if args.eager_draft else "auto")
    decoder = as_decoder(model) if args.eager_target or not cuda else GraphedDecoder(as_decoder(model))
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    target = "eager" if args.eager_target or not cuda else "graphed"
    shape = " fixed tree" if args.fixed_tree else ""
    lines = [f"{args.drafter}{shape} (k {k}) on {torch.cuda.get_device_name() if cuda else 'CPU'}, target {target}, "
             f"drafter {'eager' if args.eager_draft or not cuda else 'graphed where it runs a model or heads'}, "
             f"{args.new} new tokens, torch {torch.__version__}"]

    def generate(ids):
        if cls is NoDrafter:
            return autoregressive_generate(decoder, ids, max_new_tokens=args.new, eos_token_id=eos)
        return speculative_generate(decoder, drafter, ids, k=k, max_new_tokens=args.new, eos_token_id=eos)

    start = time.perf_counter()
    generate(prompts[0][:, :32])  # warm-up: graphs captured, libraries initialised
    lines.append(f"warm-up: {time.perf_counter() - start:.1f} s")
    untimed = drafter.propose
    timed = time_proposals(drafter, device) if cls is not NoDrafter else []  # (it synchronises around each call)
    for i, ids in enumerate(prompts):
        timed.clear()
        allocations = allocator_counts(cuda)
        s = generate(ids).stats
        grown = {key: value - allocations[key] for key, value in allocator_counts(cuda).items()}
        tens = [sum(timed[j: j + 10]) / len(timed[j: j + 10]) for j in range(0, len(timed), 10)]
        lines.append(f"prompt {i} ({ids.shape[1]} tokens): {s.target_forwards} steps, τ {s.mean_accepted_length:.2f}, "
                     f"draft {1000 * s.drafter_time_s / s.target_forwards:.2f} ms + verify "
                     f"{1000 * s.target_time_s / s.target_forwards:.2f} ms a step, wall {s.wall_time_s:.2f} s "
                     f"({1000 * s.wall_time_s / s.new_tokens:.2f} ms a token); "
                     f"propose ms by tens of steps {' '.join(f'{1000 * t:.1f}' for t in tens)}"
                     + (f"; allocator {grown}" if grown else ""))
    drafter.propose = untimed
    mark(drafter)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        stats = generate(prompts[-1]).stats
    steps = stats.target_forwards
    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    for label in ("draft.propose", "draft.observe", "verify"):
        if label in by_name:
            e = by_name[label]
            lines.append(f"{label}: {e.count / steps:.1f} a step, host {e.cpu_time_total / 1000 / steps:.2f} ms a step")
    lines.append("per step: " + ", ".join(f"{name} {by_name[name].count / steps:.1f}" for name in SYNCS
                                          if name in by_name))
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    lines += ["", f"by {sort} ({steps} steps):", events.table(sort_by=sort, row_limit=30)]
    if cuda:
        lines += ["", "by self_cpu_time_total:", events.table(sort_by="self_cpu_time_total", row_limit=20)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.drafter + ("_fixed_tree" if args.fixed_tree else "")
    (out / f"profile_{name}.txt").write_text("\n".join(lines) + "\n")
    if args.trace:
        prof.export_chrome_trace(str(out / f"trace_{name}.json"))
    print("\n".join(lines[: len(lines) - (3 if cuda else 0)]))


if __name__ == "__main__":
    main()
