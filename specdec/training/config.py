"""Typed configs of ``python -m specdec.train``, registered with the ConfigStore.

``configs/train.yaml`` composes :class:`TrainConfig` with one ``method`` (``configs/method/<name>.yaml``,
each a registered method's ``Config``) and a ``logger``; YAML only composes and overrides these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specdec.config import LoggerConfig, TargetConfig, register_configs
from specdec.training.methods import METHODS, MethodConfig


@dataclass
class DistillDataConfig:
    mode: str = "self_distill"  # "self_distill" (the target's greedy answers to prompts) or "text" (a corpus)
    num_prompts: int = 640  # self_distill: instruction prompts answered by the target
    # self_distill: answer the first num_prompts rows of this JSONL file (rows as prompts.jsonl: text, kind, ...)
    # instead of generating them, e.g. on a machine without the corpora (python -m specdec.training.distill.prompts)
    prompts_file: str | None = None
    magpie_fraction: float = 0.0  # self_distill: share of those prompts written by the target itself (Magpie)
    max_new_tokens: int = 96  # self_distill: answer length
    batch_size: int = 64  # sequences per target forward while building the data
    # answers per teacher-forced forward reading the feature layers (EAGLE, the block drafter): 1 = one at a time,
    # as the CPU stores were built; more pads them into one forward (a GPU's data phase), equal to rounding
    feature_batch: int = 1
    text_sources: list[str] = field(default_factory=lambda: ["wikipedia", "stdlib", "shakespeare"])  # mode=text
    text_seq_len: int = 256  # mode=text: tokens per chunk
    skip_first: int = 16  # rows of each corpus never trained on (the benchmark runs' prompts)
    val_fraction: float = 0.1  # sequences held out to choose drafting settings and report validation figures


@dataclass
class HeldOutConfig:
    answer_sources: list[str] = field(default_factory=lambda: ["mtbench", "humaneval"])  # held-out prompts
    limit_per_source: int = 24
    max_new_tokens: int = 64
    text_sources: list[str] = field(default_factory=lambda: ["wikipedia"])  # their first data.skip_first rows


@dataclass
class OptimConfig:
    epochs: int = 2
    batch_size: int = 256  # training examples per optimiser step (over all processes)
    lr: float = 1e-2
    weight_decay: float = 0.0
    warmup_steps: int = 20  # linear warm-up, then cosine decay to 0


@dataclass
class TrainConfig:
    method: MethodConfig = MISSING  # what is trained: configs/method/<name>.yaml
    # the frozen target: configs/target/ (target.name: alias, local directory or hub id; target.dtype)
    target: TargetConfig = MISSING
    seed: int = 0
    threads: Optional[int] = None  # torch CPU threads; null = torch's default
    run_name: str = "smollm2-135m"
    output_dir: str = "outputs/train/${method.name}/${run_name}"  # checkpoints, data, results; reused to resume
    export: Optional[str] = None  # also write the drafter's file + provenance.json to this directory
    export_dtype: Optional[str] = None  # exported weights' dtype, e.g. float16 (half the size); null = float32
    save_every: int = 50  # optimiser steps between checkpoints
    log_every: int = 10
    stop_after_steps: Optional[int] = None  # stop (checkpointed) after this many steps of this invocation
    # stop (checkpointed) at the first step boundary once this invocation has run this many seconds, data phase
    # included: a command with a wall budget (experiments/gpu/train.sh) keeps what it trained; rerun to resume
    stop_after_s: Optional[float] = None
    eval_every_epoch: bool = False  # also record the held-out figures after every epoch (metrics' per_epoch)
    data: DistillDataConfig = field(default_factory=DistillDataConfig)
    eval: HeldOutConfig = field(default_factory=HeldOutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def register_train_configs() -> None:
    register_configs()
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, method in METHODS.items():
        cs.store(group="method", name=f"{name}_schema", node=method.Config)
