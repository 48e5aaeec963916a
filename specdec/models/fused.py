"""A decoder layer as data, and the fused forwards that run a stack of them through a kernel set.

The model files (:class:`~specdec.models.compact.CompactDecoder`, the EAGLE layer, the block drafter's layers)
describe what a layer holds (:class:`Layer`: its products as a :class:`~specdec.models.backend.ProductPlan` gives
them, its RMSNorms, Qwen3's per-head q/k norms), the attention's shape (:class:`Heads`) and how a step attends
(:class:`Attention`: causal, a tree or block mask over the step's tokens and a few committed slots, or a prefill's
dense mask); the functions here run them. The kernel set is the backend's
(:meth:`~specdec.models.backend.Backend.fused_kernels`): specdec's CPU kernels for float32 on CPU, its Triton
kernels on a GPU, the same calls (``rms_norm`` with the residual add before it, ``rope_qkv``,
``cache_attention``, ``silu_mul``; the Triton set also has ``rotary_attention``, the two middle ones in one kernel);
the products are the backend's (``Backend.step_product``). A layer is then one call per RMSNorm, one for the rotary
embedding of q and k and one for the cache writes and the attention (one for both on a GPU), one for SiLU·up, and
its four products (q|k|v and gate|up stacked); on a GPU the RMSNorms and SiLU·up run inside the products that read
them (``normed_product``, ``silu_product``: :func:`fuses_products`), five kernels a layer. Torch's ops (each model's
own forward) are the reference the tests compare these with.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from specdec.models.backend import Backend, Stacked
from specdec.models.cache import KVCache

Norm = tuple[torch.Tensor, float]  # an RMSNorm's (weight [H], eps)


class Layer(NamedTuple):
    """One pre-norm decoder layer (attention, then a gated SiLU MLP, each added to the residual stream), as the
    fused forwards read it. The products are a plan's entries (``ProductPlan.group``)."""

    qkv: Any  # q|k|v stacked
    o: Any
    gate_up: Any  # gate|up stacked
    down: Any
    input_norm: Norm | None  # None: the first layer's input comes normed (EAGLE's two norms; ``normed``)
    post_norm: Norm  # before the MLP
    q_norm: Norm | None = None  # each head's q and k RMSNormed before the rotary embedding (Qwen3's layer)
    k_norm: Norm | None = None
    kv: Any = None  # k|v alone: the block drafter's context keys and values (:func:`context_keys_values`)


class Heads(NamedTuple):
    """The attention's shape: query heads, key/value heads, each head's dimensions."""

    q: int
    kv: int
    dim: int


class Attention(NamedTuple):
    """How a forward's new tokens attend over ``cache`` (one cache layer per decoder layer, the step's keys and
    values written into it uncommitted): in the kernel set's ``cache_attention`` under ``mask`` [T, recent + T]
    bool (None: causal; :meth:`KVCache.attention_mask` reads it) and ``recent`` (the last committed slots the mask
    covers), or, where ``dense`` [B, 1, T, S] is given (a prefill on CPU: ``Backend.attends_in_kernel``), through
    SDPA over the slots ``cache.write`` returns for ``kv_len``."""

    cache: KVCache
    mask: torch.Tensor | None = None
    recent: int = 0
    dense: torch.Tensor | None = None
    kv_len: int | None = None
    ordered: bool = False  # the Triton kernels' attention over the slots in order (Backend.exact_numerics)
    positions: torch.Tensor | None = None  # [M]: cos and sin are tables [P, D] read at these (the Triton attention's)


def new_positions(kernels, cache: KVCache, offsets: torch.Tensor | None, count: int) -> torch.Tensor:  # [B, T] long
    """The position ids of ``count`` new tokens a row, ``offsets`` [count] after each row's committed ones (None: 0 ..
    count - 1), padding slots at 0: ``cache.positions(offsets).clamp_(min=0)``, in one kernel where the kernel set has
    ``cache_positions`` (the Triton kernels') where torch's ops are three or four."""
    in_one = getattr(kernels, "cache_positions", None)
    if in_one is not None:
        return in_one(cache.lengths, cache.pad, offsets, count)
    if offsets is None:
        offsets = torch.arange(count, device=cache.lengths.device)
    return cache.positions(offsets).clamp_(min=0)


def decoder_layers(backend: Backend, kernels, layers: Sequence[Layer], heads: Heads,
                   stream: torch.Tensor,  # [M, H] the residual stream
                   cos: torch.Tensor, sin: torch.Tensor,  # [M, D] each, or tables read at attention.positions
                   attention: Attention, *, normed: torch.Tensor | None = None,  # [M, H'] the first layer's input
                   final_norm: Norm | None = None, head: Any = None,
                   on_layer: Callable[[int, torch.Tensor], None] | None = None) -> Any:  # [M, H] (with head: a pair)
    """``layers`` over ``stream`` through ``kernels``: the final norm of the stream where ``final_norm`` is given
    (each residual add fused into the norm after it), else the stream itself (the last add in place). The stream
    passed in may be updated in place or left as it was: read the result. ``normed``: the first layer's normed
    input (None: its ``input_norm`` of the stream). ``on_layer(i, stream)`` after each layer i = 1..len(layers) (the
    captured streams). On CPU the same arithmetic as torch's ops (no fused multiply-adds), sums in another order:
    logits equal to float32 rounding (tested). Where :func:`fuses_products`, each RMSNorm before a product and
    SiLU·up run inside that product's kernel (``normed_product``, ``silu_product``: five kernels a layer). ``head``
    (a plan's entry, with ``final_norm``): returns (the stream, ``head``'s product over its final norm), the last
    residual add and the norm inside that product's kernel where fused (EAGLE's LM head: one kernel, not two)."""
    product = backend.step_product
    fuse = fuses_products(backend, kernels, layers, stream.shape[0])
    tile = {"tile": kernels.INVARIANT_TILE} if fuse and backend.exact_numerics else {}  # invariant_linear's sums
    pending = None if normed is not None else (None, layers[0].input_norm)  # (delta, norm) before the next product
    down = None
    for i, layer in enumerate(layers):
        if pending is None:
            qkv = product(normed, layer.qkv)
        else:
            stream, qkv = _normed_product(kernels, fuse, product, stream, *pending, layer.qkv, tile)
            if i and on_layer is not None:
                on_layer(i, stream)
        out = _attend(kernels, attention, i, qkv, layer, cos, sin, heads)
        stream, gate_up = _normed_product(kernels, fuse, product, stream, product(out, layer.o), layer.post_norm,
                                          layer.gate_up, tile)
        down = (kernels.silu_product(gate_up, *layer.down[0], **tile) if fuse
                else product(kernels.silu_mul(gate_up), layer.down))
        following = layers[i + 1].input_norm if i + 1 < len(layers) else final_norm
        if following is None and i + 1 < len(layers):
            raise ValueError(f"layer {i + 1} of {len(layers)} has no input norm: only the first layer's input may "
                             f"come normed (normed=)")
        pending = (down, following)
    if head is not None:
        fuse_head = _fuses(backend, kernels, [head], stream.shape[0])
        tile = {"tile": kernels.INVARIANT_TILE} if fuse_head and backend.exact_numerics else {}
        stream, out = _normed_product(kernels, fuse_head, product, stream, down, final_norm, head, tile)
        if on_layer is not None:
            on_layer(len(layers), stream)
        return stream, out
    h = None
    if final_norm is None:
        stream += down
    else:
        h = kernels.rms_norm(stream, down, *final_norm)
    if on_layer is not None:
        on_layer(len(layers), stream)
    return stream if final_norm is None else h


def input_stream(backend: Backend, kernels, layers: Sequence[Layer], x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``x`` [..., H] as :func:`decoder_layers`' residual stream [M, H], and whether the norms run apart: then a copy
    (contiguous), as they update the stream in place; ``x``'s rows themselves where :func:`fuses_products` (the
    products with the norms inside leave the stream given as it was)."""
    stream = x.reshape(-1, x.shape[-1])
    apart = not fuses_products(backend, kernels, layers, stream.shape[0])
    return (stream.clone(memory_format=torch.contiguous_format) if apart else stream), apart


def fuses_products(backend: Backend, kernels, layers: Sequence[Layer], rows: int) -> bool:
    """Whether :func:`decoder_layers` runs each RMSNorm and SiLU·up inside the product that reads it: the kernel set
    has those products (the Triton kernels), :attr:`Backend.fused_products` is on, the products' weights are stacked
    (:class:`~specdec.models.backend.Stacked`, a GPU's), and the step has at most ``kernels.FUSED_ROWS`` rows (any
    number with exact numerics, whose products are those kernels' anyway)."""
    return _fuses(backend, kernels, [entry for layer in layers for entry in (layer.qkv, layer.gate_up, layer.down)],
                  rows)


def _fuses(backend: Backend, kernels, entries: Sequence[Any], rows: int) -> bool:
    """:func:`fuses_products` for the products of ``entries`` (a plan's) over ``rows`` rows."""
    return (getattr(kernels, "normed_product", None) is not None and backend.fused_products
            and all(isinstance(entry[0], Stacked) for entry in entries)
            and (backend.exact_numerics or rows <= kernels.FUSED_ROWS))


def _normed_product(kernels, fuse: bool, product, stream: torch.Tensor, delta: torch.Tensor | None, norm: Norm,
                    entry: Any, tile: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(the stream after ``delta``'s residual add, ``entry``'s product over its RMSNorm by ``norm``): in one kernel
    where ``fuse`` (a new stream tensor; ``tile``: its keyword), else the norm (the stream updated in place) then the
    product."""
    if fuse:
        return kernels.normed_product(stream, delta, *norm, *entry[0], **tile)
    return stream, product(kernels.rms_norm(stream, delta, *norm), entry)


def _attend(kernels, attention: Attention, i: int, qkv: torch.Tensor, layer: Layer, cos: torch.Tensor,
            sin: torch.Tensor, heads: Heads) -> torch.Tensor:  # qkv [M, (Hq + 2·Hkv)·D] -> [M, Hq·D]
    """Layer i's per-head q and k norms (:func:`head_norms`), rotary embedding, cache writes and attention of a
    stacked q|k|v: in one call where the kernel set has ``rotary_attention`` (the Triton kernels; the norms apart
    for ordered attention), else ``rope_qkv`` then ``cache_attention`` (or SDPA)."""
    cache = attention.cache
    in_one = getattr(kernels, "rotary_attention", None)
    if attention.dense is None and in_one is not None:
        inside = layer.k_norm is not None and not attention.ordered  # the norms in the attention's kernel
        return in_one(qkv if inside else head_norms(kernels, qkv, layer, heads), cos, sin, heads.q, cache.keys[i],
                      cache.values[i], cache.lengths, cache.pad, attention.mask, attention.recent,
                      ordered=attention.ordered, positions=attention.positions,
                      norms=(layer.q_norm, layer.k_norm) if inside else None)
    qkv = head_norms(kernels, qkv, layer, heads)
    if attention.positions is not None:  # the tables' rows, for kernels that read a row a token
        cos, sin = cos[attention.positions], sin[attention.positions]
    q, k, v = kernels.rope_qkv(qkv, cos, sin, heads.q, heads.kv)
    if attention.dense is None:
        return kernels.cache_attention(q, k, v, cache.keys[i], cache.values[i], cache.lengths, cache.pad,
                                       attention.mask, attention.recent)
    b, _, t, _ = attention.dense.shape
    q, k, v = (x.view(b, t, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))  # [B, heads, T, D]
    keys, values = cache.write(i, k, v, attention.kv_len)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attention.dense, enable_gqa=True)
    return out.transpose(1, 2).reshape(b * t, -1)


def head_norms(kernels, qkv: torch.Tensor, layer: Layer, heads: Heads, with_q: bool = True) -> torch.Tensor:
    """A stacked [M, (Hq + 2·Hkv)·D] q|k|v product (k|v alone without ``with_q``) with the layer's per-head q and k
    RMSNorms applied (contiguous, as ``rope_qkv`` reads it); as it is for a layer without them. The Triton kernels
    norm it in place in one kernel (``head_norms``), the others into a new tensor."""
    if layer.k_norm is None:
        return qkv
    in_place = getattr(kernels, "head_norms", None)  # the Triton kernels': one kernel, the product's output normed
    if in_place is not None and qkv.is_contiguous():
        return in_place(qkv, heads.q if with_q else 0, heads.kv, layer.k_norm, layer.q_norm if with_q else None)
    m, dim = qkv.shape[0], heads.dim
    q, k, v = qkv.split((heads.q * dim if with_q else 0, heads.kv * dim, heads.kv * dim), -1)
    parts = [kernels.rms_norm(q.reshape(-1, dim).contiguous(), None, *layer.q_norm).view(m, -1)] if with_q else []
    parts += [kernels.rms_norm(k.reshape(-1, dim).contiguous(), None, *layer.k_norm).view(m, -1), v]
    return torch.cat(parts, -1)


def context_keys_values(backend: Backend, kernels, layers: Sequence[Layer], heads: Heads,
                        context: torch.Tensor,  # [B, T, H] the block drafter's fused context
                        cos: torch.Tensor, sin: torch.Tensor,  # [B·T, D] each, or tables read at ``positions``
                        cache: KVCache, kv_len: int | None, positions: torch.Tensor | None = None) -> None:
    """Each layer's keys (per-head normed, rotated) and values of ``context``, written into its cache layer
    (uncommitted) at the rows' next slots: the block drafter's injected context. The Triton kernels norm, rotate and
    write a layer's in one kernel (``rotary_write``)."""
    b, t, _ = context.shape
    rows = context.reshape(b * t, -1)
    in_one = getattr(kernels, "rotary_write", None)
    if positions is not None and in_one is None:  # the tables' rows, for kernels that read a row a token
        cos, sin = cos[positions], sin[positions]
    for i, layer in enumerate(layers):
        kv = backend.step_product(rows, layer.kv)
        if in_one is not None:  # the k norm inside
            in_one(kv, cos, sin, cache.keys[i], cache.values[i], cache.lengths, positions, layer.k_norm)
            continue
        kv = head_norms(kernels, kv, layer, heads, with_q=False)
        _, k, v = kernels.rope_qkv(kv, cos, sin, 0, heads.kv)
        cache.write(i, k.view(b, t, heads.kv, heads.dim).transpose(1, 2),
                    v.view(b, t, heads.kv, heads.dim).transpose(1, 2), kv_len)


def normed_product(backend: Backend, kernels, x: torch.Tensor, norm: Norm, entry: Any) -> torch.Tensor:
    """``entry``'s product (a plan's) over the RMSNorm of x [..., H]: a final norm and an LM head; the norm inside
    the product's kernel where :func:`fuses_products` would put a layer's (one kernel, not two)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if _fuses(backend, kernels, [entry], rows.shape[0]):
        tile = {"tile": kernels.INVARIANT_TILE} if backend.exact_numerics else {}
        return kernels.normed_product(rows, None, *norm, *entry[0], **tile)[1].view(*x.shape[:-1], -1)
    return backend.step_product(kernels.rms_norm(rows, None, *norm), entry).view(*x.shape[:-1], -1)
