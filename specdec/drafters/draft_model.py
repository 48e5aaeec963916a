"""An independent draft model sharing the target's vocabulary, on its own static cache.

The draft cache holds every committed token but the last two. Each proposal first feeds those two (one
forward of 2 tokens), then one token per further draft. After verification the draft cache is rolled
back to ``seq_lens - 2`` — a pointer move — which is correct whether the verifier kept 0 or all K drafts:
every slot below that bound holds a committed token (the drafts it kept were the ones fed).

A distilled student (``python -m specdec.train method=draft_model``) is a lean directory holding its own
layers only; ``model=<that directory>`` loads it with the target's embeddings and LM head stitched in
(:mod:`specdec.drafters.student`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Drafter, Proposal, register
from specdec.errors import VocabMismatchError
from specdec.models import as_decoder
from specdec.sampling import SamplingParams, logits_to_probs, sample


EARLY_EXIT_LAYERS = 8  # drafter.model=target: the target's first 8 layers draft (all, for a smaller target)


@register("draft_model")
class DraftModelDrafter(Drafter):
    """``model``: any transformers causal LM (or decoder) with the target's vocabulary.

    ``num_layers`` keeps its first N layers only (Llama family): with the target itself as ``model``
    this is a self-speculative early-exit drafter that needs no extra weights. A distilled student (a
    directory :func:`~specdec.drafters.student.save_student` wrote) runs all its layers.
    """

    @dataclass
    class Config(DrafterConfig):
        name: str = "draft_model"
        # "target" (the target itself), a distilled student's directory, an alias, a local path or a hub id;
        # same vocabulary. "default" is reserved for the student shipped for the default target (none yet).
        model: str = "target"
        # Keep only the first N decoder layers (early exit). null: 8 of the target's (model=target), all of
        # another model's. A distilled student always runs all its layers.
        num_layers: Optional[int] = None

    def __init__(self, model: torch.nn.Module, num_layers: int | None = None):
        self.decoder = as_decoder(model, num_layers=num_layers)
        self.cache = None
        self.forwards = 0

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None) -> "DraftModelDrafter":
        from specdec.drafters.student import DEFAULT_DRAFT, default_student_path, is_student_dir, load_student
        from specdec.loading import check_same_vocab, load_target

        student = cfg.model == DEFAULT_DRAFT or (cfg.model not in (None, "", "target") and is_student_dir(cfg.model))
        if student and cfg.num_layers is not None:
            raise ValueError(f"drafter.num_layers={cfg.num_layers} does not apply to a distilled student "
                             f"({cfg.model!r}: all its layers run); leave drafter.num_layers null")
        if cfg.model == DEFAULT_DRAFT:
            path = default_student_path()
            if not is_student_dir(path):
                raise FileNotFoundError(f"drafter.model={DEFAULT_DRAFT}: no distilled draft model is shipped yet (in "
                                        f"{str(path)!r}); train one with `python -m specdec.train method=draft_model` "
                                        f"and point drafter.model at its directory")
            return cls(load_student(path, target))
        if cfg.model not in (None, "", "target") and is_student_dir(cfg.model):
            return cls(load_student(cfg.model, target))
        num_layers = cfg.num_layers
        if cfg.model in (None, "", "target"):
            model, draft_tokenizer = target, tokenizer
            if num_layers is None:
                num_layers = min(EARLY_EXIT_LAYERS, target.config.num_hidden_layers)
        else:
            model, draft_tokenizer = load_target(cfg.model, dtype=target.dtype, device=target.device)
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_vocab(tokenizer, draft_tokenizer)
        return cls(model, num_layers=num_layers)

    def start(self, state: DecodeState) -> None:
        if self.decoder.vocab_size != state.vocab_size:
            raise VocabMismatchError(
                f"draft model vocabulary ({self.decoder.vocab_size} tokens) differs from the target's "
                f"({state.vocab_size}); a draft model must share the target's tokenizer (or use drafter=ngram)"
            )
        batch = state.seq.shape[0]
        self.cache = self.decoder.new_cache(batch, state.capacity, state.pad)
        prefix = state.max_seq_len - 2  # all rows have the same length right after the prompt
        if prefix > 0:
            self.decoder(state.seq[:, :prefix], self.cache, kv_len=prefix, last_only=True)
            self.cache.commit(torch.full_like(state.seq_lens, prefix))
            self.forwards += 1

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        self.cache.rollback_to(state.seq_lens - 2)
        last_two = state.seq.gather(1, state.seq_lens[:, None] - 2 + torch.arange(2, device=state.seq.device))
        params = state.sampling
        tokens, probs = [], []
        logits, _ = self.decoder(last_two, self.cache, kv_len=state.max_seq_len)
        self.cache.commit(torch.full_like(state.seq_lens, 2))
        self.forwards += 1
        for i in range(k):
            token, q = self.draw(logits[:, -1], params, state.generator)  # [B], [B, V]
            tokens.append(token)
            probs.append(q)
            if i + 1 < k:
                logits, _ = self.decoder(token[:, None], self.cache, kv_len=state.max_seq_len + i + 1)
                self.cache.commit(torch.ones_like(state.seq_lens))
                self.forwards += 1
        return Proposal(
            tokens=torch.stack(tokens, 1),
            probs=None if params.greedy else torch.stack(probs, 1),
            num_proposed=[k] * state.seq.shape[0],
        )

    def draw(self, logits: torch.Tensor, params: SamplingParams,  # logits [B, V]
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:  # token [B], q [B, V]
        """One draft token per row and the distribution q it was drawn from, which the verifier is told."""
        q = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)
        return sample(q, generator), q

    def reset(self) -> None:
        self.cache = None
