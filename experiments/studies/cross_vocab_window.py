"""A draft with another tokenizer, read from a window of the prompt or from all of it (not a test).

In one process, batch 1, each prompt decoded plainly and then by each variant in turn (greedy; the outputs must
equal plain decoding's): the target (Gemma-3-270M) over its float32 values, the draft (SmolLM2-135M-Instruct) over
its own codes, as ``drafter=cross_vocab`` builds it. Each variant is a CrossVocabDrafter's settings and its k.
Prints, per variant, the speedup over plain decoding (end to end), τ, the draft's milliseconds a step and where the
time went (the target's step, the prefill, the drafting).

    python experiments/studies/cross_vocab_window.py --sources heldout_code heldout_text --prompts 8 --new 128 \\
        "dict(rule='string', schedule='heuristic', k=3)" "dict(rule='string', schedule='heuristic', k=3, window=128)"
"""

from __future__ import annotations

import argparse
import ast
import time

import torch

from specdec import autoregressive_generate, load_target, speculative_generate
from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import as_decoder
from specdec.models.backend import Backend
from specdec.models.loading import stop_token_ids


def settings(text: str) -> dict:
    """A variant written as ``dict(rule=..., k=..., ...)``: CrossVocabDrafter's keywords and k."""
    call = ast.parse(text, mode="eval").body
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "dict"):
        raise SystemExit(f"a variant is dict(...) of CrossVocabDrafter's keywords and k, got {text!r}")
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def where_time_went(stats) -> str:
    steps = sum(s.verify_steps for s in stats)
    return (f"steps {steps}, target {1e3 * sum(s.target_time_s for s in stats) / steps:.1f} ms a step, prefill "
            f"{sum(s.prefill_time_s for s in stats):.2f} s, drafting {sum(s.drafter_time_s for s in stats):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="dict(rule=..., schedule=..., window=..., k=...) each")
    ap.add_argument("--sources", nargs="+", default=["heldout_code", "heldout_text"])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per source")
    ap.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    args = ap.parse_args()
    variants = [settings(text) for text in args.variants]

    model, tokenizer = load_target("gemma3-270m")
    draft, draft_tokenizer = load_target("smollm2-135m-instruct")
    target = as_decoder(model, backend=Backend(weights="float"))
    rows = [row for source in args.sources for row in load_prompts(source, limit=args.prompts)]
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in rows]
    eos = stop_token_ids(model, tokenizer)
    drafters = [CrossVocabDrafter(draft, draft_tokenizer, tokenizer, **{k: v for k, v in variant.items() if k != "k"})
                for variant in variants]
    options = dict(max_new_tokens=args.new, eos_token_id=eos)
    with torch.no_grad():
        autoregressive_generate(target, prompts[0], max_new_tokens=8, eos_token_id=eos)  # warm-up
        for variant, drafter in zip(variants, drafters):
            speculative_generate(target, drafter, prompts[0], k=variant["k"], max_new_tokens=8, eos_token_id=eos)
        plain_s, plain_stats = 0.0, []
        seconds, stats = [0.0] * len(variants), [[] for _ in variants]
        for ids in prompts:
            start = time.perf_counter()
            plain = autoregressive_generate(target, ids, **options)
            plain_s += time.perf_counter() - start
            plain_stats.append(plain.stats)
            for i, (variant, drafter) in enumerate(zip(variants, drafters)):
                start = time.perf_counter()
                out = speculative_generate(target, drafter, ids, k=variant["k"], **options)
                seconds[i] += time.perf_counter() - start
                if out.sequences != plain.sequences:
                    raise SystemExit(f"{variant}: greedy output differs from plain decoding's")
                stats[i].append(out.stats)
    print(f"{len(prompts)} prompts ({', '.join(args.sources)}) x {args.new} tokens, greedy, batch 1; "
          f"{machine_description()}")
    print(f"plain: {plain_s:.1f} s; {where_time_went(plain_stats)}")
    for variant, took, runs in zip(variants, seconds, stats):
        steps = sum(s.verify_steps for s in runs)
        tau = sum(s.mean_accepted_length * s.verify_steps for s in runs) / steps
        print(f"{variant}: {took:.1f} s, {plain_s / took:.3f}x plain, τ {tau:.2f}, draft "
              f"{1e3 * sum(s.drafter_time_s for s in runs) / steps:.1f} ms a step; {where_time_went(runs)}")


if __name__ == "__main__":
    main()
