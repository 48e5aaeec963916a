"""specdec and vLLM's CPU build side by side: the same prompts (token ids, chat template applied once), the
same method and K, batch 1, greedy (not a test).

Methods, each run by both engines: plain decoding; n-gram prompt lookup (K ``--ngram-k``, n-grams 2-3 in
both); the distilled draft model (``drafter=draft_model``'s shipped student, exported as a transformers
directory, ``--draft-k``, full vocabulary in both); EAGLE-3 (the shipped drafter exported in the speculators
format, a chain of ``--eagle-k``). specdec's own defaults where they differ from the matched settings (the
EAGLE tree, the draft model's 8192-token head) run as extra rows, and so do, on request, specdec's plain and
n-gram rows with its C++ kernels off (``--without-kernels``) or with the target's weights streamed as float32
values rather than as the exact 4/8-bit codes they are (``--float32-weights``; the products are the same bit
for bit); an extra row's "specdec / vLLM" compares it with vLLM's row of its method. vLLM runs in its own
virtual environment (``bash experiments/vllm/setup_venv.sh``), one subprocess per method
(experiments/vllm/runner.py), fp32, eager, the same thread count; its τ and per-position acceptance come from
its own counters.

Per row: tokens/s (new tokens over the time of the generate calls, prefill included, start-up excluded), τ,
acceptance per position, speed over specdec's plain decoding, how many outputs differ from the engine's own
plain decoding and from specdec's plain decoding. τ is specdec's (tokens per verify step, every step counted);
vLLM's own figure (1 + accepted / drafts) counts only the steps that drafted, which differs for n-gram lookup
(no match, no draft): its τ here is (new tokens - prompts) / (new tokens - prompts - accepted), its own figure
kept as ``tau_vllm_own`` in the JSON. Writes ``vllm_T0.json`` / ``.md`` to --out; ``--render JSON`` rewrites
the table from a saved JSON without running anything.

    bash experiments/vllm/setup_venv.sh
    python experiments/benchmarks/vs_vllm.py --sources mtbench humaneval --prompts 24 --new 128
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from specdec import NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.drafters import DraftModelDrafter, EagleDrafter
from specdec.export import export_draft_model, export_eagle
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import Backend, as_decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side  # noqa: E402

RUNNER = Path(__file__).resolve().parents[1] / "vllm" / "runner.py"
DEFAULT_VENV = Path(os.environ.get("SPECDEC_VLLM_VENV", "~/.cache/specdec/vllm-venv")).expanduser()


def vllm_env(venv: Path, threads: int) -> dict:
    """The environment vLLM's CPU build runs best in with ``threads`` threads (see ../shared/VLLM_INTEROP.md):
    its OpenMP threads bound to the first cores, intel-openmp preloaded, a small KV-cache space."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
               VLLM_CPU_KVCACHE_SPACE="2", VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    iomp = sorted(venv.glob("lib/libiomp5.so")) + sorted(venv.glob("lib/python3*/site-packages/**/libiomp5.so"))
    if iomp:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp[0]), env.get("LD_PRELOAD", "")]))
    return env


def run_vllm(venv: Path, job: dict, work: Path, threads: int, timeout: int) -> dict:
    name = f"{job['method']}_k{job.get('k', 0)}"
    job_path, result_path, log_path = work / f"{name}.job.json", work / f"{name}.result.json", work / f"{name}.log"
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.run([str(venv / "bin" / "python"), str(RUNNER), str(job_path), str(result_path)],
                              env=vllm_env(venv, threads), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0 or not result_path.is_file():
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"vLLM's {name} failed (exit {proc.returncode}); its log {log_path} ends:\n{tail}")
    return json.loads(result_path.read_text())


def vllm_stats(counters: dict, new_tokens: int, prompts: int) -> tuple[float | None, float | None, list[float]]:
    """(τ as specdec counts it, vLLM's own τ, acceptance per position) from vLLM's counters.

    vLLM's τ is 1 + accepted / drafts over the steps that drafted; specdec's counts every verify step, and a
    step emits 1 + accepted tokens after the prefill's first, so steps = new tokens - prompts - accepted (a
    last step cut short by max_new_tokens makes this approximate). vLLM counts the drafts accepted up to each
    position (a share of all drafts); specdec reports α per position conditionally (accepted at position i
    among the drafts whose position i - 1 was accepted): converted here to specdec's, to 4 decimals, the
    first 8 positions."""
    def find(suffix):
        return next((v for n, v in counters.items() if n.endswith(suffix)), None)
    drafts, accepted = find("spec_decode_num_drafts"), find("spec_decode_num_accepted_tokens")
    per_pos = find("spec_decode_num_accepted_tokens_per_pos") or []
    if not drafts:
        return None, None, []
    reached = [drafts] + list(per_pos[:-1])
    emitted = new_tokens - prompts
    return (emitted / (emitted - accepted), 1 + accepted / drafts,
            [round(a / r, 4) if r else float("nan") for a, r in zip(per_pos[:8], reached)])


def write_report(summary: dict, out_dir: Path) -> None:
    """``vllm_T0.json`` and the table ``vllm_T0.md`` from the run's summary."""
    rows = {(r["engine"], r["method"]): r for r in summary["rows"]}
    base = rows[("specdec", "plain")]["tokens_per_second"]
    for (engine, name), r in rows.items():
        r["vs_specdec_plain"] = r["tokens_per_second"] / base
        peer = rows.get(("vLLM", name)) or rows.get(("vLLM", name.split(",")[0]))  # a variant: its method's row
        if engine == "specdec" and peer:
            r["vs_vllm_same"] = r["tokens_per_second"] / peer["tokens_per_second"]
            if r["tau"] and peer["tau"]:
                r["tau_vs_vllm"] = r["tau"] / peer["tau"]
    (out_dir / "vllm_T0.json").write_text(json.dumps(summary, indent=2) + "\n")
    order = list(dict.fromkeys(name for _, name in rows))
    lines = [f"## specdec vs vLLM's CPU build, {' + '.join(summary['sources'])} ({summary['prompts']} prompts, "
             f"{summary['max_new_tokens']} new tokens, greedy, batch 1, {summary['threads']} threads)",
             f"machine: {summary['machine']}", "",
             "| method | engine | tok/s | vs specdec plain | specdec / vLLM | τ | α per position "
             "| outputs ≠ own plain | ≠ specdec plain |", "|---|---|---|---|---|---|---|---|---|"]
    for (engine, name), r in sorted(rows.items(), key=lambda item: order.index(item[0][1])):
        alpha = " ".join(f"{a:.2f}" for a in r["alpha_per_position"]) or "—"
        lines.append(f"| {name} | {engine} | {r['tokens_per_second']:.1f} | {r['vs_specdec_plain']:.2f}x | "
                     f"{'%.2fx' % r['vs_vllm_same'] if 'vs_vllm_same' in r else '—'} | "
                     f"{'%.2f' % r['tau'] if r['tau'] else '—'} | {alpha} | {r['differ_from_own_plain']} | "
                     f"{r['differ_from_specdec_plain']} |")
    lines += ["", "τ: tokens per verify step, every step counted (vLLM's: derived from its counters; its own "
              "figure, per step that drafted, is tau_vllm_own in the JSON)."]
    (out_dir / "vllm_T0.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = benchmark_parser(__doc__, source=["mtbench", "humaneval"], prompts=24, out="benchmarks/vllm")
    ap.add_argument("--venv", default=str(DEFAULT_VENV), help="vLLM's virtual environment (vllm/setup_venv.sh)")
    ap.add_argument("--methods", nargs="+", default=["plain", "ngram", "draft_model", "eagle"])
    ap.add_argument("--ngram-k", type=int, default=4)
    ap.add_argument("--draft-k", type=int, default=1)
    ap.add_argument("--eagle-k", type=int, default=3)
    ap.add_argument("--no-extra", action="store_true", help="leave specdec's default-setting rows out")
    ap.add_argument("--without-kernels", action="store_true", help="also run specdec's plain and n-gram rows "
                    "with its C++ CPU kernels off (torch ops over oneDNN, as before them)")
    ap.add_argument("--float32-weights", action="store_true", help="also run specdec's plain and n-gram rows "
                    "with the target's weights streamed as float32 values (coded panels off), as vLLM streams them")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per vLLM method")
    ap.add_argument("--render", metavar="JSON", help="rewrite the table (and the JSON) from a saved vllm_T0.json "
                    "into --out, running nothing")
    args = ap.parse_args()
    if args.render:
        summary = json.loads(Path(args.render).read_text())
        for r in summary["rows"]:  # τ re-derived, so tables from older runs read the same way
            if r["engine"] == "vLLM" and r.get("counters"):
                r["tau"], r["tau_vllm_own"], r["alpha_per_position"] = vllm_stats(
                    r["counters"], r["new_tokens"], summary["prompts"])
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_report(summary, Path(args.out))
        return

    venv = Path(args.venv).expanduser()
    if not (venv / "bin" / "python").is_file():
        raise SystemExit(f"no vLLM environment at {str(venv)!r}: run `bash experiments/vllm/setup_venv.sh {venv}` "
                         f"first, or pass --venv")
    out_dir = Path(args.out)
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    model, tokenizer = load_target()
    target_dir = str(model.name_or_path)
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for source in args.sources
               for row in load_prompts(source, limit=args.prompts)]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]

    ours: dict = {"plain": (None, 0)}
    theirs: dict = {"plain": {"method": "plain"}}
    if "ngram" in args.methods:
        ours[f"ngram K={args.ngram_k}"] = (NgramDrafter(max_ngram=3, min_ngram=2), args.ngram_k)
        theirs[f"ngram K={args.ngram_k}"] = {"method": "ngram", "k": args.ngram_k, "ngram": [2, 3]}
    if "draft_model" in args.methods:
        hf_dir = export_draft_model(work / "draft_model_hf", force=True)
        cfg = DraftModelDrafter.Config(k=args.draft_k, draft_vocab=0)
        ours[f"draft model K={args.draft_k}"] = (DraftModelDrafter.from_config(cfg, target=model), args.draft_k)
        theirs[f"draft model K={args.draft_k}"] = {"method": "draft_model", "k": args.draft_k, "draft": str(hf_dir)}
        if not args.no_extra:
            cfg = DraftModelDrafter.Config(k=args.draft_k, draft_vocab=8192)
            ours[f"draft model K={args.draft_k}, 8192-token head (specdec's default)"] = (
                DraftModelDrafter.from_config(cfg, target=model), args.draft_k)
    if "eagle" in args.methods:
        eagle_dir = export_eagle(work / "eagle", force=True, k=args.eagle_k)
        cfg = EagleDrafter.Config(k=args.eagle_k, tree=False, weight_bits=None)  # the weights the export holds
        ours[f"eagle chain K={args.eagle_k}"] = (EagleDrafter.from_config(cfg, target=model), args.eagle_k)
        theirs[f"eagle chain K={args.eagle_k}"] = {"method": "eagle3", "k": args.eagle_k, "draft": str(eagle_dir)}
        if not args.no_extra:
            cfg = EagleDrafter.Config()
            ours["eagle tree (specdec's default)"] = (EagleDrafter.from_config(cfg, target=model), cfg.k)

    varied = [n for n in ours if n == "plain" or n.startswith("ngram")]
    for name in varied if args.without_kernels else []:
        ours[f"{name}, no specdec CPU kernels"] = (("no kernels", ours[name][0]), ours[name][1])
    for name in varied if args.float32_weights else []:
        ours[f"{name}, weights as float32"] = (("float32", ours[name][0]), ours[name][1])

    # the target's decoder per backend: the default, without specdec's CPU kernels, streaming float32 weights
    targets = {None: as_decoder(model), "no kernels": as_decoder(model, backend=Backend(kernels=False)),
               "float32": as_decoder(model, backend=Backend(weights="float"))}

    def run(drafter, k, ids):
        kwargs = dict(max_new_tokens=args.new, eos_token_id=eos, temperature=0.0)
        # ("no kernels" | "float32", drafter): the same model-free method, the target on another backend
        backend, drafter = drafter if isinstance(drafter, tuple) else (None, drafter)
        if drafter is None:
            return autoregressive_generate(targets[backend], ids, **kwargs)
        return speculative_generate(targets[backend], drafter, ids, k=k, **kwargs)

    start = time.perf_counter()
    plain_out: list = []
    seconds, tokens, stats, mismatches = side_by_side(ours, prompts, run, plain_out)
    print(f"specdec: {time.perf_counter() - start:.0f} s", flush=True)
    rows = {}
    for name in ours:
        s = stats[name]
        rows[("specdec", name)] = {
            "tokens_per_second": tokens[name] / seconds[name], "new_tokens": tokens[name],
            "tau": None if name.startswith("plain") else s.mean_accepted_length,
            "alpha_per_position": [] if name.startswith("plain") else [round(a, 4) for a in s.acceptance_per_position[:8]],
            "differ_from_own_plain": mismatches[name], "differ_from_specdec_plain": mismatches[name]}
    max_len = max(ids.shape[1] for ids in prompts) + args.new + 16
    for name, job in theirs.items():
        job = {**job, "target": target_dir, "prompts": [ids[0].tolist() for ids in prompts],
               "max_new_tokens": args.new, "max_model_len": max(512, -(-max_len // 256) * 256),
               "warmup": prompts[0][0, :32].tolist()}
        start = time.perf_counter()
        result = run_vllm(venv, job, work, threads, args.timeout)
        print(f"vLLM {name}: {time.perf_counter() - start:.0f} s (start-up {result['startup_s']:.0f} s)", flush=True)
        new_tokens = sum(map(len, result["sequences"]))
        tau, tau_own, per_pos = vllm_stats(result["counters"], new_tokens, len(prompts))
        if name == "plain":
            vllm_plain = result["sequences"]
        rows[("vLLM", name)] = {
            "tokens_per_second": new_tokens / sum(result["seconds"]),
            "new_tokens": new_tokens, "tau": tau, "tau_vllm_own": tau_own,
            "alpha_per_position": per_pos, "startup_s": result["startup_s"],
            "differ_from_own_plain": sum(a != b for a, b in zip(result["sequences"], vllm_plain)),
            "differ_from_specdec_plain": sum(a != b for a, b in zip(result["sequences"], plain_out)),
            "counters": result["counters"]}
    summary = {"sources": args.sources, "prompts": len(prompts), "max_new_tokens": args.new, "threads": threads,
               "machine": machine_description(),
               "rows": [{"engine": e, "method": n, **r} for (e, n), r in rows.items()]}
    write_report(summary, out_dir)


if __name__ == "__main__":
    sys.exit(main())
