"""Collecting a sweep's runs (each job's ``results.json``, or what Hydra left of a crashed one) into one
table, and that table as markdown. Figures are copied, never recomputed."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import pandas as pd
from omegaconf import OmegaConf

from specdec.decode.metrics import as_replayed
from specdec.jobs.runs import failed_result

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
    "acceptance_rate", "mean_accepted_length", "tokens_per_second", "baseline_tokens_per_second", "speedup",
    "speedup_low", "speedup_high", "decode_tokens_per_second", "baseline_decode_tokens_per_second", "decode_speedup",
    "decode_speedup_low", "decode_speedup_high", "few_prompts",
    "predicted_speedup", "leviathan_chain_formula", "drafting", "cost_ratio", "target_forwards",
    "drafter_forwards", "new_tokens", "wall_time_s", "baseline_wall_time_s", "prefill_time_s",
    "baseline_prefill_time_s", "lossy", "replayed", "k_auto", "device", "overrides", "run_dir",
]  # then alpha_1 .. alpha_<max k>; rates and speedups end to end, decode_* without the prompt's prefill;
# *_low and *_high: the speedup's 95% bootstrap interval over the run's (category's) prompts, empty for fewer than
# 3 prompts (few_prompts)
# What a category row copies from its run; its metrics come from per_category.
CATEGORY_CONFIG = ["job", "status", "error", "target", "drafter", "k", "temperature", "top_k", "top_p", "sources",
                   "max_new_tokens", "batch_size", "drafting", "cost_ratio", "lossy", "replayed", "k_auto", "device",
                   "overrides", "run_dir"]
CATEGORY_METRICS = ["num_prompts", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
                    "baseline_tokens_per_second", "speedup", "decode_tokens_per_second",
                    "baseline_decode_tokens_per_second", "decode_speedup", "predicted_speedup",
                    "leviathan_chain_formula", "cost_ratio", "few_prompts"]
INTERVALS = ["speedup", "decode_speedup"]  # results.json's <name>_interval: [low, high] -> <name>_low, <name>_high
# results.json (and summary.csv) written before the predictions took their names (specdec.decode.metrics): the
# prediction from measured costs was predicted_speedup_measured_costs, and predicted_speedup Leviathan's formula
OLD_PREDICTIONS = {"predicted_speedup_measured_costs": "predicted_speedup",
                   "predicted_speedup": "leviathan_chain_formula"}


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
            run = _current_names(run)
            if not run.get("overrides") and (job_dir / ".hydra" / "overrides.yaml").is_file():
                run["overrides"] = [str(o) for o in OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")]
        rel = job_dir.relative_to(sweep_dir).as_posix()
        run["run_dir"] = rel
        run["job"] = job_dir.name if rel != "." else "."
        runs.append(run)
    runs.sort(key=lambda r: _job_sort_key(r["run_dir"]))
    return runs


def _current_names(run: dict) -> dict:
    """A run's results.json, its categories' too, with the predictions under their names where an older file gave
    them the old ones (:data:`OLD_PREDICTIONS`; such a file has ``predicted_speedup_measured_costs``); an older
    replayed run's figures as a replay gives them now (:func:`~specdec.decode.metrics.as_replayed`)."""
    replayed = bool(run.get("replayed"))

    def renamed(metrics: Any) -> Any:
        if not isinstance(metrics, dict) or "predicted_speedup_measured_costs" not in metrics:
            return metrics
        metrics = {OLD_PREDICTIONS.get(key, key): value for key, value in metrics.items()}
        return as_replayed(metrics) if replayed else metrics

    run = renamed(run)
    if isinstance(run.get("per_category"), dict):
        run["per_category"] = {category: renamed(m) for category, m in run["per_category"].items()}
    return run


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
        row["k_auto"] = run.get("k") == "auto"
        if row["k_auto"]:  # drafter.k=auto: the k it chose (0: plain decoding)
            row["k"] = run.get("k_chosen")
        rows.append({**row, "category": ALL, **_intervals(run), **_alphas(run.get("acceptance_per_position"))})
        config = {c: row[c] for c in CATEGORY_CONFIG}
        for category, metrics in (run.get("per_category") or {}).items():
            rows.append({
                **config, "category": category, **{m: metrics.get(m) for m in CATEGORY_METRICS},
                **_intervals(metrics), **_alphas(metrics.get("acceptance_per_position")),
            })
    df = pd.DataFrame(rows)
    alpha_cols = sorted((c for c in df.columns if c.startswith("alpha_")), key=lambda c: int(c[6:]))
    return _typed(df.reindex(columns=COLUMNS + alpha_cols))


def _intervals(metrics: dict) -> dict[str, Optional[float]]:
    """A run's (a category's) speedup intervals as columns: ``speedup_low``, ``speedup_high``, ..."""
    out = {}
    for name in INTERVALS:
        low, high = metrics.get(f"{name}_interval") or (None, None)
        out.update({f"{name}_low": low, f"{name}_high": high})
    return out


def _alphas(per_position: Optional[Sequence[float]]) -> dict[str, float]:
    return {f"alpha_{i}": a for i, a in enumerate(per_position or [], start=1)}


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    floats = [c for c in df.columns if c.startswith("alpha_")] + [
        "temperature", "top_p", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
        "baseline_tokens_per_second", "speedup", "decode_tokens_per_second", "baseline_decode_tokens_per_second",
        "decode_speedup", *(f"{n}_{end}" for n in INTERVALS for end in ("low", "high")),
        "predicted_speedup", "leviathan_chain_formula", "cost_ratio", "wall_time_s",
        "baseline_wall_time_s", "prefill_time_s", "baseline_prefill_time_s"]
    for c in floats:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("job", "status", "error", "target", "drafter", "sources", "category", "drafting", "device", "overrides",
              "run_dir"):
        df[c] = df[c].astype("string")
    for c in ("lossy", "replayed", "k_auto", "few_prompts"):
        df[c] = df[c].map({True: True, False: False, "True": True, "False": False}).astype("boolean")
    return df


def load_summary(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ``summary.csv`` back with the dtypes :func:`summarize` gave it (floats round-trip exactly)."""
    # pandas < 3 parses floats exactly only when asked; pandas 3 always does and deprecates the option.
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], **exact)
    if "predicted_speedup_measured_costs" in df.columns:  # written before the predictions' names
        df = df.rename(columns=OLD_PREDICTIONS)
    return _typed(df.reindex(columns=list(dict.fromkeys(COLUMNS + list(df.columns)))))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec).replace("|", "\\|").replace("\n", " ")


def _drafter(row: pd.Series) -> str:
    """The drafter's name, marked where its acceptance rule is lossy (e.g. Medusa's typical acceptance), where
    the run was replayed from a log (``python -m specdec.replay``: its speedups are predictions) and where its k
    was chosen by ``drafter.k=auto`` (the k column then holds the choice)."""
    def flag(name: str) -> bool:
        return row[name] is not pd.NA and bool(row[name])

    return (str(row["drafter"]) + (" (LOSSY)" if flag("lossy") else "") + (" (REPLAYED)" if flag("replayed") else "")
            + (" (k=auto)" if flag("k_auto") else ""))


def _chain_formula(row: pd.Series) -> float | None:
    """Leviathan et al.'s chain formula where the run drafted chains, the shape it assumes; None for trees."""
    return row["leviathan_chain_formula"] if row["drafting"] is not pd.NA and row["drafting"] == "chain" else None


def _best_replayed_k(runs: pd.DataFrame, other: pd.Series) -> set:
    """The replayed runs (a K sweep of ``python -m specdec.replay``) whose predicted speedup is the highest among
    the replayed runs that differ from them in k alone, where there are several k."""
    replayed = runs[runs["replayed"].fillna(False).astype(bool) & (runs["status"] == "ok")
                    & runs["predicted_speedup"].notna()]
    keys = ["drafter", "temperature", *SERIES_KEYS]
    best = set()
    for _, group in replayed.assign(other=other[replayed.index]).groupby([*keys, "other"], dropna=False):
        if group["k"].nunique() > 1:
            best.add(group["predicted_speedup"].idxmax())
    return best


def _varying(runs: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    return [k for k in keys if runs[k].dropna().nunique() > 1]


# Override keys whose values the tables and plot labels show in columns of their own.
COLUMN_OVERRIDES = {"drafter", "drafter.k", "sampling", "sampling.temperature", "sampling.top_k", "sampling.top_p",
                    "target", "data", "data.sources", "data.max_new_tokens", "data.batch_size"}


def other_overrides(df: pd.DataFrame) -> pd.Series:
    """Per row, ``key=value`` for each override that varies across the rows and has no column of its own
    (e.g. ``drafter.schedule=heuristic drafter.confidence=0.5``): what tells such jobs apart."""
    parsed = [dict(item.lstrip("+~").split("=", 1) for item in str(o).split() if "=" in item)
              if o is not None and o is not pd.NA else {} for o in df["overrides"]]
    keys = [k for k in dict.fromkeys(k for d in parsed for k in d) if k not in COLUMN_OVERRIDES
            and len({d.get(k) for d in parsed}) > 1]
    return pd.Series([" ".join(f"{k}={d[k]}" for k in keys if k in d) for d in parsed], index=df.index, dtype=object)


def markdown_summary(df: pd.DataFrame) -> str:
    """summary.md: one table row per run, a per-category table, and the failed runs with their errors."""
    runs = df[df["category"] == ALL]
    extra = _varying(runs, SERIES_KEYS)
    other = other_overrides(df)
    varied = ["other overrides"] if other.astype(bool).any() else []

    def others(i) -> list[str]:  # row i's "other overrides" cell, where the column is shown
        return [_fmt(other[i])] if varied else []

    header = ["job", *extra, *varied, "drafter", "k", "temperature", "α", "τ", "tok/s", "baseline tok/s",
              "speedup", "decode tok/s", "baseline decode tok/s", "decode speedup", "predicted speedup",
              "Leviathan (chain)", "status"]
    lines = ["# Sweep summary", "",
             f"{len(runs)} runs, {int((runs['status'] != 'ok').sum())} failed. α: acceptance rate; "
             "τ: tokens per target forward, bonus included; speedup: measured wall clock vs the baseline; "
             "tok/s and speedup: end to end, the prompt's prefill included; decode tok/s and decode speedup: "
             "decode only, the prefill's time and its token left out; (low-high): the speedup's 95% interval over "
             "the run's prompts (a bootstrap), none for fewer than 3 prompts; "
             "predicted speedup: from measured costs, τ · plain step / (verify + draft time per step); "
             "Leviathan (chain): Leviathan et al.'s formula, for chain drafting only (it assumes a chain verified "
             "at a plain step's cost).", "",
             _md_row(header), _md_row(["---"] * len(header))]
    best = _best_replayed_k(runs, other)
    for i, r in runs.iterrows():
        lines.append(_md_row([
            _fmt(r["job"]), *(_fmt(r[k]) for k in extra), *others(i), _fmt(_drafter(r)), _fmt(r["k"]),
            _fmt(r["temperature"], "g"), _fmt(r["acceptance_rate"], ".3f"), _fmt(r["mean_accepted_length"], ".2f"),
            _fmt(r["tokens_per_second"], ".1f"), _fmt(r["baseline_tokens_per_second"], ".1f"),
            _speedup(r, "speedup"), _fmt(r["decode_tokens_per_second"], ".1f"),
            _fmt(r["baseline_decode_tokens_per_second"], ".1f"), _speedup(r, "decode_speedup"),
            _fmt(r["predicted_speedup"], ".2f") + (" (best K)" if i in best else ""),
            _fmt(_chain_formula(r), ".2f"), _fmt(r["status"]),
        ]))
    if runs["lossy"].fillna(False).any():
        lines += ["", "LOSSY: a run marked so verified with a lossy acceptance rule (typical acceptance); its "
                  "output is not distributed as the target's at temperature > 0."]
    if runs["replayed"].fillna(False).any():
        lines += ["", "REPLAYED: a run marked so was replayed from a logged pass (python -m specdec.replay) and "
                  "measured no wall clock: its α and τ are a live run's (greedy; at T > 0 their expectation), its "
                  "predicted speedup and decode tok/s come from a cost model measured on this machine (decode only, "
                  "the loop's host work included; or, where its results name costs_from, from that step-cost curve, "
                  "the drafter's steps from its rows where drafting_from_curve says how, else counted free), and its "
                  "speedup columns are empty. (best K): the highest predicted speedup among replayed runs that differ "
                  "in k alone."]
    if runs["k_auto"].fillna(False).any():
        lines += ["", "k=auto: a run marked so chose its k before decoding (drafter.k=auto, a replay of held-out "
                  "prompts); k is its choice, 0 = plain decoding."]
    lines += _category_lines(df, varied, others) + _failed_lines(runs)
    return "\n".join(lines) + "\n"


def _category_lines(df: pd.DataFrame, varied: list[str], others) -> list[str]:
    """summary.md's per-category table (the runs that succeeded), after a blank line; none without categories."""
    lines: list[str] = []
    cats = df[(df["category"] != ALL) & (df["status"] == "ok")]
    if len(cats):
        header = ["job", *varied, "drafter", "k", "temperature", "category", "prompts", "α", "τ", "speedup",
                  "decode speedup", "predicted speedup"]
        lines += ["", "## Per category", "", _md_row(header), _md_row(["---"] * len(header))]
        for i, r in cats.iterrows():
            lines.append(_md_row([
                _fmt(r["job"]), *others(i), _fmt(_drafter(r)), _fmt(r["k"]), _fmt(r["temperature"], "g"),
                _fmt(r["category"]), _fmt(r["num_prompts"]) + ("\\*" if _few(r) else ""),
                _fmt(r["acceptance_rate"], ".3f"), _fmt(r["mean_accepted_length"], ".2f"),
                _speedup(r, "speedup"), _speedup(r, "decode_speedup"), _fmt(r["predicted_speedup"], ".2f"),
            ]))
        if any(_few(r) for _, r in cats.iterrows()):
            lines += ["", "\\* fewer than 3 prompts: no interval; a speedup resting on so few prompts is not to be "
                      "told from noise."]
    return lines


def _failed_lines(runs: pd.DataFrame) -> list[str]:
    """summary.md's failed runs with their errors, after a blank line; none where every run succeeded."""
    lines: list[str] = []
    failed = runs[runs["status"] != "ok"]
    if len(failed):
        lines += ["", "## Failed runs", ""]
        for _, r in failed.iterrows():
            lines.append(f"- job {_fmt(r['job'])} (`{_fmt(r['overrides'])}`, in `{_fmt(r['run_dir'])}`): "
                         f"{_fmt(r['error'])}")
    return lines


def _few(row: pd.Series) -> bool:
    return row["few_prompts"] is not pd.NA and bool(row["few_prompts"])


def _speedup(row: pd.Series, name: str) -> str:
    """A speedup's cell: the figure, then its 95% interval where the run gave one, e.g. ``1.04 (0.98-1.10)``."""
    low, high = row[f"{name}_low"], row[f"{name}_high"]
    interval = "" if pd.isna(low) or pd.isna(high) else f" ({low:.2f}-{high:.2f})"
    return _fmt(row[name], ".2f") + ("" if _fmt(row[name]) == "–" else interval)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
