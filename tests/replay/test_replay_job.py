"""``python -m specdec.replay``: it composes the main job's groups, refuses what it cannot replay before loading
anything, and a sweep replays from one log with the main job's τ (the real default target, tiny budgets)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specdec.jobs.checks import check_before_loading
from specdec.replay.__main__ import check_replay_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
TINY = ["data.limit_per_source=1", "data.max_new_tokens=16"]


def job(module: str, *overrides, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", module, *overrides], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("replay", overrides=list(overrides))


@pytest.mark.parametrize("drafter", sorted(p.stem for p in (CONFIGS / "drafter").glob("*.yaml")))
def test_every_drafter_composes(drafter):
    # cross_vocab drafts with SmolLM2 for another tokenizer's target (on SmolLM2 itself it is refused)
    other = ["target=gemma3", "data=code_text"] if drafter == "cross_vocab" else []  # its heuristic schedule too
    cfg = composed(f"drafter={drafter}", "drafter.k=3", *other)
    presets = {"cross_vocab": "draft_model"}  # a preset of another drafter (configs/drafter/cross_vocab.yaml)
    k, room = check_replay_config(cfg)
    checked = check_before_loading(cfg, room=room)  # the checks the job makes before its target loads
    assert cfg.drafter.name == presets.get(drafter, drafter) and cfg.k_max == 8 and k == checked.k == 3
    assert len(checked.rows) == 16 and checked.auto is None


def test_help_lists_the_main_jobs_groups():
    proc = job("specdec.replay", "--help", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = {line.split(": ")[0] for line in listed.splitlines()[1:] if ": " in line}
    assert groups == {"data", "drafter", "logger", "sampling", "target"} and "_schema" not in listed


@pytest.mark.parametrize("override, message", [
    ("sampling.temperature=-1", "temperature must be a finite number >= 0 (0 = greedy), got -1"),
    ("seeds=0", "seeds must be an integer >= 1, got 0"),
    ("check_live=-1", "check_live must be an integer >= 0, got -1"),
    ("data.batch_size=0", "data.batch_size must be an integer >= 1 (prompts decoded together), got 0"),
    ("drafter.k=0", "drafter.k (lookahead) must be an integer >= 1, got 0"),
    ("drafter.k=auto", "a replay sweeps K itself (-m drafter.k=1,2,4); drafter.k=auto is the main job's"),
])
def test_refused_before_anything_loads(override, message, monkeypatch):
    import specdec.jobs.job
    from specdec.replay.__main__ import run

    def load_target(*args, **kwargs):
        raise AssertionError("a model was loaded: the refusal came too late")

    monkeypatch.setattr(specdec.jobs.job, "load_target", load_target)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(composed("drafter=ngram", override))


@pytest.mark.slow  # 70 s on a 2-core AVX2 CPU; the replay-equals-live tests cover its claim per drafter
@pytest.mark.real_model
def test_a_replayed_sweep_shares_one_log_and_matches_the_main_job(tmp_path):
    sweep = job("specdec.replay", "-m", "drafter=ngram", "drafter.k=1,2", *TINY, "k_max=4", f"log_dir={tmp_path}/logs",
                f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert "REPLAYED" in sweep.stdout and (tmp_path / "sweep" / "summary.csv").is_file()
    runs = [json.loads((tmp_path / "sweep" / str(i) / "results.json").read_text()) for i in (0, 1)]
    assert [r["replayed"] for r in runs] == [True, True] and [r["replay_log_reused"] for r in runs] == [False, True]
    assert len(list((tmp_path / "logs").glob("*.json"))) == 1 and runs[0]["k_max"] == 4
    assert "predicted (replay)" in sweep.stdout and "(best k)" in sweep.stdout  # one prediction, the best k marked
    assert sorted(runs[0]["predicted_speedup_by_k"]) == ["1", "2", "3", "4"] and "speedup" not in runs[0]
    assert runs[1]["predicted_speedup_by_k"]["2"] == pytest.approx(runs[1]["predicted_speedup"])
    live = job("specdec.run", "drafter=ngram", "drafter.k=2", *TINY, "warmup=false", f"hydra.run.dir={tmp_path}/run",
               cwd=tmp_path)
    assert live.returncode == 0, live.stderr[-2000:]
    measured = json.loads((tmp_path / "run" / "results.json").read_text())
    for key in ("mean_accepted_length", "acceptance_rate", "num_prompts"):
        assert runs[1][key] == measured[key], key


def test_a_curve_with_the_drafters_rows_predicts_where_one_without_bounds(tmp_path):
    """costs=<a curve>: with a row for the drafter (step_costs.py --drafters) the replay pays its steps and says how
    (``drafting_from_curve``, the table's PREDICTED); without, drafting is free and the figure an upper bound, higher.
    In process, one log for both (the real default target, one prompt per source, 16 tokens)."""
    from specdec.replay.__main__ import run
    from specdec.report.table import format_replay_table

    bare = ROOT / "experiments/gpu/results/h200-2026-11-27/step_costs_llama-3.1-8b.json"
    curve = json.loads(bare.read_text())
    curve["drafter_rows"] = [{"drafter": "medusa", "what": "4 heads", "batch": 1, "width": None, "ms": 2.0}]
    rows = tmp_path / "step_costs_llama-3.1-8b.json"
    rows.write_text(json.dumps(curve))
    predicted, bound = (run(composed("drafter=medusa", *TINY, f"log_dir={tmp_path}/logs", f"costs={path}"))
                        for path in (rows, bare))
    assert predicted["drafting_from_curve"] == "Medusa: its heads once a step" and bound["drafting_from_curve"] is None
    assert predicted["mean_accepted_length"] == bound["mean_accepted_length"] and bound["replay_log_reused"]
    assert predicted["predicted_speedup"] < bound["predicted_speedup"]
    assert "PREDICTED: the drafter's steps from its rows" in format_replay_table(predicted)
    assert "counted free: an upper bound" in format_replay_table(bound)


def replayed_figures() -> dict:
    """A group's summarize_prompts figures over a replay, its two predictions disagreeing as in issue 65 (n-gram K=3
    on MT-Bench: τ · plain step / (verify + draft) 1.22x, the replay's cost model 1.04x)."""
    return {"num_prompts": 4, "acceptance_rate": 0.5, "acceptance_per_position": [0.6, 0.4],
            "mean_accepted_length": 1.6, "tokens_per_second": 30.1, "baseline_tokens_per_second": 28.9, "speedup": 1.04,
            "speedup_interval": [1.0, 1.1], "decode_tokens_per_second": 30.0, "baseline_decode_tokens_per_second": 28.8,
            "decode_speedup": 1.04, "decode_speedup_interval": [1.0, 1.1], "predicted_speedup": 1.22,
            "leviathan_chain_formula": 1.37, "few_prompts": False, "drafting": "chain", "cost_ratio": 0.05}


def test_a_replay_shows_one_prediction_with_the_best_k_marked():
    """A replay's figures hold one prediction, the cost model's decode speedup (the loop's host work included), and
    nothing a live run measures; its table shows that one, marked as the replay's prediction, with its interval over
    the prompts, and the prediction at each K the log covers with the best marked."""
    from specdec.decode.metrics import as_replayed
    from specdec.report.table import format_replay_table

    replayed = as_replayed(replayed_figures())
    assert replayed["predicted_speedup"] == 1.04 and replayed["predicted_speedup_interval"] == [1.0, 1.1]
    assert not {"speedup", "decode_speedup", "tokens_per_second", "leviathan_chain_formula"} & set(replayed)
    results = {**replayed, "drafter": "ngram", "k": 3, "per_category": {"mtbench/writing": replayed}, "device": "cpu",
               "replayed": True, "predicted_speedup_by_k": {"1": 1.02, "2": 1.06, "3": 1.04}}
    table = format_replay_table(results)
    lines = table.splitlines()
    assert lines[0].startswith("ngram, k=3 (chain drafts), REPLAYED against plain decoding: speedup predicted from "
                               "this machine's measured costs")
    assert lines[1].split()[-4:] == ["predicted", "(replay)", "95%", "CI"]
    assert lines[4].split()[-2:] == ["1.04x", "1.00-1.10x"] and lines[4].startswith("ALL")
    assert "1.22" not in table and "1.37" not in table and "end to end" not in table
    assert "predicted (replay) at each k the log covers: 1: 1.02x, 2: 1.06x (best k), 3: 1.04x" in lines


def test_a_replayed_sweep_is_marked_in_the_summary_with_its_best_k(tmp_path):
    """summary.md marks replayed runs, shows their one prediction with no measured speedup (and says so, never
    "measured wall clock" for them), and marks the best k among replayed runs that differ in k alone."""
    from specdec import report
    from specdec.decode.metrics import as_replayed

    for job, (k, predicted) in enumerate([(1, 1.02), (2, 1.06), (3, 1.04)]):
        run = {"status": "ok", "drafter": "ngram", "k": k, "temperature": 0.0, "per_category": {}, "lossy": False,
               "replayed": True, **as_replayed({**replayed_figures(), "decode_speedup": predicted})}
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "results.json").write_text(json.dumps(run))
    paths = report.write_summary(tmp_path, report.collect_runs(tmp_path))
    md = paths["md"].read_text()
    assert "| 1 | ngram (REPLAYED) | 2 | 0 | 0.500 | 1.60 | – | – | – | 30.0 | 28.8 | – | 1.06 (best K) | – | ok |" in md
    assert "| 0 | ngram (REPLAYED) | 1 |" in md and "| 1.02 | – | ok |" in md
    assert "REPLAYED: a run marked so was replayed" in md and "measured no wall clock" in md
    assert bool(report.load_summary(paths["csv"])["replayed"].iloc[0])


@pytest.mark.slow  # 50 s; the T=1 replay-vs-live tests (test_replay_sampled) cover its claim in seconds
@pytest.mark.real_model
def test_a_sampled_replay_checks_itself_live(tmp_path):
    """T=1 replays with the live check: the results hold the gap; greedy, the same check finds none (exact)."""
    common = ["drafter=ngram", "drafter.k=2", *TINY, "k_max=2", "costs=false", "check_live=1",
              f"log_dir={tmp_path}/logs"]
    sampled = job("specdec.replay", "sampling=sample", "seeds=2", "live_seeds=2", *common,
                  f"hydra.run.dir={tmp_path}/sampled", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert "LIVE CHECK: 1 prompt(s) x 2 seed(s)" in sampled.stdout and "matching walk" in sampled.stdout
    results = json.loads((tmp_path / "sampled" / "results.json").read_text())
    check = results["live_check"]
    assert results["temperature"] == 1.0 and results["replay_seeds"] == 2 and results["mean_accepted_length"] >= 1
    assert check["seeds"] == 2 and check["mean_accepted_length_live"] >= 1
    ratio = check["mean_accepted_length_replayed"] / check["mean_accepted_length_live"]
    assert check["gap"] == pytest.approx(ratio - 1)
    greedy = job("specdec.replay", *common, f"hydra.run.dir={tmp_path}/greedy", cwd=tmp_path)
    assert greedy.returncode == 0, greedy.stderr[-2000:]
    check = json.loads((tmp_path / "greedy" / "results.json").read_text())["live_check"]
    assert check["seeds"] == 1 and check["gap"] == 0.0
