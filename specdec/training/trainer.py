"""Train a learned drafter end to end: data → model → loop → held-out evaluation → files.

Every method runs through :func:`train`; what differs (model, loss, evaluation, weight file) comes from
its :class:`~specdec.training.methods.TrainMethod`. In ``output_dir``: ``data.safetensors`` (the
self-distillation store, reused), ``prompts.jsonl``, ``checkpoints/``, the method's weight file and
``metrics.json``; with ``export``, the weight file and ``provenance.json`` there too. A finished run's metrics
hold ``decode_command``: the main job's command that decodes with what it wrote (:func:`decode_command`).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specdec.jobs.io import write_json
from specdec.training.distill.store import Split, build_processes, build_seconds, data_key, load_or_build
from specdec.training.export import check_export, export, export_dtype, git_commit, plain
from specdec.training.loop import check_data, fit
from specdec.training.methods import TrainMethod, build_method


def check_config(cfg: Any) -> None:
    """Refuse bad values before any work (data, training) is done."""
    export_dtype(cfg.export_dtype)
    check_export(cfg)
    if not 0.0 <= cfg.data.magpie_fraction <= 1.0:
        raise ValueError(f"data.magpie_fraction must be in [0, 1], got {cfg.data.magpie_fraction}")
    if cfg.data.prompts_file is not None:
        if not Path(cfg.data.prompts_file).is_file():
            raise ValueError(f"data.prompts_file={cfg.data.prompts_file!r} is not a file; write one with python -m "
                             f"specdec.training.distill.prompts --num {cfg.data.num_prompts} --out prompts.jsonl")
        if cfg.data.mode != "self_distill" or cfg.data.magpie_fraction:
            raise ValueError(f"data.prompts_file replaces the generated prompts of data.mode=self_distill; got "
                             f"data.mode={cfg.data.mode!r}, data.magpie_fraction={cfg.data.magpie_fraction} (set "
                             f"them to self_distill and 0, or data.prompts_file=null)")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in [0, 1), got {cfg.data.val_fraction}")
    at_least = {"optim.epochs": 1, "optim.batch_size": 1, "optim.warmup_steps": 0, "data.num_prompts": 1,
                "data.max_new_tokens": 1, "data.batch_size": 1, "data.feature_batch": 1, "data.text_seq_len": 2,
                "data.skip_first": 0, "eval.limit_per_source": 1, "eval.max_new_tokens": 1, "save_every": 1,
                "log_every": 1}
    for name, low in at_least.items():
        section, _, field = name.rpartition(".")
        value = getattr(getattr(cfg, section) if section else cfg, field)
        if value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value}")
    if not cfg.optim.lr > 0:
        raise ValueError(f"optim.lr must be > 0, got {cfg.optim.lr}")
    if cfg.optim.weight_decay < 0:
        raise ValueError(f"optim.weight_decay must be >= 0, got {cfg.optim.weight_decay}")
    if cfg.stop_after_steps is not None and cfg.stop_after_steps < 0:
        raise ValueError(f"stop_after_steps must be null (train to the end) or >= 0 (0: build the data only), "
                         f"got {cfg.stop_after_steps}")
    if cfg.stop_after_s is not None and not cfg.stop_after_s >= 0:
        raise ValueError(f"stop_after_s must be null (no wall limit) or >= 0 seconds, got {cfg.stop_after_s}")


def train(cfg: Any, target=None, tokenizer=None) -> dict[str, Any]:
    """Build (or load) the data, train (or resume), evaluate, export. Returns the metrics.

    ``cfg``: a :class:`~specdec.training.config.TrainConfig`. ``target``/``tokenizer``: an already loaded
    model (tests); default: ``load_target(cfg.target.name)``."""
    from accelerate import Accelerator

    from specdec.models.loading import load_target

    invoked = time.perf_counter()  # stop_after_s counts from here
    check_config(cfg)
    code = git_commit()  # the code this invocation runs (the provenance's commit, not the one at export time)
    method = build_method(cfg.method)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = train_device(cfg.target.device, target)
    # cpu: processes launched together (torchrun, accelerate launch) form one CPU group (gloo); left False without a
    # GPU, each would run alone as its own single process. On CUDA each process takes its own GPU.
    accelerator = Accelerator(cpu=device.type == "cpu", log_with="wandb" if cfg.logger.name == "wandb" else None)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    times: dict[str, Any] = {}
    start = time.perf_counter()
    if target is None:
        target, tokenizer = load_target(cfg.target.name, dtype=cfg.target.dtype, device=accelerator.device)
    elif target.device != accelerator.device:
        target = target.to(accelerator.device)
    target.requires_grad_(False)
    method.check_target(target)
    data = data_key(cfg, method.needs())
    check_data(out_dir, data)  # a checkpoint of data configured otherwise: refused before the data are built
    # each process builds its share of the data, the main process merges them into the store
    splits = load_or_build(cfg, target, tokenizer, method.needs(), out_dir / "data.safetensors", accelerator)
    times["data_s"] = time.perf_counter() - start
    times["data_build_s"] = build_seconds(out_dir / "data.safetensors")  # when it was built
    model = method.setup(target, splits, accelerator.device)
    if cfg.logger.name == "wandb":
        accelerator.init_trackers(cfg.logger.project, config=plain(cfg),
                                  init_kwargs={"wandb": {"mode": cfg.logger.mode, "name": cfg.run_name}})
    evaluate = (lambda m: method.evaluate(m, splits)) if cfg.eval_every_epoch else None
    deadline = None if cfg.stop_after_s is None else invoked + cfg.stop_after_s
    model, progress = fit(method, model, cfg, accelerator, out_dir, evaluate, deadline, data)
    times["train_s"] = progress.train_s  # over every invocation of this run
    if progress.first_step:
        times["resumed_at_step"] = progress.first_step
    metrics: dict[str, Any] = {"step": progress.step, "total_steps": progress.total, "device": str(accelerator.device),
                               "data_processes": build_processes(out_dir / "data.safetensors"), "git_commit": code,
                               "finished": progress.step >= progress.total, **method.summary(), "times_s": times,
                               **({"per_epoch": progress.history} if progress.history else {})}
    if progress.step >= progress.total and accelerator.is_main_process:
        chat = bool(getattr(tokenizer, "chat_template", None))
        _evaluate_and_save(method, accelerator.unwrap_model(model).eval(), cfg, splits, metrics, chat)
        accelerator.log(method.log_values(metrics), step=progress.total)
    accelerator.end_training()
    return metrics


def train_device(name: str, target=None) -> torch.device:
    """The device training runs on, from ``target.device``: ``auto`` is CUDA where present (else CPU), or the
    device of an already loaded ``target`` (tests); ``cpu`` keeps a GPU machine's run on its CPU; ``cuda`` without a
    GPU is refused here, before any work."""
    from specdec.models.loading import resolve_device

    if name == "auto" and target is not None:
        return target.device
    return resolve_device(name)


def _evaluate_and_save(method: TrainMethod, model: torch.nn.Module, cfg: Any, splits: dict[str, Split],
                       metrics: dict[str, Any], chat: bool = True) -> None:
    """Held-out evaluation into ``metrics``; the weight file and metrics.json in output_dir; the export."""
    start = time.perf_counter()
    metrics.update(method.evaluate(model, splits))
    metrics["score"] = method.score(metrics)
    metrics["times_s"]["eval_s"] = time.perf_counter() - start
    metrics["decode_command"] = decode_command(cfg, method, metrics, chat)
    method.save(model, Path(cfg.output_dir) / method.weights_file, cfg.target.name, metrics)
    write_json(Path(cfg.output_dir) / "metrics.json", metrics)
    if cfg.export:
        export(Path(cfg.export), method, model, cfg, metrics, splits)


def decode_command(cfg: Any, method: TrainMethod, metrics: dict[str, Any], chat: bool = True) -> str:
    """``python -m specdec.run`` decoding with what this run wrote: the drafter of the method's name at the run's
    export (else its output_dir), for its target (its preset, ``target=gemma3``, where one names it), with the
    settings the trained drafter needs (:meth:`~specdec.training.methods.TrainMethod.decode_overrides`), on
    completion prompts (``data=code_text``) for a target without a chat template; run from where training ran."""
    from specdec.config import TargetConfig, config_dir

    overrides = [f"drafter={method.name}", f"drafter.path={cfg.export or cfg.output_dir}"]
    if cfg.target.name != TargetConfig.name:
        presets = [p.stem for p in sorted((Path(config_dir()) / "target").glob("*.yaml"))
                   if OmegaConf.load(p).get("name") == cfg.target.name]
        overrides.append(f"target={presets[0]}" if presets else f"target.name={cfg.target.name}")
    if not chat:
        overrides.append("data=code_text")
    return " ".join(["python -m specdec.run", *map(shlex.quote, overrides + method.decode_overrides(metrics))])
