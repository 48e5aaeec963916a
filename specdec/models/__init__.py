"""Model adapters: every target or draft model is run through a decoder with a per-row cache, on a
:class:`Backend` (how its forwards run, specdec's CPU kernels or on a GPU its Triton kernels, and how its weights
stream) chosen when the decoder is built."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from specdec.models.backend import Backend
from specdec.models.graphs import GraphedDecoder, target_decoder
from specdec.models.hf import HFDecoder
from specdec.models.compact import SUPPORTED_MODEL_TYPES, CompactDecoder, supports


def as_decoder(model: nn.Module, num_layers: int | None = None, *, backend: Backend | None = None) -> nn.Module:
    """Wrap a transformers causal LM: the compact path for its family (llama, mistral, qwen2, qwen3, gemma3_text)
    when possible, running on ``backend`` (None: ``Backend()``, specdec's CPU kernels over the weights' codes where
    they have them, its Triton kernels on a GPU), else the HF fallback (its own forward; no backend applies).

    A model that already is a decoder (a :class:`GraphedDecoder` too) is returned as is: its backend is the one it
    was built with, and another ``backend`` is an error. ``num_layers`` (early exit) needs the compact path.
    """
    if isinstance(model, (CompactDecoder, GraphedDecoder)):
        if backend is not None and backend != model.backend:
            raise ValueError(f"this {type(model).__name__} was built on {model.backend}; pass its HF model to run it "
                             f"on {backend}")
        return model
    if isinstance(model, HFDecoder):
        return model
    if supports(model):
        return CompactDecoder(model, num_layers=num_layers, backend=Backend() if backend is None else backend)
    if num_layers is not None:
        raise ValueError(f"num_layers={num_layers} (early exit) needs the compact path (model types "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}); {type(model).__name__} runs through the generic "
                         "fallback")
    return HFDecoder(model)


def check_layer_ids(what: str, layers: Sequence[int], total: int) -> None:
    """Refuse ``layers`` unless it is a non-empty list of ids of a ``total``-layer target's layers; ``what``
    names the setting in the message (e.g. ``method.aux_layers``)."""
    layers = list(layers)
    outside = [i for i in layers if not 0 <= i < total]
    if not layers or outside:
        raise ValueError(f"{what}={layers} must be a non-empty list of target layer ids in [0, {total - 1}] for this "
                         f"{total}-layer target (outside it: {outside})")


__all__ = ["Backend", "CompactDecoder", "GraphedDecoder", "HFDecoder", "as_decoder", "check_layer_ids", "supports",
           "target_decoder"]
