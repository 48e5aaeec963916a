"""The Triton kernels behind :mod:`specdec.models.gpu_kernels` (which calls them; imported only there, when they
are first needed: a machine without Triton never imports this)."""

import triton
import triton.language as tl


@triton.jit
def rounded(x, KIND: tl.constexpr):
    """float32 ``x`` rounded (to nearest, ties to even) to KIND's precision, kept in float32: the rounding of a
    torch op in KIND. For bfloat16 and float16 on the bits: a float32→16-bit→float32 round trip may be folded away by
    the GPU's compiler (measured on an H200: the rotary embedding's products and sum then rounded once, in a quarter
    of the values), so that two roundings become one. Finite values only; float16's within its range (its
    subnormals below 2^-14 rounded to multiples of 2^-24 through the float32 sum with 1.5·2^-1, exact there)."""
    if KIND == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif KIND == tl.float16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
        tiny = (x + 0.75) - 0.75  # |x| < 2^-14: float32's rounding at 0.75's quantum (2^-24) is float16's
        return tl.where(tl.abs(x) < 6.103515625e-05, tiny, bits.to(tl.float32, bitcast=True))
    else:
        return x.to(KIND).to(tl.float32)


@triton.jit
def scaled_norm(x, rstd, weight, kind: tl.constexpr):
    """float32 ``x`` times its row's ``rstd``, then by the norm's ``weight``, each rounded in ``kind`` as transformers'
    ``weight * (x * rstd).to(input dtype)`` rounds it (float32 values)."""
    return rounded(weight * rounded(x * rstd, kind), kind)


@triton.jit
def silu_rounded(x, kind: tl.constexpr):
    """silu of float32 ``x`` rounded in ``kind`` as torch's ``F.silu`` rounds it (float32 values; the exp may differ
    from torch's in its last bit)."""
    return rounded(x / (1.0 + tl.exp(-x)), kind)


@triton.jit
def normed_row(x, w_ptr, offs, inside, width, eps, kind: tl.constexpr):
    """The RMSNorm of one row ``x`` [BLOCK] (float32, zero past ``width``) by the weight at ``w_ptr``, rounded as
    transformers' ``weight * x.to(input dtype)`` rounds it in ``kind`` (float32 values)."""
    w = tl.load(w_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    return scaled_norm(x, tl.rsqrt(tl.sum(x * x, axis=0) / width + eps), w, kind)


@triton.jit
def rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, width, eps, HAS_DELTA: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    kind: tl.constexpr = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * width + offs, mask=inside, other=0.0).to(tl.float32)
    if HAS_DELTA:  # the residual add, rounded to the stream's dtype as torch's x + out
        x = rounded(x + tl.load(delta_ptr + row * width + offs, mask=inside, other=0.0).to(tl.float32), kind)
        tl.store(x_ptr + row * width + offs, x.to(kind), mask=inside)
    tl.store(out_ptr + row * width + offs, normed_row(x, w_ptr, offs, inside, width, eps, kind).to(kind), mask=inside)


@triton.jit
def head_norms_kernel(qkv_ptr, wq_ptr, wk_ptr, q_heads, kv_heads, dim, eps_q, eps_k, BLOCK: tl.constexpr):
    # One program: head `head` of row `row` of a stacked q|k|v [M, (Hq + 2·Hkv)·D] (Hq = 0: k|v), in place: a q head
    # RMS-normed by wq, a k head by wk, each as rms_norm_kernel normalises a row of D (the v heads left as they are).
    row, head = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    inside = offs < dim
    kind: tl.constexpr = qkv_ptr.dtype.element_ty
    at = qkv_ptr + (row * (q_heads + 2 * kv_heads) + head) * dim + offs
    x = tl.load(at, mask=inside, other=0.0).to(tl.float32)
    if head < q_heads:
        tl.store(at, normed_row(x, wq_ptr, offs, inside, dim, eps_q, kind).to(kind), mask=inside)
    else:
        tl.store(at, normed_row(x, wk_ptr, offs, inside, dim, eps_k, kind).to(kind), mask=inside)


@triton.jit
def embedded_row(embed_ptr, token, offs, inside, width, scale, kind: tl.constexpr, SCALED: tl.constexpr):
    """Row ``token`` of the embedding table in float32, times ``scale`` rounded as torch's product in the dtype
    rounds it where SCALED (Gemma's)."""
    embedded = tl.load(embed_ptr + token * width + offs, mask=inside, other=0.0).to(tl.float32)
    if SCALED:
        embedded = rounded(embedded * scale, kind)
    return embedded


@triton.jit
def block_inputs_kernel(anchors_ptr, last_ptr, embed_ptr, w_ptr, out_ptr, width, size, mask_token, scale, eps,
                        SCALED: tl.constexpr, BLOCK: tl.constexpr):
    """The block drafter's inputs (program: position p of row n's block of ``size``): the RMSNorm (by w) of the
    embedding of the row's anchor (p = 0) or of the mask token, plus the anchor's where p > 0, plus the row's
    ``last`` context; each sum rounded as torch's ops round it in the dtype."""
    n, p = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    kind: tl.constexpr = out_ptr.dtype.element_ty
    anchor = tl.load(anchors_ptr + n)
    x = normed_row(embedded_row(embed_ptr, tl.where(p == 0, anchor, mask_token), offs, inside, width, scale, kind,
                                SCALED), w_ptr, offs, inside, width, eps, kind)
    first = normed_row(embedded_row(embed_ptr, anchor, offs, inside, width, scale, kind, SCALED), w_ptr, offs,
                       inside, width, eps, kind)
    x = tl.where(p == 0, x, rounded(x + first, kind))
    last = rounded(tl.load(last_ptr + n * width + offs, mask=inside, other=0.0).to(tl.float32), kind)
    tl.store(out_ptr + (n * size + p) * width + offs, rounded(x + last, kind).to(kind), mask=inside)


@triton.jit
def embedded_norms_kernel(tokens_ptr, embed_ptr, stream_ptr, w_embed_ptr, w_stream_ptr, out_ptr, width, scale,
                          eps_embed, eps_stream, SCALED: tl.constexpr, BLOCK: tl.constexpr):
    """EAGLE's draft layer input (program: one row): the RMSNorm of the token's embedding (a row of the embedding
    table, times ``scale`` rounded as torch's product in the dtype rounds it where SCALED), then the RMSNorm of the
    stream's row, side by side in ``out`` [M, 2H]."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    kind: tl.constexpr = out_ptr.dtype.element_ty
    embedded = embedded_row(embed_ptr, tl.load(tokens_ptr + row), offs, inside, width, scale, kind, SCALED)
    stream = tl.load(stream_ptr + row * width + offs, mask=inside, other=0.0).to(tl.float32)
    out = out_ptr + row * 2 * width + offs
    tl.store(out, normed_row(embedded, w_embed_ptr, offs, inside, width, eps_embed, kind).to(kind), mask=inside)
    tl.store(out + width, normed_row(stream, w_stream_ptr, offs, inside, width, eps_stream, kind).to(kind),
             mask=inside)


@triton.jit
def silu_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    offs = part * BLOCK + tl.arange(0, BLOCK)
    inside = offs < width
    gate = tl.load(x_ptr + row * 2 * width + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + offs, mask=inside, other=0.0).to(tl.float32)
    kind: tl.constexpr = out_ptr.dtype.element_ty
    act = silu_rounded(gate, kind)
    tl.store(out_ptr + row * width + offs, rounded(act * up, kind).to(kind), mask=inside)


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
        kind: tl.constexpr = q_ptr.dtype.element_ty
        c1 = tl.load(cos_ptr + row * dim + offs, mask=inside, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + row * dim + dim // 2 + offs, mask=inside, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + row * dim + offs, mask=inside, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + row * dim + dim // 2 + offs, mask=inside, other=0.0).to(tl.float32)
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        # x·cos + rotate_half(x)·sin, each product and the sum rounded as torch's ops round them
        y1 = rounded(rounded(a1 * c1, kind) + rounded(-a2 * s1, kind), kind).to(kind)
        y2 = rounded(rounded(a2 * c2, kind) + rounded(a1 * s2, kind), kind).to(kind)
        if head < q_heads:
            dst = q_ptr + (row * q_heads + head) * dim
        else:
            dst = k_ptr + (row * kv_heads + head - q_heads) * dim
        tl.store(dst + offs, y1, mask=inside)
        tl.store(dst + dim // 2 + offs, y2, mask=inside)


@triton.jit
def attend(q, keys, values, seen, best, total, acc, scale, IEEE: tl.constexpr):
    """One block of keys and values [N, D] into an online softmax over them for queries q [R, D]: where ``seen``
    [R, N] (or [1, N]), the scores scaled; (best, total, acc) the running max [R], sum of exps [R] and weighted
    values [R, D], updated."""
    if IEEE:
        scores = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale
    else:
        scores = tl.dot(q, tl.trans(keys)) * scale
    scores = tl.where(seen, scores, float("-inf"))
    top = tl.maximum(best, tl.max(scores, axis=1))
    safe = tl.where(top == float("-inf"), 0.0, top)  # a block nothing sees yet: no inf - inf
    p = tl.exp(scores - safe[:, None])
    fade = tl.exp(best - safe)
    total = total * fade + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * fade[:, None] + tl.dot(p, values, input_precision="ieee")
    else:
        acc = acc * fade[:, None] + tl.dot(p.to(values.dtype), values)
    return top, total, acc


@triton.jit
def rotate_half_lanes(d, dim):
    """For lanes ``d`` of a head of ``dim``: rotate_half's source dimension of each, and its sign (-1 in the first
    half, +1 in the second), as :func:`rotated` reads them."""
    half = dim // 2
    return tl.where(d < half, d + half, d - half), tl.where(d < half, -1.0, 1.0)


@triton.jit
def rotated(x, partner, cos, sin, sign, KIND: tl.constexpr):
    """The rotary embedding of float32 ``x`` (``partner``: x's other half at each dimension, ``sign`` -1 in the first
    half, +1 in the second; ``cos``, ``sin`` float32, broadcast alike): x·cos + rotate_half(x)·sin, each product
    and the sum rounded as torch's ops round them in KIND (float32 values)."""
    return rounded(rounded(x * cos, KIND) + rounded(sign * partner * sin, KIND), KIND)


@triton.jit
def read_rotated(x_ptr, cos_ptr, sin_ptr, pos_ptr, at, turns, tile, d, partner, sign, dim, kind: tl.constexpr,
                 ROTATE: tl.constexpr, TABLE: tl.constexpr, norm_ptr, eps, NORM: tl.constexpr):
    """Heads [N, D] read where ``at`` [N, 1] says (under ``tile`` [N, D]), in ``kind``; with ROTATE rotated at the
    positions of the token rows ``turns`` [N]: their cos and sin rows, or with TABLE the rows of cos and sin tables at
    the tokens' positions (``pos_ptr``): a step's queries or keys; with NORM (and ROTATE) each head RMS-normed first
    by the weight at ``norm_ptr`` (Qwen3's q and k norms) as :func:`head_norms_kernel` norms it."""
    if ROTATE:
        if TABLE:
            turns = tl.load(pos_ptr + turns, mask=tl.max(tile.to(tl.int32), 1) > 0, other=0)
        c = tl.load(cos_ptr + turns[:, None] * dim + d[None, :], mask=tile, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + turns[:, None] * dim + d[None, :], mask=tile, other=0.0).to(tl.float32)
        raw = tl.load(x_ptr + at + d[None, :], mask=tile, other=0.0).to(tl.float32)
        other = tl.load(x_ptr + at + partner[None, :], mask=tile, other=0.0).to(tl.float32)
        if NORM:  # the head's mean of squares (its lanes past dim read as 0), then each lane and its partner normed
            rstd = tl.rsqrt(tl.sum(raw * raw, axis=1) / dim + eps)[:, None]
            lanes = d < dim
            weight = tl.load(norm_ptr + d, mask=lanes, other=0.0).to(tl.float32)[None, :]
            partners = tl.load(norm_ptr + partner, mask=lanes, other=0.0).to(tl.float32)[None, :]
            raw = scaled_norm(raw, rstd, weight, kind)
            other = scaled_norm(other, rstd, partners, kind)
        heads = rotated(raw, other, c, s, sign[None, :], kind).to(kind)
    else:
        heads = tl.load(x_ptr + at + d[None, :], mask=tile, other=0.0)
    return heads


@triton.jit
def rotary_write_kernel(kv_ptr, cos_ptr, sin_ptr, pos_ptr, keys_ptr, values_ptr, lengths_ptr, new, kv_heads, capacity,
                        dim, k_norm_ptr, k_eps, TABLE: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr = False):
    # One program: KV head h of token m (new token t of row b) of a stacked k|v [M, 2·Hkv·D]: its key rotated (cos and
    # sin rows [M, D], or with TABLE tables read at the positions pos [M]) as rope_qkv_kernel rotates it (with NORM
    # RMS-normed first by the k norm, as head_norms_kernel norms it), and its value, written into slot lengths[b] + t of
    # the cache layer [B, Hkv, S, D].
    m, h = tl.program_id(0), tl.program_id(1)
    b, t = m // new, m % new
    d = tl.arange(0, BLOCK_D)
    partner, sign = rotate_half_lanes(d, dim)
    kind: tl.constexpr = keys_ptr.dtype.element_ty
    token = m + tl.zeros([1], tl.int32)  # [1]: one row
    tile = (d < dim)[None, :]  # [1, D]
    at = (m * 2 * kv_heads + h) * dim + tl.zeros([1, 1], tl.int32)
    slot = ((b * kv_heads + h) * capacity + tl.load(lengths_ptr + b) + t) * dim + d[None, :]
    tl.store(keys_ptr + slot, read_rotated(kv_ptr, cos_ptr, sin_ptr, pos_ptr, at, token, tile, d, partner, sign, dim,
                                           kind, True, TABLE, k_norm_ptr, k_eps, NORM), mask=tile)
    tl.store(values_ptr + slot, tl.load(kv_ptr + at + kv_heads * dim + d[None, :], mask=tile), mask=tile)


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, keys_ptr, values_ptr, lengths_ptr, pad_ptr, tree_ptr,
                     out_ptr, best_ptr, total_ptr, acc_ptr, rows, new, q_heads, kv_heads, capacity, dim, recent, scale,
                     chunk, q_start, k_start, v_start, q_stride, kv_stride, pos_ptr, q_norm_ptr, k_norm_ptr, q_eps,
                     k_eps, HAS_TREE: tl.constexpr, ROTATE: tl.constexpr, TABLE: tl.constexpr, SPLIT: tl.constexpr,
                     TOKENS: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                     PLANT: tl.constexpr, NORM: tl.constexpr = False):
    # One program: TOKENS new tokens of row b times the query heads sharing KV head h, as ROWS query rows (token by
    # token), over chunk s of the committed slots (chunk slots from s·chunk: all of them without SPLIT), each block of
    # keys read once for them all; the chunk holding slot lengths[b] also over the step's tokens (read from k and v,
    # rotated as read where ROTATE: cos and sin [M, D], or with TABLE tables read at the positions pos [M]), whose keys
    # and values it writes into slots lengths[b] + t (read by no program). The tree mask (causal without one) says who
    # sees whom among the step's tokens and the last ``recent`` committed slots. Token m's q, k, v start at q_start,
    # k_start, v_start + m · (q_stride or kv_stride): three tensors or one q|k|v product. Stores the attention, or
    # with SPLIT each query row's running max, sum of exps and weighted values for attention_merge_kernel. NORM (with
    # ROTATE): each q and k head RMS-normed first by the q and k norms (Qwen3's), as head_norms_kernel norms it.
    p, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tiles = tl.cdiv(new, TOKENS)
    b, t0 = p // tiles, p % tiles * TOKENS
    group = q_heads // kv_heads
    r = tl.arange(0, ROWS)
    t, g = t0 + r // group, r % group  # [R] each query row's step token and head in the group
    live = (r < TOKENS * group) & (t < new)
    m = b * new + t
    length = tl.load(lengths_ptr + (0 if PLANT == 3 else b))
    pad = tl.load(pad_ptr + b)
    d = tl.arange(0, BLOCK_D)
    dims = d < dim
    partner, sign = rotate_half_lanes(d, dim)
    kind: tl.constexpr = keys_ptr.dtype.element_ty
    cached = (b * kv_heads + h) * capacity * dim
    steps = length // chunk + 0 * r == s  # [R] whether this chunk holds the step's slots (as rows: the interpreter
    # refuses a mask of a scalar comparison's and a tensor)
    q = read_rotated(q_ptr, cos_ptr, sin_ptr, pos_ptr, q_start + m[:, None] * q_stride + (h * group + g[:, None]) * dim,
                     m, live[:, None] & dims[None, :], d, partner, sign, dim, kind, ROTATE, TABLE, q_norm_ptr, q_eps,
                     NORM)  # [R, D]
    writer = (live & (g == 0) & steps)[:, None] & dims[None, :]  # each token's key and value, once
    if PLANT != 2:
        slot = cached + (length + t)[:, None] * dim + d[None, :]
        key = read_rotated(k_ptr, cos_ptr, sin_ptr, pos_ptr, k_start + m[:, None] * kv_stride + h * dim, m, writer, d,
                           partner, sign, dim, kind, ROTATE, TABLE, k_norm_ptr, k_eps, NORM)
        tl.store(keys_ptr + slot, key, mask=writer)
        tl.store(values_ptr + slot, tl.load(v_ptr + v_start + m[:, None] * kv_stride + h * dim + d[None, :],
                                            mask=writer), mask=writer)
    best = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    columns = recent + new
    # the chunk's committed slots from the pad on; of them the last `recent`, only where the tree mask says
    for start in range(tl.maximum(pad // BLOCK_N * BLOCK_N, s * chunk), tl.minimum(length, s * chunk + chunk),
                       BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        seen = live[:, None] & ((n >= pad) & (n < length))[None, :]  # [R, N]
        if HAS_TREE:
            column = n - (length - recent)
            allowed = tl.load(tree_ptr + t[:, None] * columns + column[None, :], mask=seen & (column >= 0)[None, :],
                              other=1)
            seen = seen & (allowed != 0)
        tile = (tl.max(seen.to(tl.int32), 0) > 0)[:, None] & dims[None, :]  # the slots some query row sees
        keys = tl.load(keys_ptr + cached + n[:, None] * dim + d[None, :], mask=tile, other=0.0)  # [N, D]
        values = tl.load(values_ptr + cached + n[:, None] * dim + d[None, :], mask=tile, other=0.0)
        best, total, acc = attend(q, keys, values, seen, best, total, acc, scale, IEEE)
    # the step's own tokens: j sees itself always; others where the tree mask (causal without one) allows
    for start in range(0, tl.where(length // chunk == s, new, 0), BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        real = (j < new) & (length + j >= pad)
        if HAS_TREE:
            column = recent + j + (1 if PLANT == 1 else 0)
            allowed = tl.load(tree_ptr + t[:, None] * columns + column[None, :],
                              mask=live[:, None] & (real & (column < columns))[None, :], other=0)
            seen = real[None, :] & (allowed != 0)
        else:
            seen = real[None, :] & (j[None, :] <= t[:, None] + (1 if PLANT == 1 else 0))
        seen = live[:, None] & (seen | (j[None, :] == t[:, None]))
        tile = (tl.max(seen.to(tl.int32), 0) > 0)[:, None] & dims[None, :]
        tokens = b * new + j
        if PLANT == 4:  # planted: every step key rotated at the position of its tile's first token
            turns = b * new + t0 + 0 * j
        else:
            turns = tokens
        keys = read_rotated(k_ptr, cos_ptr, sin_ptr, pos_ptr, k_start + tokens[:, None] * kv_stride + h * dim, turns,
                            tile, d, partner, sign, dim, kind, ROTATE, TABLE, k_norm_ptr, k_eps, NORM)
        values = tl.load(v_ptr + v_start + tokens[:, None] * kv_stride + h * dim + d[None, :], mask=tile, other=0.0)
        best, total, acc = attend(q, keys, values, seen, best, total, acc, scale, IEEE)
    heads = m * q_heads + h * group + g  # [R] the query rows' (token, head)
    if SPLIT:
        at = s * rows * q_heads + heads
        tl.store(best_ptr + at, best, mask=live)
        tl.store(total_ptr + at, total, mask=live)
        tl.store(acc_ptr + at[:, None] * dim + d[None, :], acc, mask=live[:, None] & dims[None, :])
    else:
        out = acc / tl.where(live, total, 1.0)[:, None]  # a row past the step's tokens sees nothing: no 0 / 0
        tl.store(out_ptr + heads[:, None] * dim + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & dims[None, :])


@triton.jit
def attention_merge_kernel(best_ptr, total_ptr, acc_ptr, out_ptr, heads, dim, splits, SPLITS: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    # One program: query row (token, head) `row` of the attention split over chunks of slots: the chunks' online
    # softmaxes (max, sum of exps, weighted values, one row each [splits, rows·heads]) merged into its attention.
    row = tl.program_id(0)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    chunks = s < splits
    at = s * heads + row
    best = tl.load(best_ptr + at, mask=chunks, other=float("-inf"))
    weight = tl.exp(best - tl.max(best, 0))  # a chunk its row saw nothing of: 0 (its max is -inf)
    total = tl.sum(tl.load(total_ptr + at, mask=chunks, other=0.0) * weight, 0)
    acc = tl.load(acc_ptr + at[:, None] * dim + d[None, :], mask=chunks[:, None] & (d < dim)[None, :], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(out_ptr + row * dim + d, out.to(out_ptr.dtype.element_ty), mask=d < dim)


@triton.jit
def ordered_attention(q, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, keys_ptr, values_ptr, tree_ptr, best, total, acc,
                      b, t, new, first, pad, length, cached, k_start, v_start, kv_stride, h, dim, d, dims, partner,
                      sign, scale, kind: tl.constexpr, HAS_TREE: tl.constexpr, ROTATE: tl.constexpr,
                      TABLE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, IEEE: tl.constexpr):
    """The attention of step token t of row b over the slots in position order, in blocks of BLOCK_N slots: the
    committed ones, then at slot length + i the step's token t sees at depth i (a chain: token i; a tree: its
    ancestor i levels below the root, found as the (i + 1)-th token its mask row shows, parents coming before their
    children), its key and value read from the step's k and v and rotated as the cache holds them. A block then holds
    the same keys as the cache does once the token's path is committed, so a token's attention is the same, bit for
    bit, in a one-token step and in a chain or tree verified at once."""
    if HAS_TREE:
        columns = tl.arange(0, BLOCK_T)
        sees = tl.load(tree_ptr + t * new + columns, mask=columns < new, other=0) != 0  # [T] token t's mask row
        rank = tl.cumsum(sees.to(tl.int32), 0)  # [T] how many it sees up to each block position
    for start in range(first, length + new, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        i = n - length  # the depth this slot holds (< 0: committed)
        if HAS_TREE:
            match = sees[None, :] & (rank[None, :] == (i + 1)[:, None])  # [N, T]
            j = tl.sum(tl.where(match, columns[None, :], 0), 1)  # the step's token at depth i on t's path
            step_seen = (i >= 0) & (tl.sum(match.to(tl.int32), 1) > 0)
        else:  # a token sees itself always (a padding slot's query too: no empty softmax), others past the pad
            j = i
            step_seen = (i >= 0) & (i < new) & (((i <= t) & (n >= pad)) | (i == t))
        committed = (n >= pad) & (n < length)
        seen = committed | step_seen
        tile = committed[:, None] & dims[None, :]
        keys = tl.load(keys_ptr + cached + n[:, None] * dim + d[None, :], mask=tile, other=0.0)
        values = tl.load(values_ptr + cached + n[:, None] * dim + d[None, :], mask=tile, other=0.0)
        rows = b * new + j
        new_tile = step_seen[:, None] & dims[None, :]
        step_keys = read_rotated(k_ptr, cos_ptr, sin_ptr, pos_ptr, k_start + rows[:, None] * kv_stride + h * dim, rows,
                                 new_tile, d, partner, sign, dim, kind, ROTATE, TABLE, k_ptr, 0.0, False)
        step_values = tl.load(v_ptr + v_start + rows[:, None] * kv_stride + h * dim + d[None, :], mask=new_tile,
                              other=0.0)
        keys = tl.where(new_tile, step_keys, keys)
        values = tl.where(new_tile, step_values, values)
        best, total, acc = attend(q, keys, values, seen[None, :], best, total, acc, scale, IEEE)
    return best, total, acc


@triton.jit
def ordered_attention_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, keys_ptr, values_ptr, lengths_ptr, pad_ptr,
                             tree_ptr, out_ptr, new, q_heads, kv_heads, capacity, dim, q_start, k_start, v_start,
                             q_stride, kv_stride, scale, pos_ptr,
                             HAS_TREE: tl.constexpr, ROTATE: tl.constexpr, TABLE: tl.constexpr, GROUP: tl.constexpr,
                             BLOCK_N: tl.constexpr,
                             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr, PLANT: tl.constexpr):
    # One program: new token t of row b, the query heads sharing KV head h, over the slots in position order
    # (ordered_attention: target.exact_numerics). It writes the token's key and value into slot lengths[b] + t (read
    # by no program: the step's keys come from k and v) as attention_kernel does.
    m, h = tl.program_id(0), tl.program_id(1)
    b, t = m // new, m % new
    group = q_heads // kv_heads
    length = tl.load(lengths_ptr + (0 if PLANT == 3 else b))
    pad = tl.load(pad_ptr + b)
    d = tl.arange(0, BLOCK_D)
    g = tl.arange(0, GROUP)
    dims = d < dim
    heads = g < group
    partner, sign = rotate_half_lanes(d, dim)
    kind: tl.constexpr = keys_ptr.dtype.element_ty
    token = m + 0 * g  # [G] the token's row, for each head
    q = read_rotated(q_ptr, cos_ptr, sin_ptr, pos_ptr, q_start + m * q_stride + (h * group + g[:, None]) * dim, token,
                     heads[:, None] & dims[None, :], d, partner, sign, dim, kind, ROTATE, TABLE, q_ptr, 0.0,
                     False)  # [G, D]
    writer = (g == 0)[:, None] & dims[None, :]
    if PLANT != 2:
        slot = (b * kv_heads + h) * capacity * dim + (length + t + 0 * g)[:, None] * dim + d[None, :]
        at = m * kv_stride + h * dim + 0 * g[:, None]  # [G, 1] the token's head in k and v
        key = read_rotated(k_ptr, cos_ptr, sin_ptr, pos_ptr, k_start + at, token, writer, d, partner, sign, dim, kind,
                           ROTATE, TABLE, k_ptr, 0.0, False)
        tl.store(keys_ptr + slot, key, mask=writer)
        tl.store(values_ptr + slot, tl.load(v_ptr + v_start + at + d[None, :], mask=writer), mask=writer)
    best = tl.full([GROUP], float("-inf"), tl.float32)
    total = tl.zeros([GROUP], tl.float32)
    acc = tl.zeros([GROUP, BLOCK_D], tl.float32)
    best, total, acc = ordered_attention(q, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, keys_ptr, values_ptr, tree_ptr,
                                         best, total, acc, b, t, new, pad // BLOCK_N * BLOCK_N, pad, length,
                                         (b * kv_heads + h) * capacity * dim, k_start, v_start, kv_stride, h, dim, d,
                                         dims, partner, sign, scale, kind, HAS_TREE, ROTATE, TABLE, BLOCK_N, BLOCK_T,
                                         IEEE)
    out = acc / total[:, None]
    tl.store(out_ptr + (m * q_heads + h * group + g[:, None]) * dim + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=heads[:, None] & dims[None, :])


@triton.jit
def stream_rows(x_ptr, delta_ptr, rows, ks, tile, k, HAS_DELTA: tl.constexpr, kind: tl.constexpr):
    """The residual stream's tile [BLOCK_M, BLOCK_K] at ``rows`` and ``ks`` (under ``tile``) in float32: x, or x + delta
    rounded to the stream's dtype as torch's x + out (HAS_DELTA)."""
    x = tl.load(x_ptr + rows[:, None] * k + ks[None, :], mask=tile, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = rounded(x + tl.load(delta_ptr + rows[:, None] * k + ks[None, :], mask=tile, other=0.0).to(tl.float32),
                    kind)
    return x


@triton.jit
def product_operand(x_ptr, delta_ptr, norm_ptr, rows, ks, m, k, rstd, PROLOGUE: tl.constexpr,
                    HAS_DELTA: tl.constexpr, kind: tl.constexpr):
    """The left operand's tile [BLOCK_M, BLOCK_K] of :func:`product_kernel` at ``rows`` and inner positions ``ks``,
    in ``kind``: x as it is (PROLOGUE 0); the RMSNorm of x (+ delta) by the rows' ``rstd`` and the norm's weight (1);
    silu(gate)·up of a stacked gate|up x [M, 2K] (2). Rounded where :func:`rms_norm_kernel` and
    :func:`silu_mul_kernel` round."""
    tile = (rows[:, None] < m) & (ks[None, :] < k)
    if PROLOGUE == 2:
        gate = tl.load(x_ptr + rows[:, None] * 2 * k + ks[None, :], mask=tile, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + rows[:, None] * 2 * k + k + ks[None, :], mask=tile, other=0.0).to(tl.float32)
        operand = rounded(silu_rounded(gate, kind) * up, kind)
    elif PROLOGUE == 1:
        operand = stream_rows(x_ptr, delta_ptr, rows, ks, tile, k, HAS_DELTA, kind)
        weight = tl.load(norm_ptr + ks, mask=ks < k, other=0.0).to(tl.float32)
        operand = scaled_norm(operand, rstd[:, None], weight[None, :], kind)
    else:
        operand = tl.load(x_ptr + rows[:, None] * k + ks[None, :], mask=tile, other=0.0).to(tl.float32)
    return operand.to(kind)


@triton.jit
def product_kernel(x_ptr, delta_ptr, norm_ptr, stream_ptr, w_ptr, bias_ptr, out_ptr, m, n, k, eps,
                   PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, REVERSED: tl.constexpr = False,
                   RESIDUAL_SILU: tl.constexpr = False):
    # out [M, N] = a [M, K] · w [N, K]ᵀ (+ bias), one program a tile of BLOCK_M rows by BLOCK_N columns, its sum over
    # K in BLOCK_K steps in one order: a row's arithmetic is the same whatever M is, and whatever the other rows hold.
    # a is x (PROLOGUE 0), the RMSNorm of x + delta by the norm's weights (1: the rows' mean of squares first, in the
    # same steps; the first column of programs writes x + delta into stream), or silu(gate)·up of x = gate|up [M, 2K]
    # (2): the small op before a product in its program, one kernel fewer. RESIDUAL_SILU (with PROLOGUE 0): the output
    # is x + silu(the product), x's column of each block of K output columns (Medusa's residual blocks, side by side),
    # rounded where torch's ops round. REVERSED (a planted bug, tests only): the steps summed last to first.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    kind: tl.constexpr = out_ptr.dtype.element_ty
    steps = tl.cdiv(k, BLOCK_K)
    rstd = tl.zeros([BLOCK_M], tl.float32)
    if PROLOGUE == 1:
        squares = tl.zeros([BLOCK_M], tl.float32)
        for step in range(0, steps):
            ks = step * BLOCK_K + inner
            tile = (rows[:, None] < m) & (ks[None, :] < k)
            x = stream_rows(x_ptr, delta_ptr, rows, ks, tile, k, HAS_DELTA, kind)
            if HAS_DELTA:
                if tl.program_id(1) == 0:  # the stream after the add, written once
                    tl.store(stream_ptr + rows[:, None] * k + ks[None, :], x.to(kind), mask=tile)
            squares += tl.sum(x * x, axis=1)
        rstd = tl.rsqrt(squares / k + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for step in range(0, steps):
        if REVERSED:
            ks = (steps - 1 - step) * BLOCK_K + inner
        else:
            ks = step * BLOCK_K + inner
        a = product_operand(x_ptr, delta_ptr, norm_ptr, rows, ks, m, k, rstd, PROLOGUE, HAS_DELTA, kind)
        w = tl.load(w_ptr + cols[:, None] * k + ks[None, :], mask=(cols[:, None] < n) & (ks[None, :] < k), other=0.0)
        if IEEE:  # float32: no TF32
            acc += tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < n, other=0.0).to(tl.float32)[None, :]
    inside = (rows[:, None] < m) & (cols[None, :] < n)
    if RESIDUAL_SILU:
        y = rounded(acc, kind)
        residual = tl.load(x_ptr + rows[:, None] * k + (cols % k)[None, :], mask=inside, other=0.0).to(tl.float32)
        acc = rounded(residual + silu_rounded(y, kind), kind)
    tl.store(out_ptr + rows[:, None] * n + cols[None, :], acc.to(kind), mask=inside)


@triton.jit
def largest(x, index, taken, width, LARGER_FIRST: tl.constexpr):
    """One round of a top-k: the largest of ``x`` not ``taken`` (equal values the smaller ``index``, the larger where
    LARGER_FIRST: a planted bug) and its index (``width`` where none is left), then ``taken`` with it marked."""
    left = tl.where(taken, float("-inf"), x)
    best = tl.max(left, axis=0)
    tied = (left == best) & (taken == 0)
    if LARGER_FIRST:
        pick = tl.max(tl.where(tied, index, -1), axis=0)
        pick = tl.where(pick < 0, width, pick)
    else:
        pick = tl.min(tl.where(tied, index, width), axis=0)
    return best, pick, taken | (index == pick)


@triton.jit
def top_k_kernel(x_ptr, values_ptr, indices_ptr, max_ptr, sum_ptr, width, stride, k, FINAL: tl.constexpr,
                 LOG_SOFTMAX: tl.constexpr, CHUNK: tl.constexpr, PLANT: tl.constexpr):
    """The k largest of a row's chunk of CHUNK logits (program (row, chunk)), largest first, equal values the smaller
    index first: their values (float32) and indices, where a chunk holds fewer, -inf and ``width``. FINAL (the row in
    one chunk): the row's answer, as log-probabilities where LOG_SOFTMAX; else also the chunk's max and sum of
    exp(x - max), for :func:`top_k_merge_kernel`."""
    row, part = tl.program_id(0), tl.program_id(1)
    chunks = tl.num_programs(1)
    offs = part * CHUNK + tl.arange(0, CHUNK)
    inside = offs < width
    x = tl.load(x_ptr + row * stride + offs, mask=inside, other=float("-inf")).to(tl.float32)
    top = tl.max(x, axis=0)
    safe = tl.where(top == float("-inf"), 0.0, top)  # a chunk of -inf: no inf - inf
    total = tl.sum(tl.where(inside, tl.exp(x - safe), 0.0), axis=0)
    shift = 0.0
    if FINAL and LOG_SOFTMAX:
        shift = safe + tl.log(total)
    taken = offs >= width
    out = (row * chunks + part) * k
    for j in range(k):
        best, pick, taken = largest(x, offs, taken, width, PLANT == 2)  # 2, planted (tests): the larger index first
        tl.store(values_ptr + out + j, best - shift)
        tl.store(indices_ptr + out + j, pick.to(tl.int64))
    if not FINAL:
        tl.store(max_ptr + row * chunks + part, top)
        tl.store(sum_ptr + row * chunks + part, total)


@triton.jit
def top_k_merge_kernel(values_ptr, indices_ptr, max_ptr, sum_ptr, out_values_ptr, out_indices_ptr, width, chunks, k,
                       LOG_SOFTMAX: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """A row's k largest from its chunks' (:func:`top_k_kernel`), in the same order, and its log-sum-exp from the
    chunks' maxima and sums where LOG_SOFTMAX (the values then log-probabilities)."""
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    maxima = tl.load(max_ptr + row * chunks + c, mask=c < chunks, other=float("-inf"))
    sums = tl.load(sum_ptr + row * chunks + c, mask=c < chunks, other=0.0)
    shift = 0.0
    if LOG_SOFTMAX:
        top = tl.max(maxima, axis=0)
        safe = tl.where(top == float("-inf"), 0.0, top)
        shift = safe + tl.log(tl.sum(sums * tl.exp(maxima - safe), axis=0))  # a chunk of -inf adds 0
    offs = tl.arange(0, BLOCK)
    inside = offs < chunks * k
    x = tl.load(values_ptr + row * chunks * k + offs, mask=inside, other=float("-inf"))
    index = tl.load(indices_ptr + row * chunks * k + offs, mask=inside, other=width)
    taken = index >= width  # past the candidates, or a chunk's empty place
    for j in range(k):
        best, pick, taken = largest(x, index, taken, width, False)
        tl.store(out_values_ptr + row * k + j, best - shift)
        tl.store(out_indices_ptr + row * k + j, pick)


@triton.jit
def walked(d, chosen, alive, node, accepted, emitted, path, place, block, TREE: tl.constexpr):
    """A verdict's walk one level on (the greedy and sampled verdicts' kernels): the node ``chosen`` at depth ``d``
    kept where the row is still ``alive``; the emitted tokens [SPAN] and a tree's path [SPAN] (block positions)
    written as the torch ops write them (past the walk: the first draft, as their clamped gather)."""
    if TREE:
        step = tl.where(alive, chosen, 1)
        path = tl.where(place == d + 1, step, path)
        emitted = tl.where(place == d, tl.load(block + step), emitted)
    else:
        emitted = tl.where(place == d, tl.load(block + chosen), emitted)
    return tl.where(alive, chosen, node), accepted + alive.to(tl.int64), emitted, path


@triton.jit
def verdict_stored(row, token, node, accepted, emitted, path, place, accepted_ptr, next_ptr, emitted_ptr, path_ptr,
                   at_ptr, DEPTH: tl.constexpr, TREE: tl.constexpr):
    """A row's verdict written: the accepted drafts' count, the next ``token``, the emitted tokens [B, DEPTH + 1]
    (the accepted drafts, then the next token; past it what :func:`specdec.verify.emitted_tokens` leaves), a tree's
    path [B, DEPTH + 1] and the block position where the next token was predicted (``node``)."""
    emitted = tl.where((place == accepted) | (place == DEPTH), token, emitted)
    inside = place < DEPTH + 1
    tl.store(emitted_ptr + row * (DEPTH + 1) + place, emitted, mask=inside)
    if TREE:
        tl.store(path_ptr + row * (DEPTH + 1) + place, path, mask=inside)
    tl.store(accepted_ptr + row, accepted)
    tl.store(next_ptr + row, token)
    tl.store(at_ptr + row, node)


@triton.jit
def greedy_verdict_kernel(best_ptr, block_ptr, children_ptr, accepted_ptr, next_ptr, emitted_ptr, path_ptr, at_ptr,
                          t, width, DEPTH: tl.constexpr, TREE: tl.constexpr, WIDTH: tl.constexpr,
                          SPAN: tl.constexpr, PLANT: tl.constexpr):
    """A row's greedy verdict (program: the row) from the target's argmax ``best`` [B, t] at each block position and
    the ``block`` [B, t] it scored (the last token, then the drafts): a chain keeps its drafts while they equal the
    argmax before them; a tree (TREE: ``children`` [t, width], -1 = none, shared by the rows) walks from the root to
    the first child, in order, whose token is the argmax at its parent, DEPTH levels at most. Writes the accepted
    drafts' count, the next token (the argmax where the walk stopped), the emitted tokens, a tree's path (the root,
    the accepted nodes, then 1s) and the block position where the next token was predicted (:func:`verdict_stored`).
    PLANT 1 (tests): a tree's walk tries only each node's first child."""
    row = tl.program_id(0)
    best = best_ptr + row * t
    block = block_ptr + row * t
    place = tl.arange(0, SPAN)  # the emitted entries, DEPTH + 1 of them
    w = tl.arange(0, WIDTH)
    node = tl.full([], 0, tl.int64)
    alive = tl.full([], 1, tl.int1)
    accepted = tl.full([], 0, tl.int64)
    emitted = tl.zeros([SPAN], dtype=tl.int64)
    path = tl.zeros([SPAN], dtype=tl.int64)
    for d in tl.static_range(DEPTH):
        want = tl.load(best + node)
        if TREE:
            if PLANT == 1:
                kids = tl.load(children_ptr + node * width + w, mask=w < 1, other=-1)
            else:
                kids = tl.load(children_ptr + node * width + w, mask=w < width, other=-1)
            tokens = tl.load(block + tl.maximum(kids, 0))
            hit = (kids >= 0) & (tokens == want)
            first = tl.min(tl.where(hit, w, WIDTH), axis=0)
            chosen = tl.sum(tl.where(w == first, kids, 0), axis=0).to(tl.int64)
            alive = alive & (first < WIDTH)
        else:
            chosen = tl.full([], d + 1, tl.int64)
            alive = alive & (tl.load(block + chosen) == want)
        node, accepted, emitted, path = walked(d, chosen, alive, node, accepted, emitted, path, place, block, TREE)
    verdict_stored(row, tl.load(best + node), node, accepted, emitted, path, place, accepted_ptr, next_ptr,
                   emitted_ptr, path_ptr, at_ptr, DEPTH, TREE)


@triton.jit
def scaled(x_ptr, v, inside, temperature, floor):
    """Logits at ``v`` (where ``inside``) over ``temperature``, float32, -inf below ``floor`` (over ``temperature``, as
    :func:`sampling_floors_kernel` finds it for top-k and top-p; -inf for neither), as
    :func:`specdec.verify.sampling.logits_to_probs` takes them."""
    x = tl.load(x_ptr + v, mask=inside, other=float("-inf")).to(tl.float32) / temperature
    return tl.where(x < floor, float("-inf"), x)


@triton.jit
def softmax_stats(x_ptr, vocab, temperature, floor, BLOCK: tl.constexpr):
    """The largest of a row of logits [vocab] over ``temperature`` (:func:`scaled`) and the sum of exp(x /
    temperature - largest), in one pass (the sum rescaled as the largest grows): softmax's p(v) = exp(x_v /
    temperature - largest) / sum."""
    v = tl.arange(0, BLOCK)
    largest = tl.full([], -3.4028234663852886e38, tl.float32)  # float32's lowest: no exp(-inf + inf)
    total = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        x = scaled(x_ptr, start + v, start + v < vocab, temperature, floor)
        grown = tl.maximum(largest, tl.max(x, axis=0))
        total = total * tl.exp(largest - grown) + tl.sum(tl.exp(x - grown), axis=0)
        largest = grown
    return largest, total


@triton.jit
def ordered(x):
    """float32 ``x`` as an int64 that orders as the floats do, -0.0 as 0.0 (a float's bits, negatives' flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(key == -1, 0, key).to(tl.int64)


@triton.jit
def split_at(x_ptr, vocab, temperature, floor, largest, total, cut, BLOCK: tl.constexpr):
    """At ``cut`` (:func:`ordered`'s order): the mass p (:func:`softmax_stats`' ``largest`` and ``total``) puts on the
    logits over ``temperature`` above it (what top-p's sorted cumulative sum puts before a logit at ``cut``), the
    largest logit at or below it and the smallest above it (their :func:`ordered`)."""
    v = tl.arange(0, BLOCK)
    mass = tl.full([], 0.0, tl.float32)
    below = tl.full([], -(2**62), tl.int64)
    above = tl.full([], 2**62, tl.int64)
    for start in range(0, vocab, BLOCK):
        x = scaled(x_ptr, start + v, start + v < vocab, temperature, floor)
        key = ordered(x)
        mass += tl.sum(tl.where(key > cut, tl.exp(x - largest) / total, 0.0), axis=0)
        below = tl.maximum(below, tl.max(tl.where(key > cut, -(2**62), key), axis=0))
        above = tl.minimum(above, tl.min(tl.where(key > cut, key, 2**62), axis=0))
    return mass, below, above


@triton.jit
def sampling_floors_kernel(logits_ptr, kth_ptr, floors_ptr, vocab, temperature, top_p, TOP_K: tl.constexpr,
                           TOP_P: tl.constexpr, BLOCK: tl.constexpr, PLANT: tl.constexpr):
    """The logit over ``temperature`` that a position's sampling keeps at and above (program: the position of
    ``logits`` [positions, vocab]; -inf where all stay): top-k's (TOP_K: the k-th largest logit, ``kth``
    [positions], over ``temperature``) and, among what that keeps, top-p's (TOP_P): the smallest logit above which p
    puts less than ``top_p`` (:func:`split_at`), found by bisection over the floats' order, each bound moved onto a
    logit, until no logit lies between them (a pass over the vocabulary each: 32 at most, fewer as the logits are
    fewer). A logit is then kept where the mass of the larger ones is below ``top_p``, equal logits together, as
    :func:`specdec.verify.sampling.logits_to_probs` keeps it; p is summed in another order than its sorted cumulative
    sum, so the two can differ where that mass is within float32 round-off of ``top_p``. PLANT 1 (tests): top-p's
    mass over p before top-k; PLANT 2: before the temperature."""
    at = tl.program_id(0)
    x_ptr = logits_ptr + at * vocab
    floor = tl.full([], float("-inf"), tl.float32)
    if TOP_K:
        floor = tl.load(kth_ptr + at) / temperature
    if TOP_P:
        scale = temperature
        within = floor  # what top-k keeps: top-p's mass over it
        if PLANT == 1:
            within = tl.full([], float("-inf"), tl.float32)
        if PLANT == 2:
            scale = 1.0
            within = floor * temperature
        largest, total = softmax_stats(x_ptr, vocab, scale, within, BLOCK)
        low = ordered(tl.maximum(within, -3.4028234663852886e38))  # the answer at or above (float32's lowest finite)
        high = ordered(largest)  # a logit with less than top_p above it (none)
        while low < high:
            cut = low + (high - low) // 2
            mass, below, above = split_at(x_ptr, vocab, scale, within, largest, total, cut, BLOCK)
            if mass < top_p:  # the answer at or below cut
                if below >= low:
                    high = below
                else:  # no logit from low to cut: the next one above
                    high = above
                    low = above
            else:  # above cut
                low = above
        found = tl.where(high < 0, high ^ 0x7FFFFFFF, high).to(tl.int32).to(tl.float32, bitcast=True)
        if PLANT == 2:
            found = found / temperature
        floor = tl.maximum(floor, found)
    tl.store(floors_ptr + at, floor)


@triton.jit
def at_node(x_ptr, r_ptr, v, inside, temperature, floor, largest, total, stored):
    """The distribution a walk tests at ``v`` (where ``inside``): p at the node, float32 as torch's softmax gives it
    (from its logits at ``x_ptr``, :func:`softmax_stats`' ``largest`` and ``total``), or where ``stored`` the
    residual stored at ``r_ptr`` (:func:`residual_stored`; ``stored`` an int1 tensor: each read masked by it)."""
    p = tl.exp(scaled(x_ptr, v, inside & ~stored, temperature, floor) - largest) / total
    return tl.where(stored, tl.load(r_ptr + v, mask=inside & stored, other=0.0), p)


@triton.jit
def residual_stored(x_ptr, r_ptr, q_ptr, vocab, temperature, floor, largest, total, stored, BLOCK: tl.constexpr,
                    PLANT: tl.constexpr):
    """The walk's distribution r (:func:`at_node`'s) after a sibling drawn from q [vocab] is rejected, stored at
    ``r_ptr`` [vocab]: max(0, r - q) over its total, as :func:`specdec.verify.tree.residual_after_rejection` (r itself
    where round-off leaves nothing); two passes over the vocabulary, a barrier before the second writes (every warp
    has read what the walk's test read) and one after it (the walk reads it back anywhere). PLANT 1 (tests): not
    renormalised."""
    v = tl.arange(0, BLOCK)
    mass = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        inside = start + v < vocab
        r = at_node(x_ptr, r_ptr, start + v, inside, temperature, floor, largest, total, stored)
        mass += tl.sum(tl.maximum(r - tl.load(q_ptr + start + v, mask=inside, other=0.0), 0.0), axis=0)
    if PLANT == 1:
        mass = tl.full([], 1.0, tl.float32)
    tl.debug_barrier()
    for start in range(0, vocab, BLOCK):
        inside = start + v < vocab
        r = at_node(x_ptr, r_ptr, start + v, inside, temperature, floor, largest, total, stored)
        left = tl.maximum(r - tl.load(q_ptr + start + v, mask=inside, other=0.0), 0.0)
        tl.store(r_ptr + start + v, tl.where(mass > 0, left / tl.maximum(mass, 1.1754943508222875e-38), r), mask=inside)
    tl.debug_barrier()


@triton.jit
def residual_cdf(x_ptr, q_ptr, start, vocab, temperature, floor, largest, total, rejected, minus, carry, w, r_ptr,
                 stored, WIDTH: tl.constexpr, BLOCK: tl.constexpr, DRAFTED: tl.constexpr):
    """The cumulative sums (float64, after ``carry``) over the block of the row's vocabulary at ``start`` of p (or
    where ``stored`` the residual at ``r_ptr``: :func:`at_node`) less the ``rejected`` tokens [WIDTH] (-1 = none), or
    (DRAFTED) of max(0, p - ``minus`` · q) (q [vocab] the rejected draft's, ``minus`` 1, or 0 where none was): what
    :func:`specdec.verify.sampling.sample` draws from by its CDF. p is float32, as torch's softmax gives it, and so is
    p - q."""
    v = start + tl.arange(0, BLOCK)
    p = at_node(x_ptr, r_ptr, v, v < vocab, temperature, floor, largest, total, stored)
    if DRAFTED:
        p = tl.maximum(p - minus * tl.load(q_ptr + v, mask=v < vocab, other=0.0), 0.0)
    else:
        for j in tl.static_range(WIDTH):
            p = tl.where(v == tl.sum(tl.where(w == j, rejected, 0), axis=0), 0.0, p)
    return carry + tl.cumsum(tl.where(v < vocab, p, 0.0).to(tl.float64), axis=0)


@triton.jit
def residual_mass(x_ptr, q_ptr, vocab, temperature, floor, largest, total, rejected, minus, w, r_ptr, stored,
                  WIDTH: tl.constexpr, BLOCK: tl.constexpr, DRAFTED: tl.constexpr):
    """The residual's total (:func:`residual_cdf`'s last cumulative sum, block after block as the draw sums it)."""
    mass = tl.full([], 0.0, tl.float64)
    for start in range(0, vocab, BLOCK):
        mass = tl.max(residual_cdf(x_ptr, q_ptr, start, vocab, temperature, floor, largest, total, rejected, minus,
                                   mass, w, r_ptr, stored, WIDTH, BLOCK, DRAFTED), axis=0)
    return mass


@triton.jit
def residual_drawn(x_ptr, q_ptr, vocab, temperature, floor, largest, total, rejected, minus, u, w, r_ptr, stored,
                   WIDTH: tl.constexpr, BLOCK: tl.constexpr, DRAFTED: tl.constexpr):
    """The token drawn by its CDF from the residual of :func:`residual_cdf` (p itself where nothing is left), ``u``
    in [0, 1) of its total: the first token whose cumulative sum exceeds u · total, the last where none does, as
    :func:`specdec.verify.sampling.sample` draws. The total is the last cumulative sum, computed as the draw's are:
    the draw never runs past it."""
    mass = residual_mass(x_ptr, q_ptr, vocab, temperature, floor, largest, total, rejected, minus, w, r_ptr, stored,
                         WIDTH, BLOCK, DRAFTED)
    if mass <= 0:  # round-off took all of it: p
        rejected = tl.full([WIDTH], -1, tl.int64)
        minus = 0.0
        mass = residual_mass(x_ptr, q_ptr, vocab, temperature, floor, largest, total, rejected, minus, w, r_ptr,
                             stored, WIDTH, BLOCK, DRAFTED)
    goal = u * mass
    v = tl.arange(0, BLOCK)
    token = tl.full([], -1, tl.int64)
    carry = tl.full([], 0.0, tl.float64)
    start = 0
    while (token < 0) & (start < vocab):
        cdf = residual_cdf(x_ptr, q_ptr, start, vocab, temperature, floor, largest, total, rejected, minus, carry, w,
                           r_ptr, stored, WIDTH, BLOCK, DRAFTED)
        first = tl.min(tl.where((cdf > goal) & (start + v < vocab), v, BLOCK), axis=0)
        token = tl.where(first < BLOCK, start + first, token).to(tl.int64)
        carry = tl.max(cdf, axis=0)
        start += BLOCK
    return tl.where(token < 0, vocab - 1, token)


@triton.jit
def floor_at(floors_ptr, at, FLOORS: tl.constexpr):
    """The floor at block position ``at`` (FLOORS: :func:`sampling_floors_kernel`'s), else -inf: what :func:`scaled`
    leaves out below."""
    if FLOORS:
        return tl.load(floors_ptr + at)
    else:
        return tl.full([], float("-inf"), tl.float32)


@triton.jit
def sampled_verdict_kernel(logits_ptr, block_ptr, children_ptr, uniforms_ptr, q_ptr, floors_ptr, accepted_ptr,
                           next_ptr, emitted_ptr, path_ptr, at_ptr, t, width, vocab, draws, temperature,
                           DEPTH: tl.constexpr, TREE: tl.constexpr, WIDTH: tl.constexpr, SPAN: tl.constexpr,
                           BLOCK: tl.constexpr, DRAFTED: tl.constexpr, FLOORS: tl.constexpr, PLANT: tl.constexpr):
    """A row's sampled verdict under the exact rule (program: the row), for drafts with one-hot q (fixed candidates) or
    a chain drawn from its q (DRAFTED: ``q`` [B, DEPTH, vocab] float32), from the target's ``logits`` [B, t, vocab] over
    the ``block`` [B, t] it scored and the ``uniforms`` [B, draws] (float64, drawn before: column d·width + j decides
    the j-th child tried at depth d, the last draws the next token): :func:`specdec.verify.tree.onehot_walk` (a tree:
    TREE, ``children`` [t, width]) or :func:`specdec.verify.chain.rejection_sample` (a chain: node d's one child is
    d + 1), at ``temperature`` (p = softmax(logits / temperature), and with FLOORS the logits below ``floors`` [B, t]
    left out: top-k's and top-p's, :func:`sampling_floors_kernel`'s). At each node the walk reaches, p's largest logit
    and sum in one pass over the vocabulary; a child x_j is accepted where u · (1 − the mass of the distinct siblings
    rejected before it) < p(x_j) (a drafted chain's: where u · q(x) < p(x)); where every child of the last node was
    rejected, the next token is drawn from p less theirs (a drafted chain's: from max(0, p - q)), else (a leaf, the
    depth reached) from p. Writes what :func:`greedy_verdict_kernel` writes. PLANT 1 (tests): no renormalisation (each
    sibling tested against p); PLANT 2: the next token drawn from p, rejected drafts kept."""
    row = tl.program_id(0)
    logits = logits_ptr + row * t * vocab
    block = block_ptr + row * t
    uniforms = uniforms_ptr + row * draws
    place = tl.arange(0, SPAN)
    w = tl.arange(0, WIDTH)
    before = w[None, :] < w[:, None]  # [WIDTH, WIDTH]: sibling i (columns) is tried before j (rows)
    node = tl.full([], 0, tl.int64)
    alive = tl.full([], 1, tl.int1)
    refused = tl.full([], 0, tl.int1)
    accepted = tl.full([], 0, tl.int64)
    emitted = tl.zeros([SPAN], dtype=tl.int64)
    path = tl.zeros([SPAN], dtype=tl.int64)
    largest = tl.full([], 0.0, tl.float32)
    total = tl.full([], 1.0, tl.float32)
    rejected = tl.full([WIDTH], -1, tl.int64)
    for d in tl.static_range(DEPTH):
        floor = floor_at(floors_ptr, row * t + node, FLOORS)
        if alive:
            largest, total = softmax_stats(logits + node * vocab, vocab, temperature, floor, BLOCK)
        if TREE:
            kids = tl.load(children_ptr + node * width + w, mask=w < width, other=-1)
        else:
            kids = tl.where(w == 0, node + 1, -1)
        real = kids >= 0
        tokens = tl.load(block + tl.maximum(kids, 0))
        repeated = tl.sum(((tokens[:, None] == tokens[None, :]) & real[None, :] & before).to(tl.int32), axis=1) > 0
        x = scaled(logits + node * vocab, tokens, tokens < vocab, temperature, floor)  # a token past it: p 0
        p = tl.where(real & ~repeated & alive, tl.exp(x - largest) / total, 0.0)
        # what u is scaled by: the mass left untried before each sibling (one-hot q), or q at a drawn chain's draft
        if DRAFTED:
            scale = tl.load(q_ptr + (row * DEPTH + d) * vocab + tokens, mask=real & (tokens < vocab), other=1.0)
        elif PLANT == 1:
            scale = tl.full([WIDTH], 1.0, tl.float32)
        else:
            scale = 1 - (tl.cumsum(p, axis=0) - p)
        u = tl.load(uniforms + d * width + w, mask=w < width, other=1.0)
        hit = (u * scale.to(tl.float64) < p.to(tl.float64)) & (p > 0)
        first = tl.min(tl.where(hit, w, WIDTH), axis=0)
        stopped = alive & (first == WIDTH)
        rejected = tl.where(stopped & real, tokens, rejected)
        refused = refused | (stopped & (tl.max(real.to(tl.int32), axis=0) > 0))
        alive = alive & (first < WIDTH)
        if TREE:
            chosen = tl.sum(tl.where(w == first, kids, 0), axis=0).to(tl.int64)
        else:  # past the walk too: the torch ops emit the drafts
            chosen = tl.full([], d + 1, tl.int64)
        node, accepted, emitted, path = walked(d, chosen, alive, node, accepted, emitted, path, place, block, TREE)
    floor = floor_at(floors_ptr, row * t + node, FLOORS)
    if alive:  # the depth reached: p at the last node accepted
        largest, total = softmax_stats(logits + node * vocab, vocab, temperature, floor, BLOCK)
    minus = refused.to(tl.float32)  # a drafted chain's rejected draft: its q taken from p
    if PLANT == 2:
        rejected = tl.full([WIDTH], -1, tl.int64)
        minus = 0.0
    q = q_ptr + (row * DEPTH + tl.minimum(node, DEPTH - 1)) * vocab  # the rejected draft's q (read where DRAFTED)
    token = residual_drawn(logits + node * vocab, q, vocab, temperature, floor, largest, total, rejected, minus,
                           tl.load(uniforms + draws - 1), w, logits, tl.full([], 0, tl.int1), WIDTH, BLOCK, DRAFTED)
    verdict_stored(row, token, node, accepted, emitted, path, place, accepted_ptr, next_ptr, emitted_ptr, path_ptr,
                   at_ptr, DEPTH, TREE)


@triton.jit
def sampled_tree_drawn_kernel(logits_ptr, block_ptr, children_ptr, uniforms_ptr, q_ptr, floors_ptr, r_ptr,
                              accepted_ptr, next_ptr, emitted_ptr, path_ptr, at_ptr, t, width, vocab, draws,
                              temperature, DEPTH: tl.constexpr, WIDTH: tl.constexpr, SPAN: tl.constexpr,
                              BLOCK: tl.constexpr, FLOORS: tl.constexpr, PLANT: tl.constexpr):
    """A row's sampled verdict under the exact rule (program: the row) for a tree whose nodes were drawn from their
    own q (``q`` [B, t - 1, vocab] float32, a node's law given the siblings drawn before it: EAGLE's sampled tree), as
    :func:`specdec.verify.tree.walk_tree` walks it over the same ``uniforms`` (:func:`sampled_verdict_kernel`'s other
    arguments): each node's children in order, a child x accepted where u · q(x) < r(x), r starting as p at the node
    and after each rejected child max(0, r - q) over its total (:func:`residual_stored`, kept at ``r_ptr`` [B, vocab]);
    where every child of the last node was rejected the next token is drawn from r, else from p there. Writes what
    :func:`greedy_verdict_kernel` writes. PLANT 1 (tests): the residual not renormalised; PLANT 2: the next token drawn
    from p."""
    row = tl.program_id(0)
    logits = logits_ptr + row * t * vocab
    block = block_ptr + row * t
    uniforms = uniforms_ptr + row * draws
    r = r_ptr + row * vocab
    place = tl.arange(0, SPAN)
    w = tl.arange(0, WIDTH)
    node = tl.full([], 0, tl.int64)
    alive = tl.full([], 1, tl.int1)
    stored = tl.full([], 0, tl.int1)  # the walk's r: p at the node, or (after a rejection there) the stored residual
    accepted = tl.full([], 0, tl.int64)
    emitted = tl.zeros([SPAN], dtype=tl.int64)
    path = tl.zeros([SPAN], dtype=tl.int64)
    largest = tl.full([], 0.0, tl.float32)
    total = tl.full([], 1.0, tl.float32)
    for d in range(DEPTH):  # loops, not unrolled: one copy of the residual's passes in the code
        floor = floor_at(floors_ptr, row * t + node, FLOORS)
        x_ptr = logits + node * vocab
        if alive:
            largest, total = softmax_stats(x_ptr, vocab, temperature, floor, BLOCK)
        chosen = tl.full([], -1, tl.int64)
        for j in range(width):
            kid = tl.load(children_ptr + node * width + j)
            if alive & (kid >= 0) & (chosen < 0):
                token = tl.load(block + kid)
                q = q_ptr + (row * (t - 1) + kid - 1) * vocab
                inside = token < vocab
                drawn = tl.load(q + token, mask=inside, other=1.0).to(tl.float64)
                kept = at_node(x_ptr, r, token, inside, temperature, floor, largest, total, stored).to(tl.float64)
                if tl.load(uniforms + d * width + j) * drawn < kept:
                    chosen = kid
                else:
                    residual_stored(x_ptr, r, q, vocab, temperature, floor, largest, total, stored, BLOCK, PLANT)
                    stored = tl.full([], 1, tl.int1)
        alive = alive & (chosen >= 0)
        stored = stored & ~alive  # a child accepted: p at it
        node, accepted, emitted, path = walked(d, chosen, alive, node, accepted, emitted, path, place, block, True)
    floor = floor_at(floors_ptr, row * t + node, FLOORS)
    if alive:  # the depth reached: p at the last node accepted
        largest, total = softmax_stats(logits + node * vocab, vocab, temperature, floor, BLOCK)
    if PLANT == 2:
        stored = tl.full([], 0, tl.int1)
    token = residual_drawn(logits + node * vocab, q_ptr, vocab, temperature, floor, largest, total,
                           tl.full([WIDTH], -1, tl.int64), tl.full([], 0.0, tl.float32), tl.load(uniforms + draws - 1),
                           w, r, stored, WIDTH, BLOCK, False)
    verdict_stored(row, token, node, accepted, emitted, path, place, accepted_ptr, next_ptr, emitted_ptr, path_ptr,
                   at_ptr, DEPTH, True)


@triton.jit
def commit_step_kernel(accepted_ptr, emitted_ptr, live_ptr, left_ptr, eos_ptr, seq_ptr, seq_lens_ptr, lengths_ptr,
                       rows_ptr, batch, width, num_eos, seq_stride, capacity, SPAN: tl.constexpr,
                       EOS: tl.constexpr, PLANT: tl.constexpr):
    """A step's commit (program: a row), as the torch ops of ``engine._drafted_counts`` and ``engine._advance`` do
    it: the row keeps its accepted drafts and the next token (``emitted`` [B, width]) while ``live``, cut after its
    first EOS (``eos`` [num_eos]) and at ``left`` (tokens it may still emit); ``live`` and ``left`` move, the
    emitted tokens are written into ``seq`` after ``seq_lens`` (clamped to the last slot), and ``seq_lens`` and the
    target cache's ``lengths`` move past the kept ones. Writes the rows the host reads back, [2 + width, B]: the
    accepted drafts, the count, the emitted tokens position by position. PLANT 1 (tests): an EOS does not stop the
    row."""
    row = tl.program_id(0)
    place = tl.arange(0, SPAN)
    inside = place < width
    emitted = tl.load(emitted_ptr + row * width + place, mask=inside, other=-1)
    e = tl.arange(0, EOS)
    eos = tl.load(eos_ptr + e, mask=e < num_eos, other=-1)
    stops = tl.sum(((emitted[:, None] == eos[None, :]) & (e < num_eos)[None, :]).to(tl.int32), axis=1) > 0
    if PLANT == 1:
        stops = stops & (place < 0)
    first_stop = tl.min(tl.where(stops & inside, place, width), axis=0).to(tl.int64)
    accepted = tl.load(accepted_ptr + row)
    live = tl.load(live_ptr + row) != 0
    left = tl.load(left_ptr + row)
    count = tl.minimum(tl.minimum(accepted + 1, first_stop + 1), left) * live.to(tl.int64)
    left -= count
    tl.store(left_ptr + row, left)
    tl.store(live_ptr + row, (live & (first_stop >= count) & (left > 0)).to(live_ptr.dtype.element_ty))
    seq_len = tl.load(seq_lens_ptr + row)
    tl.store(seq_ptr + row * seq_stride + tl.minimum(seq_len + place, capacity - 1), emitted, mask=inside)
    tl.store(seq_lens_ptr + row, seq_len + count)
    tl.store(lengths_ptr + row, tl.load(lengths_ptr + row) + count)
    tl.store(rows_ptr + row, accepted)
    tl.store(rows_ptr + batch + row, count)
    tl.store(rows_ptr + (2 + place) * batch + row, emitted, mask=inside)


@triton.jit
def move_path_kernel(stacked_ptr, lengths_ptr, path_ptr, p, batch, heads, capacity, dim, BLOCK: tl.constexpr):
    """A tree step's accepted path moved into the slots after the committed ones (program: one of the cache's
    [2, L, B, H] rows of slots, contiguous [S, dim] each): slot ``lengths[b] + path[b, j]`` to ``lengths[b] + j``,
    j = 0 .. p - 1 in turn. Along the accepted path ``path[b, j] >= j`` and rises, so each slot is read before
    anything is written over it, as the torch ops' gather then scatter read it; past the path (entries that are never
    committed) the slots written may differ from theirs."""
    pid = tl.program_id(0)
    b = (pid // heads) % batch
    base = stacked_ptr + pid.to(tl.int64) * capacity * dim
    length = tl.load(lengths_ptr + b)
    d = tl.arange(0, BLOCK)
    inside = d < dim
    for j in range(p):
        source = length + tl.load(path_ptr + b * p + j)
        row = tl.load(base + source * dim + d, mask=inside)
        tl.store(base + (length + j) * dim + d, row, mask=inside)


@triton.jit
def stable_rank(values, at, valid):
    """Each value's place [N] (int32) in a stable descending sort of ``values`` [N] where ``valid``: how many valid
    values are larger, or equal and earlier (``at``: the values' positions)."""
    ahead = (values[None, :] > values[:, None]) | ((values[None, :] == values[:, None]) & (at[None, :] < at[:, None]))
    return tl.sum((ahead & valid[None, :]).to(tl.int32), 1)


@triton.jit
def device_tree_kernel(conf_ptr, parent_ptr, index_ptr, ids_ptr, tokens_ptr, parents_ptr, depths_ptr, mask_ptr,
                       children_ptr, candidates, batch, n, lookup, chained, width, LEVELS: tl.constexpr,
                       BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, PLANT: tl.constexpr):
    """EAGLE's device-grown tree chosen from its candidates in one program: each candidate's confidence capped at its
    ancestors' (``conf`` [C], ``parent`` [C]: -1 below the root, parents first, at most LEVELS deep); the ``n`` most
    confident kept (ties to the earlier candidate: a stable sort's order, each one's rank counted against every
    other), in draw order after a chain of ``lookup`` nodes below the root; then the tree's tensors as
    :meth:`~specdec.verify.Tree.on_device` gives them: tokens [B, n] (``ids`` of ``index`` [B, C]), parents
    [lookup + n], depths [1 + lookup + n], mask [same, same] (int8), children [same, width]. Every entry is stored
    once: nothing to order between the program's writes."""
    c = tl.arange(0, BLOCK_C)
    valid = c < candidates
    raw = tl.load(conf_ptr + c, mask=valid, other=0.0)
    up = tl.load(parent_ptr + c, mask=valid, other=-1)
    capped = raw
    depth = valid.to(tl.int64)  # levels below the root: itself and its ancestors among the candidates
    ancestry = (c[:, None] == c[None, :]) & valid[:, None]  # [C, C]: j is i or an ancestor of i
    for _ in range(LEVELS):
        has = up >= 0
        capped = tl.where(has, tl.minimum(capped, tl.load(conf_ptr + up, mask=has, other=0.0)), capped)
        depth += has.to(tl.int64)
        ancestry = ancestry | ((c[None, :] == up[:, None]) & has[:, None])
        up = tl.where(has, tl.load(parent_ptr + up, mask=has, other=-1), -1)
    if PLANT == 1:  # planted: no cap, a child may be kept without its parent
        capped = raw
    # rank: the candidates a stable descending sort puts first
    rank = stable_rank(capped, c, valid)
    kept = valid & (rank < n)
    before = c[None, :] < c[:, None]  # [C, C]: j drawn before i
    place = tl.sum((before & kept[None, :]).to(tl.int64), 1)  # [C]: its node among the kept, in draw order
    parent = tl.load(parent_ptr + c, mask=valid, other=-1)
    above = tl.sum(((c[None, :] < parent[:, None]) & kept[None, :]).to(tl.int64), 1)  # the parent's node
    above = tl.where(parent >= 0, above + lookup, -1)  # [C]: parent node (-1: the root), after the chain
    node = place + lookup
    sibling = tl.sum((before & kept[None, :] & (parent[None, :] == parent[:, None])).to(tl.int64), 1)
    sibling += tl.where(parent < 0, chained, 0)  # ``chained`` 1 with a chain: the root's first child is its
    span = 1 + lookup + n  # block positions: the root, the chain, the tree
    for b in range(batch):
        drafted = tl.load(index_ptr + b * candidates + c, mask=kept, other=0)
        tl.store(tokens_ptr + b * n + place, tl.load(ids_ptr + drafted, mask=kept, other=0), mask=kept)
    tl.store(parents_ptr + node, above, mask=kept)
    tl.store(depths_ptr + 1 + node, depth, mask=kept)  # below the root, beside the chain
    # mask rows of the tree's nodes: the root, the chain only with no tree node there, their own path
    both = kept[:, None] & kept[None, :]
    tl.store(mask_ptr + (1 + node[:, None]) * span + 1 + node[None, :], ancestry.to(tl.int8), mask=both)
    tl.store(mask_ptr + (1 + node) * span, tl.full([BLOCK_C], 1, tl.int8), mask=kept)
    # children: a tree node's at its rank among its siblings; -1 past each block position's children
    tl.store(children_ptr + (1 + above) * width + sibling, 1 + node, mask=kept & (sibling < width))
    r = tl.arange(0, BLOCK_N)  # block positions
    w = tl.arange(0, BLOCK_W)
    rows = r < span
    count = tl.sum((((1 + above)[None, :] == r[:, None]) & kept[None, :]).to(tl.int64), 1)  # [N]: tree children
    chain = (r < lookup) & rows  # the root and chain nodes but the last: one chain child each
    count += chain.to(tl.int64)
    fill = rows[:, None] & (w[None, :] < width) & (w[None, :] >= count[:, None])
    link = chain[:, None] & (w[None, :] == 0)
    tl.store(children_ptr + r[:, None] * width + w[None, :], tl.where(link, r[:, None] + 1, -1).to(tl.int64),
             mask=fill | link)
    # the root and the chain: their depths, parents, mask rows (each sees the root and the chain up to itself),
    # and the tree nodes' mask columns at the chain (unseen)
    tl.store(depths_ptr + r, r.to(tl.int64), mask=r <= lookup)
    tl.store(parents_ptr + r, (r - 1).to(tl.int64), mask=r < lookup)
    head = r <= lookup
    cols = tl.arange(0, BLOCK_N)
    tl.store(mask_ptr + r[:, None] * span + cols[None, :], (cols[None, :] <= r[:, None]).to(tl.int8),
             mask=head[:, None] & (cols[None, :] < span))
    tl.store(mask_ptr + (1 + node[:, None]) * span + 1 + cols[None, :], tl.zeros([BLOCK_C, BLOCK_N], tl.int8),
             mask=kept[:, None] & (cols[None, :] < lookup))


@triton.jit
def grow_level_kernel(conf_ptr, index_ptr, ids_ptr, outputs_ptr, hidden_ptr, seen_ptr, lengths_ptr, pad_ptr,
                      chosen_ptr, tokens_ptr, inputs_ptr, mask_ptr, positions_ptr, size, start, candidates, drafted,
                      entries, level, expand, top_k, hidden, FIRST: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
    """One level of EAGLE's device-grown tree before its forward (program: row b): the ``expand`` most confident of
    the level's ``size`` candidates (``conf`` [size]; ties to the earlier, a stable sort's order), in draw order
    (``chosen`` [expand], candidate ids from ``start``); row b's inputs [expand, H] (the draft-layer outputs of the
    chosen ones' parents, entries ``drafted - expand + (chosen - start) // top_k`` of ``outputs`` [B, D, H]; FIRST:
    the root's ``hidden`` [B, H] for each), tokens (``ids`` of ``index`` [B, C] at the chosen) and positions; and
    (program 0) the level's tree mask [expand, drafted + expand] (int8: each entry's ancestors' entries, read from
    ``seen`` [D, D], then itself) and ``seen``'s rows of the new entries."""
    b = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    inside = s < size
    conf = tl.load(conf_ptr + s, mask=inside, other=0.0)
    rank = stable_rank(conf, s, inside)
    picked = inside & (rank < expand)
    place = tl.sum(((s[None, :] < s[:, None]) & picked[None, :]).to(tl.int32), 1)  # [S]: its slot among the picked
    e = tl.arange(0, BLOCK_E)
    real = e < expand
    # each slot's candidate: a sum over the one picked candidate there
    at = tl.sum(tl.where(picked[None, :] & (place[None, :] == e[:, None]), s[None, :], 0), 1).to(tl.int64)
    chosen = start + at
    drafted_ids = tl.load(index_ptr + b * candidates + chosen, mask=real, other=0)
    tl.store(tokens_ptr + b * expand + e, tl.load(ids_ptr + drafted_ids, mask=real, other=0), mask=real)
    position = tl.load(lengths_ptr + b) - drafted - tl.load(pad_ptr + b) + level - 1
    tl.store(positions_ptr + b * expand + e, position + 0 * e, mask=real)
    entry = drafted - expand + at // top_k  # [E]: the parents' entries (not FIRST)
    h = tl.arange(0, BLOCK_H)
    for part in range(0, hidden, BLOCK_H):
        cols = part + h
        tile = real[:, None] & (cols < hidden)[None, :]
        if FIRST:
            rows = tl.load(hidden_ptr + b * hidden + cols[None, :] + 0 * e[:, None], mask=tile)
        else:
            rows = tl.load(outputs_ptr + (b * entries + entry[:, None]) * hidden + cols[None, :], mask=tile)
        tl.store(inputs_ptr + (b * expand + e[:, None]) * hidden + cols[None, :], rows, mask=tile)
    if b == 0:
        tl.store(chosen_ptr + e, chosen, mask=real)
        d = tl.arange(0, BLOCK_D)
        width = drafted + expand
        if FIRST:
            before = tl.zeros([BLOCK_E, BLOCK_D], tl.int8)
        else:
            before = tl.load(seen_ptr + entry[:, None] * entries + d[None, :],
                             mask=real[:, None] & (d[None, :] < drafted), other=0)
        row = tl.where(d[None, :] == drafted + e[:, None], 1, before).to(tl.int8)  # then itself
        tl.store(mask_ptr + e[:, None] * width + d[None, :], row, mask=real[:, None] & (d[None, :] < width))
        tl.store(seen_ptr + (drafted + e[:, None]) * entries + d[None, :], row,
                 mask=real[:, None] & (d[None, :] < entries))


@triton.jit
def grown_level_kernel(values_ptr, children_ptr, chosen_ptr, out_ptr, logp_ptr, index_ptr, parent_ptr, outputs_ptr,
                       lengths_ptr, count, start, candidates, drafted, entries, expand, top_k, hidden,
                       ROOT: tl.constexpr, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """A level of EAGLE's device-grown tree after its forward (program: row b): its ``count`` candidates appended from
    ``start`` (``values``, ``children`` [B, count]: each parent's top_k in turn): each one's path log-confidence (its
    parent's plus its own log-probability; at the ROOT its own), draft id and (program 0) parent (the ``chosen``
    candidate it hangs from; -1 at the ROOT); not at the ROOT, the level's draft-layer outputs ``out`` [B, expand,
    H] stored at entries ``drafted`` .. of ``outputs`` [B, D, H], and the row's draft cache length moved past them."""
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    inside = i < count
    value = tl.load(values_ptr + b * count + i, mask=inside, other=0.0)
    child = tl.load(children_ptr + b * count + i, mask=inside, other=0)
    if ROOT:
        logp = value
        parent = tl.full([BLOCK], -1, tl.int64)
    else:
        parent = tl.load(chosen_ptr + i // top_k, mask=inside, other=0)
        logp = tl.load(logp_ptr + b * candidates + parent, mask=inside, other=0.0) + value
    tl.store(logp_ptr + b * candidates + start + i, logp, mask=inside)
    tl.store(index_ptr + b * candidates + start + i, child, mask=inside)
    if b == 0:
        tl.store(parent_ptr + start + i, parent, mask=inside)
    if not ROOT:
        e = tl.arange(0, BLOCK_E)
        real = e < expand
        h = tl.arange(0, BLOCK_H)
        for part in range(0, hidden, BLOCK_H):
            cols = part + h
            tile = real[:, None] & (cols < hidden)[None, :]
            rows = tl.load(out_ptr + (b * expand + e[:, None]) * hidden + cols[None, :], mask=tile)
            tl.store(outputs_ptr + (b * entries + drafted + e[:, None]) * hidden + cols[None, :], rows, mask=tile)
        tl.store(lengths_ptr + b, tl.load(lengths_ptr + b) + expand)


@triton.jit
def lookup_kernel(seq_ptr, seq_lens_ptr, pad_ptr, tokens_ptr, found_ptr, capacity, max_tokens,
                  MIN_NGRAM: tl.constexpr, MAX_NGRAM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_L: tl.constexpr):
    """A row's n-gram lookup continuation (program: row b of ``seq`` [B, S]): the latest earlier occurrence of the
    longest suffix of MAX_NGRAM down to MIN_NGRAM tokens whose window lies inside the row (from its pad, ending
    before its last token) and up to ``max_tokens`` tokens after it (``found`` of them), the rest of ``tokens`` [B,
    max_tokens] the row's last token: :func:`~specdec.drafters.ngram.device_continuations`' values."""
    b = tl.program_id(0)
    row = seq_ptr + b * capacity
    length = tl.load(seq_lens_ptr + b)
    pad = tl.load(pad_ptr + b)
    last = tl.load(row + length - 1)
    start = length * 0 - 1  # where the continuation starts (-1: none)
    for n in tl.static_range(MIN_NGRAM, MAX_NGRAM + 1):  # a longer suffix's hit overrides a shorter one's
        latest = length * 0 - 1
        if n <= capacity - 1:
            for first in range(0, length, BLOCK):
                at = first + tl.arange(0, BLOCK)
                hits = (at >= pad) & (at + n <= length - 1) & (at * 0 + length - pad > n)
                for j in tl.static_range(n):
                    suffix = tl.load(row + tl.maximum(length - n + j, 0))
                    hits = hits & (tl.load(row + at + j, mask=hits, other=-1) == suffix)
                latest = tl.maximum(latest, tl.max(tl.where(hits, at, -1), 0))
        start = tl.where(latest >= 0, latest + n, start)
    found = tl.where(start >= 0, tl.minimum(tl.maximum(length - start, 0), max_tokens), 0)
    i = tl.arange(0, BLOCK_L)
    slot = tl.minimum(tl.maximum(start + i, 0), capacity - 1)
    token = tl.load(row + slot, mask=i < found, other=0)
    tl.store(tokens_ptr + b * max_tokens + i, tl.where(i < found, token, last), mask=i < max_tokens)
    tl.store(found_ptr + b, found)


@triton.jit
def positions_kernel(lengths_ptr, pad_ptr, offsets_ptr, out_ptr, count, HAS_OFFSETS: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Row ``program_id(0)``'s position ids, BLOCK of them from ``program_id(1)``·BLOCK: its committed tokens (lengths
    less pad) plus each new token's offset (read, or 0 .. count - 1 without HAS_OFFSETS), at least 0."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < count
    if HAS_OFFSETS:
        offset = tl.load(offsets_ptr + offs, mask=inside, other=0)
    else:
        offset = offs.to(tl.int64)
    base = tl.load(lengths_ptr + row) - tl.load(pad_ptr + row)
    tl.store(out_ptr + row * count + offs, tl.maximum(base + offset, 0), mask=inside)


@triton.jit
def catch_up_kernel(seq_ptr, seq_lens_ptr, lengths_ptr, pad_ptr, tokens_ptr, positions_ptr, new_ptr, last_ptr, width,
                    count, capacity, HAS_SEQ: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``program_id(0)``'s catch-up inputs (:func:`~specdec.models.gpu_kernels.catch_up_inputs`), BLOCK positions
    of them from ``program_id(1)``·BLOCK: after its ``base`` committed cache slots, the tokens one slot later in seq
    (HAS_SEQ; clamped below the capacity), their positions (base less pad, plus 0 .. count - 1, at least 0); and (the
    first program of the row) the positions committed since (seq_lens - 1 - base within 0 .. count) and the flat index
    of the newest (row·count + that less one, at least 0)."""
    row = tl.program_id(0)
    offs = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    inside = offs < count
    base = tl.load(lengths_ptr + row)
    at = row * count + offs
    if HAS_SEQ:
        slot = tl.minimum(base + 1 + offs, capacity - 1)
        tl.store(tokens_ptr + at, tl.load(seq_ptr + row * width + slot, mask=inside, other=0), mask=inside)
    tl.store(positions_ptr + at, tl.maximum(base - tl.load(pad_ptr + row) + offs, 0), mask=inside)
    if tl.program_id(1) == 0:
        new = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + row) - 1 - base, 0), count)
        tl.store(new_ptr + row, new)
        tl.store(last_ptr + row, row * count + tl.maximum(new - 1, 0))
