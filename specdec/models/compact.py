"""A compact forward pass over :class:`KVCache` for the Llama-like families: Llama 2/3 (SmolLM2), Mistral,
Qwen2, Qwen3 and Gemma-3.

transformers' cache classes keep one length for the whole batch, so rows that accept different numbers
of draft tokens cannot roll back independently in O(1). This module owns only what that needs — the
attention over a per-row static cache — and reuses the HF model's own submodules (embeddings, linear
layers, norms, MLPs, rotary embeddings) for everything else: no weights are copied or re-implemented,
and the logits match HF's (tested per family). What a family adds to Llama's layer is data
(:class:`Family`), read by the one forward: q/k norms, Gemma's norms around the attention and the MLP, a
rotary embedding per layer kind, sliding-window layers, a final logit soft-cap. How the products and the small
ops run on CPU (specdec's kernels or torch's, the weights as codes or float32) is the decoder's
:class:`~specdec.models.backend.Backend`, given when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import fused
from specdec.models.backend import Backend, ProductPlan, _version
from specdec.models.cache import KVCache


@dataclass(frozen=True)
class Family:
    """What a decoder family adds to Llama's layer (RMSNorm, attention, RMSNorm, gated MLP, residual adds), as
    data. The norms, activations and embeddings themselves are the HF model's modules (Gemma's (1 + w) RMSNorm,
    its GELU-tanh MLP and its embedding scaled by √hidden among them); sliding windows come from the config
    (``sliding_window`` with ``layer_types``, or on every layer for Mistral)."""

    qk_norm: bool = False  # each head's q and k RMSNormed before the rotary embedding (attn.q_norm, attn.k_norm)
    # Gemma: the attention's output normed (post_attention_layernorm) before its residual add, and the MLP
    # between pre_feedforward_layernorm and post_feedforward_layernorm
    sandwich_norms: bool = False
    rope_by_layer_type: bool = False  # one rotary embedding per layer kind: rotary_emb(x, positions, kind)
    window_on_every_layer: bool = False  # config.sliding_window holds on every layer (Mistral), not per layer_types

    @property
    def fused_layer(self) -> bool:
        """A layer the fused forward describes (:class:`~specdec.models.fused.Layer`): Llama's, with or without
        q/k norms (Qwen3's); not Gemma's sandwich norms and per-kind rotary embeddings."""
        return not (self.sandwich_norms or self.rope_by_layer_type)


FAMILIES = {  # transformers model_type -> what its layer adds to Llama's
    "llama": Family(),
    "mistral": Family(window_on_every_layer=True),
    "qwen2": Family(),
    "qwen3": Family(qk_norm=True),
    "gemma3_text": Family(qk_norm=True, sandwich_norms=True, rope_by_layer_type=True),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def _layer_windows(config, count: int, family: Family) -> list[int | None]:
    """Each layer's sliding window in tokens (None: global attention), as transformers reads the config."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return [None] * count
    if family.window_on_every_layer:
        return [int(window)] * count
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * count
    return [int(window) if kind == "sliding_attention" else None for kind in kinds[:count]]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


STATIC_ROPE = ("default", "linear", "llama3")  # rotary embeddings whose frequencies are fixed (not "dynamic" and
# others that transformers' dynamic_rope_update recomputes with the length): a table of positions holds


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def supports(model: nn.Module) -> bool:
    """Whether :class:`CompactDecoder` can run ``model`` (a transformers causal LM)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")


class CompactDecoder(nn.Module):
    """Causal LM forward over a :class:`KVCache`, sharing the parameters of an HF model of one of the
    :data:`FAMILIES` (Llama, Mistral, Qwen2, Qwen3, Gemma-3; the name is the first family's).

    ``num_layers`` keeps only the first N decoder layers (then the final norm and LM head): an
    early-exit copy of the target that costs nothing in memory, usable as a self-speculative drafter.
    ``backend``: how its CPU forwards run and the weights stream (:class:`~specdec.models.backend.Backend`).
    """

    def __init__(self, hf_model: nn.Module, num_layers: int | None = None, *, backend: Backend = Backend()):
        super().__init__()
        self.backend = backend
        if not supports(hf_model):
            raise TypeError(f"CompactDecoder supports model types {SUPPORTED_MODEL_TYPES}, got "
                            f"{getattr(getattr(hf_model, 'config', None), 'model_type', type(hf_model).__name__)!r}")
        config = hf_model.config
        total = config.num_hidden_layers
        if num_layers is not None and not (1 <= num_layers <= total):
            raise ValueError(f"num_layers must be in [1, {total}] for this model, got {num_layers}")
        self.family = FAMILIES[config.model_type]
        inner = hf_model.model
        self.embed_tokens = inner.embed_tokens
        self.layers = nn.ModuleList(inner.layers[: num_layers or total])
        self.windows = _layer_windows(config, len(self.layers), self.family)  # per layer: tokens, or None
        kinds = getattr(config, "layer_types", None) if self.family.rope_by_layer_type else None
        self.layer_kinds = list(kinds[: len(self.layers)]) if kinds else [None] * len(self.layers)  # RoPE per kind
        self.softcap = getattr(config, "final_logit_softcapping", None)  # Gemma-2's; None for Gemma-3
        self.norm = inner.norm
        self.rotary_emb = inner.rotary_emb
        self.lm_head = hf_model.lm_head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.config = config
        needs = {"qk_norm": ("self_attn.q_norm", "self_attn.k_norm"),
                 "sandwich_norms": ("pre_feedforward_layernorm", "post_feedforward_layernorm")}
        for flag, names in needs.items():
            missing = [n for n in names if getattr(self.family, flag) and not _has_submodule(self.layers[0], n)]
            if missing:
                raise TypeError(f"a {config.model_type} layer should hold {missing} ({flag}); this "
                                f"{type(self.layers[0]).__name__} does not: is the model_type right?")
        # SDPA's scale per layer: None = its default 1/√head_dim (Llama's); Gemma's is query_pre_attn_scalar^-½
        self._scales = [None if getattr(layer.self_attn, "scaling", None) in (None, self.head_dim ** -0.5)
                        else float(layer.self_attn.scaling) for layer in self.layers]
        self._fusable: bool | None = None  # see _fused()
        self._plan: tuple | None = None  # see _layer_plan()
        self._rope_table: tuple | None = None  # see _rope_rows()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> KVCache:
        return KVCache.allocate(len(self.layers), batch_size, self.num_kv_heads, capacity, self.head_dim, pad,
                                dtype=self.dtype, device=self.device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: KVCache,
        *,
        kv_len: int | None = None,  # on CPU attend to slots [0, kv_len) only (KVCache.key_length); covers lengths + T
        tree_mask: torch.Tensor | None = None,  # [T, T] bool; None = causal chain
        depths: torch.Tensor | None = None,  # [T] long: position offset of each new token; None = 0..T-1
        last_only: bool = False,  # logits and hidden state of the last position only ([B, 1, ...]): a prefill
        capture: tuple[int, ...] = (),  # also return these layers' hidden states (see below)
    ) -> tuple[torch.Tensor, ...]:  # logits [B, T, V] float32, last hidden state [B, T, H] (+ features)
        """Run T new tokens per row, writing their keys/values uncommitted (see :class:`KVCache`).

        ``capture``: layer ids whose residual stream is returned too, as a third output [B, T, len(capture) * H]
        (concatenated in the order given, every position even with ``last_only``): id k is the stream after k
        decoder layers (0 = the embeddings), as transformers' ``hidden_states[k]`` for k below the layer
        count, and the stream *before* the final norm for k = the layer count. EAGLE-style drafters read them.
        """
        x = self.embed_tokens(input_ids)  # [B, T, H]
        captured = {0: x} if 0 in capture else {}
        windows = [w if w is not None and w < cache.capacity else None for w in self.windows]  # those that bind
        kernels = self._fused(x)
        positions = fused.new_positions(kernels, cache, depths, input_ids.shape[1])  # [B, T]; padding slots at 0
        if kernels is not None and not any(windows):
            tables = self._rope_tables(x)  # [P, D] each, read at the positions [B·T]; else the rows [B·T, D]
            cos, sin, at = ((*tables, positions.reshape(-1)) if tables is not None
                            else (*(rows.reshape(positions.numel(), -1) for rows in self._rope_rows(x, positions)),
                                  None))
            hidden = self._fused_layers(kernels, x, cache, kv_len, tree_mask, cos, sin, at, capture, captured)
            return self._head(hidden[:, -1:] if last_only else hidden, capture, captured)
        x = self._layers(x, cache, positions, kv_len, tree_mask, depths, windows, capture, captured)
        return self._head(self.norm(x[:, -1:] if last_only else x), capture, captured)

    def _layers(self, x, cache, positions, kv_len, tree_mask, depths, windows, capture, captured) -> torch.Tensor:
        """The decoder layers of :meth:`forward` on torch's ops (the reference; every family, sliding windows): the
        residual stream [B, T, H] after them, before the final norm (the captured streams into ``captured``)."""
        b, t, _ = x.shape
        rope = {kind: tuple(r.unsqueeze(1) for r in (self.rotary_emb(x, positions) if kind is None
                                                    else self.rotary_emb(x, positions, kind)))
                for kind in dict.fromkeys(self.layer_kinds)}  # [B, 1, T, D] cos, sin per layer kind
        masks = {None: cache.attention_mask(t, kv_len, tree_mask)}  # [B, 1, T, S]
        for window in windows:
            if window not in masks:
                masks[window] = cache.within_window(masks[None], window, depths)
        family = self.family
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = self.backend.linears(h, (attn.q_proj, attn.k_proj, attn.v_proj))
            q = q.view(b, t, self.num_heads, self.head_dim)
            k = k.view(b, t, self.num_kv_heads, self.head_dim)
            if family.qk_norm:  # over each head's dimensions
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, Hq, T, D], [B, Hkv, T, D]
            v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
            cos, sin = rope[self.layer_kinds[i]]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.write(i, k, v, kv_len)  # [B, Hkv, S, D]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=masks[windows[i]], enable_gqa=True,
                                                 scale=self._scales[i])
            out = self.backend.linear(out.transpose(1, 2).reshape(b, t, -1), attn.o_proj)
            mlp = layer.mlp
            if family.sandwich_norms:
                x = x + layer.post_attention_layernorm(out)
                h = layer.pre_feedforward_layernorm(x)
            else:
                x = x + out
                h = layer.post_attention_layernorm(x)
            gate, up = self.backend.linears(h, (mlp.gate_proj, mlp.up_proj))
            out = self.backend.linear(mlp.act_fn(gate) * up, mlp.down_proj)
            x = x + (layer.post_feedforward_layernorm(out) if family.sandwich_norms else out)
            if i + 1 in capture:
                captured[i + 1] = x
        return x

    def _head(self, hidden: torch.Tensor, capture: tuple[int, ...], captured: dict) -> tuple[torch.Tensor, ...]:
        """The outputs of :meth:`forward` from the final hidden state (normed) and the captured streams."""
        logits = self.backend.linear(hidden, self.lm_head).float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if not capture:
            return logits, hidden
        missing = sorted(set(capture) - set(captured))
        if missing:
            raise ValueError(f"capture names layers {missing}, beyond this decoder's {len(self.layers)} layers")
        return logits, hidden, torch.cat([captured[k] for k in capture], -1)

    def _rope_rows(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``self.rotary_emb(x, positions)``: on the Triton kernels' path, for a rotary embedding whose frequencies do
        not change with the length (:data:`STATIC_ROPE`), the rows of a table of every position's cos and sin that
        the module computed once (on the device, in x's dtype: the same values, elementwise), two gathers where the
        module's own forward is nine kernels a step; elsewhere the module's forward."""
        tables = self._rope_tables(x)
        if tables is None:
            return self.rotary_emb(x, positions)
        return tables[0][positions], tables[1][positions]

    def _rope_tables(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The table of every position's cos and sin [P, D] each that :meth:`_rope_rows` reads (None where it runs the
        module's forward): the attention kernel reads a token's rows at its position itself."""
        emb = self.rotary_emb
        if not self.backend.stacks(x) or getattr(emb, "rope_type", "default") not in STATIC_ROPE:
            return None
        held = self._rope_table
        state = (_version(emb.inv_freq), x.dtype, x.device)
        if held is None or held[0] is not emb.inv_freq or held[1] != state:
            every = torch.arange(self.max_positions, device=x.device)[None]
            cos, sin = (table[0] for table in emb(x, every))  # [P, D] each
            held = self._rope_table = (emb.inv_freq, state, cos, sin)
        return held[2], held[3]

    def _fused(self, x: torch.Tensor):
        """The kernel set this forward runs the small ops between the products through (:meth:`_fused_layers`), or
        None: the backend's (:meth:`Backend.fused_kernels`: specdec's CPU kernels for float32 on CPU, its Triton
        kernels on a GPU; neither under autograd or torch.compile) for a layer the fused forward describes
        (:attr:`Family.fused_layer`: Llama's, Qwen3's q/k norms) with its RMSNorms and SiLU."""
        kernels = self.backend.fused_kernels(x)
        if kernels is None or not self.family.fused_layer:
            return None
        if self._fusable is None:
            self._fusable = self._rms_norms_and_silu()
        return kernels if self._fusable else None

    def _rms_norms_and_silu(self) -> bool:
        """Whether every norm is an RMSNorm of the width the fused kernels read and every MLP gates by SiLU."""
        width = {"input_layernorm": self.hidden_size, "post_attention_layernorm": self.hidden_size,
                 "self_attn.q_norm": self.head_dim, "self_attn.k_norm": self.head_dim}
        if not self.family.qk_norm:
            del width["self_attn.q_norm"], width["self_attn.k_norm"]
        norms = [(self.norm, self.hidden_size)] + [(layer.get_submodule(name), size) for layer in self.layers
                                                   for name, size in width.items()]
        return (all(hasattr(n, "variance_epsilon") and n.weight.shape == (size,) for n, size in norms)
                and all(isinstance(layer.mlp.act_fn, nn.SiLU)  # transformers 5: its own SiLU module
                        or type(layer.mlp.act_fn).__name__ == "SiLUActivation" for layer in self.layers))

    def _fused_layers(self, kernels, x, cache, kv_len, tree_mask, cos, sin, at, capture, captured) -> torch.Tensor:
        """The decoder layers and final norm of :meth:`forward` through a fused kernel set (``kernels``: specdec's
        CPU kernels or its Triton kernels; :func:`specdec.models.fused.decoder_layers` runs them), the normed hidden
        state [B, T, H] (and the captured streams into ``captured``). The cache writes and the attention run in the
        kernel set for a decode or verification step, through SDPA for a CPU prefill (``Backend.attends_in_kernel``).
        On a GPU the products are one ``F.linear`` each over q|k|v and gate|up stacked once
        (:class:`~specdec.models.backend.Stacked`), each RMSNorm and SiLU·up inside the product reading it: five
        kernels a layer, the rotary embedding (and Qwen3's q/k norms, but with exact numerics) inside the attention
        kernel."""
        b, t, width = x.shape
        dense = None if self.backend.attends_in_kernel(kernels, b * t) else cache.attention_mask(t, kv_len, tree_mask)
        attention = fused.Attention(cache, tree_mask, dense=dense, kv_len=kv_len,
                                    ordered=self.backend.exact_numerics, positions=at)
        layers, final_norm = self._layer_plan(self.backend.stacks(x))

        stream, apart = fused.input_stream(self.backend, kernels, layers, x)  # the embeddings, copied for norms apart

        def keep(i: int, stream: torch.Tensor) -> None:  # the norms apart update the stream in place, so copied for
            if i in capture:  # them; the fused products' streams are new tensors, never updated after this
                captured[i] = stream.view(b, t, width).clone() if apart else stream.view(b, t, width)

        heads = fused.Heads(self.num_heads, self.num_kv_heads, self.head_dim)
        h = fused.decoder_layers(self.backend, kernels, layers, heads, stream, cos, sin, attention,
                                 final_norm=final_norm, on_layer=keep if capture else None)
        return h.view(b, t, width)

    def _layer_plan(self, stacked: bool = False) -> tuple[list[fused.Layer], fused.Norm]:
        """What :meth:`_fused_layers` reads: each decoder layer as data (:class:`~specdec.models.fused.Layer`: its
        q|k|v, o, gate|up and down products, as ``Backend.prepare`` packs them for the few-row kernel, and its norms'
        (weight, eps)), and the final norm's. Built once and reused while the backend is the same and every
        submodule and parameter it was built from is still in place, at the same version (:class:`ProductPlan`):
        a few dictionary lookups per layer instead of four calls to ``Backend.prepare`` and a dozen module
        attribute reads (a sixth of a CPU decode step for SmolLM2-135M). ``stacked``: the products' weights stacked
        for a GPU's ``F.linear`` (:class:`~specdec.models.backend.Stacked`)."""
        if self._plan is not None and self._plan[1].stacked == stacked and self._plan[1].current(self.backend):
            return self._plan[0]
        built, layers = ProductPlan(self.backend, self.dtype, stacked=stacked), []
        held, = built.hold(self, "layers")
        for layer in built.hold(held, *held._modules):
            attn, mlp = built.hold(layer, "self_attn", "mlp")
            qk_norms = (built.norm(attn, "q_norm"), built.norm(attn, "k_norm")) if self.family.qk_norm else (None, None)
            layers.append(fused.Layer(built.group(attn, "q_proj", "k_proj", "v_proj"), built.group(attn, "o_proj"),
                                      built.group(mlp, "gate_proj", "up_proj"), built.group(mlp, "down_proj"),
                                      built.norm(layer, "input_layernorm"),
                                      built.norm(layer, "post_attention_layernorm"), *qk_norms))
        self._plan = ((layers, built.norm(self, "norm")), built)
        return self._plan[0]
