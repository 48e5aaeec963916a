"""A target forward that computes each distinct prompt's prefill once (for the exactness job, which
continues every prompt many times)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models import as_decoder
from specdec.models.backend import Backend
from specdec.models.cache import KVCache
from specdec.models.compact import CompactDecoder, supports


class SharedPrefillLlama(CompactDecoder):
    """The target's compact forward, with one shortcut for this job, which continues each prompt many
    times: a prefill (a forward of T > 1 tokens on an empty cache) is computed once per distinct prompt
    for the lifetime of this object — across batches, and across speculative sampling, plain sampling
    and scoring — and its keys/values are copied into every row that repeats it. Rotary positions count
    from each row's first real token, so the copy is the same whatever the row's left padding.

    A prefill returns the logits and hidden state of the *last* position only ([B, 1, V], [B, 1, H]):
    that is all the decode loop reads from it, and it spares [B, T, V] logits for long prompts. Every
    other forward is the plain :class:`CompactDecoder` one. With ``capture`` (an EAGLE-style drafter's feature
    layers) the prefill also returns those layers at every prompt position, computed once per prompt too."""

    def __init__(self, hf_model: torch.nn.Module, *, backend: Backend = Backend()):
        super().__init__(hf_model, backend=backend)
        self._prefills: dict[tuple, _Prefill] = {}  # by the prompt's tokens and the layers captured

    def forward(self, input_ids, cache, *, kv_len=None, tree_mask=None, depths=None, last_only=False, capture=()):
        if input_ids.shape[1] == 1 or tree_mask is not None or depths is not None or bool(cache.lengths.any()):
            return super().forward(input_ids, cache, kv_len=kv_len, tree_mask=tree_mask, depths=depths,
                                   last_only=last_only, capture=capture)
        pads = cache.pad.tolist()
        prompts = [tuple(row[p:]) for row, p in zip(input_ids.tolist(), pads)]
        for prompt in dict.fromkeys(prompts):  # distinct, in order
            if (prompt, tuple(capture)) not in self._prefills:
                self._prefills[prompt, tuple(capture)] = self._prefill(prompt, tuple(capture))
        prompts = [(p, tuple(capture)) for p in prompts]
        for b, (key, pad) in enumerate(zip(prompts, pads)):
            done, prompt = self._prefills[key], key[0]
            for layer in range(len(self.layers)):
                cache.keys[layer][b, :, pad:pad + len(prompt)] = done.keys[layer]
                cache.values[layer][b, :, pad:pad + len(prompt)] = done.values[layer]
        logits = torch.stack([self._prefills[p].logits for p in prompts])[:, None]  # [B, 1, V]
        hidden = torch.stack([self._prefills[p].hidden for p in prompts])[:, None]  # [B, 1, H]
        if not capture:
            return logits, hidden
        first = self._prefills[prompts[0]].features
        features = first.new_zeros(input_ids.shape[0], input_ids.shape[1], first.shape[-1])  # [B, S, F]
        for b, (key, pad) in enumerate(zip(prompts, pads)):
            features[b, pad:] = self._prefills[key].features
        return logits, hidden, features

    def _prefill(self, prompt: tuple[int, ...], capture: tuple[int, ...] = ()) -> _Prefill:
        ids = torch.tensor([prompt], device=self.device)  # [1, S]: no padding
        cache = KVCache.allocate(len(self.layers), 1, self.num_kv_heads, len(prompt), self.head_dim,
                                 torch.zeros(1, dtype=torch.long, device=self.device), dtype=self.dtype,
                                 device=self.device)
        logits, hidden, *features = super().forward(ids, cache, kv_len=len(prompt), capture=capture)
        return _Prefill([k[0].clone() for k in cache.keys], [v[0].clone() for v in cache.values],
                        logits[0, -1].clone(), hidden[0, -1].clone(), features[0][0].clone() if features else None)


@dataclass
class _Prefill:
    keys: list[torch.Tensor]  # per layer [H_kv, S, D]
    values: list[torch.Tensor]  # per layer [H_kv, S, D]
    logits: torch.Tensor  # [V] at the prompt's last token
    hidden: torch.Tensor  # [H] at the prompt's last token
    features: torch.Tensor | None = None  # [S, F] the captured layers at every prompt position


def fast_decoder(target: torch.nn.Module, backend: Backend | None = None) -> torch.nn.Module:
    """The decoder this job runs ``target`` with, on ``backend`` (None: ``Backend()``): :class:`SharedPrefillLlama`
    for a model of the compact path's families, else the usual adapter."""
    backend = Backend() if backend is None else backend
    return SharedPrefillLlama(target, backend=backend) if supports(target) else as_decoder(target, backend=backend)
