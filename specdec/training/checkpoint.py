"""Resumable training checkpoints: safetensors (never pickle), written atomically.

``<output_dir>/checkpoints/step-N/`` holds ``model.safetensors``, ``optimizer.safetensors`` and
``state.json`` (step, optimiser groups, the run's training settings, training seconds and per-epoch
held-out figures so far). It is
written to a temporary directory and renamed into place, then published by atomically rewriting
``checkpoints/latest``; older steps are removed only after that. A crash at any point leaves the previous
checkpoint intact and current.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specdec.errors import CheckpointError
from specdec.jobs.io import read_json_object, read_tensors

FORMAT = "specdec-train-1"


def save_checkpoint(directory: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    meta: dict[str, Any]) -> None:
    """Write checkpoints/step-N (tmp dir + rename), then point checkpoints/latest at it (tmp file + replace)."""
    root = directory / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{step}", root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(_unaliased(model.state_dict()), str(tmp / "model.safetensors"))
    state = optimizer.state_dict()
    tensors = {f"{pid}.{key}": v.detach().cpu().contiguous() for pid, st in state["state"].items()
               for key, v in st.items() if torch.is_tensor(v)}
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"format": FORMAT, "step": step, "param_groups": state["param_groups"],
                                                **meta}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    for old in root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def _unaliased_names(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of ``state`` with each tensor once: of a tensor under two names (tied embeddings and LM
    head) the first, as safetensors refuses shared memory; :func:`load_checkpoint` restores it under both."""
    seen, names = set(), []
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


def _unaliased(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: state[name].detach().cpu().contiguous() for name in _unaliased_names(state)}


def _latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The latest checkpoint's directory and state, or None without one. Raises CheckpointError for a checkpoint
    of another format, or one whose ``latest`` or ``state.json`` is missing or unreadable."""
    root = directory / "checkpoints"
    latest = root / "latest"
    if not latest.is_file():
        return None
    ckpt = root / latest.read_text().strip()
    state = ckpt / "state.json"
    if not state.is_file():
        raise CheckpointError(f"{str(latest)!r} names the checkpoint {str(ckpt)!r}, which has no state.json; "
                              f"{_restart_hint(directory, ckpt)}")
    meta = read_json_object(state, what="a checkpoint's state", hint=_restart_hint(directory, ckpt))
    if meta.get("format") != FORMAT:
        written_by = (f"format {meta['format']!r}" if "format" in meta else
                      "`python -m specdec.train_medusa` before the training package")
        raise CheckpointError(f"the checkpoint in {str(ckpt)!r} was written by {written_by} and is not resumed by "
                              f"this version ({FORMAT!r}); finish that run with the version that wrote it, or delete "
                              f"{str(root)!r} to train from the start, or use another run_name (or output_dir)")
    if not {"step", "param_groups"} <= set(meta):
        raise CheckpointError(f"{str(state)!r} lacks {sorted({'step', 'param_groups'} - set(meta))}: truncated or "
                              f"corrupt; {_restart_hint(directory, ckpt)}")
    return ckpt, meta


def _restart_hint(directory: Path, bad: Path) -> str:
    """What to do about the unusable checkpoint ``bad``: resume from an older complete one where one is left
    (a crash between publishing a step and pruning the one before), else start the run over."""
    root = directory / "checkpoints"
    older = sorted((p for p in root.glob("step-*") if p != bad and (p / "state.json").is_file()
                    and p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    if older:
        return (f"to resume from {str(older[-1])!r} instead, delete {str(bad)!r} and write {older[-1].name!r} into "
                f"{str(root / 'latest')!r}; or delete {str(root)!r} to start the run over")
    return (f"no other checkpoint is left: delete {str(root)!r} to start the run over (the built data, "
            f"{str(directory / 'data.safetensors')!r}, is kept and reused)")


def load_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    expect: dict[str, Any] | None = None) -> int:
    """Restore the latest checkpoint into ``model`` and ``optimizer``; return its step (0 if none).
    ``expect``: the training settings the checkpoint must have been written with."""
    found = _latest(directory)
    if found is None:
        return 0
    ckpt, meta = found
    if expect is not None and meta.get("run") != expect:
        raise CheckpointError(f"the checkpoint in {str(ckpt)!r} was written with another training configuration "
                              f"({meta.get('run')} vs {expect}); use another run_name (or output_dir), or delete "
                              f"{str(directory / 'checkpoints')!r} to start over")
    hint = _restart_hint(directory, ckpt)
    tensors = read_tensors(ckpt / "model.safetensors", what="training checkpoint", hint=hint)
    expected = set(_unaliased_names(model.state_dict()))
    if set(tensors) != expected:
        raise CheckpointError(f"the checkpoint in {str(ckpt)!r} holds other weights than this model "
                              f"({sorted(set(tensors) ^ expected)[:6]} differ); {hint}")
    model.load_state_dict(tensors, strict=False)  # aliases of a loaded tensor are loaded with it
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in read_tensors(ckpt / "optimizer.safetensors", what="training checkpoint", hint=hint).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return int(meta["step"])


def latest_state(directory: Path) -> dict[str, Any]:
    """The latest checkpoint's ``state.json`` (step, training seconds, per-epoch figures...); {} without one."""
    found = _latest(directory)
    return {} if found is None else found[1]
