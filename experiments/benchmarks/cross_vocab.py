"""A draft model with another tokenizer: specdec's cross-vocabulary drafting vs plain decoding vs transformers'
universal assisted generation (not a test).

In one process, the same prompts, batch 1, each prompt through every method in turn after an untimed warm-up
(``side_by_side``). The target (default Gemma-3-270M) runs on specdec's compact path; the draft (default
SmolLM2-135M-Instruct) on its own, as ``drafter=cross_vocab`` builds it. Three tables:

1. greedy, all prompts: ``plain``, then the draft through each rule (``string``: its text re-tokenised by the
   target's tokenizer; ``intersection``: the tokens both vocabularies spell alike) at each ``--k``, and with the
   heuristic draft length; outputs compared with plain decoding (they must all be identical);
2. sampled (``--temperature``, default 1), all prompts: ``plain`` vs ``intersection`` (exact, so the outputs
   differ draw by draw; τ and tokens/s compared);
3. against transformers, ``--uag-prompts`` prompts of the first source, ``--uag-new`` tokens, greedy:
   ``transformers generate`` (plain), ``transformers assisted`` (``assistant_model`` + ``assistant_tokenizer``,
   universal assisted generation, ``num_assistant_tokens`` = K, constant), specdec plain and specdec cross-vocab.

Writes ``cross_vocab.json`` / ``.md`` to --out.

    python experiments/benchmarks/cross_vocab.py --source humaneval wikipedia --prompts 16 --new 128
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from specdec import autoregressive_generate, load_target, speculative_generate
from specdec.decode.metrics import DecodeStats
from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import as_decoder
from specdec.models.loading import stop_token_ids

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side, until_eos  # noqa: E402


def main() -> None:
    ap = benchmark_parser(__doc__, source=["humaneval", "wikipedia"], prompts=16, new=128, temperature=True)
    ap.add_argument("--target", default="gemma3-270m", help="a target load_target takes (alias, path, hub id)")
    ap.add_argument("--draft", default="smollm2-135m-instruct", help="the draft model (another tokenizer)")
    ap.add_argument("--k", type=int, nargs="+", default=[4], help="draft lengths (the first: tables 2 and 3)")
    ap.add_argument("--uag-prompts", type=int, default=6, help="prompts of table 3 (transformers' assisted "
                                                               "generation is slow; 0: skip it)")
    ap.add_argument("--uag-new", type=int, default=64, help="new tokens in table 3")
    args = ap.parse_args()
    temperature = args.temperature or 1.0  # the sampled table's (greedy is table 1)

    model, tokenizer = load_target(args.target)
    draft_model, draft_tokenizer = load_target(args.draft)
    target = as_decoder(model)
    rows = [row for source in args.sources for row in load_prompts(source, limit=args.prompts)]
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    eos = stop_token_ids(model, tokenizer)
    k0 = args.k[0]
    drafters = {}

    def drafter(rule: str, schedule: str = "constant") -> CrossVocabDrafter:
        if (rule, schedule) not in drafters:
            drafters[rule, schedule] = CrossVocabDrafter(draft_model, draft_tokenizer, tokenizer, rule=rule,
                                                         schedule=schedule)
        return drafters[rule, schedule]

    def runner(new: int, temp: float = 0.0, seed: int = 0):
        def run(spec, k, ids):
            kwargs = dict(max_new_tokens=new, eos_token_id=eos, temperature=temp,
                          generator=torch.Generator().manual_seed(seed) if temp else None)
            if spec is None:
                return autoregressive_generate(target, ids, **kwargs)
            return speculative_generate(target, drafter(*spec), ids, k=k, **kwargs)
        return run

    def table(methods, prompt_list, run):
        failed = {}
        seconds, tokens, stats, mismatches = side_by_side(methods, prompt_list, run, failed=failed)
        base = next(iter(seconds))
        rate = {name: tokens[name] / seconds[name] for name in seconds}
        drafted = {name: stats[name].proposed_tokens > 0 for name in seconds}
        return {name: {"tokens_per_second": rate[name], "speedup": rate[name] / rate[base],
                       "tau": stats[name].mean_accepted_length if drafted[name] else None,
                       "alpha": stats[name].acceptance_rate if drafted[name] else None,
                       "acceptance_per_position": stats[name].acceptance_per_position,
                       "draft_ms_per_step": 1e3 * stats[name].drafter_time_s / max(1, stats[name].verify_steps),
                       "mismatching_outputs": int(mismatches[name])} for name in seconds}, failed

    greedy = {"plain": (None, 0)}
    for k in args.k:
        greedy[f"string K={k}"] = (("string",), k)
        greedy[f"intersection K={k}"] = (("intersection",), k)
    greedy[f"string K={max(args.k)} heuristic length"] = (("string", "heuristic"), max(args.k))
    results = {"greedy": table(greedy, prompts, runner(args.new))}
    sampled = {f"plain T={temperature}": (None, 0), f"intersection K={k0} T={temperature}": (("intersection",), k0)}
    results["sampled"] = table(sampled, prompts, runner(args.new, temperature))

    if args.uag_prompts:
        uag_prompts = prompts[: args.uag_prompts]
        draft_model.generation_config.num_assistant_tokens = k0
        draft_model.generation_config.num_assistant_tokens_schedule = "constant"
        draft_model.generation_config.assistant_confidence_threshold = 0.0

        def hf(ids, **extra):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.uag_new,
                                 do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                                 **extra)[:, ids.shape[1]:].tolist()
            return SimpleNamespace(sequences=[until_eos(row, eos) for row in out], stats=DecodeStats())

        def run_uag(spec, k, ids):
            if spec == "hf":
                return hf(ids)
            if spec == "uag":
                return hf(ids, assistant_model=draft_model, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer)
            return runner(args.uag_new)(spec, k, ids)

        uag = {"specdec plain": (None, 0), f"specdec string K={k0}": (("string",), k0),
               "transformers generate": ("hf", 0), f"transformers assisted K={k0}": ("uag", k0)}
        results["transformers"] = table(uag, uag_prompts, run_uag)

    machine = machine_description()
    summary = {"target": args.target, "draft": args.draft, "sources": args.sources, "prompts": len(prompts),
               "max_new_tokens": args.new, "k": args.k, "temperature": temperature, "uag_prompts": args.uag_prompts,
               "uag_new": args.uag_new, "machine": machine, "threads": torch.get_num_threads(),
               "shared_tokens": drafter("string").map.describe(),
               "tables": {name: rows for name, (rows, _) in results.items()},
               "failed": {name: failed for name, (_, failed) in results.items() if failed}}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cross_vocab.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"## {args.target} drafted by {args.draft} ({summary['shared_tokens']})",
             f"{len(prompts)} prompts ({', '.join(args.sources)}), {args.new} new tokens, batch 1; machine: {machine}, "
             f"{summary['threads']} threads"]
    titles = {"greedy": "greedy", "sampled": f"sampled, T={temperature}",
              "transformers": f"vs transformers, {args.uag_prompts} prompts, {args.uag_new} new tokens, greedy"}
    for name, (rows_, failed) in results.items():
        lines += ["", f"### {titles[name]}", "",
                  "| method | tok/s | x first row | τ | α | draft ms/step | outputs ≠ first row |",
                  "|---|---|---|---|---|---|---|"]
        for method, r in rows_.items():
            tau = f"{r['tau']:.2f}" if r["tau"] else "—"
            alpha = f"{r['alpha']:.3f}" if r["alpha"] is not None else "—"
            draft_ms = f"{r['draft_ms_per_step']:.1f}" if r["tau"] else "—"
            lines.append(f"| {method} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {tau} | {alpha} | "
                         f"{draft_ms} | {r['mismatching_outputs']} |")
        lines += [f"\n**{method} failed**: `{tb.strip().splitlines()[-1]}`" for method, tb in failed.items()]
    (out_dir / "cross_vocab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
