"""specdec.report on a fake sweep: aggregation, summary.md, plots, CLI, Hydra callback, notebook, wandb."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from specdec import report
from specdec.decode.metrics import leviathan_chain_formula
from specdec.jobs.runs import failed_result
from specdec.report.plots import _series

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAILED_ERROR = "RuntimeError: CUDA out of memory | tried to allocate 2 GiB"


def _results(drafter: str, k: int, temperature: float, alpha_i: list[float], tau: float) -> dict:
    alpha = sum(alpha_i) / len(alpha_i)
    categories = {
        cat: {"num_prompts": 2, "acceptance_rate": alpha * f, "acceptance_per_position": [a * f for a in alpha_i],
              "mean_accepted_length": 1 + (tau - 1) * f, "tokens_per_second": 30.0 * f,
              "baseline_tokens_per_second": 19.0, "speedup": 30.0 * f / 19.0, "decode_tokens_per_second": 45.0 * f,
              "baseline_decode_tokens_per_second": 25.0, "decode_speedup": 45.0 * f / 25.0,
              "predicted_speedup": 1.05 * 30.0 * f / 19.0,
              "leviathan_chain_formula": leviathan_chain_formula(alpha * f, k, 0.1 * f), "cost_ratio": 0.1 * f}
        for cat, f in (("coding", 1.1), ("writing", 0.7))
    }
    return {
        "status": "ok", "error": None, "target": "smollm2-135m", "drafter": drafter, "k": k,
        "temperature": temperature, "top_k": 0, "top_p": 1.0, "sources": ["mtbench", "humaneval"],
        "num_prompts": 4, "max_new_tokens": 64, "batch_size": 1, "acceptance_rate": alpha,
        "acceptance_per_position": alpha_i, "mean_accepted_length": tau, "tokens_per_second": 25.0 + k / 3,
        "baseline_tokens_per_second": 19.0, "speedup": (25.0 + k / 3) / 19.0,
        "decode_tokens_per_second": 40.0 + k / 3, "baseline_decode_tokens_per_second": 25.0,
        "decode_speedup": (40.0 + k / 3) / 25.0, "prefill_time_s": 3.0, "baseline_prefill_time_s": 3.0,
        "predicted_speedup": 1.05 * (25.0 + k / 3) / 19.0,
        "leviathan_chain_formula": leviathan_chain_formula(alpha, k, 0.1), "drafting": "chain", "cost_ratio": 0.1,
        "target_forwards": 100, "drafter_forwards": 100 * k, "new_tokens": int(100 * tau),
        "wall_time_s": 10.0, "baseline_wall_time_s": 13.0, "per_category": categories, "lossy": False,
        "device": "cpu", "overrides": [f"drafter={drafter}", f"drafter.k={k}", f"sampling.temperature={temperature}"],
    }


# Awkward floats on purpose: the summary must copy them bit for bit.
OK_RUNS = {
    "0": _results("ngram", 1, 0.0, [0.1 + 0.2], 1.0 + 1 / 3),
    "1": _results("ngram", 2, 0.0, [0.7, 0.6 / 7], 1.7 + 1e-12),
    "2": _results("ngram", 4, 0.0, [0.9, 0.8, 0.7, 2 / 3], 2.9),
    "3": _results("draft_model", 2, 1.0, [0.55, 0.45], 1.8),
    "10": _results("draft_model", 4, 1.0, [0.55, 0.45, 0.4, 0.1 * 3], 2.1),
}


def _hydra_files(job_dir: Path, drafter: str, k: int, overrides: list[str]) -> None:
    (job_dir / ".hydra").mkdir(parents=True)
    cfg = {"target": {"name": "smollm2-135m"}, "drafter": {"name": drafter, "k": k},
           "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0},
           "data": {"sources": ["mtbench", "humaneval"], "max_new_tokens": 64}, "logger": {"name": "none"},
           "results_file": "results.json"}
    OmegaConf.save(OmegaConf.create(cfg), job_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "multirun" / "2025-01-01" / "12-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, res in OK_RUNS.items():
        _hydra_files(sweep / job, res["drafter"], res["k"], res["overrides"])
        (sweep / job / "results.json").write_text(json.dumps(res))
        (sweep / job / "wandb" / "offline-run-x").mkdir(parents=True)  # not a job: must be skipped
    # A run that caught its exception and wrote a failed results.json (only the guaranteed fields).
    _hydra_files(sweep / "4", "ngram", 8, ["drafter.k=8"])
    (sweep / "4" / "results.json").write_text(json.dumps({
        "status": "failed", "error": FAILED_ERROR, "target": "smollm2-135m", "drafter": "ngram", "k": 8,
        "temperature": 0.0, "top_k": 0, "top_p": 1.0, "sources": ["mtbench", "humaneval"], "overrides": ["drafter.k=8"]}))
    # A run killed before it wrote anything: only Hydra's files.
    _hydra_files(sweep / "5", "draft_model", 16, ["drafter=draft_model", "drafter.k=16"])
    return sweep


def test_collect_runs_finds_every_job_and_the_crashed_one(sweep: Path) -> None:
    runs = report.collect_runs(sweep)
    assert [r["job"] for r in runs] == ["0", "1", "2", "3", "4", "5", "10"]
    crashed = runs[5]
    assert crashed["status"] == "failed"
    assert crashed["error"] == report.NO_RESULTS_ERROR == "no results.json (run crashed before writing)"
    assert crashed["overrides"] == ["drafter=draft_model", "drafter.k=16"]
    assert (crashed["drafter"], crashed["k"], crashed["temperature"]) == ("draft_model", 16, 0.0)
    assert runs[4]["error"] == FAILED_ERROR


def test_collect_runs_reports_a_truncated_results_file_as_failed(sweep: Path) -> None:
    (sweep / "1" / "results.json").write_text('{"status": "ok", "k": ')
    run = report.collect_runs(sweep)[1]
    assert run["status"] == "failed" and run["error"].startswith("unreadable results.json: JSONDecodeError")
    assert run["k"] == 2 and run["overrides"] == OK_RUNS["1"]["overrides"]


def _check_copied_exactly(df: pd.DataFrame) -> None:
    for job, res in OK_RUNS.items():
        rows = df[df["job"] == job].set_index("category")
        row = rows.loc[report.ALL]
        assert row["mean_accepted_length"] == res["mean_accepted_length"]
        assert row["acceptance_rate"] == res["acceptance_rate"]
        assert row["speedup"] == res["speedup"] and row["predicted_speedup"] == res["predicted_speedup"]
        assert row["leviathan_chain_formula"] == res["leviathan_chain_formula"]
        assert row["decode_speedup"] == res["decode_speedup"] and row["prefill_time_s"] == res["prefill_time_s"]
        assert [row[f"alpha_{i}"] for i in range(1, res["k"] + 1)] == res["acceptance_per_position"]
        assert all(math.isnan(row[f"alpha_{i}"]) for i in range(res["k"] + 1, 5))
        for cat, metrics in res["per_category"].items():
            assert rows.loc[cat, "mean_accepted_length"] == metrics["mean_accepted_length"]
            assert [rows.loc[cat, f"alpha_{i}"] for i in range(1, res["k"] + 1)] == metrics["acceptance_per_position"]
            # copied, not recomputed (the run computes each category's from its own α and cost ratio)
            assert rows.loc[cat, "predicted_speedup"] == metrics["predicted_speedup"]
            assert rows.loc[cat, "leviathan_chain_formula"] == metrics["leviathan_chain_formula"]
            assert rows.loc[cat, "decode_speedup"] == metrics["decode_speedup"]
            assert rows.loc[cat, "cost_ratio"] == metrics["cost_ratio"]


def test_summarize_copies_metrics_exactly(sweep: Path) -> None:
    df = report.summarize(report.collect_runs(sweep))
    assert (df["category"] == report.ALL).sum() == 7
    assert len(df) == 7 + 2 * len(OK_RUNS)  # failed runs have no categories
    _check_copied_exactly(df)
    failed = df[df["status"] == "failed"].set_index("job")
    assert failed.loc["4", "error"] == FAILED_ERROR and failed.loc["5", "k"] == 16


def test_write_summary_files_round_trip(sweep: Path) -> None:
    paths = report.write_summary(sweep, report.collect_runs(sweep))
    assert set(paths) == {"csv", "md", *report.PLOTS}
    _check_copied_exactly(report.load_summary(paths["csv"]))
    assert not list(sweep.glob(".*.tmp")), "temp files left behind"
    for name in report.PLOTS:
        data = paths[name].read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
        import matplotlib.image

        assert matplotlib.image.imread(paths[name]).shape[0] > 100


def test_summary_md_lists_every_run_and_the_failed_ones_with_their_errors(sweep: Path) -> None:
    md = report.write_summary(sweep, report.collect_runs(sweep))["md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| job"))
    for col in ("drafter", "k", "temperature", "α", "τ", "tok/s", "baseline tok/s", "speedup",
                "predicted speedup", "status"):
        assert f" {col} |" in header
    table = [line for line in md.split("## Per category")[0].splitlines() if line.startswith("| ")][2:]
    assert len(table) == 7
    assert "| 2 | ngram | 4 | 0 | 0.767 | 2.90 | 26.3 | 19.0 | 1.39 |" in md
    failed_section = md.split("## Failed runs")[1]
    assert FAILED_ERROR.replace("|", "\\|") in failed_section
    assert f"job 5 (`drafter=draft_model drafter.k=16`, in `5`): {report.NO_RESULTS_ERROR}" in failed_section


def test_a_lossy_run_is_marked_in_the_summary_and_the_plots(sweep: Path) -> None:
    md = report.write_summary(sweep, report.collect_runs(sweep))["md"].read_text()
    assert "LOSSY" not in md
    lossy = {**OK_RUNS["2"], "drafter": "medusa", "lossy": True}
    (sweep / "2" / "results.json").write_text(json.dumps(lossy))
    md = report.write_summary(sweep, report.collect_runs(sweep))["md"].read_text()
    assert "| 2 | medusa (LOSSY) | 4 |" in md and "LOSSY: a run marked so" in md
    df = report.summarize(report.collect_runs(sweep))
    assert "medusa (LOSSY) T=0" in set(_series(df[df["category"] == report.ALL]))


def test_jobs_told_apart_only_by_other_overrides_get_their_own_rows_and_lines(sweep: Path) -> None:
    """A sweep over a field without a column (drafter.schedule, here) names it in summary.md's rows and in the
    plots' line labels, instead of showing identical-looking rows and averaging the jobs into one point."""
    for job, schedule in (("2", "constant"), ("10", "heuristic")):
        res = {**OK_RUNS[job], "drafter": "draft_model", "k": 4, "temperature": 0.0}
        res["overrides"] = ["drafter=draft_model", "drafter.k=4", f"drafter.schedule={schedule}"]
        (sweep / job / "results.json").write_text(json.dumps(res))
    md = report.write_summary(sweep, report.collect_runs(sweep))["md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| job"))
    assert header.startswith("| job | other overrides | drafter |")
    assert "| 2 | drafter.schedule=constant | draft_model | 4 |" in md
    assert "| 10 | drafter.schedule=heuristic | draft_model | 4 |" in md
    assert "| 0 |  | ngram | 1 |" in md  # a job that did not set it: an empty cell
    assert "| 10 | drafter.schedule=heuristic | draft_model | 4 | 0 | coding |" in md  # per category too
    df = report.summarize(report.collect_runs(sweep))
    labels = set(_series(df[(df["category"] == report.ALL) & (df["status"] == "ok")]))
    assert {"draft_model T=0 drafter.schedule=constant", "draft_model T=0 drafter.schedule=heuristic"} <= labels


def test_the_predicted_speedup_is_the_one_from_measured_costs_and_leviathans_only_for_chains(sweep: Path) -> None:
    """summary.md's "predicted speedup" and speedup_vs_k.png's predicted line come from measured costs (they fit
    trees too); Leviathan's chain formula is shown for chain runs only."""
    tree = {**OK_RUNS["2"], "drafter": "eagle", "drafting": "tree"}
    (sweep / "2" / "results.json").write_text(json.dumps(tree))
    runs = report.collect_runs(sweep)
    md = report.markdown_summary(report.summarize(runs))
    chain, measured = OK_RUNS["1"], tree["predicted_speedup"]
    assert (f"| {chain['decode_speedup']:.2f} | {chain['predicted_speedup']:.2f} | "
            f"{chain['leviathan_chain_formula']:.2f} | ok |") in md
    assert f"| {tree['decode_speedup']:.2f} | {measured:.2f} | – | ok |" in md  # no chain formula for a tree
    fig = report.make_plots(report.summarize(runs))["speedup_vs_k"]
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["eagle T=0 predicted"] == [measured]
    assert lines["ngram T=0 predicted"] == [OK_RUNS[j]["predicted_speedup"] for j in ("0", "1")]


def test_results_written_under_the_old_names_of_the_predictions_still_read(sweep: Path) -> None:
    """A results.json (and a summary.csv) from before the predictions' names held the prediction from measured costs
    as predicted_speedup_measured_costs and Leviathan's formula as predicted_speedup: read under today's names, its
    categories too; an old replayed run's one prediction is its replay's (its speedups were not measured)."""
    def old_names(metrics: dict) -> dict:
        out = {k: v for k, v in metrics.items() if k not in ("predicted_speedup", "leviathan_chain_formula")}
        return {**out, "predicted_speedup_measured_costs": metrics["predicted_speedup"],
                "predicted_speedup": metrics["leviathan_chain_formula"]}

    res = OK_RUNS["1"]
    old = {**old_names(res), "per_category": {c: old_names(m) for c, m in res["per_category"].items()}}
    (sweep / "1" / "results.json").write_text(json.dumps(old))
    (sweep / "2" / "results.json").write_text(json.dumps({**old_names(OK_RUNS["2"]), "replayed": True}))
    runs = report.collect_runs(sweep)
    assert runs[1] == {**res, "run_dir": "1", "job": "1"}
    replayed = runs[2]
    assert replayed["predicted_speedup"] == OK_RUNS["2"]["decode_speedup"] and "speedup" not in replayed
    df = report.summarize(runs)
    run = df[(df["job"] == "1") & (df["category"] == report.ALL)].iloc[0]
    assert (run["predicted_speedup"], run["leviathan_chain_formula"]) == (res["predicted_speedup"],
                                                                          res["leviathan_chain_formula"])
    csv = sweep / "old.csv"
    df.rename(columns={"predicted_speedup": "predicted_speedup_measured_costs",
                       "leviathan_chain_formula": "predicted_speedup"}).to_csv(csv, index=False)
    again = report.load_summary(csv)
    assert list(again.columns) == list(df.columns) and again["predicted_speedup"].equals(df["predicted_speedup"])


def test_the_summary_shows_end_to_end_and_decode_only_rates(sweep: Path) -> None:
    """summary.md and speedup_vs_k.png: tokens/s and speedup end to end (results.json's tokens_per_second, speedup)
    and decode only (decode_tokens_per_second, decode_speedup), per run and per category."""
    runs = report.collect_runs(sweep)
    md = report.markdown_summary(report.summarize(runs))
    header = next(line for line in md.splitlines() if line.startswith("| job"))
    assert "| tok/s | baseline tok/s | speedup | decode tok/s | baseline decode tok/s | decode speedup |" in header
    assert "end to end, the prompt's prefill included" in md and "decode only, the prefill's time" in md
    res = OK_RUNS["2"]
    assert (f"| 2 | ngram | 4 | 0 | 0.767 | 2.90 | {res['tokens_per_second']:.1f} | 19.0 | {res['speedup']:.2f} | "
            f"{res['decode_tokens_per_second']:.1f} | 25.0 | {res['decode_speedup']:.2f} |") in md
    coding = res["per_category"]["coding"]
    assert f"| coding | 2 | {coding['acceptance_rate']:.3f} | {coding['mean_accepted_length']:.2f} | " \
           f"{coding['speedup']:.2f} | {coding['decode_speedup']:.2f} |" in md
    fig = report.make_plots(report.summarize(runs))["speedup_vs_k"]
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["ngram T=0 measured, end to end"] == [OK_RUNS[j]["speedup"] for j in ("0", "1", "2")]
    assert lines["ngram T=0 measured, decode only"] == [OK_RUNS[j]["decode_speedup"] for j in ("0", "1", "2")]


def test_the_summary_shows_each_speedups_interval_and_marks_categories_of_few_prompts(sweep: Path) -> None:
    """summary.md, summary.csv and speedup_vs_k.png carry results.json's speedup intervals (per run and per category);
    a category of fewer than 3 prompts is marked; results.json files written before intervals existed still read."""
    res = {**OK_RUNS["2"], "num_prompts": 6, "speedup_interval": [1.2, 1.5], "decode_speedup_interval": [1.4, 1.9],
           "few_prompts": False}
    res["per_category"] = {"humaneval/code": {**res["per_category"]["coding"], "num_prompts": 4, "few_prompts": False,
                                              "speedup_interval": [1.25, 1.6], "decode_speedup_interval": None},
                           "mtbench/writing": {**res["per_category"]["writing"], "num_prompts": 2,
                                               "few_prompts": True, "speedup_interval": None,
                                               "decode_speedup_interval": None}}
    (sweep / "2" / "results.json").write_text(json.dumps(res))
    paths = report.write_summary(sweep, report.collect_runs(sweep))
    md = paths["md"].read_text()
    assert (f"| {res['speedup']:.2f} (1.20-1.50) | {res['decode_tokens_per_second']:.1f} | 25.0 | "
            f"{res['decode_speedup']:.2f} (1.40-1.90) |") in md
    code, writing = res["per_category"]["humaneval/code"], res["per_category"]["mtbench/writing"]
    assert f"| humaneval/code | 4 | {code['acceptance_rate']:.3f} |" in md
    assert f"{code['speedup']:.2f} (1.25-1.60) | {code['decode_speedup']:.2f} |" in md
    assert f"| mtbench/writing | 2\\* | {writing['acceptance_rate']:.3f} |" in md
    assert "\\* fewer than 3 prompts: no interval" in md
    assert "the speedup's 95% interval over the run's prompts" in md
    assert f"| 1 | ngram | 2 | 0 | 0.393 | 1.70 | {OK_RUNS['1']['tokens_per_second']:.1f} | 19.0 | " \
           f"{OK_RUNS['1']['speedup']:.2f} |" in md  # an older results.json: no interval, no mark
    df = report.load_summary(paths["csv"])
    run = df[(df["job"] == "2") & (df["category"] == report.ALL)].iloc[0]
    assert (run["speedup_low"], run["speedup_high"], run["decode_speedup_low"]) == (1.2, 1.5, 1.4)
    few = df[df["category"] == "mtbench/writing"].iloc[0]
    assert bool(few["few_prompts"]) and pd.isna(few["speedup_low"])
    band = next(c for c in report.make_plots(df)["speedup_vs_k"].axes[0].collections
                if c.get_label() == "ngram T=0 end to end, 95% interval")
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(1.2)


def test_leviathan_chain_formula() -> None:
    assert leviathan_chain_formula(0.0, 4, 0.5) == pytest.approx(1 / 3)
    assert leviathan_chain_formula(1.0, 4, 0.0) == 5.0  # the α → 1 limit: k + 1 tokens per verify
    assert leviathan_chain_formula(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))


def test_failed_result_from_a_run_config() -> None:
    cfg = OmegaConf.create({"target": {"name": "t"}, "drafter": {"name": "ngram", "k": 3},
                            "sampling": {"temperature": 0.5, "top_k": 10, "top_p": 0.9}, "data": {"sources": ["a"]}})
    res = failed_result(cfg, ValueError("bad k"), ["drafter.k=3"])
    assert res == {"status": "failed", "error": "ValueError: bad k", "target": "t", "drafter": "ngram", "k": 3,
                   "temperature": 0.5, "top_k": 10, "top_p": 0.9, "seed": None, "sources": ["a"],
                   "max_new_tokens": None, "batch_size": None, "overrides": ["drafter.k=3"]}


def test_callback_writes_summary_then_exits_nonzero_when_a_run_failed(sweep: Path, capsys) -> None:
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "logger": {"name": "none"}})
    with pytest.raises(SystemExit) as exit_info:
        report.SweepSummaryCallback().on_multirun_end(config)
    assert exit_info.value.code == 1
    out = capsys.readouterr()
    assert "| job |" in out.out and "2 of 7 runs failed" in out.err
    assert (sweep / "summary.md").is_file()
    report.SweepSummaryCallback(exit_nonzero_on_failure=False).on_multirun_end(config)


def test_a_report_error_is_printed_not_raised(sweep: Path, capsys, monkeypatch) -> None:
    def broken(df):
        raise ValueError("plotting exploded")

    monkeypatch.setattr(report.sweep, "make_plots", broken)  # where write_summary looks it up
    runs = report.report_sweep(sweep)
    assert len(runs) == 7
    err = capsys.readouterr().err
    assert "could not write the summary of sweep" in err and "plotting exploded" in err


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli(sweep: Path, capsys) -> None:
    proc = _run(["-m", "specdec.report", str(sweep)], sweep)  # once for real; then in-process, faster
    assert proc.returncode == 0, proc.stderr
    # the report and a sweep's summary never load torch or transformers (~3 s a process on a 2-core CPU)
    loaded = _run(["-c", "import sys, specdec.report, specdec.report.sweep, specdec.jobs.runs; "
                   "print(sorted({'torch', 'transformers'} & set(sys.modules)))"], sweep)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
    assert "| job |" in proc.stdout and (sweep / "summary.csv").is_file() and (sweep / "tau_vs_k.png").is_file()
    assert report.main([str(sweep)]) == 0
    assert report.main(["--strict", str(sweep)]) == 1  # two runs failed
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(sweep / "nope")])
    assert exit_info.value.code == 2 and "does not exist" in capsys.readouterr().err


# A tiny Hydra app following the entry-point pattern the report relies on: catch, write a failed
# results.json, return normally in a multirun (so the other jobs and on_multirun_end still run).
HYDRA_APP = '''
import hydra
from hydra.core.config_store import ConfigStore
from specdec.jobs.io import write_json
from specdec.jobs.runs import config_fields, run_task

ConfigStore.instance().store(name="cfg", node={
    "target": {"name": "tiny"}, "drafter": {"name": "ngram", "k": 1},
    "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0}, "data": {"sources": ["x"]},
    "logger": {"name": "none"}, "fail_at_k": 2, "results_file": "results.json",
    "hydra": {"callbacks": {"keep_results": {"_target_": "specdec.jobs.runs.KeepEarlierResults"},
                            "summary": {"_target_": "specdec.report.SweepSummaryCallback"}}}})

def task(cfg, results_path):
    if cfg.drafter.k == cfg.fail_at_k:
        raise ValueError(f"k={cfg.drafter.k} is cursed")
    k = cfg.drafter.k
    results = {"status": "ok", "error": None, **config_fields(cfg),
               "acceptance_rate": 0.5, "acceptance_per_position": [0.5] * k, "mean_accepted_length": 1.5,
               "speedup": 1.2, "predicted_speedup": 1.3, "cost_ratio": 0.1}
    write_json(results_path, results)
    return results["speedup"]

@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    return run_task(cfg, task, failure_value=None)

if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])
def test_hydra_multirun_with_a_failing_job_summarizes_all_and_exits_1(tmp_path: Path, launcher: str) -> None:
    (tmp_path / "app.py").write_text(HYDRA_APP)
    sweep = tmp_path / "sweep"
    args = ["app.py", "-m", "drafter.k=1,2,3", f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}"]
    proc = _run(args + (["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []), tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    df = report.load_summary(sweep / "summary.csv")
    runs = df[df["category"] == report.ALL].set_index("k")
    assert list(runs.index) == [1, 2, 3]
    assert list(runs["status"]) == ["ok", "failed", "ok"]
    assert runs.loc[2, "error"] == "ValueError: k=2 is cursed"
    assert "ValueError: k=2 is cursed" in (sweep / "summary.md").read_text()
    assert "1 of 3 runs failed" in proc.stderr


def test_earlier_results_are_refused_not_replaced(tmp_path: Path) -> None:
    """A run or sweep pointed at a directory holding results exits 1 naming them, before anything is written
    there (results, Hydra's .hydra/ files, the summary); without the callback the job's own check refuses, so
    a failure record does not replace them either. A results file that cannot be written fails before the run."""
    (tmp_path / "app.py").write_text(HYDRA_APP)
    run = tmp_path / "run"
    assert _run(["app.py", "drafter.k=1", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    first = (run / "results.json").read_text(), (run / ".hydra" / "overrides.yaml").read_text()
    for extra in ([], ["~hydra.callbacks.keep_results"]):
        for k in (3, 2):  # a run that would succeed, one that would fail
            proc = _run(["app.py", f"drafter.k={k}", f"hydra.run.dir={run}", *extra], tmp_path)
            assert proc.returncode == 1 and "already holds results" in proc.stderr, proc.stderr[-2000:]
            assert str(run / "results.json") in proc.stderr and "nothing was run" in proc.stderr
            assert (run / "results.json").read_text() == first[0]
        if not extra:
            assert (run / ".hydra" / "overrides.yaml").read_text() == first[1]
    sweep = tmp_path / "sweep"
    assert _run(["app.py", "-m", "drafter.k=1,3", f"hydra.sweep.dir={sweep}"], tmp_path).returncode == 0
    summary = (sweep / "summary.csv").read_text()
    proc = _run(["app.py", "-m", "drafter.k=5", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 1 and "hydra.sweep.dir already holds results" in proc.stderr, proc.stderr[-2000:]
    assert not (sweep / "2").exists() and (sweep / "summary.csv").read_text() == summary
    (tmp_path / "afile").write_text("")
    proc = _run(["app.py", f"hydra.run.dir={tmp_path / 'other'}", f"results_file={tmp_path / 'afile' / 'r.json'}"],
                tmp_path)
    assert proc.returncode == 1 and "results_file=" in proc.stderr and "cannot write into" in proc.stderr
    for key, mode in (("hydra.run.dir", []), ("hydra.sweep.dir", ["-m"])):  # under a file: no directory there
        proc = _run(["app.py", *mode, f"{key}={tmp_path / 'afile' / 'sub'}"], tmp_path)
        assert proc.returncode == 1 and f"{key}=" in proc.stderr and "cannot be written" in proc.stderr, proc.stderr


def test_every_entry_point_keeps_earlier_results() -> None:
    from hydra import compose, initialize_config_dir

    import specdec.verify_dist  # noqa: F401  (stores verify_dist_schema)
    from specdec.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"), version_base="1.3"):
        for name in ("run", "verify_dist"):
            cfg = compose(name, return_hydra_config=True)
            assert cfg.hydra.callbacks.keep_results._target_ == "specdec.jobs.runs.KeepEarlierResults", name


def _python3_kernel_available() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" in KernelSpecManager().find_kernel_specs():
        return True
    try:
        from ipykernel.kernelspec import install

        install(user=True)
    except Exception:
        return False
    return "python3" in KernelSpecManager().find_kernel_specs()


def test_notebook_runs_against_the_sweep(sweep: Path, monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if not _python3_kernel_available():
        pytest.skip("no `python3` Jupyter kernel and `ipykernel.kernelspec.install(user=True)` failed")
    report.write_summary(sweep, report.collect_runs(sweep))
    monkeypatch.setenv("SPECDEC_SWEEP_DIR", str(sweep))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("7 runs" in o.get("text", "") for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == len(report.PLOTS)


def test_wandb_offline_logging(sweep: Path, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = {"name": "wandb", "project": "specdec-test", "entity": None, "mode": "offline", "tags": ["test"]}
    cfg = OmegaConf.create({"logger": logger, "drafter": {"name": "ngram", "k": 2}})
    out = tmp_path / "run"
    report.wandb_log_run(cfg, OK_RUNS["1"], out)
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "logger": logger})
    report.SweepSummaryCallback(exit_nonzero_on_failure=False).on_multirun_end(config)
    assert list((sweep / "wandb").glob("offline-run-*/files/media/table/summary_*.table.json"))
