"""The block drafter (DFlash-style) as a training method: draft layers over the frozen target's features that
predict a whole block from its anchor.

The data are EAGLE's (the same store: the target's answers with its feature layers and final hidden states at
every position, prompt included). Examples are chunks of packed sequences; each training step draws
``anchors`` per chunk among the answer positions, and the loss is the soft cross-entropy against the target's
distribution at every masked position of each anchor's block, position i weighted ``position_decay^(i-1)``
(:mod:`.objective`). Held-out figures, on every split but ``train``: the greedy chain's expected τ and
per-position acceptance at every answer position, and the tree of positional candidates chosen on ``val``
(Medusa's rule, :func:`~specdec.training.methods.medusa.objective.tree_from_ranks`), stored with the drafter.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from specdec.drafters.dflash.model import DFlashConfig, DFlashModel, save_dflash
from specdec.drafters.eagle.model import default_aux_layers, norm_scale
from specdec.drafters.features import embedding_scale
from specdec.models import check_layer_ids
from specdec.training.distill.packing import Packed, chain_tau, pack, sequence_pairs
from specdec.training.distill.store import DataNeeds, Split
from specdec.training.distill.vocab import IGNORE, check_draft_vocab, draft_vocabulary
from specdec.training.methods.base import MethodConfig, TrainMethod, register_method
from specdec.training.methods.dflash.objective import block_ranks, dflash_loss, sample_anchors
from specdec.training.methods.medusa.objective import tree_from_ranks, tree_tau

log = logging.getLogger(__name__)


@dataclass
class DFlashMethodConfig(MethodConfig):
    name: str = "dflash"
    # target layers read (ids: residual stream after k layers); null: EAGLE-3's (2, L/2, L-3), so EAGLE's data
    # store serves both
    aux_layers: Optional[list[int]] = None
    num_layers: int = 2  # draft layers (the target's width)
    block_size: int = 8  # the anchor and block_size - 1 masked positions: drafts a forward
    # the token whose embedding fills the masked positions; null: the lowest id never seen in the training data
    mask_token_id: Optional[int] = None
    draft_vocab: Optional[int] = 8192  # the N most frequent training tokens (FR-Spec); null = all
    anchors: int = 32  # blocks per chunk and step (drawn among the answer positions)
    position_decay: float = 0.8  # loss weight of masked position i: decay^(i-1)
    chunk_len: int = 256  # positions per example (sequences packed)
    # the draft LM head and final norm start as the target's (false: random, the norm at 1). The layers always start
    # random (std 0.02): target layers copied in start at ~30 nats on SmolLM2-135M. On SmolLM2 the copied norm
    # starts the logits far too large, and the first 60 steps learn less than from random (5.7 vs 7.0 nats)
    init_from_target: bool = False
    # the draft layers' learning rate over optim.lr: the layers read normed inputs of RMS 1, where optim.lr's
    # steps (right for fc and the LM head) swamp the block's inputs within a few steps; at 0.1 the first 60 steps
    # of SmolLM2's drafter learn what they learn with the layers frozen, at 1 far less
    layer_lr_scale: float = 0.3
    # every block position also reads the newest committed position's fused context, and every masked one the
    # anchor's embedding (specdec.drafters.dflash.model: DFlashModel.block_inputs); false: the published inputs
    anchor_inputs: bool = True
    tree_nodes: int = 32  # paths of the tree stored with the drafter, best first (chosen on the val split)
    max_rank: int = 8  # candidates per position considered for the tree


def channel_scale(split: Split, rows: int = 65536) -> torch.Tensor:
    """1 / RMS of each feature channel over (up to ``rows`` of) ``split``'s positions: [L * H]. A target's residual
    stream has a few channels far larger than the rest (SmolLM2-135M's layers 15 and 27: values near 25,000
    where the layer's RMS is ~66), which would dominate ``fc``'s output and gradients."""
    features = split.features[:rows].flatten(1)  # [N, L*H]
    return (1 / features.double().pow(2).mean(0).sqrt().clamp(min=1e-6)).float()


def unseen_token(tokens: torch.Tensor, vocab_size: int) -> int:
    """The lowest token id that never occurs in ``tokens`` (the last id if every one does)."""
    seen = torch.bincount(tokens.flatten(), minlength=vocab_size) > 0
    free = (~seen).nonzero().flatten()
    return int(free[0]) if free.numel() else vocab_size - 1


@register_method("dflash")
class DFlashMethod(TrainMethod):
    Config = DFlashMethodConfig
    weights_file = "model.safetensors"  # beside it config.json (specdec.drafters.dflash.model)
    description = ("block drafter (DFlash-style): draft layers over the target's fused features, injected as keys "
                   "and values, predicting a block of masked positions from its anchor in one forward")
    reference = ("DFlash (Chen, Liang, Liu 2026): τ ~6-8 with blocks of 16 on Qwen3-4B/8B (5 draft layers), up to 6.2x "
                 "lossless, about 2.5x EAGLE-3's speedup")

    def __init__(self, cfg: DFlashMethodConfig):
        super().__init__(cfg)
        for name, low in (("num_layers", 1), ("block_size", 2), ("anchors", 1), ("chunk_len", 2), ("tree_nodes", 1),
                          ("max_rank", 1)):
            if getattr(cfg, name) < low:
                raise ValueError(f"method.{name} must be >= {low}, got {getattr(cfg, name)}")
        if not cfg.layer_lr_scale > 0:
            raise ValueError(f"method.layer_lr_scale must be > 0, got {cfg.layer_lr_scale}")
        if not 0.0 < cfg.position_decay <= 1.0:
            raise ValueError(f"method.position_decay must be in (0, 1], got {cfg.position_decay}")

    def needs(self) -> DataNeeds:
        return DataNeeds(layers=tuple(self.cfg.aux_layers), context=True)

    def run_config(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.cfg).items() if k not in ("tree_nodes", "max_rank")}

    def check_target(self, target: torch.nn.Module) -> None:
        layers = target.config.num_hidden_layers
        if self.cfg.aux_layers is None:
            self.cfg.aux_layers = list(default_aux_layers(layers))
        check_layer_ids("method.aux_layers", self.cfg.aux_layers, layers)
        vocab = target.get_output_embeddings().weight.shape[0]
        check_draft_vocab(self.cfg.draft_vocab, vocab)
        mask = self.cfg.mask_token_id
        if mask is not None and not 0 <= mask < vocab:
            raise ValueError(f"method.mask_token_id={mask} is not a token id of this target (0 .. {vocab - 1}); give "
                             f"one, or null for the lowest id the training data never use")

    def setup(self, target: torch.nn.Module, splits: dict[str, Split], device: torch.device) -> DFlashModel:
        cfg, train = self.cfg, splits["train"]
        self.check_target(target)
        full_lm_head = target.get_output_embeddings().weight.detach().to(device)  # [V, H], frozen
        vocab = full_lm_head.shape[0]
        seen = torch.cat([train.context, train.tokens])
        self.token_ids = draft_vocabulary(seen, vocab, cfg.draft_vocab)
        ids = torch.arange(vocab) if self.token_ids is None else self.token_ids
        mask = cfg.mask_token_id if cfg.mask_token_id is not None else unseen_token(seen, vocab)
        config = DFlashConfig.for_target(target.config, num_layers=cfg.num_layers, block_size=cfg.block_size,
                                         mask_token_id=mask, aux_layers=tuple(cfg.aux_layers),
                                         draft_vocab_size=ids.numel(), anchor_inputs=cfg.anchor_inputs,
                                         target=str(getattr(target.config, "_name_or_path", "")))
        model = DFlashModel(config)
        model.set_token_ids(self.token_ids)
        self.lm_head_rows = full_lm_head[ids.to(device)]  # [Dv, H]: the target's, for its distribution
        if cfg.init_from_target:
            with torch.no_grad():
                model.lm_head.weight.copy_(self.lm_head_rows)
                model.norm.weight.copy_(norm_scale(target.model.norm))
        embedding = target.get_input_embeddings()
        model.to(device).attach(embedding.weight.detach().to(device), embedding_scale(embedding))
        self.feature_scale = channel_scale(train)  # [L*H]: features as fc trains on them, folded into it at save
        self.examples = self._packed(train)
        self.device = device
        self.generator = torch.Generator().manual_seed(0)
        log.info("block drafter: %d layers, block %d, mask token %d, %d training chunks", cfg.num_layers,
                 cfg.block_size, mask, len(self.examples))
        return model

    def _packed(self, split: Split) -> Packed:
        """``split``'s sequences packed into examples, each feature channel scaled to RMS 1 (:func:`channel_scale`)."""
        packed = pack(sequence_pairs(split), self.cfg.chunk_len)
        packed.features *= self.feature_scale
        return packed

    def param_groups(self, model: torch.nn.Module) -> list[dict[str, Any]]:
        dflash = model.module if hasattr(model, "module") else model
        layers = list(dflash.layers.parameters())
        held = {id(p) for p in layers}
        return [{"params": layers, "lr_scale": self.cfg.layer_lr_scale},
                {"params": [p for p in dflash.parameters() if id(p) not in held], "lr_scale": 1.0}]

    def num_examples(self) -> int:
        return len(self.examples)

    def summary(self) -> dict[str, Any]:
        return {"train_chunks": len(self.examples), "train_positions": int((self.examples.segment >= 0).sum()),
                "draft_vocab_size": int(self.lm_head_rows.shape[0])}

    def loss(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        batch = self.examples.rows(idx, self.device)
        dflash = model.module if hasattr(model, "module") else model
        anchors = sample_anchors(batch, self.cfg.anchors, self.generator)
        loss, ce, agree = dflash_loss(dflash, batch, anchors, self.lm_head_rows, self.cfg.position_decay)
        return loss, {**{f"ce{i + 1}": x for i, x in enumerate(ce)}, **{f"top1_{i + 1}": x for i, x in enumerate(agree)}}

    @torch.no_grad()
    def evaluate(self, model: DFlashModel, splits: dict[str, Split]) -> dict[str, Any]:
        dflash = model.module if hasattr(model, "module") else model
        evals, split_ranks = {}, {}
        for name in sorted(set(splits) - {"train"}):
            ranks, valid = self._ranks(dflash, self._packed(splits[name]))
            labels = torch.where(valid, 0, IGNORE)
            evals[name] = chain_tau(ranks == 0, torch.ones(ranks.shape[0], dtype=torch.bool))
            split_ranks[name] = ranks, labels
        tree, _ = tree_from_ranks(*split_ranks["val"], self.cfg.tree_nodes)
        tree = tree or [[0]]  # no label ever among the candidates (an untrained drafter): the first position's best
        tau = tree_tau(*split_ranks["val"], tree)
        for name, (ranks, labels) in split_ranks.items():  # what the tree chosen on val promises elsewhere
            evals[name]["expected_tau_tree"] = [round(t, 4) for t in tree_tau(ranks, labels, tree)]
        return {"eval": evals, "tree": tree, "expected_tau_tree": [round(t, 4) for t in tau]}

    def _ranks(self, model: DFlashModel, packed: Packed, per_pass: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`block_ranks` at every index of ``packed`` (anchors whose first label is an answer's are kept)."""
        ranks, valid = [], []
        t = packed.tokens.shape[1]
        for start in range(0, len(packed), 8):
            batch = packed.rows(torch.arange(start, min(start + 8, len(packed))), self.device)
            for first in range(0, t, per_pass):
                anchors = torch.arange(first, min(first + per_pass, t), device=self.device).expand(len(batch), -1)
                r, v = block_ranks(model, batch, anchors.contiguous(), self.cfg.max_rank)
                ranks.append(r.cpu())
                valid.append(v.cpu())
        return torch.cat(ranks), torch.cat(valid)

    def score(self, metrics: dict[str, Any]) -> float:
        return metrics["eval"]["val"]["tau_chain"][-1]

    def decode_overrides(self, metrics: dict[str, Any]) -> list[str]:
        """A stored tree of fewer paths than the drafter's defaults draft from (drafter.k - drafter.lookup) asks a
        smaller drafter.k."""
        from specdec.drafters import drafter_config

        shipped = drafter_config("dflash")
        paths = len(metrics["tree"])
        return [f"drafter.k={paths + shipped.lookup}"] if 0 < paths < shipped.k - shipped.lookup else []

    def log_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        return {f"{n}/tau_chain{len(e['tau_chain'])}": e["tau_chain"][-1] for n, e in metrics["eval"].items()} | {
            f"{n}/tau_tree{len(e['expected_tau_tree'])}": e["expected_tau_tree"][-1] for n, e in metrics["eval"].items()}

    def save(self, model: DFlashModel, path: Path, target_name: str, metrics: dict[str, Any],
             dtype: torch.dtype | None = None) -> None:
        dflash = copy.deepcopy(model.module if hasattr(model, "module") else model)
        with torch.no_grad():  # fc reads the target's features as they come
            dflash.fc.weight.mul_(self.feature_scale.to(dflash.fc.weight))
        extra = {"held_out": metrics.get("eval", {})}
        if metrics.get("tree"):
            extra["tree"] = metrics["tree"]
        save_dflash(Path(path).parent, dflash, verifier=target_name, dtype=dtype, extra=extra)
