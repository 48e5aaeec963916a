"""Building a registered drafter from its config: the shipped defaults composed as the CLI composes them.

``python -m specdec.run drafter=<name>`` composes the drafter's typed ``Config`` (its dataclass defaults), then
``configs/drafter/<name>.yaml``, then the command's overrides; :func:`drafter_config` does the same from Python,
:func:`load_drafter` builds the drafter from it in one call, and :func:`build_drafter` builds one from any
config, the fields it lacks taking those defaults.

Every drafter with weights names where they are ``path`` ("default": the drafter shipped for the default
target). Older names (Medusa's ``heads``, the draft model's ``model``) still work: :func:`weights_path` reads
them, with a note to use ``path``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specdec.drafters.base import DRAFTERS, Drafter
from specdec.models.backend import Backend
from specdec.models.loading import looks_like_path

log = logging.getLogger(__name__)

PATH_ALIAS = "${.path}"
"""The default of a drafter config's old name for ``path`` (Medusa's ``heads``, the draft model's ``model``): a
composed config reads it as ``path``, and a command that sets the old name still works (:func:`weights_path`)."""


def weights_path(cfg: Any, old: str, default: str) -> str:
    """Where the weights of the drafter ``cfg`` describes are: ``cfg.path``, the one name every drafter gives it,
    or the value a config set under its old name ``old`` (with a note to use ``path``). ``default`` is the
    config's default (the shipped drafter); both names set to different places is an error."""
    path, given = cfg.path, getattr(cfg, old, None)
    if given in (None, PATH_ALIAS) or given == path:
        return path
    if path != default:
        raise ValueError(f"drafter.path={path!r} and drafter.{old}={given!r} (its old name) name different weights; "
                         f"give drafter.path only")
    log.warning("drafter.%s is the old name of drafter.path (where a drafter's weights are, the same name for every "
                "drafter); it still works, but use drafter.path=%s", old, given)
    return given


def _registered(name: Any) -> type[Drafter]:
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; registered drafters: {', '.join(sorted(DRAFTERS))}")
    return DRAFTERS[name]


def _merge(cfg: DictConfig, values: Any, name: str, what: str) -> DictConfig:
    """``values`` over ``cfg``, with an error that names the drafter's settings when one is unknown or mistyped."""
    try:
        merged = OmegaConf.merge(cfg, values)
    except OmegaConfBaseException as exc:
        settings = ", ".join(k for k in cfg if k != "name")
        raise ValueError(f"drafter {name!r}: {what} do not fit its config ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}); its settings: {settings}") from None
    k = merged.get("k")
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"drafter {name!r}: k={k!r} in {what}; k is the lookahead, an integer >= 1 (draft tokens "
                         f"per target forward), or 'auto' (python -m specdec.run chooses it)")
    return merged


def drafter_config(name: str, **overrides: Any) -> DictConfig:
    """The config ``python -m specdec.run drafter=<name>`` composes for the registered drafter ``name`` (the preset's
    fixed ``k`` where the main job's is ``auto``): its ``Config``, then ``configs/drafter/<name>.yaml`` (the shipped
    defaults), then ``overrides`` (a setting each, as ``drafter.<setting>=...`` on the command line, e.g. ``k=4`` or
    ``path="outputs/eagle"``)."""
    from specdec.config import config_dir

    cfg = OmegaConf.structured(_registered(name).Config)
    shipped = Path(config_dir(), "drafter", f"{name}.yaml")
    if shipped.is_file():
        defaults = OmegaConf.load(shipped)
        defaults.pop("defaults", None)  # the schema, composed above
        cfg = _merge(cfg, defaults, name, f"the settings of {str(shipped)!r}")
    if "name" in overrides and overrides["name"] != name:
        raise ValueError(f"drafter_config({name!r}) builds the {name!r} drafter; leave out name={overrides['name']!r}")
    return _merge(cfg, overrides, name, f"the settings {sorted(overrides)}")


# What a directory of drafter weights is, told by its files: Medusa's heads file, a block drafter's or an EAGLE
# drafter's config.json, a distilled student's (a specdec section with its format); the kinds a training run writes.
KIND_NAMES = {"medusa": "Medusa heads", "eagle": "an EAGLE drafter", "dflash": "a block (DFlash-style) drafter",
              "draft_model": "a distilled draft model"}


def drafter_kind(path: str | Path) -> str | None:
    """The kind of drafter (a registered name) whose weights are at ``path``, from its files alone; None where they
    tell none (a causal LM's directory, a hub id, nothing there)."""
    path = Path(str(path)).expanduser()
    directory = path.parent if path.is_file() else path
    if path.name == "heads.safetensors" or (directory / "heads.safetensors").is_file():
        return "medusa"
    try:
        config = json.loads((directory / "config.json").read_text())
        provenance = json.loads((directory / "provenance.json").read_text()) \
            if (directory / "provenance.json").is_file() else {}
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if "dflash_config" in config:
        return "dflash"
    if "eagle" in str(config.get("speculators_model_type", "")).lower() or any(
            "eagle" in str(a).lower() for a in config.get("architectures") or []):
        return "eagle"
    method = provenance.get("method") if isinstance(provenance, dict) else None
    if method == "draft_model" or isinstance(config.get("specdec"), dict) and "format" in config["specdec"]:
        return "draft_model"
    return None


def lossy_rule(cfg: Any) -> str | None:
    """The lossy acceptance rule the drafter config ``cfg`` asks for (Medusa's ``acceptance: typical``); None: exact."""
    rule = cfg.get("acceptance", "exact")
    return None if rule in (None, "exact") else rule


def check_drafter_config(cfg: Any, job: Any = None) -> DictConfig:
    """Refuse, before any model loads, a drafter config that cannot run: an unknown drafter, weights at
    ``drafter.path`` of another kind of drafter, and what its own config's ``check`` refuses (given ``job``, the
    composed job config: the target, the sampling). Returns the config composed with its defaults."""
    name = cfg.get("name") if isinstance(cfg, dict) else getattr(cfg, "name", None)
    cfg = _merge(drafter_config(name), cfg, name, "the given settings")
    path = cfg.get("path")
    given = isinstance(path, str) and path not in ("default", "target", "")
    if given and looks_like_path(path) and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"drafter.path={path!r}: no such file or directory "
                                f"({str(Path(path).expanduser().absolute())!r}); give the directory a training run "
                                f"wrote (its output_dir or export), or drafter.path=default for the drafter shipped "
                                f"for the default target")
    kind = drafter_kind(path) if given else None
    if kind is not None and kind != name:
        raise ValueError(f"drafter.path={path!r} holds {KIND_NAMES[kind]}, not what drafter={name} reads; decode "
                         f"with it as drafter={kind} drafter.path={path}" +
                         (", or give drafter.path a causal LM's directory (or hub id) to draft with"
                          if name == "draft_model" else ""))
    if job is not None:
        OmegaConf.to_object(cfg).check(job)
    return cfg


def build_drafter(cfg: Any, target: torch.nn.Module, tokenizer: Any = None, backend: Backend = Backend()) -> Drafter:
    """The registered drafter named ``cfg.name`` (its ``from_config``), drafting for ``target``, its own models on
    ``backend`` (a job passes the target's). ``cfg``: its config (a composed one, its ``Config``, or a mapping);
    fields it lacks take the shipped defaults (:func:`drafter_config`). The drafter keeps the config it was built
    from as ``drafter.config``."""
    cfg = check_drafter_config(cfg)
    name = cfg.name
    if cfg.k == "auto":
        raise ValueError(f"drafter.k='auto' is chosen by the main job (python -m specdec.run drafter.k=auto) after "
                         f"it builds the drafter at the largest size it tries; build {name} with an integer k")
    drafter = _registered(name).from_config(cfg, target=target, tokenizer=tokenizer, backend=backend)
    drafter.config = cfg
    return drafter


def load_drafter(name: str, target: torch.nn.Module, tokenizer: Any = None, *, backend: Backend = Backend(),
                 **overrides: Any) -> Drafter:
    """The registered drafter ``name`` ("eagle", "medusa", "draft_model", "ngram", ...) for ``target`` and its
    ``tokenizer``, its own models on ``backend``, with the defaults ``python -m specdec.run drafter=<name>`` uses
    (the shipped weights for the default target; the preset's fixed ``k``, not the main job's ``auto``), changed by
    ``overrides`` (``drafter.<setting>`` on the command line: ``k=4``, ``path="outputs/medusa"``). ``drafter.config`` is the composed config; its ``k`` is the lookahead
    :func:`~specdec.speculative_generate` drafts with unless given one.

        model, tokenizer = load_target()
        drafter = load_drafter("eagle", model, tokenizer)
    """
    return build_drafter(drafter_config(name, **overrides), target, tokenizer, backend)
