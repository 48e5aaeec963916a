"""Reading the safetensors files a user can point specdec at (drafter weights, training checkpoints,
cached training data), with errors that name the file and say what to do.

safetensors' own errors ("Error while deserializing header: header too large") name neither the file nor
the remedy; every reader of a user-supplied file goes through :func:`read_metadata` and :func:`read_tensors`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from specdec.errors import CheckpointError


def _unreadable(path: Path, what: str, hint: str, exc: Exception) -> CheckpointError:
    return CheckpointError(f"{str(path)!r} is not a {what} written by specdec, or it is truncated or corrupt "
                           f"(safetensors: {exc}); {hint}")


def read_metadata(path: str | Path, *, what: str, hint: str) -> dict[str, str]:
    """The string metadata of the safetensors file at ``path`` (empty if it has none). ``what`` names the
    kind of file expected (e.g. "Medusa heads file") and ``hint`` what to do instead; both go into the
    :class:`~specdec.errors.CheckpointError` raised when the file is not a readable safetensors file."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, what, hint, exc) from exc


def read_tensors(path: str | Path, *, what: str, hint: str) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors file at ``path``; errors as in :func:`read_metadata` (a file whose
    header reads but whose data is cut short fails here)."""
    path = Path(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, what, hint, exc) from exc
