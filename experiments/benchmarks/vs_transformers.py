"""Side-by-side benchmark (not a test): plain vs speculative decoding, specdec vs transformers.

In one process, on the same prompts, batch 1, greedy, each prompt runs every method in turn (so drifts
in machine load hit all alike):

- ``specdec_plain``      autoregressive_generate (our static-cache path)
- ``specdec_spec``       speculative_generate with the drafter
- ``hf_plain``           transformers ``generate(do_sample=False)``
- ``hf_spec``            transformers' equivalent: ``prompt_lookup_num_tokens=K`` for the n-gram drafter,
                         ``assistant_model=`` (the same early-exit model) for the draft-model drafter

Reports tokens/s and ratios, checks that all four produce identical tokens, and writes
``benchmark.json`` / ``benchmark.md`` to --out.

    python experiments/benchmarks/vs_transformers.py --drafter ngram --k 4 --source humaneval --prompts 8 --new 128
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser  # noqa: E402


def early_exit_hf(model, num_layers: int):
    """A transformers model made of the target's first ``num_layers`` layers (+ final norm and LM head)."""
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = num_layers
    draft = model.__class__(config).eval()
    draft.load_state_dict(model.state_dict(), strict=False)
    draft.generation_config = model.generation_config
    return draft


def main() -> None:
    ap = benchmark_parser(__doc__, source="humaneval", prompts=8)
    ap.add_argument("--drafter", choices=["ngram", "draft_model"], default="ngram")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=8, help="early-exit layers of the draft model")
    ap.add_argument("--min-ngram", type=int, default=None, help="n-gram drafter: shortest suffix matched")
    args = ap.parse_args()

    torch.manual_seed(0)
    model, tokenizer = load_target()
    rows = load_prompts(args.source, limit=args.prompts)
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    if args.drafter == "ngram":
        ngram_args = {} if args.min_ngram is None else {"min_ngram": args.min_ngram}
        make_drafter = lambda: NgramDrafter(**ngram_args)  # noqa: E731
        hf_extra = dict(prompt_lookup_num_tokens=args.k)
    else:
        make_drafter = lambda: DraftModelDrafter(model, num_layers=args.num_layers)  # noqa: E731
        hf_extra = dict(assistant_model=early_exit_hf(model, args.num_layers))
        hf_extra["assistant_model"].generation_config.num_assistant_tokens = args.k
        hf_extra["assistant_model"].generation_config.num_assistant_tokens_schedule = "constant"

    def hf(ids, **extra):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, **extra)
        return out[0, ids.shape[1]:].tolist()

    methods = {
        "specdec_plain": lambda ids: autoregressive_generate(model, ids, max_new_tokens=args.new, eos_token_id=eos),
        "specdec_spec": lambda ids: speculative_generate(model, make_drafter(), ids, k=args.k,
                                                         max_new_tokens=args.new, eos_token_id=eos),
        "hf_plain": lambda ids: hf(ids),
        "hf_spec": lambda ids: hf(ids, **hf_extra),
    }
    for fn in methods.values():  # warm-up, untimed
        fn(prompts[0][:, :32])
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    mismatches = 0
    stats = None
    with torch.no_grad():
        for ids in prompts:
            outputs = {}
            for name, fn in methods.items():
                start = time.perf_counter()
                out = fn(ids)
                seconds[name] += time.perf_counter() - start
                if hasattr(out, "stats"):
                    if name == "specdec_spec":
                        stats = out.stats if stats is None else stats.merge(out.stats)
                    out = out.sequences[0]
                outputs[name] = out
                tokens[name] += len(out)
            ref = outputs["specdec_plain"]
            mismatches += sum(o != ref for o in outputs.values())
    rate = {name: tokens[name] / seconds[name] for name in methods}
    machine = machine_description()
    result = {
        "drafter": args.drafter, "k": args.k, "source": args.source, "prompts": len(prompts), "max_new_tokens": args.new,
        "machine": machine, "tokens_per_second": rate,
        "speedup_specdec": rate["specdec_spec"] / rate["specdec_plain"],
        "speedup_hf": rate["hf_spec"] / rate["hf_plain"],
        "specdec_spec_vs_hf_spec": rate["specdec_spec"] / rate["hf_spec"],
        "specdec_plain_vs_hf_plain": rate["specdec_plain"] / rate["hf_plain"],
        "acceptance_rate": stats.acceptance_rate, "mean_accepted_length": stats.mean_accepted_length,
        "mismatching_outputs": mismatches,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{args.drafter}_k{args.k}_{args.source}_{torch.get_num_threads()}threads"
    (out_dir / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"## {args.drafter}, K={args.k}, {args.source} ({len(prompts)} prompts, {args.new} new tokens, greedy, batch 1)",
        f"machine: {machine}", "",
        "| method | tok/s |", "|---|---|",
        *[f"| {name} | {rate[name]:.1f} |" for name in methods], "",
        f"speculative / plain: specdec {result['speedup_specdec']:.2f}x, transformers {result['speedup_hf']:.2f}x; "
        f"specdec spec / transformers spec: {result['specdec_spec_vs_hf_spec']:.2f}x; "
        f"α = {stats.acceptance_rate:.3f}, τ = {stats.mean_accepted_length:.2f}; "
        f"outputs differing from specdec_plain: {mismatches}",
    ]
    (out_dir / f"{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
