"""Bad input on every entry point, as a new user types it: nothing earlier lost or overwritten, nothing silent, no
hang, and every refusal that needs no model made before one loads (the models' loaders are replaced by one that
fails the test). The commands' own words are the overrides below; experiments/README.md#bad-input-2026-11-27 lists
the probe these come from, with what each gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

import specdec.replay.__main__ as replay_main
import specdec.run as run_main
import specdec.verify_dist as verify_main
from specdec.config import register_configs
from specdec.decode.engine import autoregressive_generate, speculative_generate
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import CheckpointError
from specdec.replay.log import ReplayMismatchError

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "specdec" / "assets"


def cli(module: str, *args: str, cwd: Path, full_error: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1" if full_error else "0"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and its mtime (ns)."""
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def finished_run(directory: Path, files: dict[str, str]) -> dict[str, tuple[bytes, int]]:
    """A directory as an earlier run left it (``files``: relative path -> text), and its snapshot."""
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    return snapshot(directory)


MAIN_JOB = {"results.json": '{"status": "ok", "speedup": 1.1}\n', ".hydra/config.yaml": "drafter:\n  name: ngram\n",
            ".hydra/hydra.yaml": "hydra: {}\n", ".hydra/overrides.yaml": "- drafter=ngram\n", "run.log": "done\n"}


# --- LOST: a directory holding any entry point's results is refused, before anything is written there ------------

@pytest.mark.parametrize("module, earlier, args", [
    ("specdec.verify_dist", MAIN_JOB, ["data.max_new_tokens=4"]),  # verify_dist over a finished main job
    ("specdec.run", MAIN_JOB, ["results_file=results2.json"]),  # another results file, the same directory
    ("specdec.replay", {"verify.json": "{}\n", ".hydra/config.yaml": "x: 1\n"}, []),  # over verify_dist's results
    ("specdec.run", {"data.safetensors": "store", "checkpoints/latest": "step-1", "metrics.json": "{}"}, []),  # train's
    ("specdec.train", MAIN_JOB, []),  # a training run pointed (output_dir) at a main job's results
])
def test_a_directory_with_earlier_results_is_refused_and_left_as_it_was(tmp_path, module, earlier, args):
    run = tmp_path / "earlier"
    before = finished_run(run, earlier)
    where = f"output_dir={run}" if module == "specdec.train" else f"hydra.run.dir={run}"
    proc = cli(module, *args, where, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "already holds results" in proc.stderr and "nothing was run" in proc.stderr, proc.stderr[-2000:]
    assert ("output_dir already" if module == "specdec.train" else "hydra.run.dir already") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(run) == before  # every file's bytes and mtime; no file added


def test_a_results_file_in_another_runs_directory_is_refused(tmp_path):
    """python -m specdec.run results_file=<an earlier run's directory>/results.json: refused naming results_file, and
    nothing made, not even the new run's directory."""
    from omegaconf import OmegaConf

    from specdec.jobs.runs import KeepEarlierResults

    before = finished_run(tmp_path / "earlier", MAIN_JOB)
    config = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "new")}},
                               "results_file": str(tmp_path / "earlier" / "results.json")})
    with pytest.raises(SystemExit, match="results_file already holds results"):
        KeepEarlierResults().on_run_start(config)
    assert snapshot(tmp_path / "earlier") == before and not (tmp_path / "new").exists()


def test_a_sweep_directory_with_a_jobs_results_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    before = finished_run(sweep, {"0/verify.json": "{}\n", "0/.hydra/config.yaml": "x: 1\n"})
    proc = cli("specdec.run", "-m", "drafter.k=1,2", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 1 and "hydra.sweep.dir already holds results" in proc.stderr, proc.stderr[-2000:]
    assert snapshot(sweep) == before


def test_train_refuses_a_setting_without_a_traceback(tmp_path):
    proc = cli("specdec.train", "optim.epochs=0", f"output_dir={tmp_path / 'train'}", cwd=tmp_path)
    assert proc.returncode == 1 and "error: ValueError: optim.epochs must be an integer >= 1, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_refuses_one_runs_directory(tmp_path, capsys):
    """python -m specdec.report <a run's directory> wrote a sweep summary among that run's files."""
    from specdec.report.sweep import main

    before = finished_run(tmp_path / "run", MAIN_JOB)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run")])
    assert "is one run's directory" in capsys.readouterr().err and snapshot(tmp_path / "run") == before


def test_a_refusal_prints_its_message_not_a_traceback_unless_asked(tmp_path):
    proc = cli("specdec.run", "drafter.k=0", f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 1 and "error: ValueError: drafter.k (lookahead) must be an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR=1 shows it" in proc.stderr
    assert json.loads((tmp_path / "a" / "results.json").read_text())["status"] == "failed"  # the record, traceback in
    proc = cli("specdec.run", "drafter.k=0", f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path, full_error=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "drafter.k (lookahead)" in proc.stderr


# --- refused before any model loads -----------------------------------------------------------------------------

@pytest.fixture
def no_model(monkeypatch):
    """The entry points' target loader (their job's) fails the test: a refusal must come before it."""
    import specdec.jobs.job

    def load_target(*args, **kwargs):
        raise AssertionError(f"a model was loaded ({args}): the refusal came too late")

    monkeypatch.setattr(specdec.jobs.job, "load_target", load_target)


def composed(entry: str, *overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(entry, overrides=list(overrides))


JOBS = {"run": run_main.run, "verify_dist": verify_main.run, "replay": replay_main.run}
CODE = ["target=gemma3", "data=code_text"]  # a target with another tokenizer than SmolLM2's


@pytest.mark.parametrize("entry, overrides, message", [
    # silent before: the value was checked only when the tokenizers differed
    ("run", ["drafter=cross_vocab", "drafter.cross_vocab=banana"],
     "drafter.cross_vocab must be one of ['auto', 'intersection', 'string', 'off'], got 'banana'"),
    ("run", ["drafter=cross_vocab", "drafter.cross_vocab=string"], "is the target itself ('smollm2-135m')"),
    ("run", ["drafter=cross_vocab"], "drafter.path='smollm2-135m-instruct' is the target itself"),
    ("verify_dist", ["drafter=cross_vocab"], "is the target itself"),
    # silent before: ran as if unset
    ("run", ["drafter.k=auto", "auto.ks=[]"], "auto.ks (the lookaheads drafter.k=auto tries) must be a non-empty list"),
    # blamed drafter.k, or named no setting
    ("run", ["drafter.k=auto", "auto.ks=[0]"], "auto.ks (the lookaheads drafter.k=auto tries)"),
    ("run", ["drafter.k=auto", "auto.prompts_per_source=0"], "auto.prompts_per_source must be an integer >= 1, got 0"),
    # a lossy rule passed verify_dist with exit status 0
    ("verify_dist", ["drafter=medusa", "drafter.acceptance=typical"], "is a LOSSY rule"),
    # after ~60 s of loading
    ("run", [*CODE, "drafter=cross_vocab", "drafter.cross_vocab=string", "sampling=sample"],
     "drafter.cross_vocab=string is exact under greedy decoding only"),
    ("run", ["target=gemma3"], "data.sources ['mtbench'] hold chat prompts, and this target's tokenizer has no chat"),
    ("verify_dist", ["target=gemma3"], "hold chat prompts"),
    ("replay", ["target=gemma3"], "hold chat prompts"),
    # another drafter's weights: a transformers traceback, or a complaint about draft_vocab first
    ("run", [*CODE, "drafter=cross_vocab", f"drafter.path={ASSETS / 'eagle' / 'smollm2-135m'}"],
     "holds an EAGLE drafter, not what drafter=draft_model reads; decode with it as drafter=eagle"),
    ("run", ["drafter=draft_model", f"drafter.path={ASSETS / 'medusa' / 'smollm2-135m'}"],
     "holds Medusa heads, not what drafter=draft_model reads"),
    ("run", ["drafter=eagle", f"drafter.path={ASSETS / 'dflash' / 'smollm2-135m'}"],
     "holds a block (DFlash-style) drafter, not what drafter=eagle reads"),
    ("run", ["drafter.k=0"], "drafter.k (lookahead) must be an integer >= 1 or 'auto', got 0"),
    # drafter.k=auto, the main job's default, where its replay cannot predict the run: refused naming a fixed k
    ("run", ["drafter=medusa", "drafter.acceptance=typical"], "is a lossy rule, and drafter.k=auto (the main job's"),
    ("run", ["drafter=eagle", "drafter.sampled=true", "drafter.lookup=0", "sampling=sample"],
     "which drafter.k=auto (the main job's default) cannot replay: give a fixed lookahead instead (drafter.k=<n>"),
    ("run", ["data.max_new_tokens=0"], "data.max_new_tokens must be an integer >= 1"),
    ("run", ["drafter.k=1000", "target.max_context=512"], "exceeds the model's context of 512 positions"),
    # refused after the target had loaded, before (the probe's own finds)
    ("run", ["data.max_prompt_tokens=0"], "data.max_prompt_tokens must be an integer >= 1"),
    ("run", ["data.sources=[]"], "data.sources is empty: give at least one prompt source"),
    ("run", ["drafter=medusa", "drafter.path=/nonexistent/heads"], "drafter.path='/nonexistent/heads': no such file"),
    ("run", ["drafter=eagle", "drafter.weight_bits=3"], "drafter.weight_bits must be 4, 8 or null"),
    ("run", ["drafter=medusa", "drafter.min_confidence=2"], "drafter.min_confidence must be a number in [0, 1)"),
    ("run", ["drafter=dflash", "drafter.lookup=-1"], "drafter.lookup (prompt-lookup nodes per tree) must be"),
    ("run", ["drafter=ngram", "drafter.max_ngram=0"], "need 1 <= min_ngram <= max_ngram"),
    ("run", ["drafter=draft_model", "drafter.confidence=1.5"], "drafter.confidence must be a number in [0, 1)"),
    ("verify_dist", ["samples_per_prompt=0"], "samples_per_prompt must be an integer >= 1, got 0"),
    ("verify_dist", ["significance=2"], "significance (the family-wise level) must lie in (0, 1)"),
    ("verify_dist", ["planted_bug=banana"], "unknown planted bug 'banana'"),
    ("verify_dist", ["detect_tv=-1"], "detect_tv (a TV distance) must lie in (0, 1]"),
    ("verify_dist", ["joint_tokens=-1"], "joint_tokens must be an integer >= 0, got -1"),
])
def test_refused_before_any_model_loads(no_model, entry, overrides, message):
    if entry == "verify_dist":
        cfg = composed(entry, *overrides)
    else:
        cfg = composed(entry, *overrides, *(["drafter.k=3"] if entry == "replay" else []))
    with pytest.raises((ValueError, OSError)) as err:  # OSError: a file or directory that is not there
        JOBS[entry](cfg)
    assert message in str(err.value)


def test_a_prompt_file_for_a_base_model_is_told_the_rows_kind(no_model, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"text": "def add(a, b):"}\n')
    with pytest.raises(ValueError, match='mark each row {"kind": "completion"}'):
        run_main.run(composed("run", "target=gemma3", f"data.sources=[{prompts}]"))
    prompts.write_text('{"text": "def add(a, b):", "kind": "completion"}\n')
    with pytest.raises(AssertionError, match="a model was loaded"):  # accepted: on to loading
        run_main.run(composed("run", "target=gemma3", f"data.sources=[{prompts}]"))


def test_a_non_utf8_prompt_file_is_named(no_model, tmp_path):
    prompts = tmp_path / "latin1.jsonl"
    prompts.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=f"prompt file '{prompts}' is not UTF-8 text"):
        run_main.run(composed("run", f"data.sources=[{prompts}]"))


def test_replay_log_dir_a_file_is_refused_before_the_logging_pass(no_model, tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="log_dir='.*afile' is a file, not a directory"):
        replay_main.run(composed("replay", "drafter=ngram", "drafter.k=2", f"log_dir={tmp_path / 'afile'}"))
    with pytest.raises(ValueError, match="auto.log_dir='.*afile' is a file"):
        run_main.run(composed("run", "drafter.k=auto", f"auto.log_dir={tmp_path / 'afile'}"))


# --- the engine and the Python API --------------------------------------------------------------------------------

class Asked(NgramDrafter):
    """Prompt lookup that records the lookahead each step asked it for."""

    def __init__(self):
        super().__init__()
        self.asked: list[int] = []

    def propose(self, state, k):
        self.asked.append(k)
        return super().propose(state, k)


def test_a_lookahead_beyond_the_tokens_left_is_capped(tiny_target):
    """drafter.k=1000 for 8 new tokens: the drafter is asked for 7 a step (it was asked for 1000, a hang with a draft
    model), and the output is plain decoding's."""
    from specdec.drafters.loading import drafter_config

    prompt = torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]])
    drafter = Asked()
    drafter.config = drafter_config("ngram", k=1000)  # as load_drafter builds it: a chain drafter's config
    out = speculative_generate(tiny_target, drafter, prompt, k=1000, max_new_tokens=8)
    assert drafter.asked and max(drafter.asked) == 7
    assert out.sequences == autoregressive_generate(tiny_target, prompt, max_new_tokens=8).sequences


@pytest.mark.parametrize("ids", [[[1, 2, 64]], [[1, -1, 2]]])
def test_token_ids_outside_the_vocabulary_are_named(tiny_target, ids):
    with pytest.raises(ValueError, match=r"outside the target's vocabulary of 64 \(0 .. 63\): \[-?\d+\]"):
        speculative_generate(tiny_target, NgramDrafter(), torch.tensor(ids), k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        autoregressive_generate(tiny_target, torch.tensor(ids), max_new_tokens=4)
    from specdec import compare

    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        compare(tiny_target, NgramDrafter(), ids, max_new_tokens=4, k=2, warmup=False)


# --- files -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dflash", "eagle", "medusa"])
def test_drafter_weights_holding_nan_are_refused_naming_the_file(tmp_path, kind):
    """Silent before: a block drafter of NaN weights ran at α nan, τ 1.00 and exit 0 (with 4-bit codes: "a block of 32
    weights spans nan", naming no file)."""
    from specdec.drafters.dflash.model import load_dflash
    from specdec.drafters.eagle.model import load_eagle
    from specdec.drafters.medusa.heads import load_heads

    copy = tmp_path / kind
    shutil.copytree(ASSETS / kind / "smollm2-135m", copy)
    weights = copy / ("heads.safetensors" if kind == "medusa" else "model.safetensors")
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    name = next(n for n, t in tensors.items() if t.is_floating_point() and t.dim() == 2)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(weights), metadata=metadata)
    load = {"dflash": lambda: load_dflash(copy), "eagle": lambda: load_eagle(copy),
            "medusa": lambda: load_heads(weights, hidden_size=576, vocab_size=49152)}[kind]
    with pytest.raises(CheckpointError, match=f"'{weights}' .*: {name} holds NaN or infinite values"):
        load()


def test_a_broken_replay_log_names_its_file_and_what_to_do(tmp_path):
    from specdec.replay.log import ReplayLog

    path = tmp_path / "ngram-abc.json"
    path.write_text('{"format": 1, "prompts": [')  # cut short mid-write
    with pytest.raises(ReplayMismatchError, match=f"replay log '{path}' cannot be read .*delete it and the next run"):
        ReplayLog.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ReplayMismatchError, match=f"'{path}' is not a replay log this specdec reads"):
        ReplayLog.load(path)


def test_a_foreign_replay_log_names_the_file_to_delete(tmp_path):
    from specdec.replay.log import ReplayLog

    log = ReplayLog(target={"name": "a"}, drafter={"name": "ngram"}, tokenizer=None, max_new_tokens=4,
                    temperature=0.0, eos=[0], k_max=4, tree=False, prompts=[])
    path = log.save(tmp_path / "ngram-abc.json")
    with pytest.raises(ReplayMismatchError, match=f"written for another target.*delete '{path}' and the next run"):
        ReplayLog.load(path).check(target={"name": "b"}, path=path)


def test_export_of_a_drafter_without_an_export_says_why(tmp_path, capsys):
    from specdec.export import main

    assert main(["dflash", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot export 'dflash'" in err and "own draft-vocabulary LM head" in err and "draft_model or eagle" in err
    assert not (tmp_path / "out").exists()


def test_a_lossy_drafter_allowed_and_not_rejected_never_exits_0(monkeypatch, tmp_path):
    """verify_dist drafter=medusa drafter.acceptance=typical exited 0 with PASS: a CI gate on the exit status passed
    a lossy drafter. Refused unless allow_lossy=true (above); then a run that does not reject it exits 5."""
    from types import SimpleNamespace

    cfg = composed("verify_dist", "drafter=medusa", "drafter.acceptance=typical", "allow_lossy=true", "plot=false")
    assert verify_main.check_lossy(cfg) is True
    monkeypatch.setattr(verify_main, "summary_text", lambda report: "")
    for lossy, verdict, code in ((True, 0, verify_main.EXIT_LOSSY_PASSED), (True, 3, 3), (False, 0, 0)):
        monkeypatch.setattr(verify_main, "run", lambda cfg: SimpleNamespace(
            report={"lossy_drafter": lossy, "exit_code": verdict}))
        assert verify_main._main(cfg, tmp_path / f"{lossy}{verdict}.json") == code
