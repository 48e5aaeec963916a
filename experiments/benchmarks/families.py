"""Another family's target on specdec's compact path vs the generic fallback vs transformers (not a test).

In one process, the same prompts, greedy: batch 1 runs each prompt through every method in turn after an untimed
warm-up (``side_by_side``); batch ``--batch`` runs groups of prompts, left-padded, through the compact path and
transformers. Methods at batch 1:

- ``compact plain`` / ``compact ngram K``     specdec on its compact decoder (specdec.models.compact.FAMILIES), the
                                              weights streamed as the GGUF's codes where they give them back exactly
- ``compact plain, float32 weights``          the same decoder streaming the float32 weights (``Backend(weights=
                                              "float")``)
- ``fallback plain`` / ``fallback ngram K``   specdec on the generic transformers fallback (HFDecoder: batch 1,
                                              chains), what every family outside the compact path gets
- ``transformers generate`` / ``transformers prompt lookup K``   ``generate(do_sample=False)``, with
                                              ``prompt_lookup_num_tokens=K`` for the second
- ``compact eagle`` / ``compact medusa``      learned drafters trained for the target (``--eagle DIR``,
                                              ``--medusa DIR``: what ``python -m specdec.train`` exported), with
                                              the main job's drafter defaults (token trees), at batch 1 and batched

Reports tokens/s, ratios to compact plain decoding, τ, and outputs differing from compact plain decoding; writes
``families_<target>.json`` / ``.md`` to --out.

    python experiments/benchmarks/families.py --target gemma3-270m --source humaneval wikipedia --prompts 16 --new 128 \
        --eagle <eagle export> --medusa <medusa export>
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from specdec import NgramDrafter, autoregressive_generate, load_drafter, load_target, speculative_generate
from specdec.decode.metrics import DecodeStats
from specdec.jobs.data import encode_prompt, left_pad, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import Backend, CompactDecoder, HFDecoder, as_decoder
from specdec.models.loading import stop_token_ids

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side, until_eos  # noqa: E402


def main() -> None:
    ap = benchmark_parser(__doc__, source=["humaneval", "wikipedia"], prompts=16, new=128)
    ap.add_argument("--target", default="gemma3-270m", help="a target name load_target takes (alias, path, hub id)")
    ap.add_argument("--k", type=int, default=4, help="n-gram draft length (and transformers' prompt lookup)")
    ap.add_argument("--batch", type=int, default=4, help="the batched comparison's batch size (0: skip it)")
    ap.add_argument("--eagle", help="an EAGLE drafter trained for the target (a directory): its rows too")
    ap.add_argument("--medusa", help="Medusa heads trained for the target (a directory): their rows too")
    args = ap.parse_args()

    model, tokenizer = load_target(args.target)
    compact = as_decoder(model)
    if not isinstance(compact, CompactDecoder):
        raise SystemExit(f"{args.target} ({model.config.model_type}) is not on the compact path: nothing to compare")
    float_weights = as_decoder(model, backend=Backend(weights="float"))
    fallback = HFDecoder(model)
    rows = [row for source in args.sources for row in load_prompts(source, limit=args.prompts)]
    prompts = [encode_prompt(tokenizer, row) for row in rows]
    eos = stop_token_ids(model, tokenizer)
    learned = {name: load_drafter(name, compact, tokenizer, path=path)
               for name, path in (("eagle", args.eagle), ("medusa", args.medusa)) if path}

    def hf(ids, mask=None, **extra):
        mask = torch.ones_like(ids) if mask is None else mask
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new, do_sample=False, eos_token_id=eos,
                             pad_token_id=tokenizer.pad_token_id, **extra)[:, ids.shape[1]:].tolist()
        return SimpleNamespace(sequences=[until_eos(row, eos) for row in out], stats=DecodeStats())

    def run(spec, k, ids):
        kind, target = spec
        kwargs = dict(max_new_tokens=args.new, eos_token_id=eos)
        if kind == "plain":
            return autoregressive_generate(target, ids, **kwargs)
        if kind == "ngram":
            return speculative_generate(target, NgramDrafter(), ids, k=k, **kwargs)
        if kind in learned:  # its own k (tree size)
            return speculative_generate(target, learned[kind], ids, **kwargs)
        return hf(ids, **({"prompt_lookup_num_tokens": k} if k else {}))

    methods = {"compact plain": (("plain", compact), 0), f"compact ngram K={args.k}": (("ngram", compact), args.k),
               "compact plain, float32 weights": (("plain", float_weights), 0),
               "fallback plain": (("plain", fallback), 0), f"fallback ngram K={args.k}": (("ngram", fallback), args.k),
               "transformers generate": (("hf", None), 0),
               f"transformers prompt lookup K={args.k}": (("hf", None), args.k)}
    methods |= {f"compact {name} k={drafter.config.k}": ((name, compact), 0) for name, drafter in learned.items()}
    batch1 = [torch.tensor([p]) for p in prompts]
    failed = {}
    seconds, tokens, stats, mismatches = side_by_side(methods, batch1, run, failed=failed)
    rate = {name: tokens[name] / seconds[name] for name in seconds}
    results = {name: {"batch": 1, "tokens_per_second": rate[name], "vs_compact_plain": rate[name] / rate["compact plain"],
                      "tau": stats[name].mean_accepted_length if stats[name].verify_steps else None,
                      "mismatching_outputs": int(mismatches[name])} for name in seconds}
    if args.batch > 1 and len(prompts) >= args.batch:
        groups = [left_pad(prompts[i: i + args.batch], pad_id=tokenizer.pad_token_id)
                  for i in range(0, len(prompts) - args.batch + 1, args.batch)]
        batched = {
            "compact plain": lambda ids, mask: autoregressive_generate(compact, ids, attention_mask=mask,
                                                                       max_new_tokens=args.new, eos_token_id=eos),
            f"compact ngram K={args.k}": lambda ids, mask: speculative_generate(
                compact, NgramDrafter(), ids, attention_mask=mask, k=args.k, max_new_tokens=args.new, eos_token_id=eos),
            "transformers generate": lambda ids, mask: hf(ids, mask),
        }
        for name, drafter in learned.items():
            batched[f"compact {name} k={drafter.config.k}"] = lambda ids, mask, drafter=drafter: speculative_generate(
                compact, drafter, ids, attention_mask=mask, max_new_tokens=args.new, eos_token_id=eos)
        for fn in batched.values():  # warm-up, untimed
            fn(*groups[0])
        totals, counts, outputs = dict.fromkeys(batched, 0.0), dict.fromkeys(batched, 0), {}
        taus = {}
        for ids, mask in groups:
            for name, fn in batched.items():
                start = time.perf_counter()
                out = fn(ids, mask)
                totals[name] += time.perf_counter() - start
                counts[name] += sum(len(s) for s in out.sequences)
                outputs.setdefault(name, []).extend(out.sequences)
                if out.stats.verify_steps:
                    taus[name] = out.stats if name not in taus else taus[name].merge(out.stats)
        reference = outputs["compact plain"]
        for name in batched:
            results[f"{name} batch {args.batch}"] = {
                "batch": args.batch, "tokens_per_second": counts[name] / totals[name],
                "vs_compact_plain": counts[name] / totals[name] / rate["compact plain"],
                "tau": taus[name].mean_accepted_length if name in taus else None,
                "mismatching_outputs": sum(a != b for a, b in zip(outputs[name], reference))}
    machine = machine_description()
    summary = {"target": args.target, "model_type": model.config.model_type, "sources": args.sources,
               "prompts": len(prompts), "max_new_tokens": args.new, "k": args.k, "machine": machine,
               "threads": torch.get_num_threads(), "methods": results, "failed": failed}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.target.replace("/", "_")
    (out_dir / f"families_{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"## {args.target} ({model.config.model_type}), {len(prompts)} prompts ({', '.join(args.sources)}), "
             f"{args.new} new tokens, greedy", f"machine: {machine}", "",
             "| method | batch | tok/s | x compact plain (batch 1) | τ | outputs ≠ compact plain |", "|---|---|---|---|---|---|"]
    for method, r in results.items():
        tau = f"{r['tau']:.2f}" if r.get("tau") else "—"
        lines.append(f"| {method} | {r['batch']} | {r['tokens_per_second']:.1f} | {r['vs_compact_plain']:.2f}x | {tau} | "
                     f"{r['mismatching_outputs']} |")
    lines += [f"\n**{method} failed**: `{tb.strip().splitlines()[-1]}`" for method, tb in failed.items()]
    (out_dir / f"families_{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
