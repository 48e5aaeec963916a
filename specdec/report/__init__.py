"""Sweep reports: every run's ``results.json`` gathered into ``summary.csv``, ``summary.md`` and plots.

Vocabulary (the same as the rest of specdec): a drafter proposes ``k`` *draft* tokens per target forward;
the verifier keeps an *accepted* prefix, then emits a *recovered* token (at the first rejection) or a
*bonus* token (when all ``k`` were accepted).

- α, ``acceptance_rate``: accepted draft tokens / proposed draft tokens.
- α_i, ``acceptance_per_position[i-1]`` (``alpha_i`` in the CSV): P(draft token i accepted | reached).
- τ, ``mean_accepted_length``: tokens emitted per target forward, **bonus included** (so τ ≥ 1).
- c, ``cost_ratio``: drafter step time / target step time, measured.
- ``tokens_per_second``, ``speedup`` (and the baseline's): end to end, the prompt's prefill included;
  ``decode_tokens_per_second``, ``decode_speedup``: decode only, the prefill's time and its token left out.
- ``speedup_low``/``speedup_high`` (and ``decode_speedup_*``): the speedup's 95% bootstrap interval over the run's
  (the category's) prompts, from results.json's ``speedup_interval``; none where ``few_prompts`` (fewer than 3).
- ``predicted_speedup``: τ · plain step time / (verify + draft time per step), from measured costs: it holds for
  trees as well as chains (a replayed run's: its replay's, :func:`specdec.decode.metrics.as_replayed`; among
  replayed runs that differ in k alone, the best is marked).
- ``leviathan_chain_formula``: (1 − α^(k+1)) / ((1 − α)(k·c + 1)) (Leviathan et al. 2023, Thm 3.8), which assumes
  a chain of k drafts verified at a plain step's cost: shown only for runs whose ``drafting`` is ``chain``.
  (:mod:`specdec.decode.metrics` defines both; results.json and summary.csv files written under their old names,
  ``predicted_speedup_measured_costs`` and ``predicted_speedup``, are read under these.)

Every number in the summary is copied from ``results.json``, category rows included (each category's
predicted speedup and cost ratio are the ones the run computed for it); nothing is recomputed.

Entry points: :func:`collect_runs`, :func:`summarize` (``summary.py``), :func:`make_plots` (``plots.py``),
:func:`write_summary`, the Hydra callback :class:`SweepSummaryCallback` and the CLI
``python -m specdec.report <sweep_dir>`` (``sweep.py``); :func:`wandb_log_run` for the run entry points
(``wandb.py``). Every file is written atomically (:mod:`specdec.jobs.io`), so a crash never leaves a
half-written summary.
"""

from specdec.report.plots import PLOTS, make_plots
from specdec.report.summary import (
    ALL, COLUMNS, NO_RESULTS_ERROR, RESULTS_FILE, collect_runs, load_summary, markdown_summary, summarize)
from specdec.report.sweep import SweepSummaryCallback, latest_sweep_dir, main, report_sweep, write_summary
from specdec.report.wandb import wandb_log_run, wandb_log_summary

__all__ = ["ALL", "COLUMNS", "NO_RESULTS_ERROR", "PLOTS", "RESULTS_FILE", "SweepSummaryCallback", "collect_runs",
           "latest_sweep_dir", "load_summary", "main", "make_plots", "markdown_summary", "report_sweep", "summarize",
           "wandb_log_run", "wandb_log_summary", "write_summary"]
