"""specdec's GPU kernels, written in Triton: the small ops of a decode or verification step fused, with the same
calls as the CPU kernels' (:mod:`specdec.models.cpu_kernels`), so that one fused forward runs on either device
(:meth:`specdec.models.backend.Backend.fused_kernels` picks the set).

A small model's step on a GPU is bound by kernel launches, not memory: SmolLM2-135M's forward through torch's ops
is ~900 kernels (RMSNorm as five, the rotary embedding as eight, a scatter per cache write, a mask of
[B, 1, T, S] built and read by SDPA over the whole cache). Here a layer is nine: an RMSNorm after the residual add
(:func:`rms_norm`), the q|k|v product, the rotary embedding of q and k (:func:`rope_qkv`), the cache writes and
the attention over each row's committed slots and the step's new tokens (:func:`cache_attention`: per-row lengths
and padding, a tree mask, read on the device, so a captured graph replays any step), the o product, the residual
add and RMSNorm, the gate|up product, SiLU·up (:func:`silu_mul`), the down product.

Each kernel rounds where torch's ops round in the model's dtype (the residual add, the norm's cast before its
weight, each product of the rotary embedding, SiLU before ·up): in bfloat16 its outputs equal torch's ops' but for
the order of a sum (the norm's mean of squares, the attention) and an exp's last bit. In float32 the GPU's compiler
may also fuse a product and a sum into one rounding (the rotary embedding's): equal to float32 rounding. The attention reads only the slots a row attends
to (its committed length plus the step's tokens), not the cache's capacity.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported, on CPU
tensors): the default test tier checks them there against the torch ops (``tests/models/test_gpu_kernels.py``).
``_planted`` (tests only) plants a known bug in :func:`cache_attention`, to show those tests catch it.
"""

from __future__ import annotations

import functools
import os

import torch

PLANTED = ("mask_off_by_one", "stale_cache_slot", "wrong_row_length")  # cache_attention's planted bugs (tests)


@functools.cache
def available() -> bool:
    """Whether the kernels can run: Triton installed, and a CUDA device or Triton's interpreter (CPU tensors)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() or interpreted()


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``): on CPU tensors, for tests."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _kernels():
    """The Triton kernels, compiled on first use (Triton imported only here: a CPU run without it never needs it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, width, eps, HAS_DELTA: tl.constexpr,
                        BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        inside = offs < width
        x = tl.load(x_ptr + row * width + offs, mask=inside, other=0.0)
        if HAS_DELTA:  # the residual add, rounded to the stream's dtype as torch's x + out
            x = (x.to(tl.float32) + tl.load(delta_ptr + row * width + offs, mask=inside, other=0.0).to(tl.float32)
                 ).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + row * width + offs, x, mask=inside)
        x = x.to(tl.float32)
        normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / width + eps)
        normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)  # transformers': weight * x.to(input dtype)
        w = tl.load(w_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * width + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def silu_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
        row, part = tl.program_id(0), tl.program_id(1)
        offs = part * BLOCK + tl.arange(0, BLOCK)
        inside = offs < width
        gate = tl.load(x_ptr + row * 2 * width + offs, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * width + width + offs, mask=inside, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * width + offs, (act * up).to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def rope_qkv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, q_heads, kv_heads, dim,
                        HALF: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        heads = q_heads + 2 * kv_heads
        offs = tl.arange(0, HALF)
        inside = offs < dim // 2
        src = qkv_ptr + (row * heads + head) * dim
        x1 = tl.load(src + offs, mask=inside, other=0.0)
        x2 = tl.load(src + dim // 2 + offs, mask=inside, other=0.0)
        if head >= q_heads + kv_heads:  # a value head: copied
            dst = v_ptr + (row * kv_heads + head - q_heads - kv_heads) * dim
            tl.store(dst + offs, x1, mask=inside)
            tl.store(dst + dim // 2 + offs, x2, mask=inside)
        else:
            kind = x1.dtype
            c1 = tl.load(cos_ptr + row * dim + offs, mask=inside, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + row * dim + dim // 2 + offs, mask=inside, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + row * dim + offs, mask=inside, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + row * dim + dim // 2 + offs, mask=inside, other=0.0).to(tl.float32)
            a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
            # x·cos + rotate_half(x)·sin, each product and the sum rounded as torch's ops round them
            y1 = ((a1 * c1).to(kind).to(tl.float32) + (-a2 * s1).to(kind).to(tl.float32)).to(kind)
            y2 = ((a2 * c2).to(kind).to(tl.float32) + (a1 * s2).to(kind).to(tl.float32)).to(kind)
            if head < q_heads:
                dst = q_ptr + (row * q_heads + head) * dim
            else:
                dst = k_ptr + (row * kv_heads + head - q_heads) * dim
            tl.store(dst + offs, y1, mask=inside)
            tl.store(dst + dim // 2 + offs, y2, mask=inside)

    @triton.jit
    def attention_kernel(q_ptr, k_ptr, v_ptr, keys_ptr, values_ptr, lengths_ptr, pad_ptr, tree_ptr, out_ptr,
                         new, q_heads, kv_heads, capacity, dim, recent, scale,
                         HAS_TREE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         IEEE: tl.constexpr, PLANT: tl.constexpr):
        # One program: new token t of row b, the query heads sharing KV head h. It writes that token's key and
        # value into slot lengths[b] + t (no program reads those slots: the step's keys are read from k and v),
        # then attends, with an online softmax, to the committed slots from the cache and the step's tokens.
        m, h = tl.program_id(0), tl.program_id(1)
        b, t = m // new, m % new
        group = q_heads // kv_heads
        length = tl.load(lengths_ptr + (0 if PLANT == 3 else b))
        pad = tl.load(pad_ptr + b)
        d = tl.arange(0, BLOCK_D)
        g = tl.arange(0, GROUP)
        dims = d < dim
        heads = g < group
        new_kv = (m * kv_heads + h) * dim
        cached = (b * kv_heads + h) * capacity * dim
        if PLANT != 2:
            tl.store(keys_ptr + cached + (length + t) * dim + d, tl.load(k_ptr + new_kv + d, mask=dims), mask=dims)
            tl.store(values_ptr + cached + (length + t) * dim + d, tl.load(v_ptr + new_kv + d, mask=dims), mask=dims)
        q = tl.load(q_ptr + (m * q_heads + h * group + g[:, None]) * dim + d[None, :],
                    mask=heads[:, None] & dims[None, :], other=0.0)  # [G, D]
        best = tl.full([GROUP], float("-inf"), tl.float32)
        total = tl.zeros([GROUP], tl.float32)
        acc = tl.zeros([GROUP, BLOCK_D], tl.float32)
        columns = recent + new
        # the committed slots from the pad on; of them the last `recent`, only where the tree mask says
        first = pad // BLOCK_N * BLOCK_N
        for start in range(first, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            seen = (n >= pad) & (n < length)
            if HAS_TREE:
                column = n - (length - recent)
                allowed = tl.load(tree_ptr + t * columns + column, mask=seen & (column >= 0), other=1)
                seen = seen & (allowed != 0)
            keys = tl.load(keys_ptr + cached + n[:, None] * dim + d[None, :], mask=seen[:, None] & dims[None, :],
                           other=0.0)  # [N, D]
            values = tl.load(values_ptr + cached + n[:, None] * dim + d[None, :],
                             mask=seen[:, None] & dims[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(keys)) * scale
            scores = tl.where(seen[None, :], scores, float("-inf"))
            top = tl.maximum(best, tl.max(scores, axis=1))
            safe = tl.where(top == float("-inf"), 0.0, top)  # a block nothing sees yet: no inf - inf
            p = tl.exp(scores - safe[:, None])
            fade = tl.exp(best - safe)
            total = total * fade + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * fade[:, None] + tl.dot(p, values, input_precision="ieee")
            else:
                acc = acc * fade[:, None] + tl.dot(p.to(values.dtype), values)
            best = top
        # the step's own tokens: j sees itself always; others where the tree mask (causal without one) allows
        for start in range(0, new, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            real = (j < new) & (length + j >= pad)
            if HAS_TREE:
                allowed = tl.load(tree_ptr + t * columns + recent + j + (1 if PLANT == 1 else 0),
                                  mask=real & (recent + j + (1 if PLANT == 1 else 0) < columns), other=0)
                seen = real & (allowed != 0)
            else:
                seen = real & (j <= t + (1 if PLANT == 1 else 0))
            seen = seen | (j == t)
            rows = (b * new + j) * kv_heads + h
            keys = tl.load(k_ptr + rows[:, None] * dim + d[None, :], mask=seen[:, None] & dims[None, :], other=0.0)
            values = tl.load(v_ptr + rows[:, None] * dim + d[None, :], mask=seen[:, None] & dims[None, :],
                             other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(keys)) * scale
            scores = tl.where(seen[None, :], scores, float("-inf"))
            top = tl.maximum(best, tl.max(scores, axis=1))
            safe = tl.where(top == float("-inf"), 0.0, top)  # a block nothing sees yet: no inf - inf
            p = tl.exp(scores - safe[:, None])
            fade = tl.exp(best - safe)
            total = total * fade + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * fade[:, None] + tl.dot(p, values, input_precision="ieee")
            else:
                acc = acc * fade[:, None] + tl.dot(p.to(values.dtype), values)
            best = top
        out = acc / total[:, None]
        tl.store(out_ptr + (m * q_heads + h * group + g[:, None]) * dim + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=heads[:, None] & dims[None, :])

    return rms_norm_kernel, silu_mul_kernel, rope_qkv_kernel, attention_kernel


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of ``x`` [M, H] (contiguous) by ``weight`` [H], after ``x += delta`` in place where a delta
    [M, H] is given (the residual stream's update): the normed rows [M, H]."""
    m, width = x.shape
    out = torch.empty_like(x)
    delta = delta.contiguous() if delta is not None else x
    _kernels()[0][(m,)](x, delta, weight, out, width, float(eps), HAS_DELTA=delta is not x,
                        BLOCK=_pow2(width, 16))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [M, 2I] -> [M, I]
    """silu(gate)·up of a stacked gate|up product."""
    gate_up = gate_up.contiguous()
    m, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(m, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, _pow2(width, 16))
    _kernels()[1][(m, -(-width // block))](gate_up, out, width, BLOCK=block)
    return out


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # q [M, Hq, D], k [M, Hkv, D], v [M, Hkv, D]
    """The rotary embedding (cos, sin [M, D]) of q and k from a stacked q|k|v product [M, (Hq + 2·Hkv)·D]."""
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    m, dim = qkv.shape[0], cos.shape[-1]
    q = torch.empty(m, q_heads, dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(m, kv_heads, dim, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty_like(k)
    _kernels()[2][(m, q_heads + 2 * kv_heads)](qkv, cos, sin, q, k, v, q_heads, kv_heads, dim,
                                               HALF=_pow2(dim // 2, 16))
    return q, k, v


def cache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    lengths: torch.Tensor, pad: torch.Tensor, tree_mask: torch.Tensor | None = None, recent: int = 0,
                    *, _planted: str | None = None) -> torch.Tensor:
    """A step's cache writes and attention over the per-row static cache: q [B·T, Hq, D], k and v [B·T, Hkv, D]
    (the step's T new tokens of each row), keys and values [B, Hkv, S, D] (one layer's), lengths and pad [B] long
    (committed slots, left padding), ``tree_mask`` [T, recent + T] bool (None: causal) as
    :meth:`specdec.models.cache.KVCache.attention_mask` reads it, ``recent`` the last committed slots the tree mask
    decides. Writes each new token's key and value into slot lengths + t; returns the attention [B·T, Hq·D]. Every
    bound is read on the device: no host sync, and a captured graph replays any lengths."""
    if _planted is not None and _planted not in PLANTED:
        raise ValueError(f"_planted={_planted!r}: one of {PLANTED}")
    b, kv_heads, capacity, dim = keys.shape
    m, q_heads = q.shape[0], q.shape[1]
    new = m // b
    if m != b * new or q_heads % kv_heads or k.shape != (m, kv_heads, dim) or not keys.is_contiguous():
        raise ValueError(f"cache_attention: q {tuple(q.shape)}, k {tuple(k.shape)} do not fit the contiguous keys "
                         f"{tuple(keys.shape)}")
    if tree_mask is not None:
        if tuple(tree_mask.shape) != (new, recent + new):
            raise ValueError(f"cache_attention: tree_mask [{new}, {recent + new}] expected ({recent} recent slots + "
                             f"{new} new tokens), got {tuple(tree_mask.shape)}")
        tree = tree_mask.to(torch.int8).contiguous()
    elif recent:
        raise ValueError("cache_attention: recent slots need a tree_mask saying who sees them")
    else:
        tree = lengths  # not read
    out = torch.empty(m, q_heads * dim, dtype=q.dtype, device=q.device)
    plant = 0 if _planted is None else PLANTED.index(_planted) + 1
    _kernels()[3][(m, kv_heads)](
        q.contiguous(), k.contiguous(), v.contiguous(), keys, values, lengths, pad, tree, out,
        new, q_heads, kv_heads, capacity, dim, int(recent), dim ** -0.5,
        HAS_TREE=tree_mask is not None, GROUP=_pow2(q_heads // kv_heads, 16), BLOCK_N=32, BLOCK_D=_pow2(dim, 16),
        IEEE=q.dtype == torch.float32, PLANT=plant)
    return out
