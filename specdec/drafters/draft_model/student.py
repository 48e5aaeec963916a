"""The distilled draft model: a few-layer student of a Llama-family target, its lean file and its HF export.

The student is the target's architecture with fewer decoder layers, each initialised from a chosen target
layer (Minitron-style depth pruning, e.g. layers 0, 10, 20, 29 of 30), and the target's own embeddings,
final norm and LM head. Embeddings and LM head stay frozen (tied in SmolLM2), so a student is shipped
*lean*: a directory with

- ``config.json``: the student's transformers config (``num_hidden_layers`` = its layers) plus a
  ``specdec`` section: the format tag, which weights come from the target (``from_target``), the target's
  hidden size and vocabulary (checked at load), the target layers it started from;
- ``model.safetensors``: every other weight (the decoder layers and the final norm);
- ``token_counts.safetensors``: how often each token occurs in the answers it was trained on, from which
  ``drafter.draft_vocab=N`` takes the N most frequent tokens for a smaller draft LM head.

:func:`load_student` stitches the target's tensors back in (shared, not copied). :func:`export_hf` writes a
standalone transformers directory (every weight, tokenizer files) that ``AutoModelForCausalLM.from_pretrained``
loads, e.g. as ``generate(assistant_model=...)``'s assistant: the very same draft.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import save as safetensors_bytes
from torch import nn

from specdec.errors import CheckpointError, VocabMismatchError
from specdec.jobs.io import atomic_dir, atomic_write, read_json_object, read_tensors, write_json
from specdec.models import check_layer_ids

FORMAT = "specdec-draft-model-1"
DEFAULT_DRAFT = "default"  # drafter.path=default: the student shipped for the default target
TOKEN_COUNTS = "token_counts.safetensors"
EMBEDDINGS = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def default_student_path() -> Path:
    """Where the student shipped for the default target, SmolLM2-135M-Instruct, lives in the package."""
    return Path(str(resources.files("specdec") / "assets" / "draft_model" / "smollm2-135m"))


def is_student_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by :func:`save_student` (a config.json with a specdec section).
    A config.json that cannot be read (truncated, not JSON, not an object) raises
    :class:`~specdec.errors.CheckpointError` naming it: such a directory is no kind of model, and taking it for
    another kind would blame the wrong thing."""
    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return False
    raw = read_json_object(config, what="a model config (an object)",
                           hint=f"restore it (an interrupted copy leaves truncated files), or {_HINT}")
    section = raw.get("specdec")
    return isinstance(section, dict) and section.get("format") == FORMAT


def from_target(config: Any) -> list[str]:
    """The weights a student takes from its target: the embeddings, and the LM head unless tied to them."""
    return [EMBEDDINGS] if getattr(config, "tie_word_embeddings", False) else [EMBEDDINGS, LM_HEAD]


def init_student(target: nn.Module, layers: Sequence[int], dtype: torch.dtype | None = None) -> nn.Module:
    """A causal LM of ``target``'s class with ``len(layers)`` decoder layers, layer i a copy of target layer
    ``layers[i]``; the final norm a copy of the target's; embeddings and LM head the target's own tensors
    (shared and frozen: they are not trained and not saved; copied only when ``dtype``, the student's,
    differs from the target's, e.g. a float32 student of a bfloat16 target)."""
    from transformers import AutoModelForCausalLM

    check_layer_ids("student layers", layers, target.config.num_hidden_layers)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:  # newer transformers: one attention type per layer
        config.layer_types = [target.config.layer_types[i] for i in layers]
    student = AutoModelForCausalLM.from_config(config).to(device=target.device, dtype=dtype or target.dtype)
    with torch.no_grad():
        for mine, i in zip(student.model.layers, layers):
            theirs = target.model.layers[i].state_dict()
            mine.load_state_dict(theirs)
        student.model.norm.load_state_dict(target.model.norm.state_dict())
    _stitch(student, target)
    return student


def _stitch(student: nn.Module, target: nn.Module) -> None:
    """Point the student's embeddings (and untied LM head) at the target's tensors, frozen."""
    dtype = student.model.norm.weight.dtype

    def shared(weight: nn.Parameter) -> nn.Parameter:
        return weight if weight.dtype == dtype else nn.Parameter(weight.detach().to(dtype), requires_grad=False)

    student.model.embed_tokens.weight = shared(target.get_input_embeddings().weight)
    if getattr(student.config, "tie_word_embeddings", False):
        student.lm_head.weight = student.model.embed_tokens.weight
    else:
        student.lm_head.weight = shared(target.get_output_embeddings().weight)
    student.model.embed_tokens.weight.requires_grad_(False)
    student.lm_head.weight.requires_grad_(False)


def save_student(directory: str | Path, student: nn.Module, *, target_name: str = "",
                 layers: Sequence[int] = (), dtype: torch.dtype | None = None,
                 extra: dict[str, Any] | None = None) -> None:
    """Write ``student`` lean (see the module docstring): config.json + model.safetensors, atomically each.
    ``dtype`` (e.g. torch.float16) stores the weights in it; ``extra`` goes into the specdec section."""
    directory = Path(directory)
    taken = from_target(student.config)
    tensors = {name: t.detach().cpu().to(dtype if dtype and t.is_floating_point() else t.dtype).contiguous()
               for name, t in student.state_dict().items() if name not in taken and name != LM_HEAD}
    atomic_write(directory / "model.safetensors",
                 lambda f: f.write(safetensors_bytes(tensors, metadata={"format": "pt"})), binary=True)
    config = student.config.to_dict()
    config["specdec"] = {"format": FORMAT, "from_target": taken, "target": target_name,
                         "target_hidden_size": student.config.hidden_size,
                         "target_vocab_size": student.config.vocab_size,
                         "target_layers": [int(i) for i in layers], **(extra or {})}
    write_json(directory / "config.json", config)


def save_token_counts(directory: str | Path, counts: torch.Tensor) -> None:
    """Write ``counts`` [V] (occurrences of each token in the training answers) beside a student, atomically."""
    tensors = {"counts": counts.detach().cpu().to(torch.int64).contiguous()}
    atomic_write(Path(directory) / TOKEN_COUNTS, lambda f: f.write(safetensors_bytes(tensors)), binary=True)


def frequent_tokens(directory: str | Path, n: int) -> torch.Tensor:
    """The ``n`` tokens most frequent in a student's training answers (ties: lower id first), [n] long."""
    path = Path(directory).expanduser() / TOKEN_COUNTS
    if not path.is_file():
        raise CheckpointError(f"drafter.draft_vocab={n} needs the token counts a training run writes beside the "
                              f"student ({str(path)!r} is missing); retrain with `python -m specdec.train "
                              f"method=draft_model` or leave drafter.draft_vocab=0")
    counts = read_tensors(path, what="token counts", hint=_HINT)["counts"]
    if not 1 <= n <= counts.numel():
        raise ValueError(f"drafter.draft_vocab={n} must be in [1, {counts.numel()}] (the vocabulary), or 0 for all")
    return torch.sort(counts, descending=True, stable=True).indices[:n]


_HINT = ("point drafter.path at a directory written by `python -m specdec.train method=draft_model` (its "
         "output_dir or export), trained for this target")


def _check_target(section: dict[str, Any], target_config: Any, directory: Path) -> None:
    hidden, vocab = int(section["target_hidden_size"]), int(section["target_vocab_size"])
    t_hidden, t_vocab = int(target_config.hidden_size), int(target_config.vocab_size)
    if (hidden, vocab) == (t_hidden, t_vocab):
        return
    message = (f"the draft model in {str(directory)!r} was distilled for a target of hidden size {hidden} and "
               f"vocabulary {vocab}; this target has hidden size {t_hidden} and vocabulary {t_vocab}; train one "
               f"for this target (python -m specdec.train method=draft_model target=...), or draft with the "
               f"target's own first layers (drafter.path=target)")
    raise (VocabMismatchError if vocab != t_vocab else CheckpointError)(message)


def load_student(path: str | Path, target: nn.Module) -> nn.Module:
    """The student in the lean directory ``path``, with ``target``'s embeddings (and LM head) stitched in,
    on the target's device and in its dtype, in eval mode. A student distilled for another target (hidden
    size or vocabulary) raises :class:`~specdec.errors.VocabMismatchError` or
    :class:`~specdec.errors.CheckpointError` naming both."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path).expanduser()
    if not is_student_dir(directory):
        raise CheckpointError(f"{str(directory)!r} holds no distilled draft model (no config.json with a "
                              f"specdec section of format {FORMAT!r}); {_HINT}")
    raw = json.loads((directory / "config.json").read_text())
    section = raw.pop("specdec")
    _check_target(section, target.config, directory)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    student = AutoModelForCausalLM.from_config(config)
    weights = directory / "model.safetensors"
    tensors = read_tensors(weights, what="distilled draft model", hint=_HINT, finite=True)
    taken = set(section["from_target"]) | {LM_HEAD}
    expected = set(student.state_dict()) - taken
    if set(tensors) != expected:
        raise CheckpointError(f"{str(weights)!r} does not match its config: missing "
                              f"{sorted(expected - set(tensors))[:6]}, unexpected {sorted(set(tensors) - expected)[:6]}; "
                              f"{_HINT}")
    state = student.state_dict()
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise CheckpointError(f"{str(weights)!r}: {name} has shape {list(tensor.shape)}, its config "
                                  f"({str(directory / 'config.json')!r}) implies {list(state[name].shape)}: the two "
                                  f"were not written together; restore the config.json the training run wrote, or "
                                  f"{_HINT}")
    student.load_state_dict(tensors, strict=False)
    student.to(device=target.device, dtype=target.dtype)
    _stitch(student, target)
    return student.eval()


def export_hf(directory: str | Path, student: nn.Module, tokenizer: Any = None, source: str | Path = "") -> Path:
    """A standalone transformers model directory (every weight, embeddings included; the tokenizer's files
    when given one), written to a temporary directory then renamed into place. Its config.json names the
    student it came from (``specdec.exported_from``: ``source``), the mark by which ``python -m specdec.export
    --force`` knows a directory it may replace."""
    with atomic_dir(directory) as tmp:
        student.save_pretrained(tmp, safe_serialization=True)
        config = json.loads((tmp / "config.json").read_text())
        config["specdec"] = {"exported_from": str(source)}
        write_json(tmp / "config.json", config)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(directory)
