"""The one training loop: AdamW with linear warm-up then cosine decay, Accelerate for one CPU or many GPUs,
resumable checkpoints.

The data order is a function of (seed, epoch), and each process takes its share of every batch, so a
resumed run reproduces the uninterrupted one bit for bit. Checkpoints are written every ``save_every``
steps, at the end, and on Ctrl-C; resuming with other training settings is refused. Held-out figures can
be recorded after every epoch (``eval_every_epoch``): they can peak before the loss stops improving.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.errors import CheckpointError
from specdec.training.checkpoint import latest_state, load_checkpoint, save_checkpoint
from specdec.training.methods.base import TrainMethod

log = logging.getLogger(__name__)


@dataclass
class Progress:
    step: int  # optimiser steps taken, over every invocation of this run
    total: int  # steps of the whole run
    first_step: int  # where this invocation started (0, or the checkpoint it resumed from)
    train_s: float  # training seconds over every invocation of this run
    history: list[dict[str, Any]] = field(default_factory=list)  # held-out figures after each epoch, if asked


def lr_at(step: int, total: int, cfg: Any) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def batch_indices(num_examples: int, step: int, steps_per_epoch: int, cfg: Any, accelerator) -> torch.Tensor:
    """This process's share of step ``step``'s batch: a slice of the epoch's permutation (seeded by epoch)."""
    epoch, i = divmod(step, steps_per_epoch)
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
    idx = order[i * cfg.optim.batch_size: (i + 1) * cfg.optim.batch_size]
    return idx[accelerator.process_index:: accelerator.num_processes]


def fit(method: TrainMethod, model: torch.nn.Module, cfg: Any, accelerator, out_dir: Path,
        evaluate: Callable[[torch.nn.Module], dict[str, Any]] | None = None,
        deadline: float | None = None, data: str | None = None) -> tuple[torch.nn.Module, Progress]:
    """Train ``model`` (resuming from ``out_dir``'s latest checkpoint) until the run's last step, or for
    ``cfg.stop_after_steps`` steps of this invocation, or until ``time.perf_counter()`` passes ``deadline`` (checked
    between steps, the same verdict on every process). Returns the prepared model and where it stands.
    ``evaluate``: model -> held-out figures, recorded after every epoch (:attr:`Progress.history`). ``data``: the
    digest of the data's configuration (:func:`~specdec.training.distill.store.data_key`), kept in each checkpoint
    (:func:`check_data` compares it before the data are built)."""
    optimizer = torch.optim.AdamW(method.param_groups(model), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    run = {"method": method.run_config(), "seed": cfg.seed, "optim": dict(vars(cfg.optim))}
    check_data(out_dir, data)
    first_step = load_checkpoint(out_dir, model, optimizer, expect=run)
    before = latest_state(out_dir)  # what earlier invocations of this run recorded
    trained_before = before.get("train_s", 0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps_per_epoch = math.ceil(method.num_examples() / cfg.optim.batch_size)
    progress = Progress(first_step, cfg.optim.epochs * steps_per_epoch, first_step, trained_before,
                        before.get("history", []))
    start = time.perf_counter()
    saved = first_step

    def checkpoint() -> None:
        nonlocal saved
        accelerator.wait_for_everyone()
        progress.train_s = trained_before + time.perf_counter() - start
        if accelerator.is_main_process and progress.step > saved:
            save_checkpoint(out_dir, progress.step, accelerator.unwrap_model(model), optimizer,
                            {"total_steps": progress.total, "run": run, "train_s": progress.train_s,
                             "history": progress.history, **({"data": data} if data is not None else {})})
        saved = progress.step

    model.train()
    try:
        while progress.step < progress.total and (cfg.stop_after_steps is None
                                                  or progress.step - first_step < cfg.stop_after_steps):
            if deadline is not None and _past(deadline, accelerator):
                log.info("stopping at step %d of %d: stop_after_s=%s reached", progress.step, progress.total,
                         cfg.stop_after_s)
                break
            _step(method, model, optimizer, cfg, accelerator, progress, steps_per_epoch)
            if evaluate is not None and progress.step % steps_per_epoch == 0:
                _after_epoch(method, model, evaluate, accelerator, progress, steps_per_epoch)
            if progress.step % cfg.save_every == 0 or progress.step == progress.total:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()  # nothing trained so far is lost; rerun the same command to resume
        raise
    checkpoint()
    return model, progress


def check_data(out_dir: Path, data: str | None) -> None:
    """Refuse to resume ``out_dir``'s latest checkpoint on data configured otherwise than it recorded (``data``, a
    :func:`~specdec.training.distill.store.data_key`): where the data are built again (a fresh GPU machine), not only
    where the stored data file says so. Called before the data are built; a checkpoint recording none passes."""
    recorded = latest_state(out_dir).get("data", data)
    if data is not None and recorded != data:
        raise CheckpointError(f"the checkpoint in {str(out_dir / 'checkpoints')!r} was trained on data configured "
                              f"otherwise (data.*, eval.*, the prompts file's content, the target, the seed); resume "
                              f"with the settings it was written with, or delete that folder to start over")


def _past(deadline: float, accelerator) -> bool:
    """Whether any process is past ``deadline``: one verdict for all of them (they step together)."""
    past = time.perf_counter() > deadline
    if accelerator.num_processes == 1:
        return past
    return bool(accelerator.gather(torch.tensor([float(past)], device=accelerator.device)).max().item())


def _step(method: TrainMethod, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, accelerator,
          progress: Progress, steps_per_epoch: int) -> None:
    idx = batch_indices(method.num_examples(), progress.step, steps_per_epoch, cfg, accelerator)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(progress.step, progress.total, cfg.optim) * group.get("lr_scale", 1.0)
    loss, logged = method.loss(model, idx)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    progress.step += 1
    if progress.step % cfg.log_every == 0 or progress.step == progress.total:
        log.info("step %d/%d loss %.4f %s", progress.step, progress.total, float(loss.detach()),
                 {k: round(v, 3) for k, v in logged.items()})
        accelerator.log({"loss": float(loss.detach()), **logged, "lr": optimizer.param_groups[0]["lr"]},
                        step=progress.step)


def _after_epoch(method: TrainMethod, model: torch.nn.Module, evaluate: Callable[[torch.nn.Module], dict[str, Any]],
                 accelerator, progress: Progress, steps_per_epoch: int) -> None:
    """Held-out figures of the model as it stands (they can peak before the loss does), logged and kept."""
    unwrapped = accelerator.unwrap_model(model).eval()
    metrics = evaluate(unwrapped)
    model.train()
    values = {"score": method.score(metrics), **method.log_values(metrics)}
    progress.history.append({"epoch": progress.step // steps_per_epoch, "step": progress.step, **values})
    log.info("epoch %d: held-out score %.4f", progress.step // steps_per_epoch, values["score"])
    accelerator.log({f"epoch/{k}": v for k, v in values.items()}, step=progress.step)
