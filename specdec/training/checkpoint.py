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

from specdec.io import read_tensors

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
    """The latest checkpoint's directory and state, or None without one. Raises ValueError for a checkpoint
    of another format."""
    latest = directory / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    ckpt = directory / "checkpoints" / latest.read_text().strip()
    meta = json.loads((ckpt / "state.json").read_text())
    if meta.get("format") != FORMAT:
        written_by = (f"format {meta['format']!r}" if "format" in meta else
                      "`python -m specdec.train_medusa` before the training package")
        raise ValueError(f"the checkpoint in {str(ckpt)!r} was written by {written_by} and is not resumed by this "
                         f"version ({FORMAT!r}); finish that run with the version that wrote it, or delete "
                         f"{str(directory / 'checkpoints')!r} to train from the start, or use another run_name "
                         f"(or output_dir)")
    return ckpt, meta


def load_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    expect: dict[str, Any] | None = None) -> int:
    """Restore the latest checkpoint into ``model`` and ``optimizer``; return its step (0 if none).
    ``expect``: the training settings the checkpoint must have been written with."""
    found = _latest(directory)
    if found is None:
        return 0
    ckpt, meta = found
    if expect is not None and meta.get("run") != expect:
        raise ValueError(f"the checkpoint in {str(ckpt)!r} was written with another training configuration "
                         f"({meta.get('run')} vs {expect}); use another run_name, or delete the directory to "
                         f"start over")
    hint = f"delete the checkpoint directory {str(ckpt)!r} to resume from the one before it, or start over"
    tensors = read_tensors(ckpt / "model.safetensors", what="training checkpoint", hint=hint)
    expected = set(_unaliased_names(model.state_dict()))
    if set(tensors) != expected:
        raise ValueError(f"the checkpoint in {str(ckpt)!r} holds other weights than this model "
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
