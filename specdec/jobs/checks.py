"""Every check of a decoding job's config, in one place, run before the target loads (a refusal after a minute of
loading costs a user that minute, and a sweep all its points): the lookahead (``drafter.k``, and for
``drafter.k=auto`` its settings), the target choice, the data and sampling settings, the lookahead against the
target's context, the drafter's own settings and files (:func:`~specdec.drafters.loading.check_drafter_config`), the
prompts themselves (read, and refused where chat prompts meet a target known to have no chat template) and the
device. :func:`check_before_loading` runs them all and hands :meth:`~specdec.jobs.job.Job.build` what they found
(:class:`Checked`); an entry point checks its own settings before that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specdec.config import TargetConfig
from specdec.decode.engine import capped_lookahead
from specdec.drafters.loading import check_drafter_config, lossy_rule
from specdec.jobs.data import check_chat_prompts, held_out_mix, load_prompt_mix, prompt_room
from specdec.jobs.runs import try_writing
from specdec.models.graphs import check_compile_mode
from specdec.models.loading import has_chat_template, resolve_device
from specdec.verify.sampling import SamplingParams

log = logging.getLogger(__name__)

CHAIN_KS = tuple(range(1, 9))  # the chain lookaheads drafter.k=auto tries unless told (auto.ks)
TREE_SIZES = (4, 8, 12, 16, 24)  # the tree sizes it tries unless told (those the drafter drafts at)


@dataclass(frozen=True)
class AutoSettings:
    """``drafter.k=auto``'s settings (:class:`~specdec.config.AutoConfig`), checked (:func:`check_auto`): what its
    chooser, :func:`~specdec.replay.auto.choose_lookahead`, is handed."""

    tree: bool  # the drafter drafts trees: the sizes are tree sizes, each logged on its own
    ks: tuple[int, ...] | None  # the sizes tried (auto.ks); None: CHAIN_KS or TREE_SIZES
    max_new_tokens: int  # tokens logged per calibration prompt
    seeds: int  # temperature > 0: sampled continuations logged per calibration prompt
    margin: float  # draft only where the best predicted decode speedup reaches 1 + margin
    log_dir: str | None  # where the logs and costs are kept; None: specdec's cache

    @property
    def largest(self) -> int:
        """The largest size tried: the lookahead the drafter is built with."""
        return max(self.ks or (TREE_SIZES if self.tree else CHAIN_KS))


@dataclass(frozen=True)
class Checked:
    """What :func:`check_before_loading` found in a job's config, typed: what :meth:`~specdec.jobs.job.Job.build`
    builds from beside the models' names."""

    k: int  # the lookahead the drafter is built with: drafter.k, or for drafter.k=auto the largest size it tries
    rows: Any  # datasets.Dataset: the job's prompt rows (id, source, category, kind, text)
    device: torch.device
    sampling: SamplingParams
    auto: AutoSettings | None  # drafter.k=auto's settings; None for an integer drafter.k
    held_out: Any  # drafter.k=auto: the rows it calibrates on (held out of ``rows`` where the sources allow); None


def check_lookahead(k: Any, *, auto: bool = False, hint: str = "") -> None:
    """``drafter.k``: an integer >= 1, or (``auto``: the main job) 'auto'."""
    if auto and k == "auto":
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        allowed = "an integer >= 1 or 'auto'" if auto else "an integer >= 1"
        raise ValueError(f"drafter.k (lookahead) must be {allowed}, got {k!r}"
                         + (f": {hint}" if hint else ""))


def check_auto(auto: Any, tree: bool) -> AutoSettings:
    """``drafter.k=auto``'s settings (:class:`~specdec.config.AutoConfig`), each refused naming itself; checked, for
    a drafter of trees where ``tree``."""
    ks = auto.ks
    if ks is not None and (len(ks) == 0 or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks)):
        raise ValueError(f"auto.ks (the lookaheads drafter.k=auto tries) must be a non-empty list of integers >= 1, "
                         f"or null for the defaults (chains 1..8, trees 4..24), got {list(ks)!r}")
    for name, low in (("prompts_per_source", 1), ("max_new_tokens", 1), ("seeds", 1)):
        value = auto[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"auto.{name} must be an integer >= {low}, got {value!r}")
    margin = auto.margin
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < float("inf"):
        raise ValueError(f"auto.margin (the predicted gain a drafter must show) must be a number >= 0, got {margin!r}")
    check_log_dir(auto.log_dir, "auto.log_dir")
    return AutoSettings(tree=tree, ks=tuple(ks) if ks is not None else None, max_new_tokens=auto.max_new_tokens,
                        seeds=auto.seeds, margin=margin, log_dir=auto.log_dir)


def check_log_dir(directory: str | None, key: str) -> None:
    """A directory of replay logs (``log_dir``, ``auto.log_dir``; None: specdec's cache) that can be written, checked
    before the logging pass rather than after it."""
    if directory is None:
        return
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key}={directory!r} is a file, not a directory; give a directory for the replay logs (or "
                         f"leave {key} null: specdec's cache)")
    try:
        try_writing(path)
    except OSError as exc:
        raise ValueError(f"{key}={directory!r} cannot be written ({exc}); give a directory you can write to") from exc


def check_before_loading(cfg: DictConfig, *, room: int | None = None) -> Checked:
    """Refuse what ``cfg`` (a decoding job's composed config) cannot run, before any model loads; what the job is
    built from (:class:`Checked`), the prompt rows read once here. ``room``: the lookahead the prompts must leave
    room for (default: the one the drafter is built with)."""
    check_lookahead(cfg.drafter.k, auto=True)
    auto = check_auto(cfg.auto, bool(cfg.drafter.get("tree"))) if cfg.drafter.k == "auto" else None
    if auto:
        check_auto_can_choose(cfg)
    k = auto.largest if auto else cfg.drafter.k  # k=auto: the drafter is built at the largest size it tries
    check_job_config(cfg)
    sampling = SamplingParams(cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p)
    check_compile_mode(cfg.target.compile)
    max_new = cfg.data.max_new_tokens
    prompt_room(max_new, room or k, cfg.target.max_context, "target.max_context")
    check_drafter_config(cfg.drafter, cfg)
    drafts = cfg.drafter.k
    if isinstance(drafts, int) and (capped := capped_lookahead(drafts, cfg.drafter, max_new)) < drafts:
        log.warning("drafter.k=%d: a prompt of data.max_new_tokens=%d can use at most %d drafts a step, so each step "
                    "drafts %d", drafts, max_new, capped, capped)
    rows = load_prompt_mix(list(cfg.data.sources), cfg.data.limit_per_source, seed=cfg.sampling.seed)
    check_chat_prompts(rows, has_chat_template(cfg.target.name))
    held_out = None
    if auto:  # k=auto calibrates on the rows that follow the job's own in each source
        held_out, left_out = held_out_mix(list(cfg.data.sources), cfg.data.limit_per_source,
                                          cfg.auto.prompts_per_source, seed=cfg.sampling.seed)
        if not left_out:
            log.warning("drafter.k=auto: data.sources leave no prompts out of the run; choosing on the run's own "
                        "first %d per source", cfg.auto.prompts_per_source)
    return Checked(k, rows, resolve_device(cfg.target.device), sampling, auto, held_out)


def check_auto_can_choose(cfg: DictConfig) -> None:
    """Refuse ``drafter.k=auto`` (the main job's default) where its replay cannot predict the run: a lossy acceptance
    rule, or at temperature > 0 a tree whose nodes are drawn at random (EAGLE's ``sampled: true``); the message names
    the fixed lookahead to give instead."""
    fixed = "give a fixed lookahead instead (drafter.k=<n>: a chain's drafts, a tree's nodes)"
    if lossy_rule(cfg.drafter) is not None:
        raise ValueError(f"drafter.acceptance={lossy_rule(cfg.drafter)} is a lossy rule, and drafter.k=auto (the main "
                         f"job's default) chooses by replaying the exact rule only: {fixed}")
    if cfg.drafter.get("sampled") and cfg.drafter.get("tree") and cfg.sampling.temperature:
        raise ValueError(f"drafter.sampled=true draws a tree's nodes at random at temperature "
                         f"{cfg.sampling.temperature}, which drafter.k=auto (the main job's default) cannot replay: "
                         f"{fixed}, or drafter.sampled=false")


def check_job_config(cfg: DictConfig) -> None:
    """``target=hub`` given a model (its ``name: ???`` does not replace the schema's default when Hydra merges), not
    ``target=synthetic``, and the data settings."""
    check_target_choice(cfg)
    limit = cfg.data.limit_per_source
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise ValueError(f"data.limit_per_source must be an integer >= 1 (prompts per source) or null (all), "
                         f"got {limit!r}")
    if isinstance(cfg.data.batch_size, bool) or cfg.data.batch_size < 1:
        raise ValueError(f"data.batch_size must be an integer >= 1 (prompts decoded together), got "
                         f"{cfg.data.batch_size!r}")
    max_new = cfg.data.max_new_tokens
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"data.max_new_tokens must be an integer >= 1 (tokens generated per prompt), got {max_new!r}")
    most = cfg.data.max_prompt_tokens
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
        raise ValueError(f"data.max_prompt_tokens must be an integer >= 1 (longer prompts are refused) or null (the "
                         f"context's room), got {most!r}")


def check_target_choice(cfg: Any) -> None:
    """``target=hub`` without ``target.name``: Hydra keeps the schema's default model, which would run silently;
    ``target=synthetic``: random weights, refused where τ or outputs are reported."""
    _refuse_synthetic(cfg.target)
    try:
        choice = HydraConfig.get().runtime.choices.get("target")
    except ValueError:  # not under Hydra
        return
    if choice == "hub" and cfg.target.name == TargetConfig.name:
        raise ValueError(f"target=hub needs the model: add target.name=<a hub id or a local directory> (e.g. "
                         f"target.name=HuggingFaceTB/SmolLM2-360M-Instruct); without it the embedded default "
                         f"{TargetConfig.name!r} would run (target=smollm2 names it)")


def _refuse_synthetic(target: Any) -> None:
    """``target=synthetic`` has random weights: its τ and outputs mean nothing, so no entry point reporting them runs."""
    if getattr(target, "name", None) == "synthetic":
        shape = getattr(target, "shape", None)
        raise ValueError(f"target=synthetic (shape {shape!r}) has random weights: costs only, no τ or outputs to "
                         f"report; measure its step costs with `python experiments/benchmarks/step_costs.py --shape "
                         f"{shape or 'llama-3.1-8b'}`, or pick a real target (target=smollm2, target.name=<dir>)")
