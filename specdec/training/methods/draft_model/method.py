"""A distilled draft model as a training method: a few-layer student of the target, trained on the target's
next-token distributions (DistillSpec, Zhou et al. 2024; layer selection as in Minitron's depth pruning).

The data are the target's own answers (self-distillation) with its final hidden state at every answer
position (and at the prompt's with ``prompt_loss``); the target's distribution there is its LM head applied
to that hidden state. Examples are chunks of packed token sequences (prompt + answer); the loss
(``fkl``, ``rkl`` or ``tv``, :mod:`.objective`) is taken on the answer positions. With
``on_policy_fraction`` > 0 that share of each batch is replaced by sequences the student samples from
training prompts, scored by the target on the spot (DistillSpec's on-policy data). Held-out figures: the
greedy chain's expected τ and α per depth replayed on the target's answers, and the expected acceptance at
T=1, Σ min(p, q). The student is written lean (:mod:`specdec.drafters.draft_model.student`): its layers and final norm,
the target's embeddings and LM head stitched back in at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.draft_model.student import init_student, save_student, save_token_counts
from specdec.models import check_layer_ids
from specdec.training.distill.packing import chain_tau, pack
from specdec.training.distill.store import DataNeeds, Split
from specdec.training.methods.base import MethodConfig, TrainMethod, register_method
from specdec.training.methods.draft_model.objective import (
    LOSSES, chain_matches, distill_loss, sample_continuations, scored_pairs, student_pairs)


@dataclass
class DraftModelMethodConfig(MethodConfig):
    name: str = "draft_model"
    # target layers the student's layers start from, in order (Minitron-style depth pruning); for the
    # 30-layer SmolLM2-135M: the first, two evenly spread, the last
    layers: list[int] = field(default_factory=lambda: [0, 10, 20, 29])
    loss: str = "fkl"  # fkl (forward KL) | rkl (reverse KL) | tv (total variation = 1 - acceptance at T=1)
    prompt_loss: bool = False  # also train on the prompt's positions (stores the target's hidden states there)
    chunk_len: int = 256  # positions per example (sequences packed)
    # share of each batch's examples replaced by the student's own samples (one prompt + on_policy_tokens
    # tokens each), scored by the target at training time
    on_policy_fraction: float = 0.0
    on_policy_tokens: int = 32  # tokens the student samples per on-policy prompt
    eval_depth: int = 6  # chain length replayed on held-out answers
    eval_batch: int = 4  # chunks per held-out forward


@register_method("draft_model")
class DraftModelMethod(TrainMethod):
    Config = DraftModelMethodConfig
    weights_file = "model.safetensors"  # beside it config.json: a lean student directory (drafter.path=<dir>)
    description = ("a few-layer student of the target (layers copied from chosen target layers; the target's "
                   "embeddings and LM head, frozen) distilled on the target's next-token distributions")
    reference = ("DistillSpec (Zhou et al. 2024): distilled drafts give 10-45% speedups over speculative decoding "
                 "with the undistilled draft (T5 and GPT-like targets); no published figure for a 4-layer student "
                 "of a 30-layer 135M target")

    def __init__(self, cfg: DraftModelMethodConfig):
        super().__init__(cfg)
        if cfg.loss not in LOSSES:
            raise ValueError(f"method.loss must be one of {list(LOSSES)}, got {cfg.loss!r}")
        for name in ("chunk_len", "eval_depth", "eval_batch", "on_policy_tokens"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"method.{name} must be >= 1, got {getattr(cfg, name)}")
        if not 0.0 <= cfg.on_policy_fraction <= 1.0:
            raise ValueError(f"method.on_policy_fraction must be in [0, 1], got {cfg.on_policy_fraction}")

    def needs(self) -> DataNeeds:
        return DataNeeds(context=self.cfg.prompt_loss)

    def run_config(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.cfg).items() if k not in ("eval_depth", "eval_batch")}

    def check_target(self, target: torch.nn.Module) -> None:
        check_layer_ids("method.layers", self.cfg.layers, target.config.num_hidden_layers)

    def setup(self, target: torch.nn.Module, splits: dict[str, Split], device: torch.device) -> torch.nn.Module:
        train = splits["train"]
        self.target = target
        self.device = device
        self.target_name = str(getattr(target.config, "_name_or_path", ""))
        student = init_student(target, list(self.cfg.layers), dtype=torch.float32).to(device)
        self.examples = pack(student_pairs(train, self.cfg.prompt_loss), self.cfg.chunk_len)
        self.token_counts = torch.bincount(train.tokens, minlength=target.config.vocab_size)  # drafter.draft_vocab
        starts = torch.cumsum(train.context_lengths, 0) - train.context_lengths
        self.prompts = [train.context[s: s + c] for s, c in zip(starts.tolist(), train.context_lengths.tolist())]
        return student

    def num_examples(self) -> int:
        return len(self.examples)

    def summary(self) -> dict[str, Any]:
        return {"train_chunks": len(self.examples), "train_positions": int((self.examples.answer).sum()),
                "student_layers": list(self.cfg.layers)}

    def loss(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        student = model.module if hasattr(model, "module") else model
        on = round(self.cfg.on_policy_fraction * idx.numel())
        loss, logged = (0.0, {}) if on == idx.numel() else distill_loss(student, self.examples.rows(idx[on:], self.device),
                                                                        self.cfg.loss)
        if on:
            on_loss, on_logged = self._on_policy_loss(student, idx[:on])
            share = on / idx.numel()
            loss = (1 - share) * loss + share * on_loss
            logged |= {f"on_policy_{k}": v for k, v in on_logged.items()}
        return loss, logged

    def _on_policy_loss(self, student, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss on continuations the student samples from ``idx.numel()`` training prompts, scored by the
        target; prompts and samples are drawn from a generator seeded by ``idx``, so a resumed run draws the same."""
        generator = torch.Generator().manual_seed(int(idx[0]) * 1_000_003 + idx.numel())
        prompts = [self.prompts[int(i)] for i in torch.randint(len(self.prompts), (idx.numel(),), generator=generator)]
        was_training = student.training
        student.eval()
        samples = sample_continuations(student, prompts, self.cfg.on_policy_tokens, generator)
        student.train(was_training)
        pairs = scored_pairs(self.target, samples, [p.numel() for p in prompts])
        batch = pack(pairs, max(self.cfg.chunk_len, max(s.numel() for s in samples)))
        return distill_loss(student, batch.rows(torch.arange(len(batch)), self.device), self.cfg.loss)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, splits: dict[str, Split]) -> dict[str, Any]:
        evals = {}
        for name in sorted(set(splits) - {"train"}):
            packed = pack(student_pairs(splits[name]), self.cfg.chunk_len)
            matches, counted, accept = [], [], []
            for start in range(0, len(packed), self.cfg.eval_batch):
                batch = packed.rows(torch.arange(start, min(start + self.cfg.eval_batch, len(packed))), self.device)
                m, c, a = chain_matches(model, batch, self.cfg.eval_depth)
                matches.append(m.cpu())
                counted.append(c.cpu())
                accept.append(a[c].cpu())
            evals[name] = {**chain_tau(torch.cat(matches), torch.cat(counted)),
                           "accept_t1": round(float(torch.cat(accept).mean()), 4)}
        return {"eval": evals}

    def score(self, metrics: dict[str, Any]) -> float:
        return metrics["eval"]["val"]["tau_chain"][-1]

    def log_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        values = {}
        for n, e in metrics["eval"].items():
            values[f"{n}/tau_chain{len(e['tau_chain'])}"] = e["tau_chain"][-1]
            values[f"{n}/accept_t1"] = e["accept_t1"]
            values |= {f"{n}/alpha{j + 1}": a for j, a in enumerate(e["alpha"])}
        return values

    def decode_overrides(self, metrics: dict[str, Any]) -> list[str]:
        """A target vocabulary smaller than the drafter's default draft vocabulary asks for the whole of it."""
        from specdec.drafters import drafter_config

        shipped = drafter_config("draft_model").draft_vocab
        return ["drafter.draft_vocab=0"] if shipped and self.token_counts.numel() < shipped else []

    def save(self, model: torch.nn.Module, path: Path, target_name: str, metrics: dict[str, Any],
             dtype: torch.dtype | None = None) -> None:
        student = model.module if hasattr(model, "module") else model
        save_student(Path(path).parent, student, target_name=target_name, layers=list(self.cfg.layers), dtype=dtype,
                     extra={"loss": self.cfg.loss, "held_out": metrics.get("eval", {})})
        save_token_counts(Path(path).parent, self.token_counts)
