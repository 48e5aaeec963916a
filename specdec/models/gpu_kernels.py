"""specdec's GPU kernels, written in Triton: the small ops of a decode or verification step fused, with the same
calls as the CPU kernels' (:mod:`specdec.models.cpu_kernels`), so that one fused forward runs on either device
(:meth:`specdec.models.backend.Backend.fused_kernels` picks the set).

A small model's step on a GPU is bound by kernel launches, not memory: SmolLM2-135M's forward through torch's ops
is ~900 kernels (RMSNorm as five, the rotary embedding as eight, a scatter per cache write, a mask of
[B, 1, T, S] built and read by SDPA over the whole cache). Here a step's layer is five kernels: the q|k|v product
over the RMSNorm of the stream after the residual add, computed in the product's program (:func:`normed_product`),
the rotary embedding of q and k with the cache writes and the attention over each row's committed slots and the
step's new tokens (:func:`rotary_attention`: per-row lengths and padding, a tree mask, read on the device, so a
captured graph replays any step; :func:`rope_qkv` then :func:`cache_attention` are the same in two kernels), the o
product (cuBLAS's), the gate|up product over the residual add and RMSNorm (:func:`normed_product` again), the down
product over SiLU·up (:func:`silu_product`); Qwen3's per-head q and k norms inside the attention too (apart with
exact numerics: :func:`head_norms`, in place, one kernel more). Apart (``target.fused_products=false``, and a prefill
of more than :data:`FUSED_ROWS` rows) a layer is eight: :func:`rms_norm`, :func:`silu_mul` and cuBLAS's products.
``target.exact_numerics`` runs every product through this module's product kernel (:func:`invariant_linear`) and the
attention ``ordered``: a row's arithmetic the same whatever the forward carries. Beside the layers, a drafter's
candidates: :func:`top_k` over its vocabulary (``Backend.top_k``, ``Backend.top_log_softmax``); EAGLE's layer input
(:func:`embedded_norms`) and its device-grown tree, each level's bookkeeping before and after the level's forward
(:func:`grow_level`, :func:`grown_level`) and the tree chosen from the candidates (:func:`device_tree`), one kernel
each where torch's ops are 4, ~20, ~8 and ~65; and after a
verification's forward its verdict (:func:`greedy_verdict`: a chain's or a tree's walk; :func:`sampled_verdict`: the
exact rule's, drafts with one-hot q), a tree's accepted path moved in the cache (:func:`move_path`) and the step's
commit (:func:`commit_step`: the kept counts, the tokens written, the lengths moved), one kernel each where torch's
ops take ~30-100 (sampled: ~40-180), 5 and ~15 (``Backend.step_kernels``).

Each kernel rounds where torch's ops round in the model's dtype (the residual add, the norm's cast before its
weight, each product of the rotary embedding, SiLU before ·up; in 16 bits on the bits, which no compiler folds away):
in 16 bits its outputs equal torch's ops' but for the order of a sum (the norm's mean of squares, the attention) and
an exp's last bit. In float32 the GPU's compiler may fuse a product and a sum into one rounding (the rotary
embedding's): equal to float32 rounding. The attention reads only the slots a row attends
to (its committed length plus the step's tokens), not the cache's capacity; a program of it takes several of a row's
new tokens times the query heads of one KV head (each block of keys read once for them all), and where a step's
programs are few over a long cache (a one-token step) the committed slots are split into chunks, a program each,
merged after (:func:`attention_tiles`).

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported, on CPU
tensors): the default test tier checks them there against the torch ops (``tests/models/test_gpu_kernels.py``).
``_planted`` (tests only) plants a known bug in :func:`cache_attention` or :func:`rotary_attention`, to show those
tests catch it.
"""

from __future__ import annotations

import functools
import os
import struct

import torch

from specdec.verify.sampling import validate_sampling

PLANTED = ("mask_off_by_one", "stale_cache_slot", "wrong_row_length")  # cache_attention's planted bugs (tests)
PLANTED_ROTARY = ("keys_rotated_at_the_query",)  # rotary_attention's own (tests)


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
    """The Triton kernels (:mod:`specdec.models.triton_kernels`), imported on first use: CPU runs never need Triton."""
    from specdec.models import triton_kernels

    return triton_kernels


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _plant(planted: str | None, names: tuple[str, ...]) -> int:
    """A kernel's PLANT constant for the planted bug ``planted`` (tests only): 0 for none, else its place in ``names``
    plus one; a name not among them is refused."""
    if planted is None:
        return 0
    if planted not in names:
        raise ValueError(f"_planted={planted!r}: one of {names}")
    return names.index(planted) + 1


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of ``x`` [M, H] (contiguous) by ``weight`` [H], after ``x += delta`` in place where a delta
    [M, H] is given (the residual stream's update): the normed rows [M, H]."""
    m, width = x.shape
    out = torch.empty_like(x)
    delta = delta.contiguous() if delta is not None else x
    _kernels().rms_norm_kernel[(m,)](x, delta, weight, out, width, float(eps), HAS_DELTA=delta is not x,
                                     BLOCK=_pow2(width, 16))
    return out


def head_norms(qkv: torch.Tensor, q_heads: int, kv_heads: int, k_norm: tuple[torch.Tensor, float],
               q_norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """A stacked q|k|v product [M, (Hq + 2·Hkv)·D] (contiguous; ``q_heads`` 0: k|v alone) with each q head RMS-normed
    by ``q_norm`` (weight [D], eps) and each k head by ``k_norm``, in place, in one kernel: :func:`rms_norm` over each
    head's row, bit for bit (Qwen3's and the block drafter's per-head norms, where splitting, two norms and a cat were
    five kernels; :func:`rotary_attention` and :func:`rotary_write` norm them inside, but in ordered attention).
    Returns ``qkv``."""
    m, width = qkv.shape
    dim = width // (q_heads + 2 * kv_heads)
    if not qkv.is_contiguous() or width != (q_heads + 2 * kv_heads) * dim or (q_heads and q_norm is None) \
            or k_norm[0].shape != (dim,) or (q_heads and q_norm[0].shape != (dim,)):
        raise ValueError(f"head_norms: q|k|v {tuple(qkv.shape)} (contiguous) with {q_heads} query and {kv_heads} key "
                         f"heads, norm weights of the head's dimension, k's {tuple(k_norm[0].shape)}, q's "
                         f"{None if q_norm is None else tuple(q_norm[0].shape)}")
    q_weight, q_eps = q_norm if q_heads else k_norm
    _kernels().head_norms_kernel[(m, q_heads + kv_heads)](qkv, q_weight, k_norm[0], q_heads, kv_heads, dim,
                                                          float(q_eps), float(k_norm[1]), BLOCK=_pow2(dim, 16))
    return qkv


def _in_dtype(x: float, dtype: torch.dtype) -> float:
    """``x`` rounded as ``torch.tensor(x, dtype=dtype)`` rounds it (through float32, then to nearest, ties to even),
    on the host alone: no tensor made, so a captured graph may call it."""
    single = struct.unpack("<f", struct.pack("<f", x))[0]
    if dtype == torch.float16:
        return struct.unpack("<e", struct.pack("<e", single))[0]
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", single))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return single if dtype == torch.float32 else x


def embedded_norms(tokens: torch.Tensor, embed: torch.Tensor, scale: float, stream: torch.Tensor,
                   embed_norm: torch.Tensor, embed_eps: float, stream_norm: torch.Tensor, stream_eps: float
                   ) -> torch.Tensor:
    """EAGLE's draft layer input in one kernel where torch's ops are three and the embedding: the RMSNorm (by
    ``embed_norm``) of the rows of ``embed`` [V, H] at ``tokens`` [M] (times ``scale`` as the target's embedding
    gives them: rounded to the dtype, then the product rounded), then the RMSNorm of ``stream`` [M, H] (by
    ``stream_norm``), side by side: [M, 2H], the values of ``cat([rms_norm(embeds), rms_norm(stream)], -1)``."""
    m, width = stream.shape
    if tokens.shape != (m,) or embed.shape[1] != width or embed.dtype != stream.dtype:
        raise ValueError(f"embedded_norms: tokens {tuple(tokens.shape)}, embeddings {tuple(embed.shape)} "
                         f"{embed.dtype} and stream {tuple(stream.shape)} {stream.dtype} do not fit")
    out = torch.empty(m, 2 * width, dtype=stream.dtype, device=stream.device)
    rounded_scale = _in_dtype(scale, stream.dtype)  # torch multiplies by the scale in the dtype
    _kernels().embedded_norms_kernel[(m,)](tokens.contiguous(), embed.contiguous(), stream.contiguous(), embed_norm,
                                           stream_norm, out, width, rounded_scale, float(embed_eps),
                                           float(stream_eps), SCALED=scale != 1.0, BLOCK=_pow2(width, 16))
    return out


def block_inputs(anchors: torch.Tensor, last: torch.Tensor, embed: torch.Tensor, scale: float, size: int,
                 mask_token: int, norm: torch.Tensor, eps: float) -> torch.Tensor:
    """The block drafter's block inputs with ``anchor_inputs`` (:meth:`DFlashModel.block_inputs`) in one kernel where
    torch's ops are ~14: for each row's anchor [N] a block of ``size`` positions [N, size, H], the RMSNorm (``norm``,
    ``eps``) of the anchor's embedding then of the mask token's (rows of ``embed`` [V, H] times ``scale`` as the
    target's embedding gives them), the anchor's added to the mask positions, the row's ``last`` [N, H] to all."""
    n, width = last.shape
    if anchors.shape != (n,) or embed.shape[1] != width or norm.shape != (width,) or norm.dtype != embed.dtype:
        raise ValueError(f"block_inputs: anchors {tuple(anchors.shape)}, last {tuple(last.shape)}, embeddings "
                         f"{tuple(embed.shape)} {embed.dtype} and norm {tuple(norm.shape)} {norm.dtype} do not fit")
    out = torch.empty(n, size, width, dtype=embed.dtype, device=embed.device)
    _kernels().block_inputs_kernel[(n, size)](anchors.contiguous(), last.contiguous(), embed.contiguous(), norm, out,
                                              width, size, int(mask_token), _in_dtype(scale, embed.dtype), float(eps),
                                              SCALED=scale != 1.0, BLOCK=_pow2(width, 16))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [M, 2I] -> [M, I]
    """silu(gate)·up of a stacked gate|up product."""
    gate_up = gate_up.contiguous()
    m, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(m, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, _pow2(width, 16))
    _kernels().silu_mul_kernel[(m, _cdiv(width, block))](gate_up, out, width, BLOCK=block)
    return out


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # q [M, Hq, D], k [M, Hkv, D], v [M, Hkv, D]
    """The rotary embedding (cos, sin [M, D]) of q and k from a stacked q|k|v product [M, (Hq + 2·Hkv)·D]."""
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    m, dim = qkv.shape[0], cos.shape[-1]
    q = torch.empty(m, q_heads, dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(m, kv_heads, dim, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty_like(k)
    _kernels().rope_qkv_kernel[(m, q_heads + 2 * kv_heads)](qkv, cos, sin, q, k, v, q_heads, kv_heads, dim,
                                                            HALF=_pow2(dim // 2, 16))
    return q, k, v


def rotary_write(kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 lengths: torch.Tensor, positions: torch.Tensor | None = None,
                 k_norm: tuple[torch.Tensor, float] | None = None) -> None:
    """A stacked k|v product [B·T, 2·Hkv·D] (the step's T new tokens of each row) written into one cache layer, keys
    and values [B, Hkv, S, D], at slots lengths + t, its keys rotated (cos, sin [B·T, D]; with ``positions`` [B·T]
    tables [P, D] read at them): :func:`rope_qkv` then ``KVCache.write`` in one kernel, bit for bit (the block
    drafter's context, where they were ~7 kernels a layer). ``k_norm`` (weight [D], eps): each key RMS-normed first,
    as :func:`head_norms` norms it (the block drafter's, one kernel a layer fewer)."""
    b, kv_heads, capacity, dim = keys.shape
    m = kv.shape[0]
    if (kv.shape != (m, 2 * kv_heads * dim) or m % b or not _rotary_fits(cos, sin, positions, m, dim)
            or not keys.is_contiguous() or values.shape != keys.shape or not values.is_contiguous()
            or (k_norm is not None and k_norm[0].shape != (dim,))):
        raise ValueError(f"rotary_write: k|v {tuple(kv.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}, "
                         f"positions {None if positions is None else tuple(positions.shape)}, k norm "
                         f"{None if k_norm is None else tuple(k_norm[0].shape)} do not fit the contiguous keys "
                         f"{tuple(keys.shape)} and values {tuple(values.shape)}")
    kv, cos, sin = kv.contiguous(), cos.contiguous(), sin.contiguous()
    at = lengths if positions is None else positions.contiguous()  # not read without a table
    weight, eps = (cos, 0.0) if k_norm is None else k_norm  # not read without a norm
    _kernels().rotary_write_kernel[(m, kv_heads)](kv, cos, sin, at, keys, values, lengths, m // b, kv_heads, capacity,
                                                  dim, weight, float(eps), TABLE=positions is not None,
                                                  BLOCK_D=_pow2(dim, 16), NORM=k_norm is not None)


def _rotary_fits(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, m: int, dim: int) -> bool:
    """Whether cos and sin fit ``m`` token rows of heads of ``dim``: a row each [M, D], or with ``positions`` [M]
    tables [P, D] read at them."""
    rows = m if positions is None else cos.shape[0]
    return (cos.shape == (rows, dim) and sin.shape == cos.shape
            and (positions is None or tuple(positions.shape) == (m,)))


def cache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    lengths: torch.Tensor, pad: torch.Tensor, tree_mask: torch.Tensor | None = None, recent: int = 0,
                    *, ordered: bool = False, splits: int | None = None, _planted: str | None = None) -> torch.Tensor:
    """A step's cache writes and attention over the per-row static cache: q [B·T, Hq, D], k and v [B·T, Hkv, D]
    (the step's T new tokens of each row), keys and values [B, Hkv, S, D] (one layer's), lengths and pad [B] long
    (committed slots, left padding), ``tree_mask`` [T, recent + T] bool (None: causal) as
    :meth:`specdec.models.cache.KVCache.attention_mask` reads it, ``recent`` the last committed slots the tree mask
    decides. Writes each new token's key and value into slot lengths + t; returns the attention [B·T, Hq·D]. Every
    bound is read on the device: no host sync, and a captured graph replays any lengths. ``ordered``: the slots in
    one pass in position order, the step's tokens at their positions (a tree's: each token's path, depth by depth),
    so that a token attends bit for bit as in a one-token step once its path is committed (``target.exact_numerics``;
    not with ``recent`` slots). ``splits``: the committed slots read in that many chunks, merged after (None: as
    :func:`attention_tiles` chooses; ordered attention in one)."""
    m, q_heads, dim = q.shape
    kv_heads = keys.shape[1]
    if k.shape != (m, kv_heads, dim) or v.shape != k.shape:
        raise ValueError(f"cache_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit the "
                         f"keys {tuple(keys.shape)}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return _attention((q, k, v), (0, 0, 0), (q_heads * dim, kv_heads * dim), None, q_heads, keys, values, lengths,
                      pad, tree_mask, recent, ordered, splits, _planted)


def rotary_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, keys: torch.Tensor,
                     values: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor,
                     tree_mask: torch.Tensor | None = None, recent: int = 0, *, ordered: bool = False,
                     splits: int | None = None, positions: torch.Tensor | None = None,
                     norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None = None,
                     _planted: str | None = None) -> torch.Tensor:
    """:func:`rope_qkv` then :func:`cache_attention` (``ordered`` as there) in one kernel: the attention of a stacked
    q|k|v product [B·T, (Hq + 2·Hkv)·D], its q and k rotated (cos, sin [B·T, D]) as the kernel reads them, the same
    arithmetic and roundings (one kernel a layer fewer). ``positions`` [B·T]: cos and sin are tables [P, D] of every
    position, each token's rows read at its position (no gather of the rows before the step). ``norms`` (the q norm's
    and the k norm's (weight [D], eps)): each q and k head RMS-normed first, as :func:`head_norms` norms them (Qwen3's
    layer: one kernel fewer again); not ``ordered`` (a norm's sum over a head read in tiles of other shapes than the
    one-token step's could round otherwise: exact numerics norm the heads apart)."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    width = (q_heads + 2 * kv_heads) * dim
    if qkv.dim() != 2 or qkv.shape[1] != width or not _rotary_fits(cos, sin, positions, qkv.shape[0], dim):
        raise ValueError(f"rotary_attention: q|k|v {tuple(qkv.shape)} (expected [M, {width}]), cos {tuple(cos.shape)} "
                         f"and sin {tuple(sin.shape)} (expected [M, {dim}], or tables [P, {dim}] with positions [M]: "
                         f"{None if positions is None else tuple(positions.shape)}) do not fit the keys "
                         f"{tuple(keys.shape)}")
    if norms is not None and (ordered or any(norm[0].shape != (dim,) for norm in norms)):
        raise ValueError(f"rotary_attention: q and k norms {[tuple(norm[0].shape) for norm in norms]} (expected "
                         f"[{dim}] each) inside the attention, not ordered (ordered={ordered}: norm them apart)")
    return _attention((qkv, qkv, qkv), (0, q_heads * dim, (q_heads + kv_heads) * dim), (width, width),
                      (cos, sin, positions), q_heads, keys, values, lengths, pad, tree_mask, recent, ordered, splits,
                      _planted, norms)


def _attention(sources, starts, strides, rotary, q_heads, keys, values, lengths, pad, tree_mask, recent, ordered,
               splits, _planted, norms=None):
    """Launch the attention kernel over token rows read from ``sources`` (q, k, v tensors) at ``starts`` + m ·
    ``strides`` (q's, k's and v's), rotated by ``rotary`` (cos, sin, and the positions their rows are read at or
    None: a row each) where given, its q and k heads normed first by ``norms`` (q's, k's) where given."""
    plant = _plant(_planted, PLANTED + PLANTED_ROTARY)
    b, kv_heads, capacity, dim = keys.shape
    m = sources[0].shape[0]
    new = m // b
    if m != b * new or q_heads % kv_heads or not keys.is_contiguous():
        raise ValueError(f"cache_attention: {m} token rows, {q_heads} query heads do not fit the contiguous keys "
                         f"{tuple(keys.shape)}")
    if tree_mask is not None:
        if tuple(tree_mask.shape) != (new, recent + new):
            raise ValueError(f"cache_attention: tree_mask [{new}, {recent + new}] expected ({recent} recent slots + "
                             f"{new} new tokens), got {tuple(tree_mask.shape)}")
        tree = tree_mask.contiguous()  # read as bytes: a bool mask as it is (no copy a layer), others converted
        tree = tree.view(torch.int8) if tree.dtype == torch.bool else tree.to(torch.int8)
    elif recent:
        raise ValueError("cache_attention: recent slots need a tree_mask saying who sees them")
    else:
        tree = lengths  # not read
    if ordered and recent:
        raise ValueError("cache_attention: ordered attention reads no recent slots (EAGLE's draft layer keeps the "
                         "unordered one)")
    out = torch.empty(m, q_heads * dim, dtype=keys.dtype, device=keys.device)
    cos, sin, positions = rotary if rotary is not None else (lengths, lengths, None)  # not read without the rotation
    at = lengths if positions is None else positions.contiguous()  # not read without a table
    common = dict(HAS_TREE=tree_mask is not None, ROTATE=rotary is not None, TABLE=positions is not None,
                  BLOCK_N=ATTENTION_SLOTS, BLOCK_D=_pow2(dim, 16), IEEE=keys.dtype == torch.float32, PLANT=plant)
    if ordered:
        if splits not in (None, 1):
            raise ValueError(f"cache_attention: splits={splits}: ordered attention reads the slots in one pass")
        _kernels().ordered_attention_kernel[(m, kv_heads)](
            *sources, cos, sin, keys, values, lengths, pad, tree, out, new, q_heads, kv_heads, capacity, dim, *starts,
            *strides, dim ** -0.5, at, GROUP=_pow2(q_heads // kv_heads, 16), BLOCK_T=_pow2(new, 16), **common)
        return out
    tokens, rows, splits, chunk = attention_tiles(b, new, q_heads, kv_heads, capacity, splits)
    programs = b * _cdiv(new, tokens)
    partial = (torch.empty(splits, m * q_heads, device=keys.device), torch.empty(splits, m * q_heads,
               device=keys.device), torch.empty(splits, m * q_heads, dim, device=keys.device)) if splits > 1 else \
        (out, out, out)  # float32: each chunk's max, sum of exps and weighted values a query row
    (q_norm, q_eps), (k_norm, k_eps) = norms if norms is not None else ((lengths, 0.0), (lengths, 0.0))  # or unread
    _kernels().attention_kernel[(programs, kv_heads, splits)](
        *sources, cos, sin, keys, values, lengths, pad, tree, out, *partial, m, new, q_heads, kv_heads, capacity, dim,
        int(recent), dim ** -0.5, chunk, *starts, *strides, at, q_norm, k_norm, float(q_eps), float(k_eps),
        SPLIT=splits > 1, TOKENS=tokens, ROWS=rows, NORM=norms is not None, **common)
    if splits > 1:
        _kernels().attention_merge_kernel[(m * q_heads,)](*partial, out, m * q_heads, dim, splits,
                                                          SPLITS=_pow2(splits), BLOCK_D=_pow2(dim, 16))
    return out


ATTENTION_SLOTS = 32  # the slots a block of keys the attention reads at once
ATTENTION_PROGRAMS = 256  # programs that keep an H100's or H200's 132 processors busy (not yet timed on a GPU)
SPLIT_SLOTS = 1024  # the most committed slots of a row one attention program reads, where a step's programs are few


def attention_tiles(b: int, new: int, q_heads: int, kv_heads: int, capacity: int, splits: int | None = None
                    ) -> tuple[int, int, int, int]:
    """How :func:`cache_attention` divides a step's attention (B rows of ``new`` tokens, a cache of ``capacity``
    slots) into programs: (tokens, rows, splits, chunk). A program takes ``tokens`` of a row's new tokens times the
    query heads of one KV head, ``rows`` query rows (16, the least a matrix product takes; 64 where the programs
    would still be :data:`ATTENTION_PROGRAMS` or more: a block of keys read once for 4x the queries), each block of
    keys read once for all of them; and the committed slots in ``splits`` chunks of ``chunk`` slots, one program
    each, merged after (flash-decoding), where a cache holds more than :data:`SPLIT_SLOTS` slots and the programs
    are fewer than :data:`ATTENTION_PROGRAMS` (a one-token step over a long context: otherwise a few processors read
    every key). ``splits`` given: that many (tests). The chunks are fixed by the capacity, not the lengths (a
    captured graph replays any), so a program past a row's length reads nothing."""
    group = q_heads // kv_heads
    rows = _pow2(group, 16)
    if rows < 64 and b * kv_heads * _cdiv(new, 64 // group) >= ATTENTION_PROGRAMS:
        rows = 64
    tokens = rows // group
    programs = b * _cdiv(new, tokens) * kv_heads
    if splits is None:
        wanted = min(_cdiv(capacity, SPLIT_SLOTS), _cdiv(ATTENTION_PROGRAMS, programs))
        splits = wanted if capacity > SPLIT_SLOTS else 1
    if splits < 1:
        raise ValueError(f"cache_attention: splits={splits}: at least 1")
    chunk = _cdiv(_cdiv(capacity, splits), ATTENTION_SLOTS) * ATTENTION_SLOTS
    return tokens, rows, _cdiv(capacity, chunk), chunk


INVARIANT_TILE = (16, 32, 64)  # product_kernel's rows, columns and inner steps a program: fixed, whatever M is
FUSED_TILE = (16, 16, 128)  # normed_product's and silu_product's by default: twice the programs for a step's few rows
# (not yet timed on a GPU: experiments/gpu/profile_step.py's products table); exact numerics pass INVARIANT_TILE
FUSED_ROWS = 64  # the most rows a step's products take their norm or SiLU·up inside (Backend.fused_products); more
# (a prefill): rms_norm or silu_mul, then cuBLAS's product (exact numerics: always inside, any rows)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     _planted: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (x [..., K], weight [N, K]) in a fixed order per row: every row's products summed
    over K in the same steps whatever the number of rows, so a row's result does not depend on the batch or on how
    many tokens the forward carries (cuBLAS picks its algorithm by shape). ``target.exact_numerics``' products.
    ``_planted`` (tests only): the order of the inner steps chosen by the number of rows, as a shape-tuned library
    chooses its reduction (a split of the inner steps alone can give the same bits on a GPU's tensor cores)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return _product(flat, weight, bias, 0, _planted=_planted).view(*x.shape[:-1], weight.shape[0])


def normed_product(stream: torch.Tensor, delta: torch.Tensor | None, norm: torch.Tensor, eps: float,
                   weight: torch.Tensor, bias: torch.Tensor | None = None, *, tile: tuple[int, int, int] = FUSED_TILE
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm` then :func:`invariant_linear` in one kernel: the RMSNorm of ``stream`` [M, K] (after the
    residual add of ``delta`` [M, K] where given) by ``norm`` [K], through weight [N, K] (+ bias). Returns (the stream
    after the add: a new tensor, ``stream`` left as it was; ``stream`` itself without a delta, the product [M, N]). The
    same roundings as the two kernels; the mean of squares summed in the product's inner steps (the norm's last bit
    may differ from :func:`rms_norm`'s), a row's arithmetic the same whatever M is. ``tile``: a program's rows,
    columns and inner steps (each at least 16, powers of two; :data:`INVARIANT_TILE`: :func:`invariant_linear`'s
    sums)."""
    if stream.dim() != 2 or norm.shape != (stream.shape[1],) or (delta is not None and delta.shape != stream.shape):
        raise ValueError(f"normed_product: stream {tuple(stream.shape)}, delta "
                         f"{None if delta is None else tuple(delta.shape)} and norm {tuple(norm.shape)} do not fit")
    stream = stream.contiguous()
    after = torch.empty_like(stream) if delta is not None else stream
    out = _product(stream, weight, bias, 1, delta=None if delta is None else delta.contiguous(), norm=norm,
                   after=after, eps=eps, tile=tile)
    return after, out


def silu_product(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 tile: tuple[int, int, int] = FUSED_TILE) -> torch.Tensor:
    """:func:`silu_mul` then :func:`invariant_linear` in one kernel: silu(gate)·up of a stacked gate|up [M, 2K] through
    weight [N, K] (+ bias), [M, N]; the same roundings, a row's arithmetic the same whatever M is (``tile`` as
    :func:`normed_product`'s)."""
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[1]:
        raise ValueError(f"silu_product: gate|up {tuple(gate_up.shape)} is not [M, 2·{weight.shape[1]}] (the "
                         f"weight's inputs twice)")
    return _product(gate_up.contiguous(), weight, bias, 2, tile=tile)


def residual_silu_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                          tile: tuple[int, int, int] = FUSED_TILE) -> torch.Tensor:
    """x + silu(x·W_jᵀ + b_j) for each block W_j of K rows of ``weight`` [N, K] (x [M, K]; N a multiple of K), side by
    side: [M, N]. Medusa's residual blocks, every head's in one kernel (weights and biases stacked) where torch's ops
    are three a head; rounded where those round (the product with its bias, SiLU, the add), a row's arithmetic the
    same whatever M is (``tile`` as :func:`normed_product`'s)."""
    if x.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] % x.shape[1]:
        raise ValueError(f"residual_silu_product: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit (a "
                         f"weight of blocks of the rows' width, [n·K, K])")
    return _product(x.contiguous(), weight, bias, 0, residual_silu=True, tile=tile)


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: int, *,
             delta: torch.Tensor | None = None, norm: torch.Tensor | None = None, after: torch.Tensor | None = None,
             eps: float = 0.0, tile: tuple[int, int, int] = INVARIANT_TILE, residual_silu: bool = False,
             _planted: bool = False) -> torch.Tensor:
    """Launch :func:`~specdec.models.triton_kernels.product_kernel` over the rows of x (contiguous) with ``prologue``
    (0: none, 1: RMSNorm, 2: SiLU·up), in ``tile``s; ``residual_silu``: x + silu(the product) as the output."""
    m, n = x.shape[0], weight.shape[0]
    k = x.shape[1] // 2 if prologue == 2 else x.shape[1]
    if weight.shape[1] != k:
        raise ValueError(f"product: the weight {tuple(weight.shape)} does not take rows of {k}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    rows, cols, inner = tile
    _kernels().product_kernel[(_cdiv(m, rows), _cdiv(n, cols))](
        x, x if delta is None else delta, weight if norm is None else norm, x if after is None else after,
        weight.contiguous(), weight if bias is None else bias, out, m, n, k, float(eps), PROLOGUE=prologue,
        HAS_DELTA=delta is not None, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=rows,
        BLOCK_N=cols, BLOCK_K=inner, REVERSED=_planted and m > 1, RESIDUAL_SILU=residual_silu)
    return out


TOP_K_ROW = 8192  # a row of at most this many logits takes one program (one kernel); longer rows, chunks of
TOP_K_CHUNK = 4096  # this many, then one program a row merging them (two kernels)
PLANTED_TOP_K = ("last_chunk_dropped", "ties_to_the_larger_index")  # top_k's planted bugs (tests)


def top_k(logits: torch.Tensor, k: int, *, log_softmax: bool = False, _planted: str | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.float().topk(k)`` over the last dimension as (values float32, indices int64) [..., k], largest first
    and equal values the smaller index first; ``log_softmax``: the values as log-probabilities (minus the row's
    log-sum-exp). A drafter's candidates over its vocabulary in one or two kernels, where torch's ``topk`` over a long
    row at a small batch takes its multi-block path (a radix select of a few kernels a pass, then a sort) and
    ``log_softmax`` one more. ``_planted`` (tests only): one of :data:`PLANTED_TOP_K`."""
    plant = _plant(_planted, PLANTED_TOP_K)
    width = logits.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= width:
        raise ValueError(f"top_k: k={k!r} must be an integer in [1, {width}] (the logits' last dimension)")
    flat = logits.reshape(-1, width)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    values = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    indices = torch.empty(rows, k, dtype=torch.long, device=logits.device)
    if width <= TOP_K_ROW:
        block = _pow2(width, 16)
        _kernels().top_k_kernel[(rows, 1)](flat, values, indices, values, values, width, flat.stride(0), k,
                                           FINAL=True, LOG_SOFTMAX=log_softmax, CHUNK=block, PLANT=plant,
                                           num_warps=8 if block >= 4096 else 4)
    else:
        chunks = width // TOP_K_CHUNK if plant == 1 else _cdiv(width, TOP_K_CHUNK)
        part_values = torch.empty(rows, chunks, k, dtype=torch.float32, device=logits.device)
        part_indices = torch.empty(rows, chunks, k, dtype=torch.long, device=logits.device)
        maxima, sums = (torch.empty(rows, chunks, dtype=torch.float32, device=logits.device) for _ in range(2))
        _kernels().top_k_kernel[(rows, chunks)](flat, part_values, part_indices, maxima, sums, width, flat.stride(0),
                                                k, FINAL=False, LOG_SOFTMAX=log_softmax, CHUNK=TOP_K_CHUNK,
                                                PLANT=plant, num_warps=8)
        _kernels().top_k_merge_kernel[(rows,)](part_values, part_indices, maxima, sums, values, indices, width, chunks,
                                               k, LOG_SOFTMAX=log_softmax, BLOCK=_pow2(chunks * k, 16),
                                               CHUNKS=_pow2(chunks, 16))
    return values.view(*logits.shape[:-1], k), indices.view(*logits.shape[:-1], k)


def _kth_largest(logits: torch.Tensor, k: int) -> torch.Tensor:  # [..., V] -> [...] float32
    """Each row's k-th largest logit (:func:`top_k`'s kernels): what top-k keeps at or above."""
    return top_k(logits, k)[0][..., -1].contiguous()


PLANTED_VERDICT = ("first_child_only",)  # greedy_verdict's planted bug (tests)
PLANTED_COMMIT = ("eos_ignored",)  # commit_step's (tests)


def greedy_verdict(best: torch.Tensor, block: torch.Tensor, children: torch.Tensor | None = None,
                   depth: int | None = None, *, _planted: str | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A verification's greedy verdict in one kernel, from the target's argmax ``best`` [B, T] at each block position
    and the ``block`` [B, T] (long) it scored: a chain (``children`` None: T - 1 drafts) or a tree (``children``
    [T, W], -1 = none, at most ``depth`` levels). Returns (num_accepted [B], next_tokens [B], emitted [B, D + 1], a
    tree's path [B, D + 1] in block positions or None, the block position where the next token was predicted [B]):
    what :func:`~specdec.verify.greedy_chain` or :func:`~specdec.verify.greedy_tree` and the decode loop's
    bookkeeping after them give, entries past the emitted ones included, where the torch ops take ~30 kernels for a
    chain and ~100 for a tree. ``_planted`` (tests only): one of :data:`PLANTED_VERDICT`."""
    batch, t = best.shape
    tree = children is not None
    depth = depth if tree else t - 1
    long = dict(dtype=torch.long, device=best.device)
    accepted, next_tokens, at = (torch.empty(batch, **long) for _ in range(3))
    emitted = torch.empty(batch, depth + 1, **long)
    path = torch.empty(batch, depth + 1, **long) if tree else None
    width = children.shape[1] if tree else 1
    _kernels().greedy_verdict_kernel[(batch,)](
        best.contiguous(), block.contiguous(), children.contiguous() if tree else best, accepted, next_tokens, emitted,
        path if tree else emitted, at, t, width, DEPTH=depth, TREE=tree, WIDTH=_pow2(width, 2),
        SPAN=_pow2(depth + 1, 2), PLANT=_plant(_planted, PLANTED_VERDICT))
    return accepted, next_tokens, emitted, path, at


PLANTED_SAMPLED = ("no_renormalisation", "recovered_from_p", "top_k_ignored")  # sampled_verdict's (tests)
PLANTED_FLOORS = ("top_p_before_top_k", "top_p_before_temperature")  # sampling_floors' (tests)
VOCAB_BLOCK = 2048  # the logits sampled_verdict and sampling_floors read at once along a row's vocabulary


def sampling_floors(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, *,
                    _planted: str | None = None) -> torch.Tensor | None:
    """Each position's floor over ``temperature`` [...] float32 (``logits`` [..., V]): the logits over ``temperature``
    that :func:`~specdec.verify.sampling.logits_to_probs` keeps at ``top_k`` (the k-th largest, :func:`top_k`'s
    kernels) and ``top_p`` are those at or above it; None where neither applies. Top-p in one kernel (a program a
    position, bisection over the floats' order: 32 passes over its vocabulary at most) where the torch ops sort every
    position's vocabulary; the kept tokens are the torch ops' but where the mass above one is within float32
    round-off of ``top_p`` (summed in another order). ``_planted`` (tests only): one of :data:`PLANTED_FLOORS`."""
    validate_sampling(temperature, top_k, top_p)
    vocab = logits.shape[-1]
    top_k = top_k if 0 < top_k < vocab else 0
    if not top_k and top_p >= 1:
        return None
    flat = logits.reshape(-1, vocab).contiguous()
    floors = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    _kernels().sampling_floors_kernel[(flat.shape[0],)](
        flat, _kth_largest(flat, top_k) if top_k else flat, floors, vocab, float(temperature), float(top_p),
        TOP_K=bool(top_k), TOP_P=top_p < 1, BLOCK=min(VOCAB_BLOCK, _pow2(vocab, 16)),
        PLANT=_plant(_planted, PLANTED_FLOORS))
    return floors.view(logits.shape[:-1])


def sampled_verdict(logits: torch.Tensor, block: torch.Tensor, uniforms: torch.Tensor, temperature: float,
                    children: torch.Tensor | None = None, depth: int | None = None, *, top_k: int = 0,
                    top_p: float = 1.0, draft_probs: torch.Tensor | None = None, _planted: str | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A verification's sampled verdict under the exact rule in one kernel, at ``temperature`` > 0 with ``top_k`` (0:
    none) and ``top_p`` (1: none; what they keep found first by :func:`sampling_floors`' kernels), for drafts with
    one-hot q (fixed candidates: n-gram lookup, Medusa's and EAGLE's fixed trees, the block drafter's) or drawn from
    their ``draft_probs`` (q [B, T - 1, V], each node's law: a draft model's chain, EAGLE's sampled tree): from the
    target's ``logits`` [B, T, V] over the ``block`` [B, T] (long) it scored and the ``uniforms`` the rule draws before
    it (:meth:`~specdec.verify.ExactRule.draw`: [B, D·W + 1] float64), a chain (``children`` None: T - 1 drafts) or a
    tree (``children`` [T, W], at most ``depth`` levels). The law of :func:`~specdec.verify.rejection_sample`,
    :func:`~specdec.verify.tree.onehot_walk` and (a drawn tree: ``sampled_tree_drawn_kernel``, each sibling's residual
    stored in a [B, V] buffer) :func:`~specdec.verify.tree.walk_tree` over the same uniforms, and their draws but
    where p's float32 rounding (a sum in another order) moves a uniform across a boundary; the probabilities only at
    the nodes the walk reaches, where the torch ops take softmax over every position and ~50 kernels for a chain and
    ~130-180 for a tree. Returns what :func:`greedy_verdict` returns. ``_planted`` (tests only): one of
    :data:`PLANTED_SAMPLED`."""
    batch, t, vocab = logits.shape
    if not temperature > 0:
        raise ValueError(f"sampled_verdict: temperature must be > 0 (0 is greedy_verdict's), got {temperature!r}")
    tree = children is not None
    depth = depth if tree else t - 1
    width = children.shape[1] if tree else 1
    if uniforms.shape != (batch, depth * width + 1) or uniforms.dtype != torch.float64:
        raise ValueError(f"sampled_verdict: uniforms must be float64 [B, D·W + 1] = [{batch}, {depth * width + 1}], "
                         f"got {uniforms.dtype} {list(uniforms.shape)}")
    drafted = draft_probs is not None and t > 1
    if drafted and draft_probs.shape != (batch, t - 1, vocab):
        raise ValueError(f"sampled_verdict: draft_probs must be [B, T - 1, V] = [{batch}, {t - 1}, {vocab}], got "
                         f"{list(draft_probs.shape)}")
    plant = _plant(_planted, PLANTED_SAMPLED)
    floors = sampling_floors(logits, temperature, 0 if plant == 3 else top_k, top_p)
    long = dict(dtype=torch.long, device=logits.device)
    accepted, next_tokens, at = (torch.empty(batch, **long) for _ in range(3))
    emitted = torch.empty(batch, depth + 1, **long)
    path = torch.empty(batch, depth + 1, **long) if tree else None
    logits, block, uniforms = logits.contiguous(), block.contiguous(), uniforms.contiguous()
    q = draft_probs.float().contiguous() if drafted else logits
    shape = dict(SPAN=_pow2(depth + 1, 2), BLOCK=min(VOCAB_BLOCK, _pow2(vocab, 16)), FLOORS=floors is not None)
    if drafted and tree:  # each sibling's residual over the vocabulary: stored, a row each
        residual = torch.empty(batch, vocab, dtype=torch.float32, device=logits.device)
        _kernels().sampled_tree_drawn_kernel[(batch,)](
            logits, block, children.contiguous(), uniforms, q, logits if floors is None else floors, residual,
            accepted, next_tokens, emitted, path, at, t, width, vocab, uniforms.shape[1], float(temperature),
            DEPTH=depth, WIDTH=_pow2(width, 2), PLANT=plant, **shape)
    else:
        _kernels().sampled_verdict_kernel[(batch,)](
            logits, block, children.contiguous() if tree else block, uniforms, q,
            logits if floors is None else floors, accepted, next_tokens, emitted, path if tree else emitted, at, t,
            width, vocab, uniforms.shape[1], float(temperature), DEPTH=depth, TREE=tree, WIDTH=_pow2(width, 2),
            DRAFTED=drafted, PLANT=plant, **shape)
    return accepted, next_tokens, emitted, path, at


def commit_step(accepted: torch.Tensor, emitted: torch.Tensor, live: torch.Tensor, left: torch.Tensor,
                eos: torch.Tensor, seq: torch.Tensor, seq_lens: torch.Tensor, lengths: torch.Tensor, capacity: int, *,
                _planted: str | None = None) -> torch.Tensor:
    """A step kept on the device in one kernel (the decode loop's ``_DeviceCommit``, where its torch ops take ~15):
    each row keeps its ``accepted`` [B] drafts and the next token of ``emitted`` [B, E] while ``live`` [B] (bool),
    cut after its first EOS (``eos`` [n] long) and at ``left`` [B] (tokens it may still emit); ``live`` and ``left``
    move, the emitted tokens are written into ``seq`` [B, S] after ``seq_lens`` [B] (at most at slot ``capacity`` -
    1), and ``seq_lens`` and the target cache's ``lengths`` [B] move past the kept ones (a tree's path already moved
    into place). Returns the rows the host reads back, [2 + E, B] long: the accepted drafts, the counts, the emitted
    tokens position by position. ``_planted`` (tests only): one of :data:`PLANTED_COMMIT`."""
    batch, width = emitted.shape
    if seq.stride(1) != 1:
        raise ValueError("commit_step: seq must have unit stride along its slots")
    rows = torch.empty(2 + width, batch, dtype=torch.long, device=emitted.device)
    _kernels().commit_step_kernel[(batch,)](
        accepted, emitted.contiguous(), live, left, eos, seq, seq_lens, lengths, rows, batch, width, eos.numel(),
        seq.stride(0), capacity, SPAN=_pow2(width, 2), EOS=_pow2(eos.numel(), 2),
        PLANT=_plant(_planted, PLANTED_COMMIT))
    return rows


def move_path(stacked: torch.Tensor, lengths: torch.Tensor, path: torch.Tensor) -> None:
    """:meth:`~specdec.models.cache.KVCache.move_path` of a cache whose every layer's keys and values are views of
    ``stacked`` [2, L, B, H, S, D] (contiguous), in one kernel where the torch ops take five: the uncommitted slots
    ``lengths + path[b, j]`` moved to ``lengths + j`` (``path`` [B, P] long, a tree's accepted path in block
    positions). The slots of the accepted path equal the torch ops'; those past it are never committed."""
    if not stacked.is_contiguous():
        raise ValueError("move_path: the stacked cache must be contiguous")
    two, layers, batch, heads, capacity, dim = stacked.shape
    _kernels().move_path_kernel[(two * layers * batch * heads,)](stacked, lengths, path.contiguous(), path.shape[1],
                                                                 batch, heads, capacity, dim, BLOCK=_pow2(dim, 16))


PLANTED_TREE = ("confidence_uncapped",)  # device_tree's planted bug (tests)


def device_tree(confidence: torch.Tensor, parent: torch.Tensor, index: torch.Tensor, token_ids: torch.Tensor, n: int,
                levels: int, width: int, lookup: int = 0, *, _planted: str | None = None
                ) -> tuple[torch.Tensor, ...]:
    """:class:`~specdec.drafters.eagle.growth.DeviceGrowth`'s choice of its tree in one kernel, where the torch ops
    take ~65: of the C candidates (``confidence`` [C] float32, each uncapped; ``parent`` [C] long, -1 below the root,
    parents first, at most ``levels`` deep; ``index`` [B, C] their draft ids, ``token_ids`` [Dv] the target's) the
    ``n`` most confident, each capped at its ancestors' (so a kept node's parent is kept), ties to the earlier
    candidate as a stable sort orders them, in draw order. Returns their tokens [B, n] and, after a chain of ``lookup``
    nodes below the root, the tree's parents [lookup + n], depths, mask and children (``width`` columns) as
    :meth:`~specdec.verify.Tree.on_device` gives them. ``_planted`` (tests only): one of :data:`PLANTED_TREE`."""
    candidates = confidence.shape[0]
    batch = index.shape[0]
    if n > candidates or parent.shape != (candidates,) or index.shape != (batch, candidates):
        raise ValueError(f"device_tree: {n} nodes of {candidates} candidates, parent {tuple(parent.shape)}, index "
                         f"{tuple(index.shape)}")
    span = 1 + lookup + n
    long = dict(dtype=torch.long, device=confidence.device)
    tokens = torch.empty(batch, n, **long)
    parents, depths = torch.empty(lookup + n, **long), torch.empty(span, **long)
    mask = torch.empty(span, span, dtype=torch.int8, device=confidence.device)
    children = torch.empty(span, width, **long)
    _kernels().device_tree_kernel[(1,)](
        confidence.float().contiguous(), parent.contiguous(), index.contiguous(), token_ids.contiguous(), tokens,
        parents, depths, mask, children, candidates, batch, n, lookup, int(lookup > 0), width, LEVELS=levels,
        BLOCK_C=_pow2(candidates, 16), BLOCK_N=_pow2(span, 16), BLOCK_W=_pow2(width, 2),
        PLANT=_plant(_planted, PLANTED_TREE), num_warps=8)  # [C, C] tiles: 8 warps hold them without spilling
    return tokens, parents, depths, mask.view(torch.bool), children


def grow_level(confidence: torch.Tensor, index: torch.Tensor, token_ids: torch.Tensor, outputs: torch.Tensor,
               hidden: torch.Tensor, seen: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor, start: int,
               drafted: int, level: int, expand: int, top_k: int) -> tuple[torch.Tensor, ...]:
    """One level of :class:`~specdec.drafters.eagle.growth.DeviceGrowth` before its draft forward, in one kernel where
    the torch ops are ~20: of the level's candidates (``confidence`` [S], from candidate ``start`` of ``index`` [B, C])
    the ``expand`` most confident in draw order (ties to the earlier), then the forward's inputs: chosen [E], tokens
    [B, E] (``token_ids`` of their draft ids), the parents' draft-layer outputs [B, E, H] (entries of ``outputs`` [B,
    D, H]; at ``level`` 1 the root's ``hidden`` [B, H]), the tree mask [E, drafted + E] over the ``drafted`` entries
    and the new ones (their ancestors' rows of ``seen`` [D, D] int8, whose new rows it writes) and positions [B, E]
    (the draft cache's ``lengths`` and ``pad``)."""
    batch, candidates = index.shape
    size, entries, width = confidence.shape[0], seen.shape[0], outputs.shape[2]
    long = dict(dtype=torch.long, device=index.device)
    chosen, tokens, positions = torch.empty(expand, **long), torch.empty(batch, expand, **long), \
        torch.empty(batch, expand, **long)
    inputs = torch.empty(batch, expand, width, dtype=outputs.dtype, device=outputs.device)
    mask = torch.empty(expand, drafted + expand, dtype=torch.int8, device=index.device)
    _kernels().grow_level_kernel[(batch,)](
        confidence.float().contiguous(), index, token_ids.contiguous(), outputs, hidden.contiguous(), seen, lengths,
        pad, chosen, tokens, inputs, mask, positions, size, start, candidates, drafted, entries, level, expand, top_k,
        width, FIRST=level == 1, BLOCK_S=_pow2(size, 16), BLOCK_E=_pow2(expand, 2), BLOCK_D=_pow2(entries, 16),
        BLOCK_H=min(_pow2(width, 16), 1024))
    return chosen, tokens, inputs, mask.view(torch.bool), positions


def grown_level(values: torch.Tensor, children: torch.Tensor, chosen: torch.Tensor | None, out: torch.Tensor | None,
                logp: torch.Tensor, index: torch.Tensor, parent: torch.Tensor, outputs: torch.Tensor,
                lengths: torch.Tensor, start: int, drafted: int, expand: int, top_k: int) -> None:
    """One level of :class:`~specdec.drafters.eagle.growth.DeviceGrowth` after its draft forward, in one kernel where
    the torch ops are ~8, in place: the level's candidates (``values``, ``children`` [B, P, top_k], the top-k of each
    of the P ``chosen`` parents' draft logits; ``chosen`` None: the root's, P = 1) appended from candidate ``start``
    to ``logp`` [B, C] (the parent's path log-confidence plus its own), ``index`` [B, C] and ``parent`` [C]; the
    level's draft-layer outputs ``out`` [B, E, H] stored at entries ``drafted`` .. of ``outputs`` [B, D, H] and the
    draft cache's ``lengths`` moved past them (not at the root)."""
    batch = values.shape[0]
    count = values[0].numel()
    root = chosen is None
    _kernels().grown_level_kernel[(batch,)](
        values.contiguous(), children.contiguous(), logp if root else chosen, logp if root else out.contiguous(),
        logp, index, parent, outputs, lengths, count, start, index.shape[1], drafted, outputs.shape[1], expand, top_k,
        outputs.shape[2], ROOT=root, BLOCK=_pow2(count, 16), BLOCK_E=_pow2(expand, 2),
        BLOCK_H=min(_pow2(outputs.shape[2], 16), 1024))


def lookup_continuations(seq: torch.Tensor, seq_lens: torch.Tensor, pad: torch.Tensor, max_tokens: int,
                         max_ngram: int = 3, min_ngram: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~specdec.drafters.ngram.device_continuations` in one kernel (one program a row) where torch's ops are
    ~75: each row's n-gram lookup continuation in ``seq`` [B, S] (its tokens from ``pad`` to ``seq_lens``), filled
    with its last token past what the lookup found: tokens [B, max_tokens], found [B] (long)."""
    batch, capacity = seq.shape
    tokens = torch.empty(batch, max_tokens, dtype=torch.long, device=seq.device)
    found = torch.empty(batch, dtype=torch.long, device=seq.device)
    _kernels().lookup_kernel[(batch,)](seq.contiguous(), seq_lens.contiguous(), pad.contiguous(), tokens, found,
                                       capacity, max_tokens, MIN_NGRAM=min_ngram, MAX_NGRAM=max_ngram,
                                       BLOCK=min(_pow2(capacity, 16), 1024), BLOCK_L=_pow2(max_tokens, 2))
    return tokens, found


def cache_positions(lengths: torch.Tensor, pad: torch.Tensor, offsets: torch.Tensor | None, count: int
                    ) -> torch.Tensor:
    """The position ids [B, count] of ``count`` new tokens a row, ``offsets`` [count] after each row's committed ones
    (None: 0 .. count - 1), padding slots at 0: ``KVCache.positions(offsets).clamp_(min=0)`` (``lengths``, ``pad``
    [B] its) in one kernel where torch's ops are three or four."""
    batch = lengths.shape[0]
    out = torch.empty(batch, count, dtype=torch.long, device=lengths.device)
    block = min(_pow2(count, 2), POSITIONS_BLOCK)
    _kernels().positions_kernel[(batch, _cdiv(count, block))](
        lengths, pad, lengths if offsets is None else offsets.contiguous(), out, count, HAS_OFFSETS=offsets is not None,
        BLOCK=block)
    return out


POSITIONS_BLOCK = 1024  # the most positions a program of cache_positions or catch_up_inputs takes (a prefill's more)


def catch_up_inputs(seq: torch.Tensor | None, seq_lens: torch.Tensor, lengths: torch.Tensor, pad: torch.Tensor,
                    count: int, capacity: int) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a feature drafter's catch-up reads of the ``count`` positions a row after its cache's committed ones
    (``lengths``, ``pad`` [B]), in one kernel where torch's ops are ~10-13: the tokens after them in ``seq`` [B, S] (the
    slot after each, clamped below ``capacity``) [B, count] (None without a ``seq``), their position ids (clamped at 0)
    [B, count], how many a row has committed since (``seq_lens`` [B] less one, less ``lengths``, within 0 .. count)
    [B], and the flat index of each row's newest of them in a [B·count] view (b·count, plus that many less one, at
    least 0) [B]."""
    batch, device = seq_lens.shape[0], seq_lens.device
    positions = torch.empty(batch, count, dtype=torch.long, device=device)
    tokens = None if seq is None else torch.empty_like(positions)
    new, last = (torch.empty(batch, dtype=torch.long, device=device) for _ in range(2))
    width = 1 if seq is None else seq.shape[1]
    block = min(_pow2(count, 2), POSITIONS_BLOCK)
    _kernels().catch_up_kernel[(batch, _cdiv(count, block))](
        positions if seq is None else seq.contiguous(), seq_lens, lengths, pad, positions if tokens is None else tokens,
        positions, new, last, width, count, min(capacity, width), HAS_SEQ=seq is not None, BLOCK=block)
    return tokens, positions, new, last
