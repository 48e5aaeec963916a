"""Files in and out: reading the safetensors files a user can point specdec at (drafter weights, training
checkpoints, cached training data) with errors that name the file and say what to do, and the one atomic
writer (temp file beside the target, then a rename) every results file, summary, plot and export uses,
and its directory form (:func:`atomic_dir`) for exports written by other libraries' ``save_pretrained``.

safetensors' own errors ("Error while deserializing header: header too large") name neither the file nor
the remedy; every reader of a user-supplied file goes through :func:`read_metadata` and :func:`read_tensors`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from safetensors import SafetensorError, safe_open

from specdec.errors import CheckpointError

if TYPE_CHECKING:
    import torch


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


def read_tensors(path: str | Path, *, what: str, hint: str, finite: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors file at ``path``; errors as in :func:`read_metadata` (a file whose
    header reads but whose data is cut short fails here). ``finite``: weights, refused (naming the file and the
    tensor) where one holds NaN or infinite values, which would draft nothing and say nothing."""
    import torch  # here, not at the top: the report's modules write files through this one without torch
    from safetensors.torch import load_file

    path = Path(path)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, what, hint, exc) from exc
    for name, tensor in tensors.items() if finite else ():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{str(path)!r} ({what}): {name} holds NaN or infinite values (a training run "
                                  f"that diverged, or a corrupt file); {hint}")
    return tensors


def read_json_object(path: str | Path, *, hint: str, what: str = "a JSON object") -> dict[str, Any]:
    """The JSON object in the file at ``path``; a :class:`~specdec.errors.CheckpointError` naming the file and
    ``hint`` (what to do) when it cannot be read, is not JSON (truncated, corrupt) or holds something else
    than an object (``what`` names what it should hold)."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{str(path)!r} is not readable JSON ({exc}): truncated or corrupt; {hint}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{str(path)!r} holds a JSON {type(value).__name__}, not {what}; {hint}")
    return value


# --- atomic writes: a crash mid-write never leaves a truncated results file, summary or plot ---------------


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Any], None], binary: bool = False) -> Path:
    """Write through ``write(file)`` into a temp file beside ``path``, then rename it over ``path``. The file
    gets the permissions a plain ``open`` would give it (mkstemp's are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Fill the yielded temporary directory beside ``path``; on success it replaces ``path`` (a directory
    already there is moved aside, then removed), on failure it is removed and ``path`` is left as it was. The
    directory gets a plain ``mkdir``'s permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / path.name)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # the directory that was there goes back
                os.replace(old / path.name, path)
                old.rmdir()
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text))


def write_json(path: str | Path, obj: Any) -> Path:
    """JSON with indent 2; values JSON lacks (paths, dtypes) are written as their str()."""
    return atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, default=str) + "\n"))


def save_figure(fig: Any, path: str | Path) -> Path:  # fig: a matplotlib Figure
    return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
