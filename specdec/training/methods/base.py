"""The training-method protocol and registry: what a learned drafter brings to the shared trainer.

A method is a small module: its typed ``Config`` (a :class:`MethodConfig`), the data it needs stored
(:class:`~specdec.training.distill.store.DataNeeds`), the model it trains, its loss on a batch of
training examples, its held-out evaluation and the file it exports, which the drafter registered under the
method's name loads (``python -m specdec.run drafter=<name> drafter.path=<that directory>``). The trainer
(:mod:`specdec.training.trainer`) owns the rest (data, loop, checkpoints, provenance) and never branches on
a method's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from omegaconf import MISSING

from specdec.training.distill.store import DataNeeds, Split


@dataclass
class MethodConfig:
    name: str = MISSING  # registry key of the method (specdec.training.methods.METHODS)


class TrainMethod(ABC):
    """One learned drafter's training objective. Built from its config; :meth:`setup` comes first."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]]
    weights_file: ClassVar[str]  # the file :meth:`save` writes in a directory, e.g. "heads.safetensors"
    description: ClassVar[str] = ""  # one line for the provenance: what is trained on what
    reference: ClassVar[str] = ""  # published figures to compare with, for the provenance

    def __init__(self, cfg: MethodConfig):
        self.cfg = cfg

    def needs(self) -> DataNeeds:
        """What the data store must hold for this method."""
        return DataNeeds()

    def run_config(self) -> dict[str, Any]:
        """The settings a checkpoint must have been written with to be resumed (evaluation-only ones left out)."""
        return dict(vars(self.cfg))

    def check_target(self, target: torch.nn.Module) -> None:
        """Refuse settings ``target`` cannot serve (layer ids, vocabulary sizes); called as soon as the target is
        loaded, before any data are built."""

    @abstractmethod
    def setup(self, target: torch.nn.Module, splits: dict[str, Split], device: torch.device) -> torch.nn.Module:
        """Build the trainable model for ``target`` and prepare the training examples from ``splits``."""

    def param_groups(self, model: torch.nn.Module) -> list[dict[str, Any]]:
        """The optimiser's parameter groups: dicts of ``params`` and an ``lr_scale`` (the group's learning rate over
        ``optim.lr``, schedule included). One group at scale 1 by default."""
        return [{"params": list(model.parameters()), "lr_scale": 1.0}]

    @abstractmethod
    def num_examples(self) -> int:
        """Training examples per epoch; the trainer draws batches of their indices."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss on training examples ``idx`` [b] (this process's share of a batch), and what to log."""

    def summary(self) -> dict[str, Any]:
        """Facts about the training examples and the model for the metrics (e.g. their count)."""
        return {"train_examples": self.num_examples()}

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, splits: dict[str, Split]) -> dict[str, Any]:
        """Held-out figures on every split but ``train``: per-position acceptance, expected τ."""

    def score(self, metrics: dict[str, Any]) -> float:
        """The figure a sweep over this method maximises, from :meth:`evaluate`'s ``metrics``."""
        return float("nan")

    def log_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Scalars of :meth:`evaluate`'s ``metrics`` for the tracker (wandb)."""
        return {}

    def decode_overrides(self, metrics: dict[str, Any]) -> list[str]:
        """The drafter settings (``drafter.<setting>=...``) that decoding with what this run trained needs beyond
        the drafter's shipped defaults (e.g. a smaller tree than they ask for), from :meth:`evaluate`'s ``metrics``."""
        return []

    @abstractmethod
    def save(self, model: torch.nn.Module, path: Path, target_name: str, metrics: dict[str, Any],
             dtype: torch.dtype | None = None) -> None:
        """Write the trained drafter (what its drafter loads) to ``path`` atomically, weights in ``dtype``."""


METHODS: dict[str, type[TrainMethod]] = {}


def register_method(name: str) -> Callable[[type[TrainMethod]], type[TrainMethod]]:
    """Class decorator: make a method buildable from a config whose ``name`` is ``name``."""

    def wrap(cls: type[TrainMethod]) -> type[TrainMethod]:
        cls.name = name
        METHODS[name] = cls
        return cls

    return wrap


def build_method(cfg: MethodConfig) -> TrainMethod:
    if cfg.name not in METHODS:
        raise ValueError(f"unknown training method {cfg.name!r}; registered methods: {sorted(METHODS)}")
    return METHODS[cfg.name](cfg)
