"""Distilled draft model side by side with transformers' assisted generation (not a test).

In one process, on the same prompts, batch 1, each prompt runs every method in turn after an untimed warm-up
(machine drifts hit all alike):

- ``plain``: specdec's plain decoding (the reference), and ``hf plain``: transformers' ``generate``;
- ``draft K=..``: specdec with the distilled draft (``drafter=draft_model``), one row per K and per
  ``--variants`` spec (overrides of configs/drafter/draft_model.yaml, e.g. ``confidence=0.4`` or
  ``schedule=heuristic,k=8`` or ``draft_vocab=8192``);
- ``hf assisted K=..``: transformers' ``generate(assistant_model=...)`` with the very same draft exported as a
  transformers directory (``python -m specdec.export draft_model``), K matched (``num_assistant_tokens=K``,
  schedule constant, no confidence threshold), and ``hf assisted defaults`` with transformers' own settings.

For specdec's rows: α (accepted / proposed), α per position, τ, tokens/s and speedup over specdec's plain
decoding; for every row, tokens/s relative to ``plain`` and to transformers' counterpart. Under greedy
decoding, how many outputs differ from plain decoding's (must be 0 for all, transformers' included). At T=1
every method draws from its own seeded generator: outputs differ by design (exactness is verify_dist's job).
Writes ``draft_model_<source>_T<t>.json`` / ``.md`` to --out.

    python experiments/benchmarks/draft_model.py --source mtbench --prompts 80 --new 128 --k 2 3 4 5
    python experiments/benchmarks/draft_model.py --source humaneval --prompts 40 --k 4 --variants confidence=0.4
    python experiments/benchmarks/draft_model.py --temperature 1.0 --prompts 24 --k 3
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from specdec import autoregressive_generate, load_target, speculative_generate
from specdec.drafters import DraftModelDrafter
from specdec.export import export_draft_model
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, parse_overrides  # noqa: E402


def main() -> None:
    ap = benchmark_parser(__doc__, prompts=80, temperature=True)
    ap.add_argument("--model", default="default", help="drafter.path: 'default' (shipped) or a student directory")
    ap.add_argument("--k", type=int, nargs="+", default=[4], help="draft lengths, each run by both engines")
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="drafter.draft_vocab of specdec's K rows (transformers' assistant always scores all tokens)")
    ap.add_argument("--variants", nargs="*", default=[], metavar="KEY=VALUE,...",
                    help="further specdec draft-model configs (overrides of configs/drafter/draft_model.yaml)")
    ap.add_argument("--no-hf", action="store_true", help="leave transformers' rows out")
    args = ap.parse_args()

    out_dir = Path(args.out)
    model, tokenizer = load_target()
    rows = load_prompts(args.source, limit=args.prompts)
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    greedy = args.temperature == 0
    seeds = iter(range(10**9))

    def ours(drafter, k):
        def run(ids):
            generator = None if greedy else torch.Generator().manual_seed(next(seeds))
            kwargs = dict(max_new_tokens=args.new, eos_token_id=eos, temperature=args.temperature, generator=generator)
            out = (autoregressive_generate(model, ids, **kwargs) if drafter is None else
                   speculative_generate(model, drafter, ids, k=k, **kwargs))
            return out.sequences[0], out.stats
        return run

    def hf(**assist):
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=args.temperature, top_k=0,
                                                               top_p=1.0)

        def run(ids):
            torch.manual_seed(next(seeds))
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new, eos_token_id=eos,
                                 pad_token_id=tokenizer.pad_token_id, **sampling, **assist)
            return out[0, ids.shape[1]:].tolist(), None
        return run

    methods = {"plain": ours(None, 0)}
    ks = {}  # specdec's draft rows: their K (the transformers row they are compared with)
    if not args.no_hf:
        methods["hf plain"] = hf()
    for k in args.k:
        cfg = DraftModelDrafter.Config(path=args.model, k=k, draft_vocab=args.draft_vocab)
        methods[f"draft K={k}"] = ours(DraftModelDrafter.from_config(cfg, target=model, tokenizer=tokenizer), k)
        ks[f"draft K={k}"] = k
    for spec in args.variants:
        cfg = DraftModelDrafter.Config(**{"model": args.model, **parse_overrides(spec, DraftModelDrafter.Config)})
        methods[f"draft {spec}"] = ours(DraftModelDrafter.from_config(cfg, target=model, tokenizer=tokenizer), cfg.k)
        ks[f"draft {spec}"] = cfg.k
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        hf_dir = export_draft_model(out_dir / "draft_model_hf", args.model, force=True)
        assistant = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
        for k in args.k:
            methods[f"hf assisted K={k}"] = hf(assistant_model=assistant, num_assistant_tokens=k,
                                               num_assistant_tokens_schedule="constant",
                                               assistant_confidence_threshold=0.0)
        methods["hf assisted defaults"] = hf(assistant_model=assistant)

    for run in methods.values():  # warm-up, untimed
        run(prompts[0][:, :32])
    seconds, tokens, stats = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0), {}
    mismatches = dict.fromkeys(methods, 0)
    with torch.no_grad():
        for ids in prompts:
            reference = None
            for name, run in methods.items():
                start = time.perf_counter()
                seq, s = run(ids)
                seconds[name] += time.perf_counter() - start
                tokens[name] += len(seq)
                if s is not None:
                    stats[name] = s if name not in stats else stats[name].merge(s)
                reference = seq if reference is None else reference
                mismatches[name] += seq != reference

    results = {}
    for name in methods:
        r = {"tokens_per_second": tokens[name] / seconds[name], "new_tokens": tokens[name],
             "mismatching_outputs": mismatches[name] if greedy else None}
        if name in stats and name != "plain":
            s = stats[name]
            r |= {"alpha": s.acceptance_rate, "alpha_conditional": s.acceptance_rate_conditional,
                  "alpha_per_position": [round(a, 4) for a in s.acceptance_per_position[:8]],
                  "tau": s.mean_accepted_length, "verify_step_ms": 1000 * s.target_time_s / s.target_forwards,
                  "drafter_step_ms": 1000 * s.drafter_time_s / s.target_forwards}
        results[name] = r
    base = results["plain"]["tokens_per_second"]
    for name, r in results.items():
        r["speedup"] = r["tokens_per_second"] / base
        peer = f"hf assisted K={ks[name]}" if name in ks else None
        if peer in results:
            r["vs_hf_assisted"] = r["tokens_per_second"] / results[peer]["tokens_per_second"]
    if "hf plain" in results:
        results["plain"]["vs_hf_plain"] = base / results["hf plain"]["tokens_per_second"]
    machine = machine_description()
    summary = {"source": args.source, "prompts": len(prompts), "max_new_tokens": args.new, "model": args.model,
               "draft_vocab": args.draft_vocab,
               "temperature": args.temperature, "machine": machine, "threads": torch.get_num_threads(),
               "methods": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"draft_model_{args.source}_T{args.temperature:g}"
    (out_dir / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"## Distilled draft model vs transformers' assisted generation, {args.source} ({len(prompts)} prompts, "
             f"{args.new} new tokens, T={args.temperature:g}, batch 1, {torch.get_num_threads()} threads; "
             f"specdec's K rows: draft_vocab={args.draft_vocab})",
             f"machine: {machine}", "",
             "| method | α | α per position | τ | tok/s | vs plain | vs transformers' same | step ms (verify + draft) "
             "| outputs ≠ plain |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        alpha = " ".join(f"{a:.2f}" for a in r.get("alpha_per_position", [])) or "—"
        same = r.get("vs_hf_assisted", r.get("vs_hf_plain"))
        step = f"{r['verify_step_ms']:.1f} + {r['drafter_step_ms']:.1f}" if "tau" in r else "—"
        lines.append(f"| {name} | {r['alpha']:.3f} | {alpha} | {r['tau']:.2f} | " if "tau" in r else f"| {name} | — | — | — | ")
        lines[-1] += (f"{r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {'—' if same is None else f'{same:.2f}x'} | "
                      f"{step} | {'—' if r['mismatching_outputs'] is None else r['mismatching_outputs']} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
