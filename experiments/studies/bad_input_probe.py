"""Bad input on every entry point, as a new user could type it: each command runs in a fresh process, in a scratch
directory that also holds an earlier run's results (its files' bytes and mtimes compared after every command), and is
classed by what it gave:

- REFUSED: a non-zero exit with a message and no traceback, before a model loaded (no "Loading weights" in its output);
- REFUSED AFTER LOAD: the same, once a model had loaded (the check needs the model or its tokenizer);
- TRACEBACK: a non-zero exit that shows a Python traceback (an unclear error);
- RAN: exit 0 (to read: silent, or a valid input that the probe took for bad);
- HANG: still running at the time limit;
- LOSS: an earlier run's file changed or disappeared.

    python experiments/studies/bad_input_probe.py --out benchmarks/bad_input.md     # ~10 min on 2 cores

The table it writes is the one in experiments/README.md#bad-input-2026-11-27.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "specdec" / "assets"


def cases(scratch: Path) -> list[tuple[str, list[str]]]:
    """(module, arguments) per bad input; ``scratch`` holds the files some of them point at."""
    eagle, medusa, dflash = (str(ASSETS / kind / "smollm2-135m") for kind in ("eagle", "medusa", "dflash"))
    earlier, afile, notes = scratch / "earlier", scratch / "afile", scratch / "notes"
    files = {name: scratch / f"{name}.jsonl" for name in ("empty", "no_text", "poem", "array", "text")}
    run, verify, replay, train = "specdec.run", "specdec.verify_dist", "specdec.replay", "specdec.train"
    return [
        (run, ["drafter=nonexistent"]),
        (run, ["drafter.k=-3"]),
        (run, ["drafter.k=2.5"]),
        (run, ["drafter.k=abc"]),
        (run, ["drafter.unknown_setting=1"]),
        (run, ["sampling.temperature=-0.5"]),
        (run, ["sampling.temperature=nan"]),
        (run, ["sampling.top_p=0"]),
        (run, ["sampling.top_p=1.5"]),
        (run, ["sampling.top_k=-1"]),
        (run, ["data.sources=[nope]"]),
        (run, ["data.sources=[]"]),
        (run, [f"data.sources=[{scratch / 'missing.jsonl'}]"]),
        (run, [f"data.sources=[{files['empty']}]"]),
        (run, [f"data.sources=[{files['no_text']}]"]),
        (run, [f"data.sources=[{files['poem']}]"]),
        (run, [f"data.sources=[{files['array']}]"]),
        (run, ["data.limit_per_source=-1"]),
        (run, ["data.max_new_tokens=0"]),
        (run, ["data.max_new_tokens=100000"]),
        (run, ["data.max_prompt_tokens=0"]),
        (run, ["target.max_context=10"]),
        (run, [f"target.name={scratch / 'no_model'}"]),
        (run, [f"target.name={scratch}"]),
        (run, ["target.dtype=float8"]),
        (run, ["target.device=cuda"]),
        (run, ["target.compile=banana"]),
        (run, ["logger.name=banana"]),
        (run, ["drafter=medusa", f"drafter.path={scratch / 'missing'}"]),
        (run, ["drafter=medusa", f"drafter.path={eagle}"]),
        (run, ["drafter=eagle", f"drafter.path={medusa}"]),
        (run, ["drafter=dflash", f"drafter.path={eagle}"]),
        (run, ["drafter=dflash", f"drafter.path={scratch / 'truncated'}"]),
        (run, ["drafter=eagle", "drafter.weight_bits=3"]),
        (run, ["drafter=medusa", "drafter.min_confidence=2"]),
        (run, ["drafter=ngram", "drafter.max_ngram=0"]),
        (run, ["drafter=draft_model", "drafter.schedule=fast"]),
        (run, ["drafter=draft_model", "drafter.confidence=1.5"]),
        (run, ["drafter=draft_model", f"drafter.path={dflash}"]),
        (run, ["drafter.k=auto", "auto.margin=-1"]),
        (run, ["drafter.k=auto", "auto.seeds=0"]),
        (run, [f"hydra.run.dir={afile}"]),
        (run, [f"results_file={earlier / 'results.json'}"]),
        (verify, ["samples_per_prompt=0"]),
        (verify, ["significance=2"]),
        (verify, ["planted_bug=banana"]),
        (verify, ["detect_tv=-1"]),
        (verify, ["joint_tokens=-1"]),
        (verify, ["drafter.k=auto"]),
        (verify, [f"hydra.run.dir={earlier}"]),
        (replay, ["k_max=0"]),
        (replay, ["drafter.k=auto"]),
        (replay, ["drafter=draft_model", "drafter.schedule=heuristic"]),
        (replay, [f"hydra.run.dir={earlier}"]),
        (train, ["method=banana"]),
        (train, ["optim.epochs=0"]),
        (train, ["data.num_prompts=0"]),
        (train, [f"output_dir={earlier}"]),
        ("specdec.export", ["eagle", "--out", str(notes)]),
        ("specdec.export", ["eagle", "--model", str(scratch / "missing"), "--out", str(scratch / "x")]),
        ("specdec.export", ["eagle", "--k", "0", "--out", str(scratch / "y")]),
        ("specdec.export", ["medusa", "--out", str(scratch / "z")]),
        ("specdec.report", [str(scratch / "missing")]),
        ("specdec.report", [str(earlier)]),
    ]


def prepare(scratch: Path) -> None:
    """The files the cases point at, and an earlier main job's results (which no case may change)."""
    earlier = scratch / "earlier"
    (earlier / ".hydra").mkdir(parents=True)
    (earlier / "results.json").write_text('{"status": "ok", "speedup": 1.1}\n')
    (earlier / ".hydra" / "config.yaml").write_text("drafter:\n  name: ngram\n")
    (scratch / "afile").write_text("not a directory\n")
    (scratch / "notes").mkdir()
    (scratch / "notes" / "mine.txt").write_text("my notes\n")
    (scratch / "empty.jsonl").write_text("")
    (scratch / "no_text.jsonl").write_text('{"prompt_text": "hi"}\n')
    (scratch / "poem.jsonl").write_text('{"text": "hi", "kind": "poem"}\n')
    (scratch / "array.jsonl").write_text('["hi"]\n')
    (scratch / "text.jsonl").write_text('{"text": "hi"}\n')
    (scratch / "no_model").mkdir()
    shutil.copytree(ASSETS / "dflash" / "smollm2-135m", scratch / "truncated")
    weights = scratch / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def probe(module: str, args: list[str], scratch: Path, index: int, timeout: float) -> dict:
    hydra_entry = module in ("specdec.run", "specdec.verify_dist", "specdec.replay")
    if hydra_entry and not any(a.startswith(("hydra.run.dir=", "results_file=")) for a in args):
        args = [*args, f"hydra.run.dir={scratch / 'runs' / str(index)}"]
    if module == "specdec.train" and not any(a.startswith("output_dir=") for a in args):
        args = [*args, f"output_dir={scratch / 'train' / str(index)}"]
    earlier = snapshot(scratch / "earlier"), snapshot(scratch / "notes")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=scratch, env=env, capture_output=True,
                              text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, (exc.stdout or b"").decode() + (exc.stderr or b"").decode()
    seconds = time.perf_counter() - start
    loaded = "Loading weights" in out
    if (snapshot(scratch / "earlier"), snapshot(scratch / "notes")) != earlier:
        verdict = "LOSS"
    elif rc is None:
        verdict = "HANG"
    elif rc == 0:
        verdict = "RAN"
    elif "Traceback" in out:
        verdict = "TRACEBACK"
    else:
        verdict = "REFUSED AFTER LOAD" if loaded else "REFUSED"
    lines = [line.strip() for line in out.splitlines() if line.strip() and "%|" not in line
             and "HYDRA_FULL_ERROR" not in line and not line.startswith("[20")]  # no progress bars, no log lines
    first = next((i for i, line in enumerate(lines) if any(w in line for w in ("rror", "Could not", "already holds",
                                                                                "cannot", "refus"))), None)
    if first is None:
        message = lines[-1] if lines else ""
    else:  # Hydra's own errors say what is wrong on their second line
        message = " ".join(lines[first:first + (2 if not lines[first].startswith("error:") else 1)])
    return {"command": f"python -m {module} {' '.join(args)}", "rc": rc, "seconds": seconds, "verdict": verdict,
            "message": message.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/bad_input.md")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a command counts as a hang")
    ap.add_argument("--only", type=int, nargs="*", help="the cases to run (their numbers), all by default")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="specdec-bad-input-"))
    prepare(scratch)
    rows = []
    for i, (module, argv) in enumerate(cases(scratch), start=1):
        if args.only and i not in args.only:
            continue
        row = probe(module, argv, scratch, i, args.timeout)
        rows.append(row)
        print(f"{i:3d} {row['verdict']:<18} {row['seconds']:5.1f} s  {row['command'][:90]}\n      {row['message'][:300]}",
              flush=True)
    shown = lambda text: text.replace(str(scratch), "$S").replace(str(ROOT), ".").replace("|", "\\|")
    table = ["| # | command (`$S`: the scratch directory) | gives | s | message |", "|---|---|---|---|---|"]
    table += [f"| {i} | `{shown(r['command'])}` | {r['verdict']} | {r['seconds']:.0f} | {shown(r['message'])[:300]} |"
              for i, r in enumerate(rows, start=1)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(table) + "\n")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in sorted({r["verdict"] for r in rows})}
    print(f"{len(rows)} inputs: {counts}; table: {args.out}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
