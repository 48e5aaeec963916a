"""The job layer every Hydra entry point shares (``python -m specdec.run``, ``specdec.verify_dist``): the
config fields a results file carries, the machine line, the logger check, and one failure rule.

The failure rule (:func:`run_task`): a job that fails still leaves its results file (status "failed", the
error, the traceback, the config fields), so a sweep's summary lists it with its error. Run alone, the job
then raises; in a multirun it returns ``failure_value`` instead, since an escaping exception would make
Hydra skip the summary callback at the end (which exits 1 when any run failed).

Earlier results are never replaced: a run (or sweep) pointed at a directory that already holds results of any
entry point (:data:`RESULT_FILES`: a main job's, verify_dist's, replay's, a sweep's summary, a training run's data,
checkpoints or metrics) or the record of an earlier run (its ``.hydra/``) is refused before Hydra writes anything
there (:class:`KeepEarlierResults`, in every entry point's config), and :func:`run_task` checks again, and that
the results file can be written at all, before any work.

A job that fails on a bad setting or file (a ``ValueError`` or ``OSError``: every refusal of specdec's) prints its
message alone, without the traceback (kept in the results file); ``HYDRA_FULL_ERROR=1`` shows it as Hydra does.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specdec.jobs.io import write_json

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# Config fields every results file carries, failed or not, with where they live in the job's config.
CONFIG_KEYS = {
    "target": "target.name",
    "drafter": "drafter.name",
    "k": "drafter.k",
    "temperature": "sampling.temperature",
    "top_k": "sampling.top_k",
    "top_p": "sampling.top_p",
    "seed": "sampling.seed",
    "sources": "data.sources",
    "max_new_tokens": "data.max_new_tokens",
    "batch_size": "data.batch_size",
}
LOGGERS = ("none", "wandb")


def hydra_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job ([] when called from Python)."""
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra
        return []


def config_fields(cfg: DictConfig, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """:data:`CONFIG_KEYS` read from ``cfg`` (None where absent) and the job's overrides."""
    fields = {}
    for key, where in CONFIG_KEYS.items():
        try:
            value = OmegaConf.select(cfg, where, default=None)
        except Exception:  # an interpolation that cannot resolve outside its job (e.g. ${hydra:...})
            value = None
        fields[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    fields["overrides"] = list(hydra_overrides() if overrides is None else overrides)
    return fields


def failed_result(cfg: DictConfig, error: BaseException | str, overrides: Sequence[str] | None = None) -> dict:
    """A failed job's results file: status, error ("ExceptionType: message") and the config fields."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    return {"status": "failed", "error": error, **config_fields(cfg, overrides)}


def machine_description(device: torch.device | str = "cpu") -> str:
    """The line every figure is reported with: the GPU's name, or the CPU's model and thread count."""
    import torch  # here: a sweep's summary and the report use this module without torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), and whether it has AVX-512 / bf16 / AMX instructions."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = info.splitlines()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags] or (["avx2"] if "avx2" in flags else [])
    return f"{name} ({', '.join(isa) or 'no AVX2'})"


def check_logger(cfg: DictConfig) -> None:
    """Checked before any work: a misspelt logger must not cost a whole run."""
    if cfg.logger.name not in LOGGERS:
        raise ValueError(f"logger.name must be one of {LOGGERS}, got {cfg.logger.name!r}")


# What any entry point leaves in its directory: the main job's and replay's results, verify_dist's, a sweep's summary
# (report), a training run's data store, prompts, checkpoints and metrics, an export's provenance.
RESULT_FILES = ("results.json", "verify.json", "summary.csv", "summary.md", "data.safetensors", "prompts.jsonl",
                "checkpoints", "metrics.json", "provenance.json")
RUN_RECORD = ".hydra"  # Hydra's record of the run that wrote a directory's results (config, overrides)


def earlier_results(directory: str | Path, results_file: str, *, sweep: bool = False, record: bool = False,
                    own: Sequence[str] = ()) -> list[Path]:
    """What earlier runs left in ``directory``: its ``results_file`` and any of :data:`RESULT_FILES` but ``own``
    (what the entry point itself resumes from: a training run's), with ``record`` an earlier run's ``.hydra/``
    too; with ``sweep``, the same one level down (the sweep's jobs) as well."""
    directory = Path(directory)
    names = [name for name in dict.fromkeys([results_file, *RESULT_FILES]) if name not in own]
    names += [RUN_RECORD] if record and RUN_RECORD not in own else []
    found = [directory / name for name in names if (directory / name).exists()]
    if sweep:
        found += sorted(path for name in names for path in directory.glob(f"*/{name}"))
    return found


def _kept_message(found: list[Path], key: str) -> str:
    shown = ", ".join(str(path) for path in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"{key} already holds results ({shown}); nothing was run and they are kept. Leave {key} to its "
            f"default (a new timestamped directory), choose another, or move those files away to run there again")


class KeepEarlierResults(Callback):
    """Hydra callback: refuse a run whose ``hydra.run.dir`` (or a multirun whose ``hydra.sweep.dir``) already
    holds results or an earlier run's record (:func:`earlier_results`), or cannot be written, before Hydra writes
    its own files there. ``own``: names the entry point resumes from and may find (train's checkpoints). Exits with
    status 1 and the reason (Hydra's callback runner lets SystemExit through, and only warns about other
    exceptions)."""

    def __init__(self, own: Sequence[str] = (), key: str = "hydra.run.dir") -> None:
        self.own, self.key = tuple(own), key

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir, results_file = Path(config.hydra.run.dir), _results_file(config)
        results = run_dir / results_file  # a results_file with a directory of its own: that one is checked too
        if results.parent.resolve() != run_dir.resolve() and (found := earlier_results(results.parent, results.name)):
            raise SystemExit(_kept_message(found, "results_file"))
        _claim(run_dir, self.key, earlier_results(run_dir, results.name, record=True, own=self.own))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _claim(config.hydra.sweep.dir, "hydra.sweep.dir",
               earlier_results(config.hydra.sweep.dir, _results_file(config), sweep=True, record=True, own=self.own))


def _results_file(config: DictConfig) -> str:
    return config.get("results_file") or RESULT_FILES[0]  # train writes metrics.json, one of RESULT_FILES


def try_writing(directory: str | Path) -> None:
    """Create ``directory`` if need be and write a temporary file there: an OSError where that cannot be done."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
        pass


def _claim(directory: str, key: str, found: list[Path]) -> None:
    if found:
        raise SystemExit(_kept_message(found, key))
    try:
        try_writing(directory)
    except OSError as exc:
        raise SystemExit(f"{key}={directory!r} cannot be written ({exc}); choose a directory you can write to")


def check_results_path(results_path: Path, results_file: str, run_dir: Path | None = None) -> None:
    """Before any work: ``results_path``'s directory and the run's own ``run_dir`` hold no earlier results (they are
    never replaced, not even by this run's failure record) and the former can be written."""
    found = earlier_results(results_path.parent, results_path.name)  # this run's .hydra/ is there by now
    if run_dir is not None and Path(run_dir).resolve() != results_path.parent.resolve():
        found += earlier_results(run_dir, results_path.name)
    if found:
        raise FileExistsError(_kept_message(found, "the run's output directory"))
    try:
        try_writing(results_path.parent)
    except OSError as exc:
        raise ValueError(f"results_file={results_file!r}: cannot write into {str(results_path.parent)!r} ({exc}); "
                         f"set results_file to a name (or path) in a writable directory") from exc


def refuse_briefly(exc: BaseException, where: str | Path | None = None) -> None:
    """Outside a multirun: a bad setting or file (``ValueError``, ``OSError``) exits 1 with its message alone (the
    traceback is ``where``, or with ``HYDRA_FULL_ERROR=1`` shown as Hydra shows it); other errors go on up."""
    if isinstance(exc, (ValueError, OSError)) and os.environ.get("HYDRA_FULL_ERROR") != "1":
        kept = f"the traceback is in {where}; " if where else ""
        raise SystemExit(f"error: {type(exc).__name__}: {exc}\n({kept}HYDRA_FULL_ERROR=1 shows it here)") from None


def run_task(cfg: DictConfig, task: Callable[[DictConfig, Path], T], *, failure_value: T,
             extra_failure_fields: dict[str, Any] | None = None) -> T:
    """Run ``task(cfg, results_path)`` under the failure rule of the module docstring; ``results_path`` is
    ``cfg.results_file`` in the job's output directory. Earlier results there, or a directory that cannot be
    written, fail before any work without writing anything (:func:`check_results_path`)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    results_path = run_dir / cfg.results_file
    try:
        check_results_path(results_path, cfg.results_file, run_dir)
    except (OSError, ValueError) as exc:  # nothing was written: no failure record either
        refuse_briefly(exc)
        raise
    try:
        check_logger(cfg)
        return task(cfg, results_path)
    except Exception as exc:
        write_json(results_path, {**failed_result(cfg, exc), **(extra_failure_fields or {}),
                                  "traceback": traceback.format_exc()})
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            refuse_briefly(exc, results_path)
            raise
        print(f"job failed: {type(exc).__name__}: {exc} (details in {results_path})", file=sys.stderr)
        return failure_value
