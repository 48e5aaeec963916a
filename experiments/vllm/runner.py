"""One vLLM method over a list of prompts, batch 1, greedy: runs inside vLLM's own virtual environment
(experiments/vllm/setup_venv.sh) and imports nothing from specdec, which drives it
(experiments/benchmarks/vs_vllm.py). Not a test.

    VENV/bin/python experiments/vllm/runner.py JOB.json RESULT.json

JOB.json: {"target": DIR, "method": "plain" | "ngram" | "draft_model" | "eagle3", "k": K, "draft": DIR,
"ngram": [MIN, MAX], "prompts": [[token ids], ...], "max_new_tokens": N, "max_model_len": L,
"warmup": [token ids]}. The prompts are token ids (specdec applied the chat template), so both engines read
the very same input. Each prompt is one ``generate`` call, timed on its own after an untimed warm-up, as
specdec times one generation. RESULT.json: the new token ids, seconds per prompt, the engine's start-up time,
and vLLM's own speculative-decoding counters (drafts, draft tokens, accepted tokens, accepted per position)
over the timed prompts.
"""

from __future__ import annotations

import json
import sys
import time


def _counters(llm) -> dict:
    """vLLM's speculative-decoding counters (names holding 'spec_decode'), summed over engines."""
    out: dict = {}
    for metric in llm.get_metrics():
        if "spec_decode" not in metric.name:
            continue
        if hasattr(metric, "values"):  # a vector: per draft position
            old = out.get(metric.name, [])
            values = list(metric.values)
            out[metric.name] = [a + b for a, b in zip(values, old + [0] * (len(values) - len(old)))]
        elif hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + metric.value
    return out


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or [0] * len(value)
            out[name] = [a - b for a, b in zip(value, old)]
        else:
            out[name] = value - (old or 0)
    return out


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):  # the usage is the docstring
        print(__doc__)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    job_path, result_path = sys.argv[1], sys.argv[2]
    job = json.load(open(job_path))
    from vllm import LLM, SamplingParams

    method, k = job["method"], int(job.get("k") or 0)
    spec = None
    if method == "ngram":
        low, high = job.get("ngram", [2, 3])
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": low, "prompt_lookup_max": high}
    elif method in ("draft_model", "eagle3"):
        spec = {"method": method, "model": job["draft"], "num_speculative_tokens": k}
    elif method != "plain":
        raise SystemExit(f"unknown method {method!r}: plain, ngram, draft_model or eagle3")
    start = time.perf_counter()
    llm = LLM(model=job["target"], dtype="float32", enforce_eager=True, seed=0, max_model_len=job["max_model_len"],
              speculative_config=spec, disable_log_stats=False)
    startup = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"])
    llm.generate([{"prompt_token_ids": job["warmup"]}], params, use_tqdm=False)
    before = _counters(llm)
    sequences, seconds = [], []
    for ids in job["prompts"]:
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        sequences.append(list(out[0].outputs[0].token_ids))
    counters = _delta(_counters(llm), before)
    json.dump({"method": method, "k": k, "startup_s": startup, "sequences": sequences, "seconds": seconds,
               "counters": counters}, open(result_path, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
