"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the current suffix.

Training-free and model-free (Saxena 2023; transformers' ``prompt_lookup_num_tokens``). Drafts are
deterministic (one-hot q). When no row finds a match the proposal is empty and the step is a plain
decode step, so a miss costs no verification work.

``min_ngram`` defaults to 2: a single matching token predicts the continuation poorly, and verifying a
draft is not free where the forward is compute-bound (this 2-core CPU: 5 tokens cost ~1.8x one). On 6
HumanEval prompts, K=4, greedy: min_ngram=1 gave α 0.41 and 1.13x over plain decoding, min_ngram=2
α 0.59 and 1.30x (experiments/benchmarks/vs_transformers.py, one thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Drafter, Proposal, register
from specdec.models.backend import Backend


def lookup(tokens: np.ndarray, k: int, max_ngram: int, min_ngram: int) -> np.ndarray:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix.

    tokens: [S] the row's tokens so far. Returns [<= k].
    """
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = tokens[n_tokens - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: n_tokens - 1], n)  # earlier starts only
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return tokens[start: start + k]
    return tokens[:0]


@register("ngram")
class NgramDrafter(Drafter):
    @dataclass
    class Config(DrafterConfig):
        name: str = "ngram"
        max_ngram: int = 3  # longest suffix looked up
        min_ngram: int = 2  # shortest suffix looked up before giving up (see the module docstring)

        def check(self, job) -> None:
            NgramDrafter(self.max_ngram, self.min_ngram)  # its own check; the drafter needs no model to build

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "NgramDrafter":
        return cls(max_ngram=cfg.max_ngram, min_ngram=cfg.min_ngram)

    def propose(self, state: DecodeState, k: int) -> Proposal:
        found = [
            lookup(np.asarray(row, dtype=np.int64), k, self.max_ngram, self.min_ngram) if on else np.zeros(0, np.int64)
            for row, on in zip(state.tokens, state.active)
        ]
        width = max(len(f) for f in found)
        if width == 0:
            return Proposal(tokens=state.last_tokens.new_zeros(len(found), 0), num_proposed=[0] * len(found))
        # Rows with shorter matches are filled with their last token: any filler keeps exactness.
        padded = [np.concatenate([f, np.full(width - len(f), row[-1], np.int64)]) for f, row in zip(found, state.tokens)]
        tokens = torch.from_numpy(np.stack(padded)).to(state.last_tokens.device)
        return Proposal(tokens=tokens, num_proposed=[len(f) for f in found])

    def observe(self, state: DecodeState) -> None:
        """Nothing to roll back: each proposal is looked up afresh in ``state.tokens``."""
