"""Random-weight targets at a real model's shape: what a step costs at the scale people deploy, on machines that
cannot receive the weights (a transfer of 64 MiB cannot carry Llama-3.1-8B's 16 GB).

:func:`synthetic_target` builds a transformers causal LM from a shape (a preset of :data:`SHAPES`, or any
``config.json``, or a directory holding one), its weights drawn on the device in the target dtype (nothing is read
or transferred), and runs through the same compact decoder and backend as a real target. Its logits mean nothing:
it is for **costs only** (``experiments/benchmarks/step_costs.py``); the entry points that would report τ or
outputs refuse it (``target=synthetic``), and what measures it marks it so (:data:`MARK`). With ``weight_bits``
its weights are rounded to the block codes specdec's CPU kernels stream as such (``Backend(weights="codes")``), the
memory-bound regime of a 4-bit GGUF on a CPU (what llama.cpp users meet).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

MARK = "SYNTHETIC (random weights at the shape's size: costs only, no τ or outputs)"

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
SHAPES: dict[str, dict[str, Any]] = {  # the published configs' shapes (what a step's cost depends on)
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                     "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE,
                     "max_position_embeddings": 131072, "tie_word_embeddings": False},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                     "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
                     "max_position_embeddings": 131072, "tie_word_embeddings": True},
    "qwen3-8b": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                 "tie_word_embeddings": False},
}


def shape_config(shape: str, **overrides: Any):
    """The transformers config of ``shape``: a preset name (:data:`SHAPES`), a ``config.json`` path or a directory
    holding one; ``overrides`` replace fields (e.g. ``num_hidden_layers`` for a shorter model of the same width)."""
    from transformers import AutoConfig

    if shape.lower() in SHAPES:
        fields = dict(SHAPES[shape.lower()])
    else:
        path = Path(shape)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"target.shape={shape!r} is neither a preset ({sorted(SHAPES)}) nor a config.json "
                                    f"(or a directory holding one): name a preset or the path of a model's config.json")
        try:
            fields = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{str(path)!r} is not JSON ({exc}): a model's config.json is") from None
    fields.update(overrides)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"the shape {shape!r} names no model_type; a transformers config.json does")
    return AutoConfig.for_model(model_type, **fields)


def synthetic_target(shape: str, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                     seed: int = 0, weight_bits: int | None = None, **overrides: Any):
    """A causal LM of ``shape`` (:func:`shape_config`) with random weights drawn on ``device`` in ``dtype``
    (transformers' own initialisation, seeded), in eval mode, its config marked ``specdec_synthetic``: for costs
    only (:data:`MARK`). ``weight_bits`` (4 or 8; float32 on a CPU) rounds every layer's linear weights to codes of
    that many bits and the embedding (the LM head where tied) to 8-bit ones, per block of 32 inputs
    (``cpu_kernels.round_to_codes``: a Q4_1 or Q8_0 GGUF's forms, as the embedded SmolLM2 target's), so that
    ``Backend(weights="codes")`` streams them as those codes."""
    from transformers import AutoModelForCausalLM

    if weight_bits is not None and (torch.device(device).type != "cpu" or dtype != torch.float32):
        raise ValueError(f"weight_bits={weight_bits} rounds weights to the codes specdec's CPU kernels stream: "
                         f"give device='cpu' and dtype=torch.float32 (got {device!r}, {dtype}), or no weight_bits")
    config = shape_config(shape, **overrides)
    config.specdec_synthetic = True
    device = torch.device(device)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if weight_bits is not None:
        _round_to_codes(model, weight_bits)
    return model.eval()


def _round_to_codes(model: Any, bits: int) -> None:
    """Every linear weight of ``model`` rounded in place to ``bits``-bit codes, the embedding (and the LM head,
    tied or not) to 8-bit codes (see :func:`synthetic_target`)."""
    from specdec.models import cpu_kernels

    heads = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    with torch.no_grad():
        for weight in {id(p): p for p in model.parameters() if p.dim() == 2}.values():
            weight.copy_(cpu_kernels.round_to_codes(weight, 8 if id(weight) in heads else bits))


def is_synthetic(model: Any) -> bool:
    """Whether ``model`` (or a decoder over one) has a synthetic target's random weights."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "specdec_synthetic", False))
