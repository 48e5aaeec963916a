"""Writing a sweep's summary (summary.csv, summary.md, plots), the Hydra callback that does it at the end of
a multirun, and the CLI ``python -m specdec.report <sweep_dir>``."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specdec.jobs.io import atomic_write, save_figure, write_text
from specdec.report.plots import make_plots
from specdec.report.summary import RESULTS_FILE, collect_runs, load_summary, markdown_summary, summarize
from specdec.report.wandb import wandb_log_summary


def write_summary(sweep_dir: str | os.PathLike, runs: Sequence[dict]) -> dict[str, Path]:
    """Write summary.csv, summary.md and ``<plot>.png`` into ``sweep_dir``; return their paths by name."""
    sweep_dir = Path(sweep_dir)
    df = summarize(runs)
    paths = {
        "csv": atomic_write(sweep_dir / "summary.csv", lambda f: df.to_csv(f, index=False)),
        "md": write_text(sweep_dir / "summary.md", markdown_summary(df)),
    }
    for name, fig in make_plots(df).items():
        paths[name] = save_figure(fig, sweep_dir / f"{name}.png")
    return paths


def latest_sweep_dir(root: str | os.PathLike = "multirun") -> Path:
    """The most recently modified sweep under ``root`` (a directory holding multirun.yaml or summary.csv)."""
    root = Path(root)
    sweeps = [p.parent for pattern in ("multirun.yaml", "summary.csv") for p in root.glob(f"**/{pattern}")]
    if not sweeps:
        raise FileNotFoundError(f"no sweep (a directory with multirun.yaml or summary.csv) under {str(root)!r}; "
                                "run `python -m specdec.run -m ...` first or set SPECDEC_SWEEP_DIR")
    return max(set(sweeps), key=lambda p: p.stat().st_mtime)


def report_sweep(sweep_dir: str | os.PathLike, results_file: str = RESULTS_FILE,
                 logger: Optional[DictConfig] = None) -> list[dict]:
    """Collect, write and print a sweep's summary; log it to wandb when ``logger.name == "wandb"``.

    A failure to write the summary or to log it is printed with its context, never raised: the runs'
    own results.json files stay where they are. Returns the collected runs (empty if even that failed).
    """
    sweep_dir = Path(sweep_dir)
    try:
        runs = collect_runs(sweep_dir, results_file)
    except Exception:
        _print_error(f"could not collect the runs of sweep {sweep_dir}")
        return []
    try:
        paths = write_summary(sweep_dir, runs)
        print(paths["md"].read_text(encoding="utf-8"))
        print(f"specdec.report: wrote {', '.join(p.name for p in paths.values())} in {sweep_dir}")
    except Exception:
        _print_error(f"could not write the summary of sweep {sweep_dir} ({len(runs)} runs; "
                     f"each run's {results_file} is in its job directory)")
        return runs
    if logger is not None and logger.get("name") == "wandb":
        try:
            wandb_log_summary(logger, sweep_dir, load_summary(paths["csv"]), paths)
        except Exception:
            _print_error(f"could not log the summary of sweep {sweep_dir} to wandb (files are in {sweep_dir})")
    return runs


def _print_error(context: str) -> None:
    print(f"specdec.report: {context}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)


class SweepSummaryCallback(Callback):
    """Hydra callback: at the end of a multirun, summarize ``hydra.sweep.dir`` and print the table.

    Needs the task function to catch its own exceptions (writing a failed results.json and returning):
    a job that raises makes Hydra's sweeper re-raise after the batch, and ``on_multirun_end`` never runs.
    With ``exit_nonzero_on_failure`` the process then exits with status 1 when any run failed, after the
    summary is written (Hydra would otherwise exit 0, since every job returned normally).
    """

    def __init__(self, exit_nonzero_on_failure: bool = True) -> None:
        self.exit_nonzero_on_failure = exit_nonzero_on_failure

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        results_file = OmegaConf.select(config, "results_file", default=RESULTS_FILE)
        runs = report_sweep(config.hydra.sweep.dir, results_file, OmegaConf.select(config, "logger"))
        failed = [r for r in runs if r.get("status") != "ok"]
        if failed and self.exit_nonzero_on_failure:
            print(f"specdec.report: {len(failed)} of {len(runs)} runs failed (jobs "
                  f"{', '.join(str(r['job']) for r in failed)}); exiting with status 1", file=sys.stderr, flush=True)
            raise SystemExit(1)  # Hydra's callback runner catches Exception but lets SystemExit through


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.report",
                                     description="Summarize a sweep: summary.csv, summary.md and plots.")
    parser.add_argument("sweep_dir", help="a multirun directory, e.g. multirun/2025-01-01/12-00-00")
    parser.add_argument("--results-file", default=RESULTS_FILE, help="per-run results file name")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when any run failed")
    args = parser.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        parser.error(f"sweep directory {args.sweep_dir!r} does not exist")
    if (Path(args.sweep_dir) / args.results_file).is_file() and not list(Path(args.sweep_dir).glob(
            f"*/{args.results_file}")):  # a summary written there would sit among one run's own files
        parser.error(f"{args.sweep_dir!r} is one run's directory (its {args.results_file} is there), not a sweep's; "
                     f"pass the multirun directory that holds the jobs' directories (multirun/<date>/<time>)")
    runs = report_sweep(args.sweep_dir, args.results_file)
    if not runs:
        print(f"specdec.report: no runs found under {args.sweep_dir}", file=sys.stderr)
        return 1
    return 1 if args.strict and any(r.get("status") != "ok" for r in runs) else 0
