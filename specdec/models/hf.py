"""Generic fallback for causal LMs outside the Llama family: transformers' own forward and DynamicCache.

Rollback is a crop of the cache (O(1) in transformers, but one length for the whole batch), so this path
runs batch 1 only; the Llama family goes through :mod:`specdec.models.compact` instead.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from specdec.models.compact import SUPPORTED_MODEL_TYPES


@dataclass
class CroppedCache:
    """A DynamicCache plus the bookkeeping :class:`specdec.models.cache.KVCache` exposes to the decode loop."""

    inner: DynamicCache
    lengths: torch.Tensor  # [1] long: committed tokens
    pad: torch.Tensor  # [1] long: always 0 (batch 1, no padding)
    capacity: int

    def commit(self, num_tokens: torch.Tensor) -> None:  # [1]
        self.lengths += num_tokens
        self._crop()

    def rollback_to(self, lengths: torch.Tensor) -> None:  # [1]
        self.lengths.copy_(lengths)
        self._crop()

    def _crop(self) -> None:
        # crop(-n) drops the last n entries in transformers 4 and 5 alike (5 refuses a positive length).
        surplus = self.inner.get_seq_length() - int(self.lengths[0])
        if surplus > 0:
            self.inner.crop(-surplus)


def cache_keyword(hf_model: nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` from transformers 5.24 on, ``past_key_values`` before
    (5.24 still takes the old name, with a deprecation warning, until its removal)."""
    parameters = inspect.signature(hf_model.forward).parameters
    return "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"


class HFDecoder(nn.Module):
    """Any transformers causal LM behind the interface of :class:`specdec.models.compact.CompactDecoder`."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.model = hf_model
        config = hf_model.config
        self.vocab_size = config.vocab_size
        self.hidden_size = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 10**9)
        self.config = config
        self.cache_keyword = cache_keyword(hf_model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> CroppedCache:
        if batch_size != 1 or int(pad.max()) != 0:
            raise NotImplementedError(
                f"{type(self.model).__name__} runs through the generic transformers fallback, which supports "
                f"batch size 1 only (got {batch_size}); the compact path that batches covers the model types "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (specdec.models.compact.FAMILIES)"
            )
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        return CroppedCache(DynamicCache(), zero, zero.clone(), capacity)

    def forward(self, input_ids: torch.Tensor, cache: CroppedCache, *, kv_len: int | None = None,
                tree_mask: torch.Tensor | None = None, depths: torch.Tensor | None = None, last_only: bool = False,
                capture: tuple[int, ...] = ()):
        if tree_mask is not None:
            raise NotImplementedError(f"token trees need the compact path (model types "
                                      f"{', '.join(SUPPORTED_MODEL_TYPES)}); {type(self.model).__name__} runs "
                                      "through the generic transformers fallback: use a chain drafter")
        t = input_ids.shape[1]
        start = int(cache.lengths[0])
        positions = torch.arange(start, start + t, device=input_ids.device)[None]
        out = self.model(input_ids=input_ids, position_ids=positions, use_cache=True, output_hidden_states=True,
                         **{self.cache_keyword: cache.inner})
        # The forward appended T entries; the loop commits what it keeps (commit crops the rest).
        extra = (torch.cat([out.hidden_states[k] for k in capture], -1),) if capture else ()
        if last_only:
            return out.logits[:, -1:].float(), out.hidden_states[-1][:, -1:], *extra
        return out.logits.float(), out.hidden_states[-1], *extra
