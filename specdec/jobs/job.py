"""One decoding job, built once from its composed config: what the main job (:mod:`specdec.run`), replay
(:mod:`specdec.replay`) and verify_dist (:mod:`specdec.verify_dist`) each decode with.

    job = Job.build(cfg)                # refusals first, then the target, its backend and the drafter
    decoder = job.decoder(graphs=True)  # what the target's forwards run through

:meth:`Job.build` refuses what the config cannot run before any model loads
(:func:`~specdec.jobs.checks.check_before_loading`: every check, the lookahead resolved, for ``drafter.k=auto`` the
largest size it tries, the prompt rows read and the device resolved), then seeds torch, chooses the backend the target
and the drafter both run on (:func:`target_backend`: ``target.coded_weights``, ``target.gpu_kernels``), loads the
target on its device, builds the drafter, and encodes the prompts (``drafter.k=auto``'s held-out ones too) in the room
the context leaves them. An entry point checks its own settings before it builds the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from specdec.drafters import Drafter, build_drafter
from specdec.jobs.checks import AutoSettings, check_before_loading
from specdec.jobs.data import encode_prompts, prompt_room
from specdec.models import target_decoder
from specdec.models.backend import Backend
from specdec.models.loading import load_target, stop_token_ids
from specdec.verify.sampling import SamplingParams


@dataclass
class Job:
    """A decoding job's target, drafter, prompts and settings, as its config gives them."""

    k: int  # the lookahead the drafter is built with (drafter.k=auto: the largest it tries)
    rows: Any  # datasets.Dataset: the prompt rows (id, source, category, kind, text), one per prompt
    device: torch.device
    backend: Backend  # the target's and the drafter's
    target: torch.nn.Module  # the transformers causal LM, in eval mode
    tokenizer: Any
    drafter: Drafter
    context: int  # positions a sequence may fill: target.max_context, at most the model's
    limit: int  # tokens a prompt may have: what the context leaves, at most data.max_prompt_tokens
    prompts: list[list[int]]  # token ids, one list per row
    eos: list[int]  # the tokens generation stops at
    sampling: SamplingParams
    seed: int  # sampling.seed
    max_new_tokens: int  # data.max_new_tokens
    batch_size: int  # data.batch_size
    compile: str  # target.compile: whether the target's forwards (and the drafter's own) replay graphs
    auto: AutoSettings | None = None  # drafter.k=auto's checked settings; None for an integer drafter.k
    calibration: list[list[int]] = field(default_factory=list)  # drafter.k=auto: its held-out prompts, encoded

    @classmethod
    def build(cls, cfg: DictConfig, *, room: int | None = None, backend: Backend | None = None) -> Job:
        """The job ``cfg`` (a decoding job's composed config) describes, its drafter built at ``drafter.k``
        (``drafter.k=auto``: the largest size it tries); ``room``: the lookahead the prompts leave room for (default:
        the drafter's); ``backend``: the one the target and the drafter run on (None: the one ``cfg.target`` names).
        Every refusal that needs no model comes first."""
        checked = check_before_loading(cfg, room=room)
        torch.manual_seed(cfg.sampling.seed)
        backend = target_backend(cfg.target) if backend is None else backend
        target, tokenizer = load_target(cfg.target.name, dtype=cfg.target.dtype, device=checked.device)
        drafter = build_drafter({**cfg.drafter, "k": checked.k}, target, tokenizer, backend)
        context = min(cfg.target.max_context, target.config.max_position_embeddings)
        where = "target.max_context" if context == cfg.target.max_context else "max_position_embeddings"
        limit = prompt_room(cfg.data.max_new_tokens, room or checked.k, context, where)
        if cfg.data.max_prompt_tokens is not None:
            limit = min(limit, cfg.data.max_prompt_tokens)
        prompts = encode_prompts(tokenizer, checked.rows, limit, context)
        calibration = encode_prompts(tokenizer, checked.held_out, limit, context) if checked.auto else []
        return cls(k=checked.k, rows=checked.rows, device=checked.device, backend=backend, target=target,
                   tokenizer=tokenizer, drafter=drafter, context=context, limit=limit, prompts=prompts,
                   eos=stop_token_ids(target, tokenizer), sampling=checked.sampling, seed=cfg.sampling.seed,
                   max_new_tokens=cfg.data.max_new_tokens, batch_size=cfg.data.batch_size, compile=cfg.target.compile,
                   auto=checked.auto, calibration=calibration)

    def decoder(self, graphs: bool = False) -> torch.nn.Module:
        """What the target's forwards run through, on the job's backend: with ``graphs``, graphs where
        ``target.compile`` and the device allow them (:func:`~specdec.models.target_decoder`), else eagerly."""
        return target_decoder(self.target, self.compile if graphs else "none", backend=self.backend)

    @property
    def pad_id(self) -> int:
        """The token prompts are left-padded with: the tokenizer's pad token, else 0."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


def target_backend(target: Any) -> Backend:
    """The backend a job's target and drafter run on, from its ``target`` config: the weights as their codes or as
    float32 (``target.coded_weights``), specdec's Triton kernels on a GPU or torch's ops (``target.gpu_kernels``),
    specdec's CPU kernels otherwise at their defaults; ``target.fused_products`` runs the norms and SiLU·up inside the
    Triton kernels' products, ``target.exact_numerics`` orders their arithmetic, ``target.fused_steps`` runs a step's
    greedy verdict and commit in one kernel each."""
    return Backend(weights="codes" if target.coded_weights else "float", gpu_kernels=target.gpu_kernels,
                   fused_products=target.fused_products, exact_numerics=target.exact_numerics,
                   fused_steps=target.fused_steps)
