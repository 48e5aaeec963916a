"""Sweep reports: every run's ``results.json`` gathered into ``summary.csv``, ``summary.md`` and plots.

Vocabulary (the same as the rest of specdec): a drafter proposes ``k`` *draft* tokens per target forward;
the verifier keeps an *accepted* prefix, then emits a *recovered* token (at the first rejection) or a
*bonus* token (when all ``k`` were accepted).

- α, ``acceptance_rate``: accepted draft tokens / proposed draft tokens.
- α_i, ``acceptance_per_position[i-1]`` (``alpha_i`` in the CSV): P(draft token i accepted | reached).
- τ, ``mean_accepted_length``: tokens emitted per target forward, **bonus included** (so τ ≥ 1).
- c, ``cost_ratio``: drafter step time / target step time, measured.
- predicted speedup: (1 − α^(k+1)) / ((1 − α)(k·c + 1)) (Leviathan et al. 2023, Thm 3.8).

Every number in the summary is copied from ``results.json``, category rows included (each category's
predicted speedup and cost ratio are the ones the run computed for it); nothing is recomputed.

Entry points: :func:`collect_runs`, :func:`summarize`, :func:`write_summary`; the Hydra callback
:class:`SweepSummaryCallback`; :func:`wandb_log_run` for the run entry point; and a CLI,
``python -m specdec.report <sweep_dir>``. Every file is written atomically (:mod:`specdec.io`), so a
crash never leaves a half-written summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pandas as pd
from hydra.experimental.callback import Callback
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from specdec.io import atomic_write, save_figure, write_text
from specdec.jobs import failed_result

RESULTS_FILE = "results.json"
NO_RESULTS_ERROR = "no results.json (run crashed before writing)"
ALL = "all"  # the `category` of a run's overall row

# Beyond drafter and temperature, these config fields split the plot lines when they vary in a sweep.
SERIES_KEYS = ["target", "top_k", "top_p", "sources", "max_new_tokens", "batch_size"]
INT_COLUMNS = ["k", "top_k", "num_prompts", "max_new_tokens", "batch_size",
               "target_forwards", "drafter_forwards", "new_tokens"]
COLUMNS = [
    "job", "status", "error", "target", "drafter", "k", "temperature", "top_k", "top_p", "sources",
    "num_prompts", "max_new_tokens", "batch_size", "category",
    "acceptance_rate", "mean_accepted_length", "tokens_per_second", "baseline_tokens_per_second",
    "speedup", "predicted_speedup", "cost_ratio", "target_forwards", "drafter_forwards", "new_tokens",
    "wall_time_s", "baseline_wall_time_s", "lossy", "device", "overrides", "run_dir",
]  # then alpha_1 .. alpha_<max k>
# What a category row copies from its run; its metrics come from per_category.
CATEGORY_CONFIG = ["job", "status", "error", "target", "drafter", "k", "temperature", "top_k", "top_p", "sources",
                   "max_new_tokens", "batch_size", "cost_ratio", "lossy", "device", "overrides", "run_dir"]
CATEGORY_METRICS = ["num_prompts", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
                    "baseline_tokens_per_second", "speedup", "predicted_speedup", "cost_ratio"]


# ---------------------------------------------------------------------------------------------------------
# Collecting runs


def _is_job_dir(path: Path, names: Sequence[str], results_file: str, is_top: bool, is_sweep_child: bool) -> bool:
    if results_file in names or ".hydra" in names:
        return True
    # Hydra names job dirs by job number: an empty one is a job killed before it wrote anything.
    return is_sweep_child and path.name.isdigit() and not is_top


def _job_dirs(sweep_dir: Path, results_file: str) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(sweep_dir):
        path = Path(root)
        if _is_job_dir(path, dirs + files, results_file, path == sweep_dir, path.parent == sweep_dir):
            found.append(path)
            dirs.clear()  # a job's own subfolders (.hydra, wandb, ...) are not jobs
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "wandb")
    return found


def _job_sort_key(run_dir: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in Path(run_dir).parts)


def _failed_from_hydra_files(job_dir: Path, error: str) -> dict:
    """A failed record for a job without a usable results.json, from what Hydra saved at job start."""
    hydra_dir = job_dir / ".hydra"
    cfg = OmegaConf.load(hydra_dir / "config.yaml") if (hydra_dir / "config.yaml").is_file() else OmegaConf.create()
    overrides = OmegaConf.load(hydra_dir / "overrides.yaml") if (hydra_dir / "overrides.yaml").is_file() else []
    return failed_result(cfg, error, [str(o) for o in overrides])


def collect_runs(sweep_dir: str | os.PathLike, results_file: str = RESULTS_FILE) -> list[dict]:
    """Every run of a Hydra sweep (``<sweep_dir>/<job_num>/results.json``), failed ones included.

    A job dir without ``results_file`` (the job crashed before writing it) or with an unreadable one becomes
    a failed run whose config fields and overrides come from the job's ``.hydra/`` files. Each run gains
    ``job`` and ``run_dir`` (its directory relative to ``sweep_dir``). Sorted by job number.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {str(sweep_dir)!r} does not exist")
    runs = []
    for job_dir in _job_dirs(sweep_dir, results_file):
        path = job_dir / results_file
        if not path.is_file():
            run = _failed_from_hydra_files(job_dir, NO_RESULTS_ERROR)
        else:
            try:
                run = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(run, dict):
                    raise ValueError(f"expected a JSON object, got {type(run).__name__}")
            except ValueError as e:
                run = _failed_from_hydra_files(job_dir, f"unreadable {results_file}: {type(e).__name__}: {e}")
            if not run.get("overrides") and (job_dir / ".hydra" / "overrides.yaml").is_file():
                run["overrides"] = [str(o) for o in OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")]
        rel = job_dir.relative_to(sweep_dir).as_posix()
        run["run_dir"] = rel
        run["job"] = job_dir.name if rel != "." else "."
        runs.append(run)
    runs.sort(key=lambda r: _job_sort_key(r["run_dir"]))
    return runs


# ---------------------------------------------------------------------------------------------------------
# Summary table


def _join(value: Any, sep: str) -> Any:
    return sep.join(map(str, value)) if isinstance(value, (list, tuple)) else value


def summarize(runs: Sequence[dict]) -> pd.DataFrame:
    """One row per run (``category == "all"``) and one per run × prompt category, in a single frame.

    Columns: :data:`COLUMNS`, then ``alpha_1 .. alpha_<max k>`` (per-position acceptance; NaN past a run's
    own k). Metrics are copied from results.json unchanged; a category row carries its run's config fields
    and its own metrics.
    """
    rows = []
    for run in runs:
        row = {c: run.get(c) for c in COLUMNS}
        row["sources"] = _join(run.get("sources"), ",")
        row["overrides"] = _join(run.get("overrides"), " ")
        rows.append({**row, "category": ALL, **_alphas(run.get("acceptance_per_position"))})
        config = {c: row[c] for c in CATEGORY_CONFIG}
        for category, metrics in (run.get("per_category") or {}).items():
            rows.append({
                **config, "category": category, **{m: metrics.get(m) for m in CATEGORY_METRICS},
                **_alphas(metrics.get("acceptance_per_position")),
            })
    df = pd.DataFrame(rows)
    alpha_cols = sorted((c for c in df.columns if c.startswith("alpha_")), key=lambda c: int(c[6:]))
    return _typed(df.reindex(columns=COLUMNS + alpha_cols))


def _alphas(per_position: Optional[Sequence[float]]) -> dict[str, float]:
    return {f"alpha_{i}": a for i, a in enumerate(per_position or [], start=1)}


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    floats = [c for c in df.columns if c.startswith("alpha_")] + [
        "temperature", "top_p", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
        "baseline_tokens_per_second", "speedup", "predicted_speedup", "cost_ratio", "wall_time_s",
        "baseline_wall_time_s"]
    for c in floats:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("job", "status", "error", "target", "drafter", "sources", "category", "device", "overrides", "run_dir"):
        df[c] = df[c].astype("string")
    df["lossy"] = df["lossy"].map({True: True, False: False, "True": True, "False": False}).astype("boolean")
    return df


def load_summary(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ``summary.csv`` back with the dtypes :func:`summarize` gave it (floats round-trip exactly)."""
    # pandas < 3 parses floats exactly only when asked; pandas 3 always does and deprecates the option.
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], **exact)
    return _typed(df.reindex(columns=list(dict.fromkeys(COLUMNS + list(df.columns)))))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec).replace("|", "\\|").replace("\n", " ")


def _drafter(row: pd.Series) -> str:
    """The drafter's name, marked where its acceptance rule is lossy (e.g. Medusa's typical acceptance)."""
    lossy = row["lossy"] is not pd.NA and bool(row["lossy"])
    return str(row["drafter"]) + (" (LOSSY)" if lossy else "")


def _varying(runs: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    return [k for k in keys if runs[k].dropna().nunique() > 1]


def markdown_summary(df: pd.DataFrame) -> str:
    """summary.md: one table row per run, a per-category table, and the failed runs with their errors."""
    runs = df[df["category"] == ALL]
    extra = _varying(runs, SERIES_KEYS)
    header = ["job", *extra, "drafter", "k", "temperature", "α", "τ", "tok/s", "baseline tok/s",
              "speedup", "predicted speedup", "status"]
    lines = ["# Sweep summary", "",
             f"{len(runs)} runs, {int((runs['status'] != 'ok').sum())} failed. α: acceptance rate; "
             "τ: tokens per target forward, bonus included; speedup: measured wall clock vs the baseline.", "",
             _md_row(header), _md_row(["---"] * len(header))]
    for _, r in runs.iterrows():
        lines.append(_md_row([
            _fmt(r["job"]), *(_fmt(r[k]) for k in extra), _fmt(_drafter(r)), _fmt(r["k"]),
            _fmt(r["temperature"], "g"), _fmt(r["acceptance_rate"], ".3f"), _fmt(r["mean_accepted_length"], ".2f"),
            _fmt(r["tokens_per_second"], ".1f"), _fmt(r["baseline_tokens_per_second"], ".1f"),
            _fmt(r["speedup"], ".2f"), _fmt(r["predicted_speedup"], ".2f"), _fmt(r["status"]),
        ]))
    if runs["lossy"].fillna(False).any():
        lines += ["", "LOSSY: a run marked so verified with a lossy acceptance rule (typical acceptance); its "
                  "output is not distributed as the target's at temperature > 0."]
    cats = df[(df["category"] != ALL) & (df["status"] == "ok")]
    if len(cats):
        header = ["job", "drafter", "k", "temperature", "category", "prompts", "α", "τ", "speedup"]
        lines += ["", "## Per category", "", _md_row(header), _md_row(["---"] * len(header))]
        for _, r in cats.iterrows():
            lines.append(_md_row([
                _fmt(r["job"]), _fmt(_drafter(r)), _fmt(r["k"]), _fmt(r["temperature"], "g"), _fmt(r["category"]),
                _fmt(r["num_prompts"]), _fmt(r["acceptance_rate"], ".3f"), _fmt(r["mean_accepted_length"], ".2f"),
                _fmt(r["speedup"], ".2f"),
            ]))
    failed = runs[runs["status"] != "ok"]
    if len(failed):
        lines += ["", "## Failed runs", ""]
        for _, r in failed.iterrows():
            lines.append(f"- job {_fmt(r['job'])} (`{_fmt(r['overrides'])}`, in `{_fmt(r['run_dir'])}`): "
                         f"{_fmt(r['error'])}")
    return "\n".join(lines) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# ---------------------------------------------------------------------------------------------------------
# Plots: built on Figure + the Agg canvas directly, so no pyplot state or global backend is touched.


def _ok_runs(df: pd.DataFrame, category: str = ALL) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["category"] == category) & df["k"].notna()]


def _series(df: pd.DataFrame) -> pd.Series:
    """A line label per row: drafter and temperature, plus any other config field that varies."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    extra = _varying(df, SERIES_KEYS)  # a category row carries its run's config, so rows vary as runs do
    return df.apply(lambda r: " ".join([_drafter(r), f"T={r['temperature']:g}",
                                        *(f"{k}={r[k]}" for k in extra)]), axis=1)


def _new_figure(nrows: int = 1, ncols: int = 1, width: float = 6.0, height: float = 4.0):
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _by_k(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Mean per k (repeated runs of one configuration, e.g. seeds, become one point)."""
    means = df.groupby("k")[list(columns)].mean().sort_index()
    means.index = means.index.astype(int)
    return means


def plot_tau_vs_k(df: pd.DataFrame) -> Figure:
    """τ (mean accepted length, bonus included) vs k, one line per drafter × temperature."""
    runs = _ok_runs(df)
    fig, axes = _new_figure()
    ax = axes[0, 0]
    for label, g in runs.groupby(_series(runs), sort=True):
        means = _by_k(g, ["mean_accepted_length"])
        ax.plot(means.index, means["mean_accepted_length"], marker="o", label=label)
    ax.set(xlabel="k (draft tokens per verify)", ylabel="τ (tokens per target forward)", title="τ vs k")
    _finish(ax, runs)
    return fig


def plot_acceptance_per_position(df: pd.DataFrame) -> Figure:
    """α_i vs draft position i, one panel per drafter × temperature, one line per k."""
    runs = _ok_runs(df)
    groups = list(runs.groupby(_series(runs), sort=True))
    ncols = min(3, max(1, len(groups)))
    fig, axes = _new_figure(max(1, math.ceil(len(groups) / ncols)), ncols, width=5.0)
    for ax, (label, g) in zip(axes.flat, groups):
        alpha_cols = [c for c in g.columns if c.startswith("alpha_")]
        for k, row in g.groupby("k")[alpha_cols].mean().sort_index().iterrows():
            values = row.iloc[: int(k)]
            ax.plot(range(1, len(values) + 1), values.to_numpy(), marker="o", label=f"k={k}")
        ax.set(xlabel="draft position i", ylabel="α_i = P(accepted | reached)", title=label, ylim=(0, 1.05))
        ax.set_xticks(range(1, int(g["k"].max()) + 1))
        _finish(ax, g)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Per-position acceptance")
    return fig


def plot_speedup_vs_k(df: pd.DataFrame) -> Figure:
    """Measured (solid) and predicted (dashed) speedup vs k, one colour per drafter × temperature."""
    runs = _ok_runs(df)
    fig, axes = _new_figure()
    ax = axes[0, 0]
    for label, g in runs.groupby(_series(runs), sort=True):
        means = _by_k(g, ["speedup", "predicted_speedup"])
        (line,) = ax.plot(means.index, means["speedup"], marker="o", label=f"{label} measured")
        ax.plot(means.index, means["predicted_speedup"], marker="x", linestyle="--", color=line.get_color(),
                label=f"{label} predicted")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set(xlabel="k (draft tokens per verify)", ylabel="speedup over plain decoding",
           title="Measured vs predicted speedup")
    _finish(ax, runs)
    return fig


def plot_per_category(df: pd.DataFrame) -> Figure:
    """τ and measured speedup vs k per prompt category; one row of panels per drafter × temperature."""
    cats = df[(df["status"] == "ok") & (df["category"] != ALL) & df["k"].notna()]
    groups = list(cats.groupby(_series(cats), sort=True)) if len(cats) else []
    fig, axes = _new_figure(max(1, len(groups)), 2, width=5.0)
    for (label, g), row in zip(groups, axes):
        for category, gc in g.groupby("category", sort=True):
            means = _by_k(gc, ["mean_accepted_length", "speedup"])
            row[0].plot(means.index, means["mean_accepted_length"], marker="o", label=category)
            row[1].plot(means.index, means["speedup"], marker="o", label=category)
        row[0].set(xlabel="k", ylabel="τ", title=f"{label}: τ per category")
        row[1].set(xlabel="k", ylabel="speedup", title=f"{label}: speedup per category")
        row[1].axhline(1.0, color="gray", linewidth=0.8)
        for ax in row:
            _finish(ax, g)
    if not groups:
        axes[0, 0].text(0.5, 0.5, "no per-category results", ha="center", va="center")
    return fig


def _finish(ax, runs: pd.DataFrame) -> None:
    ks = sorted(int(k) for k in runs["k"].dropna().unique())
    if ks and ax.get_xlabel().startswith("k"):
        ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


PLOTS: dict[str, Callable[[pd.DataFrame], Figure]] = {
    "tau_vs_k": plot_tau_vs_k,
    "acceptance_per_position": plot_acceptance_per_position,
    "speedup_vs_k": plot_speedup_vs_k,
    "per_category": plot_per_category,
}


def make_plots(df: pd.DataFrame) -> dict[str, Figure]:
    """Every plot of :data:`PLOTS` by name; empty when the sweep has no successful run."""
    if _ok_runs(df).empty:
        return {}
    return {name: plot(df) for name, plot in PLOTS.items()}


# ---------------------------------------------------------------------------------------------------------
# Writing the summary


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


# ---------------------------------------------------------------------------------------------------------
# wandb (imported lazily: a run without the wandb logger never pays for it)


def _wandb_init(logger: DictConfig, output_dir: Path, **kwargs: Any):
    import wandb

    output_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=logger.get("project"), entity=logger.get("entity"), tags=list(logger.get("tags") or []),
        mode=logger.get("mode", "offline"), dir=str(output_dir),
        settings=wandb.Settings(silent=True, console="off"), **kwargs,
    )


def _sweep_group() -> Optional[str]:
    """The sweep's directory as a wandb group, when called inside a Hydra multirun job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "_".join(Path(HydraConfig.get().sweep.dir).parts[-2:])


def wandb_log_run(cfg: DictConfig, results: dict, output_dir: str | os.PathLike, group: Optional[str] = None) -> None:
    """Log one run to wandb: the resolved config, scalar metrics, per-position and per-category acceptance.

    ``cfg.logger`` gives project, entity, tags and mode ("offline" needs no network; ``wandb sync`` later).
    The run's files go under ``<output_dir>/wandb``; ``group`` defaults to the sweep in a multirun.
    """
    import wandb

    name = f"{results.get('drafter')}-k{results.get('k')}-T{results.get('temperature')}"
    run = _wandb_init(cfg.logger, Path(output_dir), config=OmegaConf.to_container(cfg, resolve=True), name=name,
                      group=group or _sweep_group(), job_type="run")
    try:
        scalars = {k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        alphas = results.get("acceptance_per_position") or []
        scalars.update({f"acceptance_per_position/{i}": a for i, a in enumerate(alphas, start=1)})
        for category, metrics in (results.get("per_category") or {}).items():
            scalars.update({f"per_category/{category}/{m}": metrics[m] for m in CATEGORY_METRICS if m in metrics})
        if alphas:
            scalars["acceptance_per_position_table"] = wandb.Table(
                columns=["position", "alpha"], data=[[i, a] for i, a in enumerate(alphas, start=1)])
        run.log(scalars)
        run.summary["status"] = results.get("status")
        run.summary["error"] = results.get("error")
    finally:
        run.finish()


def wandb_log_summary(logger: DictConfig, sweep_dir: Path, df: pd.DataFrame, paths: dict[str, Path]) -> None:
    """Log a sweep's summary table and plots as one wandb run (job_type "sweep-summary")."""
    import wandb

    group = "_".join(Path(sweep_dir).parts[-2:])
    run = _wandb_init(logger, Path(sweep_dir), name=f"summary-{group}", group=group, job_type="sweep-summary")
    try:
        table = df.astype(object).where(df.notna(), None)
        logged: dict[str, Any] = {"summary": wandb.Table(dataframe=table)}
        logged.update({name: wandb.Image(str(p)) for name, p in paths.items() if p.suffix == ".png"})
        run.log(logged)
    finally:
        run.finish()


# ---------------------------------------------------------------------------------------------------------
# CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.report",
                                     description="Summarize a sweep: summary.csv, summary.md and plots.")
    parser.add_argument("sweep_dir", help="a multirun directory, e.g. multirun/2025-01-01/12-00-00")
    parser.add_argument("--results-file", default=RESULTS_FILE, help="per-run results file name")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when any run failed")
    args = parser.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        parser.error(f"sweep directory {args.sweep_dir!r} does not exist")
    runs = report_sweep(args.sweep_dir, args.results_file)
    if not runs:
        print(f"specdec.report: no runs found under {args.sweep_dir}", file=sys.stderr)
        return 1
    return 1 if args.strict and any(r.get("status") != "ok" for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
