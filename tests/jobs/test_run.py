"""The main job and sweeps, end to end through Hydra (the real default target, tiny budgets)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specdec.config import register_configs
from specdec.models import cpu_kernels

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
REQUIRED = ["drafter", "k", "temperature", "acceptance_rate", "acceptance_per_position", "mean_accepted_length",
            "tokens_per_second", "baseline_tokens_per_second", "speedup", "predicted_speedup", "num_prompts",
            "decode_tokens_per_second", "baseline_decode_tokens_per_second", "decode_speedup", "prefill_time_s",
            "leviathan_chain_formula", "drafting", "speedup_interval", "decode_speedup_interval",
            "few_prompts", "per_prompt"]
TINY = ["data.limit_per_source=1", "data.max_new_tokens=8", "warmup=false"]
FIXED = "drafter.k=4"  # a fixed lookahead: no drafter.k=auto calibration (the main job's default)


def preset_k(drafter: str) -> str:
    """drafter.k=<the k of configs/drafter/<drafter>.yaml>: the preset's fixed lookahead instead of the main job's auto."""
    from omegaconf import OmegaConf

    return f"drafter.k={OmegaConf.load(CONFIGS / 'drafter' / f'{drafter}.yaml').k}"


def pinned(override: str) -> str:
    """The fixed lookahead a job of ``override`` runs at: the preset's k where it names a drafter, else FIXED."""
    drafter = next((item.split("=")[1] for item in override.split() if item.startswith("drafter=")), None)
    return FIXED if drafter is None else preset_k(drafter)


def run_job(*overrides, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "specdec.run", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["target", "drafter", "sampling", "data", "logger", "experiment"])
def test_every_config_composes(group):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for option in group_options(group):
            extra = ["target.name=some/model"] if (group, option) == ("target", "hub") else []
            cfg = compose("run", overrides=[f"{group}={option}", *extra], return_hydra_config=True)
            assert cfg.drafter.k == "auto" and cfg.data.max_new_tokens >= 1  # the main job chooses its lookahead


@pytest.mark.parametrize("entry, groups", [
    ("run", ["data", "drafter", "experiment", "logger", "sampling", "target"]),
    ("verify_dist", ["data", "drafter", "logger", "sampling", "target"]),
    ("train", ["logger", "method", "target"]),
])
def test_help_lists_only_the_choices_a_user_can_make(entry, groups):
    """Each entry point's --help lists the groups it composes (train's method group only in train's), each with
    its YAML options: no typed schema (drafter/eagle_schema, ...) offered as a choice."""
    proc = subprocess.run([sys.executable, "-m", f"specdec.{entry}", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    lines = [line for line in listed.splitlines()[1:] if ": " in line]
    assert {line.split(": ")[0]: line.split(": ")[1].split(", ") for line in lines} == {
        group: group_options(group) for group in groups}
    assert "_schema" not in listed


@pytest.mark.real_model
@pytest.mark.parametrize("coded", [True, False])
def test_main_job_writes_results(tmp_path, coded):
    proc = run_job(*TINY, FIXED, f"target.coded_weights={coded}", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "ok" and all(key in results for key in REQUIRED)
    assert results["num_prompts"] == 2 and results["greedy_mismatches"] == 0
    assert results["mean_accepted_length"] >= 1 and len(results["acceptance_per_position"]) == results["k"]
    assert "speedup" in proc.stdout and "predicted" in proc.stdout
    # SmolLM2 streamed as its codes where the CPU kernel runs (cpu_kernels.pack_codes): ~112 MB of panels a
    # step; else (or with target.coded_weights=false) float32's 538 MB
    coded = coded and cpu_kernels.available()
    assert 0 < results["bandwidth_fraction"] and (100e6 < results["step_bytes"] < 130e6 if coded
                                                  else results["step_bytes"] > 500e6)
    assert "speed of light: a step reads" in proc.stdout
    assert results["cuda_graph_captures"] is None and results["drafter_graph_captures"] is None  # eager on CPU
    assert "graphs captured" not in proc.stdout


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["eagle", "medusa", "draft_model", "ngram"])
def test_the_main_job_on_the_gpu_path_through_emulated_graphs(drafter):
    """The main job as it runs on a GPU (target.compile=auto: the target's forwards and the drafter's own work
    replaying graphs), in process on CPU through emulated graphs: plain decoding's greedy outputs, the captures
    of each reported in results.json and under the table (ngram runs no model: no drafter graphs)."""
    from specdec.config import config_dir
    from specdec.models import Backend
    from specdec.report.table import format_table
    from specdec.run import run

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("run", overrides=[f"drafter={drafter}", "data.sources=[mtbench]", *TINY, preset_k(drafter)])
    results = run(cfg, Backend.emulated_gpu())
    assert results["greedy_mismatches"] == 0 and results["cuda_graph_captures"] > 0
    assert results["cuda_graph_capture_time_s"] > 0
    graphed = drafter != "ngram"
    assert (results["drafter_graph_captures"] is not None) == graphed
    assert not graphed or results["drafter_graph_captures"] > 0 and results["drafter_graph_capture_time_s"] > 0
    line, = (line for line in format_table(results).splitlines() if line.startswith("graphs captured"))
    assert line.startswith("graphs captured (one-off, left out of the timings above): target ")
    assert ("drafter" in line) == graphed


def table_results(**fields) -> dict:
    """What run() hands format_table, for a chain drafter on one category of prompts."""
    row = dict(num_prompts=2, acceptance_rate=0.5, mean_accepted_length=1.5, tokens_per_second=10.0,
               baseline_tokens_per_second=8.0, speedup=1.25, decode_tokens_per_second=24.0,
               baseline_decode_tokens_per_second=16.0, decode_speedup=1.5, predicted_speedup=1.07,
               leviathan_chain_formula=2.33, drafting="chain")
    return {**row, "drafter": "ngram", "k": 4, "per_category": {"chat": row}, "acceptance_per_position": [0.5],
            "cost_ratio": 0.1, "device": "cpu", "cuda_graph_captures": None, "cuda_graph_capture_time_s": None,
            "drafter_graph_captures": None, "drafter_graph_capture_time_s": None, "wall_time_s": 4.0,
            "prefill_time_s": 2.6, "baseline_wall_time_s": 5.0, "baseline_prefill_time_s": 2.6, **fields}


def test_the_table_names_the_drafter_its_lookahead_and_which_speedup_it_shows():
    """The table's first line: the drafter, the k it decoded with (k=auto's choice marked) and the shape of its
    drafts, and what its figures are: the speedups measured wall clock, the prediction from measured step costs."""
    from specdec.report.table import format_table

    title = format_table(table_results()).splitlines()[0]
    assert title == ("ngram, k=4 (chain drafts) against plain decoding on the same prompts: speedup = measured wall "
                     "clock, predicted = from the run's measured step costs")
    auto = format_table(table_results(k="auto", k_chosen=0)).splitlines()[0]
    assert auto.startswith("ngram, k=0 chosen by drafter.k=auto (plain decoding) against plain decoding")


def test_a_run_slower_than_plain_decoding_points_to_k_auto():
    """A fixed lookahead that lost (0.77x: n-gram K=4 at batch 4), end to end or decode only, says so under the table
    and names drafter.k=auto; a run that gained, or one where k=auto chose, does not."""
    from specdec.report.table import format_table

    hint = [line for line in format_table(table_results(speedup=0.77)).splitlines() if "drafter.k=auto chooses" in line]
    assert len(hint) == 1 and hint[0].startswith("speculative decoding ran at 0.77x plain decoding here")
    assert "drafter.k=auto chooses" not in format_table(table_results())
    assert "ran at 0.69x plain decoding" in format_table(table_results(speedup=0.94, decode_speedup=0.69))
    chose = {"k": 0, "predicted_speedup": {1: 0.7}, "prompts": 8, "seconds": 60.0}
    assert "drafter.k=auto chooses" not in format_table(table_results(speedup=0.9, k="auto", k_chosen=0, auto=chose))


def test_the_table_shows_end_to_end_and_decode_only_figures():
    """Tokens/s and speedup end to end (the prompt's prefill included) and decode only (left out), named so over
    the columns, from results.json's keys; the prefill's share of the time under the table."""
    from specdec.report.table import format_table

    lines = format_table(table_results()).splitlines()[1:]  # under the title (test_the_table_names_...)
    assert "end to end (with prefill)" in lines[0]
    assert lines[0].index("end to end") < lines[0].index("decode only (no prefill)")
    assert lines[1].split() == ["category", "prompts", "α", "τ", "tok/s", "base", "tok/s", "speedup", "95%", "CI",
                                "tok/s", "base", "tok/s", "speedup", "95%", "CI", "predicted"]
    for row in lines[3:5]:
        assert row.split()[4:] == ["10.0", "8.0", "1.25x", "–", "24.0", "16.0", "1.50x", "–", "1.07x"]
    assert "prefill: 65% of the end-to-end time (52% for plain decoding), left out of the decode-only figures " \
           "with the token it gives" in lines


def test_the_main_job_gives_each_speedup_its_interval_and_marks_categories_of_few_prompts(monkeypatch):
    """On a tiny target: results.json keeps every prompt's figures and each group's 95% bootstrap interval (ALL and
    a category of 3 prompts), categories named by their source, those of fewer than 3 prompts marked; the printed
    table shows the intervals and the marks."""
    from helpers import CHAT_TEMPLATE, tiny_train_pair

    import specdec.jobs.job
    import specdec.run as run_job
    from specdec.report.table import format_table

    model, tokenizer = tiny_train_pair()
    tokenizer.chat_template = CHAT_TEMPLATE
    monkeypatch.setattr(specdec.jobs.job, "load_target", lambda name, **_: (model, tokenizer))
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run", overrides=["drafter=ngram", "data.limit_per_source=3", "data.max_new_tokens=6",
                                        "warmup=false"])
    results = run_job.run(cfg)
    assert [p["category"] for p in results["per_prompt"]] == [
        "mtbench/writing", "mtbench/roleplay", "mtbench/reasoning", "humaneval/code", "humaneval/code",
        "humaneval/code"]
    assert results["per_prompt"][3]["prompts"] == ["HumanEval/0"] and results["per_prompt"][0]["speedup"] > 0
    for group in (results, results["per_category"]["humaneval/code"]):
        low, high = group["speedup_interval"]
        assert low <= high and len(group["decode_speedup_interval"]) == 2 and not group["few_prompts"]
    writing = results["per_category"]["mtbench/writing"]
    assert writing["few_prompts"] and writing["speedup_interval"] is None
    table = format_table(results)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[4:9]}
    assert rows["mtbench/writing"][1] == "1*" and rows["mtbench/writing"][7] == "–"
    code = rows["humaneval/code"]
    assert code[1] == "3" and code[7] == "{:.2f}-{:.2f}x".format(*results["per_category"]["humaneval/code"]
                                                                  ["speedup_interval"])
    assert rows["ALL"][7] == "{:.2f}-{:.2f}x".format(*results["speedup_interval"])
    assert "* fewer than 3 prompts (at a batch > 1: batches, the unit timed): no interval" in table


def test_summarize_gives_end_to_end_and_decode_only_rates():
    """results.json: tokens_per_second / speedup end to end as before, decode_* without the prefill and its token."""
    from specdec.decode.metrics import DecodeStats, summarize

    def stats(wall, forwards):
        return DecodeStats(k=2, new_tokens=40, prefill_tokens=4, wall_time_s=wall, prefill_time_s=1.0,
                           target_forwards=forwards, target_time_s=0.1 * forwards, verify_steps=forwards,
                           verified_tokens=36)

    out = summarize(stats(2.0, 12), stats(3.0, 36), k=2, num_prompts=4)
    assert out["tokens_per_second"] == 20.0 and out["baseline_tokens_per_second"] == 40 / 3
    assert out["speedup"] == pytest.approx(1.5) and out["decode_speedup"] == pytest.approx(2.0)
    assert out["decode_tokens_per_second"] == 36.0 and out["baseline_decode_tokens_per_second"] == 18.0


def test_results_predicted_speedup_is_the_one_from_measured_costs():
    """results.json's predicted_speedup is τ · plain step / (verify + draft time per step); Leviathan's idealised
    chain formula is leviathan_chain_formula, and the measured-cost prediction's old name is gone."""
    from specdec.decode.metrics import DecodeStats, leviathan_chain_formula, summarize

    spec = DecodeStats(k=2, new_tokens=40, prefill_tokens=4, wall_time_s=2.0, prefill_time_s=1.0, target_forwards=12,
                       target_time_s=1.8, drafter_time_s=0.6, verify_steps=12, verified_tokens=36,
                       proposed_per_position=[12, 8], accepted_per_position=[8, 4])
    base = DecodeStats(k=0, new_tokens=40, prefill_tokens=4, wall_time_s=3.0, prefill_time_s=1.0,
                       target_forwards=36, target_time_s=3.6, verify_steps=36, verified_tokens=36)
    out = summarize(spec, base, k=2, num_prompts=4)
    assert out["predicted_speedup"] == pytest.approx(3.0 * 0.1 / (0.15 + 0.05))  # τ 3, plain step 0.1 s
    assert out["leviathan_chain_formula"] == pytest.approx(leviathan_chain_formula(0.6, 2, 0.25))  # α 12/20, c 0.25
    assert "predicted_speedup_measured_costs" not in out


def test_the_tables_prediction_is_from_measured_costs_and_leviathans_only_for_chains():
    """The predicted column holds the prediction from measured costs, which fits trees too; Leviathan's chain
    formula, from results.json, is shown under the table for chain drafting only."""
    from specdec.report.table import format_table

    for drafting in ("chain", "tree"):
        results = table_results(drafting=drafting, verify_step_time_s=0.012, target_step_time_s=0.01)
        lines = format_table(results).splitlines()
        assert lines[2].split()[-1] == "predicted"
        assert all(line.endswith("1.07x") for line in lines[4:6])  # the chat row and ALL
        assert ("Leviathan's chain formula (verify at a plain step's cost): 2.33x" in lines) == (drafting == "chain")
        assert ("2.33" in format_table(results)) == (drafting == "chain")


def test_the_table_names_the_graphs_captured_where_they_ran():
    """Under the run table, the shapes the target's and the drafter's graphs captured and what that cost (left out
    of the timings), for whichever replayed graphs; no line for an eager run."""
    from specdec.report.table import format_table

    results = table_results()
    assert "graphs captured" not in format_table(results)
    results.update(cuda_graph_captures=5, cuda_graph_capture_time_s=1.3)  # a drafter without graphs (n-gram)
    target = "graphs captured (one-off, left out of the timings above): target 5 shapes in 1.3 s"
    assert target in format_table(results).splitlines()
    results.update(drafter_graph_captures=12, drafter_graph_capture_time_s=0.5)
    assert f"{target}, drafter 12 shapes in 0.5 s" in format_table(results).splitlines()


BAD_INPUTS = [  # (overrides, what the error must say)
    ("target.name=./no/such/model", "no/such/model"),
    ("drafter.k=0", "drafter.k (lookahead) must be an integer >= 1 or 'auto', got 0"),
    ("sampling.temperature=-0.5", "temperature must be a finite number >= 0"),
    ("sampling.top_p=1.5", "top_p must lie in (0, 1]"),
    ("data.max_prompt_tokens=5", "tokens, more than the 5 allowed"),
    ("drafter=medusa drafter.acceptance=typcal", "acceptance must be 'exact' or 'typical'"),
    ("data.max_new_tokens=100000", "exceeds the model's context of 2048 positions"),
    ("drafter=medusa drafter.path=/etc/passwd", "'/etc/passwd' is not a Medusa heads file written by specdec"),
    ("target.compile=graphs", "target.compile='graphs' is not a mode"),
    ("target=hub", "target=hub needs the model: add target.name="),
    ("data.limit_per_source=0", "data.limit_per_source must be an integer >= 1 (prompts per source) or null"),
    ("data.batch_size=0", "data.batch_size must be an integer >= 1"),
    ("target.max_context=4", "raise target.max_context (at least 14, plus the longest prompt's length)"),
    ("sampling.temperature=inf", "temperature must be a finite number >= 0 (0 = greedy), got inf"),
]


@pytest.mark.real_model
@pytest.mark.parametrize("override, message", BAD_INPUTS[:1])
def test_bad_input_fails_clearly_and_leaves_a_failed_results_file(tmp_path, override, message):
    """A job run alone: non-zero exit, the error on stderr, a results file saying "failed" and why (the
    other bad inputs, which fail the same way, in one sweep below)."""
    proc = run_job(*TINY, pinned(override), *override.split(), f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "failed" and message in results["error"]


LOSSY = "drafter=medusa drafter.acceptance=typical sampling=sample drafter.k=23"  # k=auto replays exact rules only


@pytest.mark.real_model
def test_in_one_sweep_each_bad_input_fails_clearly_and_a_lossy_rule_is_marked(tmp_path):
    """Each bad input of BAD_INPUTS as one job of a single multirun (one process: the imports and the target
    load paid once): each job fails with its own clear error in its results file and on stderr, and the
    sweep exits 1. The sweep's last job runs a lossy acceptance rule: marked lossy in its results file, its
    table and the log."""
    from omegaconf import OmegaConf

    cases = tmp_path / "configs" / "bad_input"
    cases.mkdir(parents=True)
    for i, override in enumerate([override for override, _ in BAD_INPUTS] + [LOSSY]):
        groups = [item for item in override.split() if "." not in item.split("=")[0]]
        values = [item for item in override.split() if item not in groups]
        defaults = "".join(f"  - override /{item.replace('=', ': ')}\n" for item in groups)
        body = OmegaConf.to_yaml(OmegaConf.from_dotlist([*TINY, pinned(override), *values]))
        (cases / f"case{i}.yaml").write_text("# @package _global_\n" + (f"defaults:\n{defaults}" if defaults else "")
                                            + body)
    names = ",".join(f"case{i}" for i in range(len(BAD_INPUTS) + 1))
    sweep = tmp_path / "sweep"
    proc = run_job("-m", f"hydra.searchpath=[file://{tmp_path / 'configs'}]", f"+bad_input={names}",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    for i, (override, message) in enumerate(BAD_INPUTS):
        results = json.loads((sweep / str(i) / "results.json").read_text())
        assert results["status"] == "failed" and message in results["error"], (override, results["error"])
        assert message in proc.stderr, override
    lossy = json.loads((sweep / str(len(BAD_INPUTS)) / "results.json").read_text())
    assert lossy["status"] == "ok" and lossy["lossy"] is True
    assert "LOSSY: the drafter verifies" in proc.stdout  # the table's line
    assert "typical acceptance is LOSSY" in proc.stdout  # the log's warning (Hydra logs to stdout)


@pytest.mark.slow  # ~45 s: two workers each import the stack; joblib with a tiny app is in test_report.py
@pytest.mark.real_model
def test_joblib_multirun_summarizes_and_lists_the_failed_run(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_job("-m", *TINY, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "data.sources=[humaneval]",
                   "drafter.k=1,3", "sampling.top_p=1.0,0.0", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    # top_p=0 is invalid: those two runs fail, the other two must still be there and summarised.
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = (sweep / "summary.md").read_text()
    assert summary.count("failed") >= 2 and "top_p must lie in (0, 1]" in summary
    runs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    assert sorted(r["status"] for r in runs) == ["failed", "failed", "ok", "ok"]
    import pandas as pd

    table = pd.read_csv(sweep / "summary.csv")
    ok = [r for r in runs if r["status"] == "ok"]
    for r in ok:  # the summary copies each run's own τ
        assert any(abs(t - r["mean_accepted_length"]) < 1e-9 for t in table["mean_accepted_length"].dropna())
    assert list(sweep.glob("*.png"))


@pytest.mark.parametrize("launcher", ["joblib", "slurm"])
def test_launchers_compose(launcher):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
        assert launcher.replace("slurm", "Slurm").lower() in cfg.hydra.launcher._target_.lower()
