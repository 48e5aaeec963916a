"""EAGLE side by side (not a test): plain decoding vs the EAGLE drafter vs the shipped Medusa default vs n-gram,
and block drafters (``--dflash``).

In one process, on the same prompts, batch 1, each prompt runs every method in turn after an untimed
warm-up (``experiments.common.side_by_side``), so machine drifts hit all alike. Medusa and EAGLE run with
their configs' defaults (configs/drafter/*.yaml) unless told otherwise. For each method: τ, α per draft
position (the share of steps whose i-th draft was accepted, given it was proposed and every one before it
accepted — :meth:`DecodeStats.acceptance_per_position`), tokens/s, speedup over plain decoding, and the
speedup predicted from costs measured in this run (τ × plain step / (verify step + drafter step)); under
greedy decoding, how many outputs differ from plain decoding's (must be 0). At temperature > 0 each method
draws from its own generator seeded per prompt; outputs differ by design, exactness is verify_dist's job.

    python experiments/benchmarks/eagle.py --source mtbench --prompts 80 --new 128
    python experiments/benchmarks/eagle.py --eagle k=16 k=24,depth=7 tree=false,k=4 --prompts 16
    python experiments/benchmarks/eagle.py --temperature 1.0 --prompts 80
    python experiments/benchmarks/eagle.py --source mtbench:80 humaneval:40 --dflash "" tree=null,k=7

``--source`` takes several prompt sets, each ``name`` (``--prompts`` of it) or ``name:N`` (N of it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from specdec import NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.drafters import DFlashDrafter, EagleDrafter, MedusaDrafter
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, parse_overrides, side_by_side  # noqa: E402


def main() -> None:
    ap = benchmark_parser(__doc__, source=["mtbench"], prompts=80, temperature=True)
    ap.add_argument("--eagle", nargs="*", default=[""], metavar="KEY=VALUE,...",
                    help="EAGLE drafter configs, each as overrides of configs/drafter/eagle.yaml ('' = the defaults)")
    ap.add_argument("--medusa", nargs="*", default=[""], metavar="KEY=VALUE,...", help="Medusa configs, likewise")
    ap.add_argument("--dflash", nargs="*", default=[], metavar="KEY=VALUE,...",
                    help="block drafter configs, as overrides of configs/drafter/dflash.yaml ('' = the defaults)")
    ap.add_argument("--ngram-k", type=int, default=4, help="the n-gram peer's K (0: leave it out)")
    args = ap.parse_args()

    model, tokenizer = load_target()
    prompts = []
    for spec in args.sources:
        name, _, count = spec.partition(":")
        rows = load_prompts(name, limit=int(count) if count else args.prompts)
        prompts += [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    args.source = "+".join(spec.replace(":", "") for spec in args.sources)
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    methods: dict = {"plain": (None, 0)}
    for spec in args.medusa:
        cfg = MedusaDrafter.Config(**parse_overrides(spec, MedusaDrafter.Config))
        methods[f"medusa {spec or 'default'}"] = (MedusaDrafter.from_config(cfg, target=model), cfg.k)
    for spec in args.eagle:
        cfg = EagleDrafter.Config(**parse_overrides(spec, EagleDrafter.Config))
        methods[f"eagle {spec or 'default'}"] = (EagleDrafter.from_config(cfg, target=model), cfg.k)
    for spec in args.dflash:
        cfg = DFlashDrafter.Config(**parse_overrides(spec, DFlashDrafter.Config))
        methods[f"dflash {spec or 'default'}"] = (DFlashDrafter.from_config(cfg, target=model), cfg.k)
    if args.ngram_k:
        methods[f"ngram K={args.ngram_k}"] = (NgramDrafter(), args.ngram_k)
    seeds = iter(range(10**9))

    def run(drafter, k, ids):
        generator = torch.Generator().manual_seed(next(seeds)) if args.temperature > 0 else None
        kwargs = dict(max_new_tokens=args.new, eos_token_id=eos, temperature=args.temperature, generator=generator)
        if drafter is None:
            return autoregressive_generate(model, ids, **kwargs)
        return speculative_generate(model, drafter, ids, k=k, **kwargs)

    seconds, tokens, stats, mismatches = side_by_side(methods, prompts, run)
    plain_step = stats["plain"].target_time_s / stats["plain"].target_forwards
    results = {}
    for name, (drafter, k) in methods.items():
        s = stats[name]
        step = (s.target_time_s + s.drafter_time_s) / s.target_forwards
        results[name] = {
            "k": k, "tau": s.mean_accepted_length, "alpha_per_position": [round(a, 4) for a in
                                                                          s.acceptance_per_position[:8]],
            "tokens_per_second": tokens[name] / seconds[name], "verify_step_ms": 1000 * s.target_time_s / s.target_forwards,
            "drafter_step_ms": 1000 * s.drafter_time_s / s.target_forwards,
            "predicted_measured_tau": s.mean_accepted_length * plain_step / step,
            "mismatching_outputs": mismatches[name] if args.temperature == 0 else None,
        }
    base = results["plain"]["tokens_per_second"]
    for r in results.values():
        r["speedup"] = r["tokens_per_second"] / base
    machine = machine_description()
    summary = {"source": args.source, "prompts": len(prompts), "max_new_tokens": args.new,
               "temperature": args.temperature, "machine": machine, "methods": results}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"eagle_{args.source}_T{args.temperature:g}"
    (out_dir / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"## Drafters vs plain, {args.source} ({len(prompts)} prompts, {args.new} new tokens, "
             f"T={args.temperature:g}, batch 1)", f"machine: {machine}", "",
             "| method | τ | α per position | tok/s | speedup | predicted (measured costs) | step ms (verify + draft) "
             "| outputs ≠ plain |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        alpha = " ".join(f"{a:.2f}" for a in r["alpha_per_position"]) or "—"
        differ = "—" if r["mismatching_outputs"] is None else r["mismatching_outputs"]
        lines.append(f"| {name} | {r['tau']:.2f} | {alpha} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['predicted_measured_tau']:.2f}x | {r['verify_step_ms']:.1f} + {r['drafter_step_ms']:.1f} | "
                     f"{differ} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
