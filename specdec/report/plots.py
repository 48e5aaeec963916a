"""The sweep plots: τ, per-position acceptance and measured vs predicted speedup against k, and the per-
category view. Built on Figure + the Agg canvas directly, so no pyplot state or global backend is touched."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd

if TYPE_CHECKING:  # matplotlib loads when a plot is drawn, not with every job that may report
    from matplotlib.figure import Figure

from specdec.report.summary import ALL, SERIES_KEYS, _drafter, _varying, other_overrides


def _ok_runs(df: pd.DataFrame, category: str = ALL) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["category"] == category) & df["k"].notna()]


def _series(df: pd.DataFrame) -> pd.Series:
    """A line label per row: drafter and temperature, plus any other config field or override that varies."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    extra = _varying(df, SERIES_KEYS)  # a category row carries its run's config, so rows vary as runs do
    other = other_overrides(df)
    return df.apply(lambda r: " ".join([_drafter(r), f"T={r['temperature']:g}", *(f"{k}={r[k]}" for k in extra),
                                        *([other[r.name]] if other[r.name] else [])]), axis=1)


def _new_figure(nrows: int = 1, ncols: int = 1, width: float = 6.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    """Measured speedup end to end (solid, its 95% interval over the prompts shaded) and decode only (dotted), and
    predicted (dashed; from measured costs, which fits trees too, and like decode only without the prefill) vs k,
    one colour per drafter × temperature."""
    runs = _ok_runs(df)
    fig, axes = _new_figure()
    ax = axes[0, 0]
    for label, g in runs.groupby(_series(runs), sort=True):
        means = _by_k(g, ["speedup", "decode_speedup", "predicted_speedup", "speedup_low", "speedup_high"])
        (line,) = ax.plot(means.index, means["speedup"], marker="o", label=f"{label} measured, end to end")
        if means["speedup_low"].notna().any():
            ax.fill_between(means.index, means["speedup_low"], means["speedup_high"], color=line.get_color(),
                            alpha=0.15, label=f"{label} end to end, 95% interval")
        ax.plot(means.index, means["decode_speedup"], marker="s", linestyle=":", color=line.get_color(),
                label=f"{label} measured, decode only")
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
