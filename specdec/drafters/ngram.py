"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the current suffix.

Training-free and model-free (Saxena 2023; transformers' ``prompt_lookup_num_tokens``). Drafts are
deterministic (one-hot q). When no row finds a match the proposal is empty and the step is a plain
decode step, so a miss costs no verification work. On a GPU (``on_device``) the lookup runs on the device
(:func:`device_continuations`): k drafts every step, each row's filled with its last token past its match (a verify
step costs about the same for k + 1 tokens as for one there), nothing read back, so the decode loop reads each step a
step late; the genuine drafts are counted there and read back with the step.

``min_ngram`` defaults to 2: a single matching token predicts the continuation poorly, and verifying a
draft is not free where the forward is compute-bound (this 2-core CPU: 5 tokens cost ~1.8x one). On 6
HumanEval prompts, K=4, greedy: min_ngram=1 gave α 0.41 and 1.13x over plain decoding, min_ngram=2
α 0.59 and 1.30x (experiments/benchmarks/vs_transformers.py, one thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Drafter, DraftRuntime, Proposal, Traits, register
from specdec.models.backend import Backend
from specdec.models.graphs import Graphs


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


def device_continuations(
    seq: torch.Tensor,  # [B, S] long: each row's tokens at slots pad .. seq_lens - 1 (DecodeState.seq)
    seq_lens: torch.Tensor,  # [B] long
    pad: torch.Tensor,  # [B] long
    max_tokens: int,
    max_ngram: int = 3,
    min_ngram: int = 2,
    kernels=None,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, max_tokens], found [B] long (how many of them are the lookup's)
    """:func:`lookup` for every row on the device, in ops of fixed shapes (no value read back): each row's n-gram
    lookup continuation (the latest earlier occurrence of the longest suffix of ``max_ngram`` down to ``min_ngram``
    tokens, and up to ``max_tokens`` tokens after it), the rest of the row's ``max_tokens`` filled with its last
    token. A drafter's prompt-lookup branch on a GPU (:mod:`specdec.drafters.trees.lookup_branch`) and the n-gram
    drafter's own lookup there. ``kernels``: the step kernels (:meth:`Backend.step_kernels`, a GPU's), whose
    ``lookup_continuations`` is one kernel where the ops below are ~75."""
    if kernels is not None:
        return kernels.lookup_continuations(seq, seq_lens, pad, max_tokens, max_ngram, min_ngram)
    batch, capacity = seq.shape
    rows = torch.arange(batch, device=seq.device)
    last = seq[rows, seq_lens - 1]  # [B]
    start = torch.full((batch,), -1, dtype=torch.long, device=seq.device)  # where the continuation starts (-1: none)
    for n in range(min_ngram, max_ngram + 1):  # longer suffixes overwrite shorter ones' hits
        if n > capacity - 1:
            break
        offsets = torch.arange(n, device=seq.device)
        suffix = seq.gather(1, (seq_lens[:, None] - n + offsets).clamp(min=0))  # [B, n]
        windows = seq.unfold(1, n, 1)  # [B, S - n + 1, n]: the n tokens from each slot
        at = torch.arange(windows.shape[1], device=seq.device)
        # windows inside the row that end before the suffix does
        earlier = (at[None] >= pad[:, None]) & (at[None] + n <= seq_lens[:, None] - 1)
        hits = (windows == suffix[:, None]).all(-1) & earlier & (seq_lens - pad > n)[:, None]  # [B, S - n + 1]
        latest = torch.where(hits, at[None], -1).amax(1)  # [B]
        start = torch.where(latest >= 0, latest + n, start)
    slots = start[:, None] + torch.arange(max_tokens, device=seq.device)  # [B, L]
    found = torch.where(start >= 0, (seq_lens - start).clamp(min=0, max=max_tokens), 0)  # [B]
    inside = torch.arange(max_tokens, device=seq.device)[None] < found[:, None]
    tokens = torch.where(inside, seq.gather(1, slots.clamp(min=0, max=capacity - 1)), last[:, None])
    return tokens, found


def state_continuations(state: DecodeState, max_tokens: int, graphs: Graphs | None = None, max_ngram: int = 3,
                        min_ngram: int = 2, backend: Backend | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, max_tokens], found [B]
    """:func:`device_continuations` of a decode state's rows, replayed as one graph where ``graphs`` is given (its few
    dozen small ops would each cost a launch), eagerly otherwise; one kernel where ``backend``'s step kernels run on
    the rows' device (a GPU's)."""
    kernels = None if backend is None else backend.step_kernels(state.seq.device)

    def find(seq, seq_lens, pad):
        return device_continuations(seq, seq_lens, pad, max_tokens, max_ngram, min_ngram, kernels)

    inputs = (state.seq, state.seq_lens, state.pad)
    return find(*inputs) if graphs is None else graphs(find, inputs, key=("lookup", max_tokens, max_ngram, min_ngram))


@register("ngram")
class NgramDrafter(Drafter):
    @dataclass
    class Config(DrafterConfig):
        name: str = "ngram"
        max_ngram: int = 3  # longest suffix looked up
        min_ngram: int = 2  # shortest suffix looked up before giving up (see the module docstring)
        # look up on the device (k drafts every step, filled where shorter; read a step late): null = where the
        # target is on a GPU, whose verify step costs about the same for k + 1 tokens as for one
        on_device: Optional[bool] = None

        def check(self, job) -> None:
            NgramDrafter(self.max_ngram, self.min_ngram)  # its own check; the drafter needs no model to build

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, *, on_device: bool = False,
                 device: torch.device | str | None = None, backend: Backend = Backend()):
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.on_device = on_device
        self.traits = Traits(device_only=on_device)
        # the lookup on the device is a few dozen small ops: one graph replay where the target's forwards replay
        # graphs (``device``: the target's; None, or the host's lookup: nothing to replay)
        self.runtime = DraftRuntime(backend, device=lambda: None if device is None else torch.device(device)) \
            if on_device else None

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "NgramDrafter":
        device = None if target is None else next(target.parameters()).device
        on_device = cfg.on_device if cfg.on_device is not None else device is not None and device.type == "cuda"
        return cls(max_ngram=cfg.max_ngram, min_ngram=cfg.min_ngram, on_device=on_device, device=device,
                   backend=backend)

    def propose(self, state: DecodeState, k: int) -> Proposal:
        if self.on_device:  # k drafts a row, the genuine ones counted there
            tokens, found = state_continuations(state, k, self.runtime.graphs, self.max_ngram, self.min_ngram,
                                                self.runtime.backend)
            return Proposal(tokens=tokens, num_proposed=[k] * tokens.shape[0], counted=found)
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
