"""Export a trained drafter with its provenance: the method's weight file(s) + ``provenance.json`` (command,
config, the run's output_dir, commit, machine, data size, wall time, metrics), written together: a failure
leaves the export that was there, and a directory holding another run's export is refused."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specdec.jobs.io import write_json
from specdec.jobs.runs import machine_description
from specdec.training.distill.store import Split
from specdec.training.methods.base import TrainMethod


def plain(cfg: Any) -> dict[str, Any]:
    """A typed config as plain JSON-able containers."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def export_dtype(name: str | None) -> torch.dtype | None:
    """The exported weights' dtype named by ``export_dtype`` (None: keep float32)."""
    if not name:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export_dtype={name!r} is not a torch floating dtype; use float16, bfloat16, float32 or null")
    return dtype


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def data_description(cfg: Any) -> str:
    data = cfg.data
    if data.mode != "self_distill":
        return f"chunks of {data.text_sources} (first {data.skip_first} rows excluded)"
    return ("the target's greedy answers (self-distillation) to generated instruction prompts in MT-Bench's eight "
            "categories (specdec/training/distill/prompts.py: templates filled from Wikipedia titles and sentences, "
            "stdlib signatures and docstrings, the Lee news corpus, Shakespeare and word lists, each corpus minus "
            f"its first {data.skip_first} rows), plus passages and code to continue; MT-Bench and HumanEval held out"
            + (f"; {data.magpie_fraction:.0%} of the prompts written by the target itself (Magpie)"
               if data.magpie_fraction else ""))


def data_size(splits: dict[str, Split]) -> dict[str, dict[str, int]]:
    return {name: {"sequences": int(s.lengths.numel()), "tokens": int(s.tokens.numel())} for name, s in splits.items()}


def check_export(cfg: Any) -> None:
    """Refuse ``cfg.export`` when it holds another run's export: a provenance.json naming another output_dir
    (a run is its output_dir: data, checkpoints, settings). Re-exporting the same run there is fine, as is a
    new directory or one without a provenance.json."""
    if not cfg.export:
        return
    provenance = Path(cfg.export) / "provenance.json"
    if not provenance.is_file():
        return
    try:
        written = json.loads(provenance.read_text())
        other = written.get("output_dir") or written["config"]["output_dir"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"export={cfg.export!r} holds a provenance.json that cannot be read ({exc!r}), so it may be "
                         f"another run's export; use another export= directory, or delete {str(provenance)!r} (and "
                         f"the weights beside it) to export there") from exc
    if Path(other).resolve() != Path(cfg.output_dir).resolve():
        raise ValueError(f"export={cfg.export!r} already holds the export of another run (output_dir={other!r}, "
                         f"run_name={written.get('config', {}).get('run_name')!r}), which this run "
                         f"(output_dir={cfg.output_dir!r}) would overwrite; use another export= directory, or delete "
                         f"{cfg.export!r} to replace that export")


def export(directory: Path, method: TrainMethod, model: torch.nn.Module, cfg: Any, metrics: dict[str, Any],
           splits: dict[str, Split]) -> None:
    """The method's weight file (with what its drafter needs, e.g. Medusa's tree) + provenance.json, written
    into a temporary directory inside ``directory``, then moved into place, provenance.json last: a failure
    while writing leaves the export that was there intact. Refuses a directory holding another run's export."""
    check_export(cfg)
    provenance = {
        "command": " ".join(["python -m specdec.train", *sys.argv[1:]]),
        "config": plain(cfg),
        "output_dir": str(Path(cfg.output_dir).resolve()),  # the run exported (what check_export compares)
        "method": {"name": method.name, "description": method.description},
        "data": {"mode": cfg.data.mode, "size": data_size(splits), "description": data_description(cfg),
                 "processes": metrics.get("data_processes", 1)},  # processes that built the data
        "git_commit": metrics.get("git_commit") or git_commit(),  # the code training ran
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(metrics.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "wall_time_s": metrics["times_s"],
        "metrics": metrics,
        **({"reference": method.reference} if method.reference else {}),
    }
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".export.", suffix=".tmp"))
    try:
        method.save(model, tmp / method.weights_file, cfg.target.name, metrics, dtype=export_dtype(cfg.export_dtype))
        write_json(tmp / "provenance.json", provenance)
        for path in sorted(tmp.iterdir(), key=lambda p: p.name == "provenance.json"):  # renames: same filesystem
            os.replace(path, directory / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
