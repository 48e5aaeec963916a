"""Medusa side by side (not a test): plain decoding vs Medusa trees and chains vs the n-gram drafter.

In one process, on the same held-out prompts, batch 1, greedy, each prompt runs every method in turn (so
drifts in machine load hit all alike). transformers has no Medusa decoding, so the peer in the same
process is specdec's training-free n-gram drafter. For each method: τ, tokens/s, speedup over plain
decoding, and two predictions of that speedup, both from costs measured in this run:

- ``predicted`` (a priori): the τ the heads' training expected for this tree (``expected_tau_greedy`` in
  their provenance: on this source's held-out answers where training evaluated them — MT-Bench's and
  HumanEval's first 24 — else on the validation split) × plain step time / (verify step + drafter step);
- ``predicted_measured_tau``: the same with the τ measured here. Its gap to the measured speedup is loop
  overhead (sampling, cache compaction, host sync) and the prefill.

Checks that every method's tokens equal plain decoding's, writes ``medusa_<source>.json`` / ``.md`` to --out.

    python experiments/benchmarks/medusa.py --trees 4 7 15 --dynamic 15:0.2 --chains 2 --source mtbench --prompts 16

``--dynamic K:CONF`` runs a dynamic tree (``MedusaDrafter(min_confidence=CONF)``): of the first K paths,
the ones whose confidence reaches CONF. A tree written ``K+L`` (``--trees 15+8``, ``--dynamic 15:0.3+4``)
adds the prompt-lookup branch of up to L nodes (``drafter.lookup=L``, ``drafter.k=K+L``). ``--dtype`` is
``drafter.dtype`` (default ``auto``: bfloat16 where it is fast; the target stays float32). ``--cpu-linear mkl``
runs the target's linear layers through MKL instead of oneDNN (``Backend(onednn=False)``), as before.

    python experiments/benchmarks/medusa.py --trees 15 15+8 --dynamic 15:0.4+4 --dtype bfloat16 --prompts 16
"""

from __future__ import annotations

import json
import math
import sys
from functools import partial
from pathlib import Path

import torch

from specdec import NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.drafters.medusa import MedusaDrafter, default_heads_path, drafting_dtype, load_heads
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import Backend, as_decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side, spec_type  # noqa: E402


def main() -> None:
    ap = benchmark_parser(__doc__, prompts=24)
    ap.add_argument("--heads", default=None, help="heads.safetensors (default: the shipped heads)")
    ap.add_argument("--trees", nargs="*", default=["4", "8"], metavar="K[+L]", type=spec_type(r"\d+(\+\d+)?", "K or K+L"),
                    help="trees of the first K paths (+ a prompt-lookup branch of up to L nodes)")
    ap.add_argument("--chains", type=int, nargs="*", default=[], help="chain lengths k (first k heads)")
    ap.add_argument("--dynamic", nargs="*", default=[], metavar="K:CONF[+L]",
                    help="dynamic trees: at most K paths, those with confidence >= CONF (e.g. 15:0.2, 15:0.3+4)")
    ap.add_argument("--dtype", default="auto",
                    help="the heads' dtype as drafter.dtype: auto (bf16 where fast, the default), float32, bfloat16")
    ap.add_argument("--ngram-k", type=int, default=4, help="the n-gram peer's K (0: leave it out)")
    ap.add_argument("--cpu-linear", choices=["onednn", "mkl"], default="onednn",
                    help="the target's linear layers on CPU: oneDNN with packed weights (default) or MKL's W·xᵀ")
    args = ap.parse_args()
    backend = Backend(onednn=args.cpu_linear == "onednn")

    model, tokenizer = load_target()
    target = as_decoder(model, backend=backend)
    heads_path = Path(args.heads) if args.heads else default_heads_path()
    heads, meta = load_heads(heads_path, hidden_size=model.config.hidden_size, vocab_size=model.config.vocab_size)
    provenance_file = heads_path.parent / "provenance.json"
    metrics = json.loads(provenance_file.read_text())["metrics"] if provenance_file.is_file() else {}
    expected_tau = (metrics.get("eval", {}).get(f"answers_{args.source}", {}).get("expected_tau_greedy")
                    or metrics.get("expected_tau_greedy", []))  # on this source's held-out answers, else val
    rows = load_prompts(args.source, limit=args.prompts)
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    lm_head = model.get_output_embeddings().weight
    medusa = partial(MedusaDrafter, heads, lm_head, dtype=args.dtype, backend=backend,
                     embed_weight=model.get_input_embeddings().weight if heads.token_aware else None)

    def tree(spec: str, conf: float = 0.0) -> tuple[MedusaDrafter, int]:  # "K" or "K+L"
        k, _, lookup = spec.partition("+")
        return medusa(meta["tree"], conf, lookup=int(lookup or 0)), int(k) + int(lookup or 0)

    draft_dtype = drafting_dtype(args.dtype, lm_head)
    methods = {"plain": (None, 0)}
    for spec in args.trees:
        methods[f"medusa tree k={spec}"] = tree(spec)
    for spec in args.dynamic:
        k, _, conf = spec.partition(":")
        conf, _, lookup = conf.partition("+")
        methods[f"medusa dynamic k<={k}{'+' + lookup if lookup else ''} conf>={conf}"] = \
            tree(f"{k}+{lookup or 0}", float(conf))
    for k in args.chains:
        methods[f"medusa chain k={k}"] = (medusa(None), k)
    if args.ngram_k:
        methods[f"ngram K={args.ngram_k}"] = (NgramDrafter(), args.ngram_k)

    def run(drafter, k, ids):
        if drafter is None:
            return autoregressive_generate(target, ids, max_new_tokens=args.new, eos_token_id=eos)
        return speculative_generate(target, drafter, ids, k=k, max_new_tokens=args.new, eos_token_id=eos)

    seconds, tokens, stats, mismatches = side_by_side(methods, prompts, run)

    plain_step = stats["plain"].target_time_s / stats["plain"].target_forwards  # s per plain decode step
    results = {}
    for name, (drafter, k) in methods.items():
        s = stats[name]
        step = (s.target_time_s + s.drafter_time_s) / s.target_forwards  # verify + draft, s per step
        tau = s.mean_accepted_length
        fixed = name.startswith("medusa tree") and "+" not in name  # the provenance's τ: Medusa nodes only
        a_priori = expected_tau[k - 1] if fixed and k <= len(expected_tau) else float("nan")
        results[name] = {
            "k": k, "tau": tau, "acceptance_rate": s.acceptance_rate, "tokens_per_second": tokens[name] / seconds[name],
            "step_ms": 1000 * step, "verify_step_ms": 1000 * s.target_time_s / s.target_forwards,
            "drafter_step_ms": 1000 * s.drafter_time_s / s.target_forwards,
            "expected_tau": a_priori, "predicted": a_priori * plain_step / step,
            "predicted_measured_tau": tau * plain_step / step, "mismatching_outputs": mismatches[name],
        }
    base = results["plain"]["tokens_per_second"]
    for r in results.values():
        r["speedup"] = r["tokens_per_second"] / base
    machine = machine_description()
    if model.device.type == "cpu":
        machine += f", CPU linear layers: {args.cpu_linear}"
    summary = {"source": args.source, "prompts": len(prompts), "max_new_tokens": args.new, "machine": machine,
               "heads": str(heads_path), "draft_vocab_size": heads.draft_vocab_size, "dtype": str(draft_dtype),
               "methods": results}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"medusa_{args.source}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"## Medusa vs plain, {args.source} ({len(prompts)} prompts, {args.new} new tokens, greedy, batch 1)",
             f"machine: {machine}; heads: {heads_path} (draft vocabulary {heads.draft_vocab_size}, drafting in "
             f"{draft_dtype})", "",
             "| method | τ | expected τ | tok/s | speedup | predicted | predicted (measured τ) | step ms (verify + draft) "
             "| outputs ≠ plain |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        expected = "—" if math.isnan(r["expected_tau"]) else f"{r['expected_tau']:.2f}"
        predicted = "—" if math.isnan(r["predicted"]) else f"{r['predicted']:.2f}x"
        lines.append(f"| {name} | {r['tau']:.2f} | {expected} | {r['tokens_per_second']:.1f} | "
                     f"{r['speedup']:.2f}x | {predicted} | {r['predicted_measured_tau']:.2f}x | "
                     f"{r['verify_step_ms']:.1f} + {r['drafter_step_ms']:.1f} | {r['mismatching_outputs']} |")
    (out_dir / f"medusa_{args.source}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
