"""Medusa heads (Cai et al. 2024) as a training method: residual heads over the frozen target's LM head.

Head i, on the hidden state that predicted token t+1, learns token t+2+i by cross-entropy weighted
``head_decay ** i`` (Medusa-1), or against the target's own distribution over that label
(``soft_labels``). With ``draft_vocab: N`` the heads score only the N tokens most frequent in the training
answers (their rows of the frozen LM head); a label outside them is left out of the loss and counted as a
miss in evaluation. ``token_aware`` heads (Hydra-style) also read the emitted token and the draft path.
Evaluation: per-head top-1 / top-5 accuracy on every held-out split, and the draft tree chosen on ``val``
(the paths of head ranks the target most often follows, best first) with its expected τ everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from specdec.drafters.medusa import MedusaHeads, save_heads
from specdec.training.distill.store import Split
from specdec.training.distill.vocab import IGNORE, check_draft_vocab, draft_vocabulary, to_draft_labels
from specdec.training.methods.base import MethodConfig, TrainMethod, register_method
from specdec.training.methods.medusa.objective import (accuracies, head_labels, known_embeddings, label_ranks,
                                                       medusa_loss, soft_targets, tree_from_ranks, tree_tau,
                                                       with_previous_token)


@dataclass
class MedusaMethodConfig(MethodConfig):
    name: str = "medusa"
    num_heads: int = 3
    own_lm_head: bool = False  # an own (trainable) LM head per Medusa head instead of the target's, shared
    token_aware: bool = False  # heads also read the emitted token and the draft path (Hydra-style)
    draft_vocab: Optional[int] = 8192  # heads score the N most frequent answer tokens only (FR-Spec); null = all
    head_decay: float = 0.8  # loss weight of head i is head_decay ** i (Medusa-1)
    soft_labels: bool = False  # learn the target's distribution over each label, not the label alone
    tree_nodes: int = 32  # paths stored with the heads, best first (chosen on the val split)
    max_rank: int = 10  # candidates per head considered for the tree


@register_method("medusa")
class MedusaMethod(TrainMethod):
    Config = MedusaMethodConfig
    weights_file = "heads.safetensors"
    description = "Medusa-1 heads over the target's final hidden state"
    reference = "Medusa-1 on Vicuna-7B, head top-1 accuracy: 0.56 / 0.32 / 0.20 (heads 1..3)"

    def __init__(self, cfg: MedusaMethodConfig):
        super().__init__(cfg)
        if cfg.token_aware and cfg.num_heads < 2:
            raise ValueError(f"method.token_aware needs method.num_heads >= 2, got {cfg.num_heads} (the training "
                             f"examples mark where answers end by head 2's labels)")

    def run_config(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.cfg).items() if k not in ("tree_nodes", "max_rank")}

    def check_target(self, target: torch.nn.Module) -> None:
        check_draft_vocab(self.cfg.draft_vocab, target.get_output_embeddings().weight.shape[0])

    def setup(self, target: torch.nn.Module, splits: dict[str, Split], device: torch.device) -> MedusaHeads:
        cfg = self.cfg
        full_lm_head = target.get_output_embeddings().weight.detach().to(device)  # [V, H], frozen
        self.vocab_size = full_lm_head.shape[0]
        _, train_labels = head_labels(splits["train"].tokens, splits["train"].lengths, cfg.num_heads)
        self.token_ids = draft_vocabulary(train_labels, self.vocab_size, cfg.draft_vocab)
        heads = MedusaHeads(full_lm_head.shape[1], self.vocab_size, cfg.num_heads, cfg.own_lm_head,
                            token_ids=self.token_ids, token_aware=cfg.token_aware)
        heads.init_lm_heads(full_lm_head)
        heads.to(device)
        self.lm_head_weight = heads.draft_lm_head(full_lm_head)  # [V', H]: sliced once
        self.embed_weight = target.get_input_embeddings().weight.detach().to(device)  # token-aware heads
        self.hidden, labels, self.known_tokens = self.examples(splits["train"])
        self.labels = to_draft_labels(labels, self.token_ids, self.vocab_size)
        self.draft_vocab_size = heads.draft_vocab_size
        return heads

    def examples(self, split: Split) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(hidden [P, H], labels [P, h], the token-aware heads' known tokens [P, 1+h] or None)."""
        rows, labels = head_labels(split.tokens, split.lengths, self.cfg.num_heads)
        hidden = split.hidden[rows]
        if not self.cfg.token_aware:
            return hidden, labels, None
        hidden, tokens = with_previous_token(hidden, labels)
        return hidden, tokens[:, 1:], tokens

    def num_examples(self) -> int:
        return int(self.hidden.shape[0])

    def summary(self) -> dict[str, Any]:
        return {"train_positions": self.num_examples(), "draft_vocab_size": self.draft_vocab_size}

    def _known(self, tokens: torch.Tensor | None, rows: Any) -> torch.Tensor | None:
        if tokens is None:
            return None
        return known_embeddings(self.embed_weight, tokens[rows].to(self.embed_weight.device))

    def loss(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.lm_head_weight.device
        known = self._known(self.known_tokens, idx)
        logits = model(self.hidden[idx].to(device), self.lm_head_weight, known=known)  # [b, h, V']
        targets = soft_targets(self.hidden, idx, self.labels, self.lm_head_weight) if self.cfg.soft_labels else None
        loss, per_head = medusa_loss(logits, self.labels[idx].to(device), self.cfg.head_decay, targets)
        return loss, {f"loss_head{j}": x for j, x in enumerate(per_head)}

    @torch.no_grad()
    def evaluate(self, model: MedusaHeads, splits: dict[str, Split]) -> dict[str, Any]:
        device = self.lm_head_weight.device
        evals, split_ranks = {}, {}
        for name in sorted(set(splits) - {"train"}):
            hidden, labels, tokens = self.examples(splits[name])
            hidden, labels = hidden.to(device), labels.to(device)
            draft_labels = to_draft_labels(labels.cpu(), self.token_ids, self.vocab_size).to(device)
            known = None if tokens is None else (lambda rows, t=tokens: self._known(t, rows))
            ranks = label_ranks(model, self.lm_head_weight, hidden, draft_labels, self.cfg.max_rank, known=known)
            valid = labels != IGNORE  # a label outside the draft vocabulary counts as a miss
            evals[name] = {"positions": int(hidden.shape[0]), **accuracies(ranks, labels),
                           "in_draft_vocab": float(((draft_labels != IGNORE) & valid).sum() / valid.sum().clamp(min=1))}
            split_ranks[name] = ranks.cpu(), labels.cpu()
        tree, tau = tree_from_ranks(*split_ranks["val"], self.cfg.tree_nodes)
        for name, (ranks, labels) in split_ranks.items():  # what the tree chosen on val promises elsewhere
            evals[name]["expected_tau_greedy"] = [round(t, 4) for t in tree_tau(ranks, labels, tree)]
        return {"eval": evals, "tree": tree, "expected_tau_greedy": [round(t, 4) for t in tau]}

    def score(self, metrics: dict[str, Any]) -> float:
        return metrics["eval"]["val"]["top1"][0]  # head 1's held-out top-1 accuracy

    def decode_overrides(self, metrics: dict[str, Any]) -> list[str]:
        """A tree of fewer paths than the drafter's defaults draft from (drafter.k - drafter.lookup) asks a
        smaller drafter.k."""
        from specdec.drafters import drafter_config

        shipped = drafter_config("medusa")
        paths = len(metrics["tree"])
        return [f"drafter.k={paths + shipped.lookup}"] if 0 < paths < shipped.k - shipped.lookup else []

    def log_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        """Per-head accuracies of every split, for the tracker."""
        return {f"{n}/{k}_head{j}": v for n, e in metrics["eval"].items() for k in ("top1", "top5")
                for j, v in enumerate(e[k])}

    def save(self, model: MedusaHeads, path: Path, target_name: str, metrics: dict[str, Any],
             dtype: torch.dtype | None = None) -> None:
        save_heads(path, model, target=target_name, tree=metrics["tree"], dtype=dtype)
