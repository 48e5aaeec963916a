"""EAGLE-3 (Li et al. 2025) as a training method: one draft layer over the frozen target's features.

The data are the target's own answers (self-distillation, the chat template applied as at decode time)
with the target's feature layers and final hidden states at every position, prompt included
(:class:`~specdec.training.distill.store.DataNeeds` ``context``). Examples are chunks of packed sequences;
the loss is the training-time test against the target's distribution (:mod:`.objective`). Held-out
figures: the greedy chain's expected τ and per-depth acceptance replayed on the target's answers.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from specdec.drafters.eagle.model import EagleConfig, EagleModel, default_aux_layers, norm_scale, save_eagle
from specdec.drafters.features import embedding_scale
from specdec.models import check_layer_ids
from specdec.training.distill.store import DataNeeds, Split
from specdec.training.distill.vocab import check_draft_vocab, draft_vocabulary
from specdec.training.methods.base import MethodConfig, TrainMethod, register_method
from specdec.training.distill.packing import Packed, chain_tau, pack, sequence_pairs
from specdec.training.methods.eagle.objective import chain_matches, eagle_loss

log = logging.getLogger(__name__)


@dataclass
class EagleMethodConfig(MethodConfig):
    name: str = "eagle"
    # target layers read (ids: residual stream after k layers); null: EAGLE-3's (2, L/2, L-3) for the target's L
    aux_layers: Optional[list[int]] = None
    draft_vocab: Optional[int] = 8192  # the N most frequent training tokens (FR-Spec); null = all
    ttt_steps: int = 4  # training-time test: steps the draft layer is unrolled on its own outputs
    step_decay: float = 0.8  # loss weight of step i
    chunk_len: int = 256  # positions per example (sequences packed)
    init_from_target: bool = True  # the draft LM head and final norm start as the target's
    eval_depth: int = 6  # chain length replayed on held-out answers
    # divide each feature layer by its RMS over the training data while training, folded into fc when saved (the
    # format unchanged): for targets whose residual stream is large (Gemma-3-270M: RMS 41-797 at its feature
    # layers), where fc's output would swamp the draft layer's attention and MLP
    scale_features: bool = False
    # with init_from_target, the draft's final norm starts as the target's too; false: at 1, as for a target whose
    # final norm scales some channels by hundreds (Gemma-3-270M: up to 301), from which a random draft layer starts
    # with logits in the hundreds
    norm_from_target: bool = True


def feature_scale(split: Split, rows: int = 65536) -> torch.Tensor:
    """1 / RMS of each feature layer over (up to ``rows`` of) ``split``'s positions, one per input of fc: [L * H]."""
    features = split.features[:rows]  # [N, L, H]
    rms = features.double().pow(2).mean((0, 2)).sqrt().clamp(min=1e-6)  # [L]
    return (1 / rms).float().repeat_interleave(features.shape[-1])


@register_method("eagle")
class EagleMethod(TrainMethod):
    Config = EagleMethodConfig
    weights_file = "model.safetensors"  # beside it config.json: a speculators-format directory
    description = "EAGLE-3 draft layer over the target's low/middle/high features, trained with the training-time test"
    reference = ("EAGLE-3 (Li et al. 2025): τ 6.1-6.7 on 7-13B targets (chat, T=0); published EAGLE-3 drafters for "
                 "Qwen3-1.7B/4B: τ ~2.1-2.2")

    def __init__(self, cfg: EagleMethodConfig):
        super().__init__(cfg)
        self.feature_scale: torch.Tensor | None = None  # see EagleMethodConfig.scale_features
        for name in ("ttt_steps", "chunk_len", "eval_depth"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"method.{name} must be >= 1, got {getattr(cfg, name)}")

    def needs(self) -> DataNeeds:
        return DataNeeds(layers=tuple(self.cfg.aux_layers), context=True)

    def run_config(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.cfg).items() if k != "eval_depth"}

    def check_target(self, target: torch.nn.Module) -> None:
        if self.cfg.aux_layers is None:
            self.cfg.aux_layers = list(default_aux_layers(target.config.num_hidden_layers))
        check_layer_ids("method.aux_layers", self.cfg.aux_layers, target.config.num_hidden_layers)
        check_draft_vocab(self.cfg.draft_vocab, target.get_output_embeddings().weight.shape[0])

    def setup(self, target: torch.nn.Module, splits: dict[str, Split], device: torch.device) -> EagleModel:
        cfg, train = self.cfg, splits["train"]
        self.check_target(target)
        full_lm_head = target.get_output_embeddings().weight.detach().to(device)  # [V, H], frozen
        vocab = full_lm_head.shape[0]
        self.token_ids = draft_vocabulary(torch.cat([train.context, train.tokens]), vocab, cfg.draft_vocab)
        ids = torch.arange(vocab) if self.token_ids is None else self.token_ids
        config = EagleConfig.for_target(target.config, ids.numel(), tuple(cfg.aux_layers), target=str(
            getattr(target.config, "_name_or_path", "")))
        model = EagleModel(config)
        model.set_token_ids(self.token_ids)
        self.lm_head_rows = full_lm_head[ids.to(device)]  # [Dv, H]: the target's, for its distribution
        if cfg.init_from_target:
            with torch.no_grad():
                model.lm_head.weight.copy_(self.lm_head_rows)
                if cfg.norm_from_target:
                    model.norm.weight.copy_(norm_scale(target.model.norm))  # Gemma's 1 + w
        embedding = target.get_input_embeddings()
        model.to(device).attach(embedding.weight.detach().to(device), embedding_scale(embedding))
        self.feature_scale = feature_scale(train) if cfg.scale_features else None  # [L*H] or None
        self.examples = self._packed(train)
        if self.feature_scale is not None:
            log.info("feature layers %s scaled by 1/RMS: %s while training", list(cfg.aux_layers),
                     [round(float(1 / x), 1) for x in self.feature_scale[:: train.features.shape[-1]]])
        self.device = device
        return model

    def _packed(self, split: Split) -> Packed:
        """``split``'s sequences packed into examples, the features as fc trains on them (scaled, if so)."""
        packed = pack(sequence_pairs(split), self.cfg.chunk_len)
        if self.feature_scale is not None:
            packed.features *= self.feature_scale
        return packed

    def num_examples(self) -> int:
        return len(self.examples)

    def summary(self) -> dict[str, Any]:
        return {"train_chunks": len(self.examples), "train_positions": int((self.examples.segment >= 0).sum()),
                "draft_vocab_size": int(self.lm_head_rows.shape[0])}

    def loss(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        batch = self.examples.rows(idx, self.device)
        eagle = model.module if hasattr(model, "module") else model
        loss, per_step, agree = eagle_loss(eagle, batch, self.lm_head_rows, self.cfg.ttt_steps, self.cfg.step_decay)
        return loss, {**{f"ce{i}": x for i, x in enumerate(per_step)}, **{f"top1_{i}": x for i, x in enumerate(agree)}}

    @torch.no_grad()
    def evaluate(self, model: EagleModel, splits: dict[str, Split]) -> dict[str, Any]:
        evals = {}
        for name in sorted(set(splits) - {"train"}):
            packed = self._packed(splits[name])
            matches, counted = [], []
            for start in range(0, len(packed), 16):
                batch = packed.rows(torch.arange(start, min(start + 16, len(packed))), self.device)
                m, c = chain_matches(model, batch, self.cfg.eval_depth)
                matches.append(m.cpu())
                counted.append(c.cpu())
            evals[name] = chain_tau(torch.cat(matches), torch.cat(counted))
        return {"eval": evals}

    def score(self, metrics: dict[str, Any]) -> float:
        return metrics["eval"]["val"]["tau_chain"][-1]

    def log_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        return {f"{n}/tau_chain{len(e['tau_chain'])}": e["tau_chain"][-1] for n, e in metrics["eval"].items()} | {
            f"{n}/alpha{j + 1}": a for n, e in metrics["eval"].items() for j, a in enumerate(e["alpha"])}

    def save(self, model: EagleModel, path: Path, target_name: str, metrics: dict[str, Any],
             dtype: torch.dtype | None = None) -> None:
        eagle = model.module if hasattr(model, "module") else model
        if self.feature_scale is not None:  # fc reads the target's features as they come
            if dtype == torch.float16:
                log.warning("method.scale_features: fc's weights, divided by the features' RMS, fall below float16's "
                            "normal range and lose precision; export in float32 (export_dtype=null) or bfloat16")
            eagle = copy.deepcopy(eagle)
            with torch.no_grad():
                eagle.fc.weight.mul_(self.feature_scale.to(eagle.fc.weight))
        save_eagle(Path(path).parent, eagle, verifier=target_name, dtype=dtype,
                   extra={"held_out": metrics.get("eval", {})})
