"""specdec's Triton kernels (specdec.models.gpu_kernels) against the torch ops they replace. Without a GPU they run
under Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1 where CUDA is absent), in float32,
float16 and bfloat16 (the attention's matrix products not in bfloat16 there: the interpreter's are not a GPU's); with
one, the ``gpu`` tier runs them compiled. Each planted bug of the attention kernel fails the check that the real
kernel passes."""

import collections
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_family, tiny_llama

from specdec import NgramDrafter, autoregressive_generate, speculative_generate
from specdec.models import Backend, GraphedDecoder, as_decoder
from specdec.models.cache import KVCache

gpu_kernels = pytest.importorskip("specdec.models.gpu_kernels")
if not gpu_kernels.available():
    pytest.skip("Triton is not installed, or neither CUDA nor its interpreter is on", allow_module_level=True)

import triton  # noqa: E402 (installed: checked above)
import triton.language as tl  # noqa: E402

from specdec.models.triton_kernels import rounded  # noqa: E402

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu), "cpu"]


def _dtypes(device, products=False):
    """The dtypes to check on ``device``: bfloat16 matrix products only on a GPU (the interpreter's are not one's)."""
    return (torch.float32, torch.float16) + ((torch.bfloat16,) if device == "cuda" or not products else ())


def _tolerance(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_the_small_ops_round_as_torch_ops_do(device):
    """RMSNorm after the residual add, SiLU·up and the rotary embedding: each product and sum rounded to the
    dtype where torch's ops round it: the stream and the rotary embedding equal torch's, the norm and SiLU·up to
    the last bit (a mean of squares summed in another order, another exp)."""
    g = torch.Generator().manual_seed(0)
    for dtype in _dtypes(device):
        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device, dtype)

        stream, delta, weight = rand(5, 48), rand(5, 48), rand(48)
        expected_stream = stream + delta
        h = expected_stream.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        normed = gpu_kernels.rms_norm(stream, delta, weight, 1e-5)
        assert torch.equal(stream, expected_stream)  # the residual stream, updated in place
        torch.testing.assert_close(normed, weight * h.to(dtype), atol=_tolerance(dtype), rtol=_tolerance(dtype))
        gate_up = rand(5, 80)  # SiLU's exp may differ from torch's in its last bit
        torch.testing.assert_close(gpu_kernels.silu_mul(gate_up), F.silu(gate_up[:, :40]) * gate_up[:, 40:],
                                   atol=_tolerance(dtype), rtol=_tolerance(dtype))
        heads, kv_heads, dim = 4, 2, 16
        qkv, cos, sin = rand(6, (heads + 2 * kv_heads) * dim), rand(6, dim), rand(6, dim)
        q, k, v = gpu_kernels.rope_qkv(qkv, cos, sin, heads, kv_heads)

        def rotated(x):
            x1, x2 = x.chunk(2, -1)
            return x * cos[:, None] + torch.cat((-x2, x1), -1) * sin[:, None]

        # exact where each product is rounded to 16 bits; a GPU's compiler may fuse float32's product and sum
        exact = 0 if dtype != torch.float32 or device == "cpu" else 1e-6
        torch.testing.assert_close(q, rotated(qkv[:, :heads * dim].view(6, heads, dim)), atol=exact, rtol=exact)
        torch.testing.assert_close(k, rotated(qkv[:, heads * dim:(heads + kv_heads) * dim].view(6, kv_heads, dim)),
                                   atol=exact, rtol=exact)
        assert torch.equal(v, qkv[:, (heads + kv_heads) * dim:].view(6, kv_heads, dim))


# (lengths, pad, new tokens, tree mask or None, recent): a decode step, a chain, a tree over padded rows of
# different lengths, an EAGLE-style tree over recent slots, and a prefill over left padding
CASES = [
    ([9, 40], [0, 5], 1, None, 0),
    ([9, 40], [0, 5], 5, None, 0),
    ([7, 33], [2, 0], 4, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], 0),
    ([7, 33], [0, 3], 3, [[1, 0, 1, 0, 0], [0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], 2),
    ([0, 0], [0, 6], 11, None, 0),
]


def _attention_agrees(device, dtype, case, planted=None, ordered=False, splits=None, capacity=64) -> bool:
    """Whether cache_attention (``planted``: with that bug; ``splits``: in that many chunks of slots) writes the cache
    as KVCache.write does and attends as SDPA over KVCache.attention_mask, on random keys with stale values in every
    slot past the committed ones."""
    lengths, pad, new, tree, recent = case
    g = torch.Generator().manual_seed(1)
    b, heads, kv_heads, dim = 2, 6, 2, 16
    cache = KVCache.allocate(1, b, kv_heads, capacity, dim, torch.tensor(pad), dtype=dtype, device=torch.device(device))
    cache.stacked.copy_(torch.randn(cache.stacked.shape, generator=g))  # stale values everywhere
    cache.lengths.copy_(torch.tensor(lengths))
    q, k, v = (torch.randn(b * new, n, dim, generator=g).to(device, dtype) for n in (heads, kv_heads, kv_heads))
    mask = None if tree is None else torch.tensor(tree, dtype=torch.bool, device=device)
    keys, values = cache.keys[0].clone(), cache.values[0].clone()
    out = gpu_kernels.cache_attention(q, k, v, keys, values, cache.lengths, cache.pad, mask, recent, ordered=ordered,
                                      splits=splits, _planted=planted)
    ref_keys, ref_values = cache.write(0, k.view(b, new, kv_heads, dim).transpose(1, 2),
                                       v.view(b, new, kv_heads, dim).transpose(1, 2))
    attend = cache.attention_mask(new, None, mask, recent)
    ref = F.scaled_dot_product_attention(q.view(b, new, heads, dim).transpose(1, 2), ref_keys, ref_values,
                                         attn_mask=attend, enable_gqa=True).transpose(1, 2).reshape(b * new, -1)
    tol = _tolerance(dtype)
    return (torch.equal(keys, ref_keys) and torch.equal(values, ref_values)
            and torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cache_attention_writes_and_attends_as_the_torch_ops(device, case):
    for dtype in _dtypes(device, products=True):
        assert _attention_agrees(device, dtype, CASES[case]), dtype


@pytest.mark.parametrize("device", DEVICES)
def test_the_ordered_attention_writes_and_attends_as_the_torch_ops(device):
    """The attention over the slots in order (``exact_numerics``): the same check, every case without recent slots."""
    for case in CASES:
        if not case[4]:
            assert _attention_agrees(device, torch.float32, case, ordered=True), case


# longer rows: chunks past a row's length, the step's slots in a later chunk than the first, a tree over recent slots
LONG_CASES = [([70, 101], [3, 40], 4, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], 0),
              ([95, 64], [0, 33], 3, [[1, 0, 1, 0, 0], [0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], 2),
              ([31, 120], [0, 0], 1, None, 0)]


@pytest.mark.parametrize("device", DEVICES)
def test_the_attention_split_over_chunks_of_slots_is_the_torch_ops(device):
    """The committed slots read in chunks of 32 by a program each, their online softmaxes merged after
    (flash-decoding: a one-token step over a long context), over a cache of 128 slots: the same check, every case;
    each planted bug still fails it."""
    for case in CASES + LONG_CASES:
        for splits in (2, 4):
            assert _attention_agrees(device, torch.float32, case, splits=splits, capacity=128), (case, splits)
    assert _attention_agrees(device, torch.float16, LONG_CASES[0], splits=4, capacity=128)
    for planted in gpu_kernels.PLANTED:
        assert not all(_attention_agrees(device, torch.float32, case, planted, splits=4, capacity=128)
                       for case in CASES + LONG_CASES), planted


def test_the_attention_splits_only_a_few_programs_over_a_long_cache():
    """How a step's attention is divided (tokens, query rows, chunks, chunk slots): a one-token step over 8,192 slots
    at Llama-3.1-8B's heads (8 programs) in chunks; SmolLM2-135M's step over 1,024 slots in one; a batch of 8
    verifying 64 tokens a row at 8B in programs of 64 query rows (16 tokens), unsplit."""
    assert gpu_kernels.attention_tiles(1, 1, 32, 8, 8192) == (4, 16, 8, 1024)
    assert gpu_kernels.attention_tiles(1, 1, 9, 3, 1024) == (5, 16, 1, 1024)
    assert gpu_kernels.attention_tiles(1, 32, 9, 3, 1024) == (5, 16, 1, 1024)
    assert gpu_kernels.attention_tiles(8, 64, 32, 8, 8192) == (16, 64, 1, 8192)
    with pytest.raises(ValueError, match="splits=0"):
        gpu_kernels.attention_tiles(1, 1, 9, 3, 1024, splits=0)


@pytest.mark.parametrize("planted", gpu_kernels.PLANTED)
def test_a_planted_attention_bug_fails_the_check(planted):
    """A mask off by one (a new token sees the next one), a stale cache slot (the step's keys never written) and a
    wrong row length (every row read at the first row's length) each fail the check above on some case."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert not all(_attention_agrees(device, torch.float32, case, planted) for case in CASES)


def test_cache_attention_refuses_shapes_that_do_not_fit():
    keys = torch.zeros(2, 2, 16, 8)
    q, k = torch.zeros(6, 4, 8), torch.zeros(6, 2, 8)
    lengths = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"tree_mask \[3, 3\] expected"):
        gpu_kernels.cache_attention(q, k, k, keys, keys.clone(), lengths, lengths, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="do not fit"):
        gpu_kernels.cache_attention(q, torch.zeros(6, 3, 8), k, keys, keys.clone(), lengths, lengths)
    with pytest.raises(ValueError, match="_planted"):
        gpu_kernels.cache_attention(q, k, k, keys, keys.clone(), lengths, lengths, _planted="typo")


def _backend(device, exact_numerics=False):
    return Backend(exact_numerics=exact_numerics) if device == "cuda" else Backend.interpreted_gpu(exact_numerics)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,fused_products,exact", [("llama", True, False), ("llama", False, False),
                                                          ("qwen3", True, False), ("qwen3", True, True)])
def test_the_decoder_on_the_kernels_gives_the_torch_ops_logits(device, family, fused_products, exact, monkeypatch):
    """A prefill, a decode step and a tree verification through the fused forward on the Triton kernels (graphs
    replayed, emulated on CPU; the norms inside the products or apart) give the logits, the hidden states and the
    captured streams (the embeddings' among them, which the norms apart would update in place) of torch's ops; every
    attention went through the kernel, Qwen3's q and k norms inside it (through ``head_norms`` with exact numerics,
    whose ordered attention norms apart)."""
    calls = collections.Counter()
    for name in ("rotary_attention", "head_norms"):
        real = getattr(gpu_kernels, name)
        monkeypatch.setattr(gpu_kernels, name, lambda *a, real=real, name=name, **kw: calls.update(
            [name] + (["normed inside"] if kw.get("norms") is not None else [])) or real(*a, **kw))
    model = (tiny_llama(layers=2, seed=0) if family == "llama" else tiny_family("qwen3", window=1024)).to(device)
    backend = dataclasses.replace(_backend(device, exact), fused_products=fused_products)
    fused = GraphedDecoder(as_decoder(model, backend=backend))
    plain = as_decoder(model, backend=Backend(kernels=False, onednn=False, gpu_kernels=False))
    pad = torch.tensor([0, 2], device=device)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2], [0, 0, 6, 7, 8, 9]], device=device)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=device)
    depths = torch.tensor([0, 1, 1], device=device)
    caches = [fused.new_cache(2, 32, pad), plain.new_cache(2, 32, pad)]
    outputs = []
    with torch.no_grad():  # as the decode loop runs (autograd keeps the torch ops)
        for decoder, cache in zip((fused, plain), caches):
            results = [decoder(ids, cache, last_only=True, capture=(0, 2))]
            cache.commit(torch.tensor([6, 6], device=device))
            for step in range(2):
                results.append(decoder(ids[:, step:step + 1], cache, capture=(0, 2)))
                cache.commit(torch.ones(2, dtype=torch.long, device=device))
            results.append(decoder(ids[:, :3], cache, tree_mask=tree, depths=depths, capture=(0, 2)))
            outputs.append([x for result in results for x in result])  # logits, hidden, captured, a forward
    for got, want in zip(*outputs):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert calls["rotary_attention"] and fused.captures == 2  # the one-token step and the tree, each captured once
    qwen3 = calls["rotary_attention"] if family == "qwen3" else 0
    assert (calls["head_norms"], calls["normed inside"]) == ((qwen3, 0) if exact else (0, qwen3)), calls


@pytest.mark.parametrize("device", DEVICES)
def test_a_qkv_s_head_norms_in_one_kernel_are_the_norms_apart(device):
    """Qwen3's and the block drafter's per-head q and k RMSNorms over a stacked q|k|v (or k|v) product, in place in
    one kernel: bit for bit the split, the two rms_norm kernels and the cat they replace, in every dtype."""
    from types import SimpleNamespace

    from specdec.models import fused

    g = torch.Generator().manual_seed(3)
    heads = fused.Heads(6, 2, 16)
    apart = SimpleNamespace(rms_norm=gpu_kernels.rms_norm)  # a kernel set without head_norms: the five kernels
    for dtype in _dtypes(device):
        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device, dtype)

        layer = fused.Layer(None, None, None, None, None, None, q_norm=(rand(16), 1e-6), k_norm=(rand(16), 1e-5))
        for with_q in (True, False):
            qkv = rand(5, ((heads.q if with_q else 0) + 2 * heads.kv) * heads.dim)
            want = fused.head_norms(apart, qkv.clone(), layer, heads, with_q)
            got = fused.head_norms(gpu_kernels, qkv, layer, heads, with_q)
            assert got.data_ptr() == qkv.data_ptr() and torch.equal(got, want), (dtype, with_q)
    with pytest.raises(ValueError, match="head_norms"):
        gpu_kernels.head_norms(torch.zeros(2, 60), 2, 1, (torch.ones(16), 1e-6), (torch.ones(16), 1e-6))


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_speculative_decoding_on_the_kernels_equals_plain(device):
    model = tiny_llama(layers=2, seed=0).to(device)
    target = GraphedDecoder(as_decoder(model, backend=_backend(device)))
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]], device=device)
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    out = speculative_generate(target, NgramDrafter(), ids, k=3, max_new_tokens=12, eos_token_id=[])
    assert out.sequences == ref.sequences


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu),
                                    pytest.param("cpu", marks=pytest.mark.slow)])  # ~1 min under the interpreter
def test_eagle_drafts_through_replayed_graphs_on_the_kernels(device):
    """EAGLE's draft layer on the Triton kernels, its fixed tree grown on the device (a GPU's default) by replayed graphs
    (emulated on CPU) over the target's graphed forwards on the same kernels: plain decoding's greedy output, two
    left-padded rows."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter
    from specdec.jobs.data import left_pad

    model = tiny_llama(layers=4, seed=0).to(device)
    target = GraphedDecoder(as_decoder(model, backend=_backend(device)))
    drafter = EagleDrafter(random_eagle(model).to(device), tree=True, min_confidence=0.0, depth=2, top_k=2, expand=2,
                           grow_on_device=True, backend=_backend(device))
    drafter.runtime.replay_graphs("auto")
    ids, mask = (t.to(device) for t in left_pad([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6]]))
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    out = speculative_generate(target, drafter, ids, attention_mask=mask, k=4, max_new_tokens=8, eos_token_id=[])
    assert out.sequences == ref.sequences and drafter.runtime.graphs.captures > 0


def _rotary_attention_agrees(device, dtype, case, planted=None) -> bool:
    """Whether rotary_attention over a stacked q|k|v (``planted``: with that bug) writes and returns bit for bit what
    rope_qkv then cache_attention write and return."""
    lengths, pad, new, tree, recent = case
    g = torch.Generator().manual_seed(2)
    b, heads, kv_heads, dim, capacity = 2, 6, 2, 16, 64
    qkv = torch.randn(b * new, (heads + 2 * kv_heads) * dim, generator=g).to(device, dtype)
    cos, sin = (torch.randn(b * new, dim, generator=g).to(device, dtype) for _ in range(2))
    stale = torch.randn(b, kv_heads, capacity, dim, generator=g).to(device, dtype)
    mask = None if tree is None else torch.tensor(tree, dtype=torch.bool, device=device)
    lengths, pad = torch.tensor(lengths, device=device), torch.tensor(pad, device=device)
    caches = [(stale.clone(), stale.clone()) for _ in range(2)]
    q, k, v = gpu_kernels.rope_qkv(qkv, cos, sin, heads, kv_heads)
    apart = gpu_kernels.cache_attention(q, k, v, *caches[0], lengths, pad, mask, recent)
    fused = gpu_kernels.rotary_attention(qkv, cos, sin, heads, *caches[1], lengths, pad, mask, recent,
                                         _planted=planted)
    if dtype == torch.float32 and device == "cuda":  # the compiler may fuse float32's product and sum either way
        return all(torch.allclose(x, y, atol=1e-5, rtol=1e-5) for x, y in [(fused, apart), *zip(*caches)])
    return torch.equal(fused, apart) and all(torch.equal(x, y) for x, y in zip(*caches))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_rotary_attention_is_the_rotary_embedding_then_the_attention(device, case):
    """The rotary embedding inside the attention kernel (one kernel a layer fewer): the same keys written and the same
    attention as the two kernels, bit for bit, in every dtype; a planted bug (the step's keys rotated at the query's
    position) fails it where a step has several tokens."""
    for dtype in _dtypes(device, products=True):
        assert _rotary_attention_agrees(device, dtype, CASES[case]), dtype
    if CASES[case][2] > 1:
        assert not _rotary_attention_agrees(device, torch.float32, CASES[case], "keys_rotated_at_the_query")


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_attention_reads_cos_and_sin_tables_at_the_positions(device):
    """cos and sin as tables of every position, each token's rows read by the kernel at its position (no gather a
    forward): bit for bit the attention over the gathered rows, every case, ordered too; the positions shuffled
    differ."""
    g = torch.Generator().manual_seed(4)
    b, heads, kv_heads, dim, capacity = 2, 6, 2, 16, 64
    for case in CASES:
        lengths, pad, new, tree, recent = case
        for ordered in (False, True) if not recent else (False,):
            qkv = torch.randn(b * new, (heads + 2 * kv_heads) * dim, generator=g).to(device)
            tables = [torch.randn(80, dim, generator=g).to(device) for _ in range(2)]
            positions = torch.randint(0, 80, (b * new,), generator=g).to(device)
            stale = torch.randn(b, kv_heads, capacity, dim, generator=g).to(device)
            mask = None if tree is None else torch.tensor(tree, dtype=torch.bool, device=device)
            args = (torch.tensor(lengths, device=device), torch.tensor(pad, device=device), mask, recent)

            def attend(cos, sin, at):
                keys, values = stale.clone(), stale.clone()
                out = gpu_kernels.rotary_attention(qkv, cos, sin, heads, keys, values, *args, ordered=ordered,
                                                   positions=at)
                return out, keys

            rows = attend(tables[0][positions], tables[1][positions], None)
            assert all(torch.equal(x, y) for x, y in zip(attend(*tables, positions), rows)), (case, ordered)
            if b * new > 2:
                shuffled = attend(*tables, positions.flip(0))
                assert not all(torch.equal(x, y) for x, y in zip(shuffled, rows)), (case, ordered)


@pytest.mark.parametrize("device", DEVICES)
def test_the_q_and_k_norms_inside_the_attention_are_the_norms_apart(device):
    """Qwen3's per-head q and k RMSNorms inside the attention's kernel (and inside the block drafter's context write):
    the keys written and the attention bit for bit those of head_norms then the kernel, every case (float16: a
    tree's); the q norm's weight given for k's differs; ordered attention refuses them (exact numerics norm apart). A
    Qwen3 target's fused step then runs no head_norms kernel (its logits: the decoder test)."""
    g = torch.Generator().manual_seed(6)
    b, heads, kv_heads, dim, capacity = 2, 6, 2, 16, 64
    for dtype in _dtypes(device, products=True):
        norms = tuple((torch.randn(dim, generator=g).to(device, dtype), eps) for eps in (1e-6, 1e-5))
        for lengths, pad, new, tree, recent in CASES if dtype == torch.float32 else CASES[2:3]:  # f16: the tree
            qkv = torch.randn(b * new, (heads + 2 * kv_heads) * dim, generator=g).to(device, dtype)
            cos, sin = (torch.randn(b * new, dim, generator=g).to(device, dtype) for _ in range(2))
            stale = torch.randn(b, kv_heads, capacity, dim, generator=g).to(device, dtype)
            mask = None if tree is None else torch.tensor(tree, dtype=torch.bool, device=device)
            args = (torch.tensor(lengths, device=device), torch.tensor(pad, device=device), mask, recent)

            def attend(x, norms=None):
                keys, values = stale.clone(), stale.clone()
                return gpu_kernels.rotary_attention(x, cos, sin, heads, keys, values, *args, norms=norms), keys

            apart = attend(gpu_kernels.head_norms(qkv.clone(), heads, kv_heads, norms[1], norms[0]))
            assert all(torch.equal(x, y) for x, y in zip(attend(qkv, norms), apart)), (dtype, lengths, new)
            if dtype == torch.float32:
                assert not torch.equal(attend(qkv, (norms[0], norms[0]))[1], apart[1]), (lengths, new)  # q's for k's
            kv = qkv[:, heads * dim:].contiguous()  # a context's k|v, its keys normed inside the write
            written = [(stale.clone(), stale.clone()) for _ in range(2)]
            gpu_kernels.rotary_write(gpu_kernels.head_norms(kv.clone(), 0, kv_heads, norms[1]), cos, sin, *written[0],
                                     args[0])
            gpu_kernels.rotary_write(kv, cos, sin, *written[1], args[0], k_norm=norms[1])
            assert all(torch.equal(x, y) for x, y in zip(*written)), (dtype, lengths, new)
    with pytest.raises(ValueError, match="not ordered"):
        gpu_kernels.rotary_attention(qkv, cos, sin, heads, stale.clone(), stale.clone(), args[0], args[1],
                                     ordered=True, norms=norms)


@pytest.mark.parametrize("device", DEVICES)
def test_a_context_s_keys_rotated_and_written_in_one_kernel_are_rope_then_the_cache_write(device):
    """The block drafter's context: a stacked k|v rotated and written into the cache at each row's next slots in one
    kernel, bit for bit rope_qkv then KVCache.write, in every dtype, from cos and sin rows or tables read at the
    positions; the slots past them untouched."""
    g = torch.Generator().manual_seed(5)
    b, t, kv_heads, dim, capacity = 2, 3, 2, 16, 24
    for dtype in _dtypes(device):
        kv = torch.randn(b * t, 2 * kv_heads * dim, generator=g).to(device, dtype)
        tables = [torch.randn(40, dim, generator=g).to(device, dtype) for _ in range(2)]
        positions = torch.randint(0, 40, (b * t,), generator=g).to(device)
        cache = KVCache.allocate(1, b, kv_heads, capacity, dim, torch.tensor([0, 2]), dtype=dtype,
                                 device=torch.device(device))
        cache.stacked.copy_(torch.randn(cache.stacked.shape, generator=g))
        cache.lengths.copy_(torch.tensor([5, 17]))
        keys, values = cache.keys[0].clone(), cache.values[0].clone()
        _, k, v = gpu_kernels.rope_qkv(kv, tables[0][positions], tables[1][positions], 0, kv_heads)
        cache.write(0, k.view(b, t, kv_heads, dim).transpose(1, 2), v.view(b, t, kv_heads, dim).transpose(1, 2))
        for cos, sin, at in ((tables[0][positions], tables[1][positions], None), (*tables, positions)):
            written = keys.clone(), values.clone()
            gpu_kernels.rotary_write(kv, cos, sin, *written, cache.lengths, at)
            assert torch.equal(written[0], cache.keys[0]) and torch.equal(written[1], cache.values[0]), dtype
    with pytest.raises(ValueError, match="rotary_write"):
        gpu_kernels.rotary_write(kv[:, :-1], cos, sin, keys, values, cache.lengths, at)


def test_rotary_attention_refuses_shapes_that_do_not_fit():
    keys, lengths = torch.zeros(2, 2, 16, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"expected \[M, 64\]"):
        gpu_kernels.rotary_attention(torch.zeros(6, 60), torch.zeros(6, 8), torch.zeros(6, 8), 4, keys, keys.clone(),
                                     lengths, lengths)


@triton.jit
def _round_all(x_ptr, out_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):  # each value's rounded(x, KIND)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, rounded(x, KIND), mask=offs < n)


@pytest.mark.parametrize("device", DEVICES)
def test_rounding_on_the_bits_is_torchs(device):
    """triton_kernels.rounded, the kernels' rounding to 16 bits done on the bits (which no compiler folds away),
    equals torch's float32 → bfloat16 / float16 conversion, float16's subnormals and ties included."""
    g = torch.Generator().manual_seed(3)
    values = torch.cat([torch.randn(4096, generator=g) * scale for scale in (1e-7, 1e-5, 1e-3, 1.0, 300.0)])
    ties = torch.arange(1, 200, dtype=torch.float32) * 2.0 ** -25  # halfway between float16 subnormals
    values = torch.cat([values, ties, -ties, torch.tensor([0.0, -0.0, 65504.0])]).to(device)
    for dtype, kind in ((torch.bfloat16, tl.bfloat16), (torch.float16, tl.float16)):
        out = torch.empty_like(values)
        _round_all[(triton.cdiv(values.numel(), 1024),)](values, out, values.numel(), KIND=kind, BLOCK=1024)
        assert torch.equal(out, values.to(dtype).float()), dtype


@pytest.mark.parametrize("device", DEVICES)
def test_invariant_linear_gives_a_row_the_same_bits_whatever_the_rows_beside_it(device):
    """``target.exact_numerics``' products: each row of a product of M rows equals, bit for bit, the product of that
    row alone, for any M; a planted inner step that depends on M (as a shape-tuned library's) fails."""
    g = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(70, 200, generator=g).to(device), torch.randn(70, generator=g).to(device)
    x = torch.randn(40, 200, generator=g).to(device)

    def invariant(planted=False):
        full = gpu_kernels.invariant_linear(x, weight, bias, _planted=planted)
        return all(torch.equal(gpu_kernels.invariant_linear(x[i:i + 1], weight, bias, _planted=planted)[0], full[i])
                   for i in (0, 7, 16, 39))

    assert invariant()
    # sums of 200 products in another order than F.linear's: float32 rounding of their size (|value| ~ 15)
    torch.testing.assert_close(gpu_kernels.invariant_linear(x, weight, bias), F.linear(x, weight, bias),
                               rtol=1e-5, atol=1e-4)
    assert not invariant(planted=True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_norm_or_silu_inside_a_product_is_the_two_kernels(device):
    """normed_product is rms_norm (the residual add first) then invariant_linear in one kernel: the same stream after
    the add, bit for bit, into a new tensor (the stream given is left as it was), the product to the norm's last bit
    (its mean of squares summed in other steps); silu_product is silu_mul then invariant_linear bit for bit in
    invariant_linear's tiles. Each row of either gives the bits it gives alone (exact numerics)."""
    g = torch.Generator().manual_seed(5)
    for dtype in _dtypes(device, products=True):
        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device, dtype)

        stream, delta, norm, weight, bias = rand(40, 200), rand(40, 200), rand(200), rand(70, 200), rand(70)
        given = stream.clone()
        after, out = gpu_kernels.normed_product(stream, delta, norm, 1e-5, weight, bias)
        apart = stream.clone()
        expected = F.linear(gpu_kernels.rms_norm(apart, delta, norm, 1e-5), weight, bias)
        assert torch.equal(stream, given) and torch.equal(after, apart), dtype
        torch.testing.assert_close(out, expected, atol=_tolerance(dtype), rtol=_tolerance(dtype))
        same, alone = gpu_kernels.normed_product(stream, None, norm, 1e-5, weight)
        assert same is stream
        gate_up, down = rand(40, 2 * 96), rand(50, 96)
        fused = gpu_kernels.silu_product(gate_up, down)
        invariant = gpu_kernels.silu_product(gate_up, down, tile=gpu_kernels.INVARIANT_TILE)
        assert torch.equal(invariant, gpu_kernels.invariant_linear(gpu_kernels.silu_mul(gate_up), down)), dtype
        torch.testing.assert_close(fused, invariant, atol=_tolerance(dtype), rtol=_tolerance(dtype))
        for i in (0, 7, 16, 39):
            assert torch.equal(gpu_kernels.normed_product(stream[i:i + 1], delta[i:i + 1], norm, 1e-5, weight,
                                                          bias)[1][0], out[i]), (dtype, i)
            assert torch.equal(gpu_kernels.normed_product(stream[i:i + 1], None, norm, 1e-5, weight)[1][0], alone[i])
            assert torch.equal(gpu_kernels.silu_product(gate_up[i:i + 1], down)[0], fused[i]), (dtype, i)


def test_the_fused_products_refuse_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        gpu_kernels.normed_product(torch.zeros(3, 8), None, torch.zeros(6), 1e-5, torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"not \[M, 2·8\]"):
        gpu_kernels.silu_product(torch.zeros(3, 12), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="does not take rows of 8"):
        gpu_kernels.normed_product(torch.zeros(3, 8), None, torch.zeros(8), 1e-5, torch.zeros(4, 6))


@pytest.mark.parametrize("device", DEVICES)
def test_a_layer_is_five_kernels_with_its_norms_and_silu_inside_the_products(device, monkeypatch):
    """A step's layer on the Triton kernels: the q|k|v and gate|up products with their RMSNorms inside, the attention,
    the o product, the down product with SiLU·up inside (the final norm apart); ``fused_products=False`` runs the norms
    and SiLU·up as kernels of their own, and so does a forward of more than FUSED_ROWS rows (a prefill). The logits
    agree to float32 rounding."""
    calls = collections.Counter()
    for name in ("normed_product", "silu_product", "rms_norm", "silu_mul", "rotary_attention"):
        real = getattr(gpu_kernels, name)
        monkeypatch.setattr(gpu_kernels, name, lambda *a, _n=name, _r=real, **kw: calls.update([_n]) or _r(*a, **kw))
    model = tiny_llama(layers=2, seed=0).to(device)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2]], device=device)
    logits = []
    for fused in (True, False):
        decoder = as_decoder(model, backend=dataclasses.replace(_backend(device), fused_products=fused))
        cache = decoder.new_cache(1, 32, torch.zeros(1, dtype=torch.long, device=device))
        with torch.no_grad():
            monkeypatch.setattr(gpu_kernels, "FUSED_ROWS", 4)
            calls.clear()
            decoder(ids, cache, last_only=True)  # 6 rows: apart
            assert calls == {"rms_norm": 5, "silu_mul": 2, "rotary_attention": 2}, calls
            cache.commit(torch.full((1,), 6, device=device))
            calls.clear()
            logits.append(decoder(ids[:, :4], cache)[0])  # a chain of 4 rows
        expected = ({"normed_product": 4, "silu_product": 2, "rms_norm": 1, "rotary_attention": 2} if fused
                    else {"rms_norm": 5, "silu_mul": 2, "rotary_attention": 2})
        assert calls == expected, (fused, calls)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_a_steps_rotary_rows_are_a_table_the_rotary_module_computed_once(device):
    """On the Triton kernels' path a step's cos and sin are rows of a table of every position that the model's
    rotary module computed once: bit for bit the module's own values (float32, bf16), and no cos or sin computed in a
    step. A rotary embedding whose frequencies change with the length (transformers' "dynamic") keeps the module."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_llama(layers=1, seed=0).to(device, dtype)
        decoder = as_decoder(model, backend=_backend(device))
        x = torch.zeros(1, device=device, dtype=dtype)
        positions = torch.randint(0, decoder.max_positions, (3, 7), device=device)
        for got, want in zip(decoder._rope_rows(x, positions), model.model.rotary_emb(x, positions)):
            assert torch.equal(got, want), dtype
        cache = decoder.new_cache(1, 16, torch.zeros(1, dtype=torch.long, device=device))
        ids = torch.tensor([[5, 9, 3]], device=device)
        for rope_type, computed in (("default", 0), ("dynamic", 1)):
            model.model.rotary_emb.rope_type = rope_type
            with torch.no_grad(), Ops() as ops:
                decoder(ids, cache, last_only=True)
            assert ops.seen["cos"] == ops.seen["sin"] == computed, (dtype, rope_type, ops.seen)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_numerics_verifies_a_chain_with_the_plain_steps_logits(device):
    """With ``exact_numerics`` (invariant products, the attention over the slots in order) a forward of T chained
    tokens gives each position the logits T one-token steps give it, bit for bit, at batch 1 and 2 (and a row the same
    logits at either batch size); the default kernels need not (their products and attention blocks depend on T)."""
    model = tiny_llama(layers=2, seed=0).to(device)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5], [0, 0, 6, 7, 8, 9, 10, 11]], device=device)
    chain = torch.tensor([[4, 12, 6, 1], [3, 3, 9, 2]], device=device)

    def logits(backend, rows, stepwise):
        decoder = as_decoder(model, backend=backend)
        cache = decoder.new_cache(rows, 32, torch.tensor([0, 2][:rows], device=device))
        with torch.no_grad():
            decoder(ids[:rows], cache, last_only=True)
            cache.commit(torch.full((rows,), ids.shape[1], device=device))
            if not stepwise:
                return decoder(chain[:rows], cache)[0]
            out = []
            for t in range(chain.shape[1]):
                out.append(decoder(chain[:rows, t:t + 1], cache)[0])
                cache.commit(torch.ones(rows, dtype=torch.long, device=device))
            return torch.cat(out, 1)

    exact = _backend(device, exact_numerics=True)
    verified = {rows: logits(exact, rows, False) for rows in (1, 2)}
    for rows in (1, 2):
        assert torch.equal(verified[rows], logits(exact, rows, True)), rows
    assert torch.equal(verified[1][0], verified[2][0])  # nor on the batch beside it
    torch.testing.assert_close(verified[2], logits(_backend(device), 2, False), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_numerics_verifies_a_tree_with_the_plain_steps_logits(device):
    """A tree verified in one forward gives each node the logits plain decoding gives after that node's path, bit for
    bit, with ``exact_numerics`` (the attention reads each node's ancestors at their positions, in order); through
    the default kernels (under the interpreter) it does not."""
    from specdec.verify import Tree

    model = tiny_llama(layers=2, seed=0).to(device)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5]], device=device)
    tree = Tree.from_parents([-1, -1, 0, 1, 2], device=device)  # two branches, the first three levels deep
    block = torch.tensor([[13, 4, 12, 6, 1, 9]], device=device)  # the last token, then the nodes' tokens
    def decoded(tokens, exact=True, **tree_args):
        decoder = as_decoder(model, backend=_backend(device, exact_numerics=exact))
        cache = decoder.new_cache(1, 32, torch.zeros(1, dtype=torch.long, device=device))
        with torch.no_grad():
            decoder(ids, cache, last_only=True)
            cache.commit(torch.full((1,), ids.shape[1], device=device))
            if tree_args:
                return decoder(tokens, cache, **tree_args)[0][0]
            out = []
            for t in range(tokens.shape[1]):
                out.append(decoder(tokens[:, t:t + 1], cache)[0][0, 0])
                cache.commit(torch.ones(1, dtype=torch.long, device=device))
            return torch.stack(out)

    verified = decoded(block, tree_mask=tree.mask, depths=tree.depths)  # [6, V]: the root, then each node
    for path in ([0, 1, 3, 5], [0, 2, 4]):  # block positions from the root down each branch
        assert torch.equal(verified[path], decoded(block[:, path])), path
    if device == "cpu":  # the default kernels (products by shape, the step's tokens attended apart) differ here
        default = decoded(block, exact=False, tree_mask=tree.mask, depths=tree.depths)
        assert not torch.equal(default[[0, 1, 3, 5]], decoded(block[:, [0, 1, 3, 5]], exact=False))


def _top_k_agrees(device, planted=None) -> bool:
    """Whether ``top_k`` (``planted``: with that bug) gives torch's ``topk`` over rows of one chunk (a draft
    vocabulary) and of several merged (a width that no chunk divides, its largest value in the last, partial chunk):
    float32 rows torch's indices and values, as log-probabilities to float32's rounding; bfloat16 rows (with ties)
    torch's values at distinct indices holding them; rows of many equal values the stable order, the smaller index
    first."""
    g = torch.Generator().manual_seed(0)
    agrees = True
    for width, rows, k in ((50, 3, 1), (2000, 2, 5), (10000, 2, 6)):
        x = torch.randn(rows, width, generator=g)
        x[:, -3] = 5.0  # the last chunk's
        x = x.to(device)
        values, indices = gpu_kernels.top_k(x, k, _planted=planted)
        top = x.topk(k)
        agrees &= torch.equal(indices, top.indices) and torch.equal(values, top.values)
        log_values, log_indices = gpu_kernels.top_k(x, k, log_softmax=True, _planted=planted)
        top = x.log_softmax(-1).topk(k)
        agrees &= torch.equal(log_indices, top.indices) and torch.allclose(log_values, top.values, atol=1e-5)
        half = x[:, : width // 2].to(torch.bfloat16)  # an odd width, ties among the largest
        values, indices = gpu_kernels.top_k(half, k, _planted=planted)
        agrees &= (torch.equal(values, half.float().topk(k).values)
                   and torch.equal(half.float().gather(1, indices), values)
                   and all(row.unique().numel() == k for row in indices))
        tied = torch.randint(0, 3, (rows, width), generator=g).float().to(device)
        values, indices = gpu_kernels.top_k(tied, k, _planted=planted)
        order = torch.sort(-tied, stable=True).indices[:, :k]
        agrees &= torch.equal(indices, order) and torch.equal(values, tied.gather(1, order))
    return agrees


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_is_torchs_topk_in_the_stable_order(device):
    assert _top_k_agrees(device)


@pytest.mark.parametrize("planted", gpu_kernels.PLANTED_TOP_K)
def test_a_planted_top_k_bug_fails_the_check(planted):
    assert not _top_k_agrees("cpu", planted)


def test_top_k_refuses_a_k_its_row_cannot_give():
    for k in (0, 51, 2.0, True):
        with pytest.raises(ValueError, match=f"k={k!r}"):
            gpu_kernels.top_k(torch.zeros(2, 50), k)


@pytest.mark.parametrize("device, min_confidence", [pytest.param("cuda", 0.0, marks=pytest.mark.gpu),
                                                     pytest.param("cuda", 0.05, marks=pytest.mark.gpu), ("cpu", 0.05)])
def test_medusa_drafts_its_tree_on_the_top_k_kernel_as_on_torchs_topk(device, min_confidence, monkeypatch):
    """Medusa's fixed and dynamic trees (the candidates' log-probabilities then read) drafted through the Triton top-k
    (the heads and the target on the kernels, graphs replayed) give the tokens and acceptances torch's ``topk`` gives
    (the target and heads on torch's ops): plain decoding's greedy output, every step alike. On a CPU (the interpreter,
    ~25 s a case) the dynamic tree alone: it reads both the indices and the log-probabilities."""
    from helpers import random_heads

    from specdec.drafters import MedusaDrafter

    calls = []
    real = gpu_kernels.top_k
    monkeypatch.setattr(gpu_kernels, "top_k", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = tiny_llama(layers=2, seed=0).to(device)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]], device=device)
    paths = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0]]
    runs = []
    for backend in (_backend(device), Backend.emulated_gpu() if device == "cpu" else Backend(gpu_kernels=False)):
        target = GraphedDecoder(as_decoder(model, backend=backend))
        drafter = MedusaDrafter(random_heads().to(device), model.lm_head.weight, paths, min_confidence,
                                backend=backend)
        drafter.runtime.replay_graphs("auto")
        runs.append(speculative_generate(target, drafter, ids, k=len(paths), max_new_tokens=12, eos_token_id=[]))
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    assert runs[0].sequences == runs[1].sequences == ref.sequences and calls
    assert [(r.stats.proposed_tokens, r.stats.accepted_per_position, r.stats.verify_steps) for r in runs[:1]] == \
        [(r.stats.proposed_tokens, r.stats.accepted_per_position, r.stats.verify_steps) for r in runs[1:]]


@pytest.mark.parametrize("device", DEVICES)
def test_medusa_s_residual_blocks_in_one_kernel_are_the_torch_ops(device):
    """residual_silu_product: x + silu(x·W_jᵀ + b_j) for every head j at once, its weights stacked, as each head's
    three torch ops give it (to float32 rounding of the product's sums: another order; each row as it is alone); the
    heads on the Triton kernels run it, one kernel for all their blocks, and give the torch ops' logits."""
    from helpers import random_heads

    g = torch.Generator().manual_seed(8)
    for dtype in _dtypes(device, products=True):
        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device, dtype)

        x, weight, bias = rand(7, 48), rand(3 * 48, 48) * 0.2, rand(3 * 48)
        out = gpu_kernels.residual_silu_product(x, weight, bias)
        expected = torch.cat([x + F.silu(F.linear(x, w, b)) for w, b in zip(weight.split(48), bias.split(48))], -1)
        torch.testing.assert_close(out, expected, atol=_tolerance(dtype), rtol=_tolerance(dtype))
        assert all(torch.equal(gpu_kernels.residual_silu_product(x[i:i + 1], weight, bias)[0], out[i]) for i in (0, 6))
    with pytest.raises(ValueError, match="do not fit"):
        gpu_kernels.residual_silu_product(torch.zeros(3, 8), torch.zeros(12, 8))
    heads = random_heads().to(device)
    for block in heads.blocks:
        torch.nn.init.normal_(block.linear.bias, generator=g)
    hidden, lm_head = torch.randn(2, 32, generator=g).to(device), torch.randn(64, 32, generator=g).to(device)
    expected = heads(hidden, lm_head)
    calls = []
    real = gpu_kernels.residual_silu_product
    heads.backend = _backend(device)
    try:
        gpu_kernels.residual_silu_product = lambda *a, **kw: calls.append(1) or real(*a, **kw)
        with torch.no_grad():
            logits = heads(hidden, lm_head)
            later = heads(hidden, lm_head, num_heads=3, first=1)  # heads 1 and 2
    finally:
        gpu_kernels.residual_silu_product = real
    assert len(calls) == 2
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(later, expected[:, 1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_the_positions_in_one_kernel_are_the_caches(device, monkeypatch):
    """cache_positions: ``KVCache.positions(offsets).clamp_(min=0)`` (a step's 0..T-1, or a tree's depths) in one
    kernel, padding slots (committed fewer than the padding) at 0; a prefill's many positions in several programs a
    row (here programs of 4)."""
    g = torch.Generator().manual_seed(9)
    for case in range(8):
        monkeypatch.setattr(gpu_kernels, "POSITIONS_BLOCK", 4 if case % 2 else 1024)
        batch, count = int(torch.randint(1, 5, (), generator=g)), int(torch.randint(1, 20, (), generator=g))
        lengths, pad = (torch.randint(0, 12, (batch,), generator=g).to(device) for _ in range(2))
        depths = torch.randint(0, 6, (count,), generator=g).to(device)
        cache = KVCache(keys=[], values=[], lengths=lengths, pad=pad)
        assert torch.equal(gpu_kernels.cache_positions(lengths, pad, None, count),
                           cache.positions(torch.arange(count, device=device)).clamp_(min=0))
        assert torch.equal(gpu_kernels.cache_positions(lengths, pad, depths, count),
                           cache.positions(depths).clamp_(min=0))


@pytest.mark.parametrize("device", DEVICES)
def test_a_catch_up_s_inputs_in_one_kernel_are_the_torch_ops(device, monkeypatch):
    """catch_up_inputs: what EAGLE's catch-up reads (the tokens after its cache's committed positions, their position
    ids, how many a row committed since, the flat index of the newest; the block drafter's, the tokens aside) in one
    kernel, as its torch ops give them: the slots clamped below the capacity, the counts within 0..T, positions of
    padding slots at 0; the first catch-up's many positions (a prompt's) in several programs a row (here of 4)."""
    g = torch.Generator().manual_seed(10)
    for case in range(10):
        monkeypatch.setattr(gpu_kernels, "POSITIONS_BLOCK", 4 if case % 2 else 1024)
        batch, t, capacity = int(torch.randint(1, 5, (), generator=g)), int(torch.randint(1, 13, (), generator=g)), 24
        seq = torch.randint(0, 100, (batch, 32), generator=g).to(device)
        base, pad = torch.randint(0, 22, (batch,), generator=g).to(device), torch.randint(0, 6, (batch,), generator=g)
        seq_lens = (base + torch.randint(-2, t + 3, (batch,), generator=g).to(device)).clamp(min=0)
        pad = pad.to(device)
        steps = torch.arange(t, device=device)
        tokens = seq.gather(1, (base[:, None] + 1 + steps).clamp_(max=capacity - 1))
        positions = KVCache(keys=[], values=[], lengths=base, pad=pad).positions(steps).clamp_(min=0)
        count = (seq_lens - 1 - base).clamp_(min=0, max=t)
        last = torch.arange(batch, device=device) * t + (count - 1).clamp(min=0)
        got = gpu_kernels.catch_up_inputs(seq, seq_lens, base, pad, t, capacity)
        for name, a, b in zip(("tokens", "positions", "count", "last"), got, (tokens, positions, count, last)):
            assert torch.equal(a, b), name
        without = gpu_kernels.catch_up_inputs(None, seq_lens, base, pad, t, capacity)  # the block drafter's: no tokens
        assert without[0] is None and all(torch.equal(a, b) for a, b in zip(without[1:], got[1:]))


def _random_step(generator, device):
    """A verification's argmax and block for a random chain (T 1..6) or tree (2..10 nodes), batch 1 or 3, over a
    vocabulary of 4 (many drafts accepted): (tree or None, block [B, T], best [B, T])."""
    from specdec.verify import Tree

    def pick(n):
        return int(torch.randint(n, (), generator=generator))

    batch = (1, 3)[pick(2)]
    tree = None
    if pick(2):
        tree = Tree.from_parents([-1] + [pick(i + 1) - 1 for i in range(1, 1 + pick(9))], device=device)
    t = 1 + (tree.num_nodes if tree is not None else pick(6))
    block, best = (torch.randint(4, (batch, t), generator=generator).to(device) for _ in range(2))
    return tree, block, best


def _torch_verdict(tree, block, best):
    """What the decode loop's torch ops make of a greedy verdict: num_accepted, next_tokens, emitted, path, at."""
    from specdec.verify import accepted_path, emitted_tokens, greedy_chain, greedy_tree

    drafts = block[:, 1:]
    if tree is None:
        accepted, next_tokens = greedy_chain(drafts, best)
        return accepted, next_tokens, emitted_tokens(drafts, accepted, next_tokens), None, accepted
    nodes, accepted, next_tokens = greedy_tree(tree, drafts, best)
    path = accepted_path(nodes)
    emitted = emitted_tokens(drafts.gather(1, nodes.clamp(min=0)), accepted, next_tokens)
    return accepted, next_tokens, emitted, path, path.gather(1, accepted[:, None])[:, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_greedy_verdict_in_one_kernel_is_the_torch_ops(device):
    """``greedy_verdict`` (one kernel a step where the torch ops take ~30 for a chain and ~100 for a tree) gives what
    greedy_chain or greedy_tree and the loop's bookkeeping give, every entry of every output, over 100 random chains
    and trees of 1-10 drafts at batch 1 and 3 (drafts over 4 tokens: walks 0 to 3 deep). Planted: a walk that
    tries only each node's first child differs."""
    generator = torch.Generator().manual_seed(0)
    depths, planted_differs = collections.Counter(), False
    for _ in range(100):
        tree, block, best = _random_step(generator, device)
        want = _torch_verdict(tree, block, best)
        children, depth = (None, None) if tree is None else (tree.children, tree.max_depth)
        got = gpu_kernels.greedy_verdict(best, block, children, depth)
        for name, a, b in zip(("num_accepted", "next_tokens", "emitted", "path", "at"), want, got):
            assert (a is None and b is None) or torch.equal(a, b), (name, tree, block, best, a, b)
        depths.update(want[0].tolist())
        if tree is not None:
            planted = gpu_kernels.greedy_verdict(best, block, children, depth, _planted="first_child_only")
            planted_differs |= not all(torch.equal(a, b) for a, b in zip(want[:3], planted[:3]))
    assert max(depths) >= 3 and planted_differs


@pytest.mark.parametrize("device", DEVICES)
def test_a_verification_s_greedy_verdict_on_the_kernel_is_the_torch_ops_whole(device):
    """The decode loop's greedy verdict (engine._greedy_verdict) through the kernel gives every output the torch ops
    give: the accepted drafts, the next and emitted tokens, a tree's path, the hidden state where the next token was
    predicted and the drafter's feature layers along the kept positions (EAGLE's), over 40 random chains and trees."""
    from specdec.decode.engine import _greedy_verdict

    generator = torch.Generator().manual_seed(2)
    for _ in range(40):
        tree, block, best = _random_step(generator, device)
        batch, t = block.shape
        logits = torch.nn.functional.one_hot(best, 4).float() + 0.1 * torch.rand(batch, t, 4, generator=generator).to(
            device)
        hidden, features = (torch.randn(batch, t, width, generator=generator).to(device) for width in (6, 12))
        children = () if tree is None else (tree.children,)
        want, got = (_greedy_verdict(kernels, tree, block, *children, logits, hidden, features)
                     for kernels in (None, gpu_kernels))
        assert len(want) == len(got) == 6 and all(torch.equal(a, b) for a, b in zip(want, got)), (tree, block, best)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tree_s_path_moved_in_one_kernel_is_the_torch_ops(device):
    """``move_path`` (one kernel where KVCache.move_path's torch ops take five) moves a tree's accepted path into the
    slots after the committed ones as the torch ops do: every slot equal but those past the path (never committed),
    over the trees among 40 random verifications, with random cache lengths (batch 1 and 3, 2 layers, 2 heads,
    float32 and bf16). Planted: the path off by one (each slot moved from the next block position) differs."""
    from specdec.models.cache import KVCache

    generator = torch.Generator().manual_seed(3)
    planted_differs = False
    for trial in range(40):
        tree, block, best = _random_step(generator, device)
        if tree is None:
            continue
        batch, capacity = block.shape[0], 32
        accepted, _, _, path, _ = _torch_verdict(tree, block, best)
        dtype = (torch.float32, torch.bfloat16)[trial % 2]
        lengths = torch.randint(1, capacity - path.shape[1] - 12, (batch,), generator=generator).to(device)
        caches = [KVCache.allocate(2, batch, 2, capacity, 8, torch.zeros(batch, dtype=torch.long), dtype=dtype,
                                   device=device) for _ in range(3)]
        for cache in caches:
            cache.stacked.copy_(torch.randn(cache.stacked.shape, generator=generator).to(cache.stacked))
            cache.lengths.copy_(lengths)
        caches[1].stacked.copy_(caches[0].stacked)
        caches[2].stacked.copy_(caches[0].stacked)
        caches[0].move_path(path)
        gpu_kernels.move_path(caches[1].stacked, caches[1].lengths, path)
        gpu_kernels.move_path(caches[2].stacked, caches[2].lengths, (path + 1).clamp(max=block.shape[1] - 1))
        slot = torch.arange(capacity, device=device)
        kept = ~((slot[None] > (lengths + accepted)[:, None]) & (slot[None] < (lengths + path.shape[1])[:, None]))
        kept = kept[None, None, :, None, :, None].expand_as(caches[0].stacked)
        assert torch.equal(caches[0].stacked[kept], caches[1].stacked[kept]), (trial, path, accepted)
        planted_differs |= not torch.equal(caches[0].stacked[kept], caches[2].stacked[kept])
    assert planted_differs


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_committed_in_one_kernel_is_the_torch_ops(device):
    """``commit_step`` (one kernel where the loop's torch ops take ~15) counts, writes and moves what
    engine._drafted_counts and engine._advance do: the rows read back, live, left, seq, seq_lens and the cache's
    lengths, over 100 random steps (batch 1 and 3, 1-5 emitted tokens, EOS among them or not, rows stopped, tokens
    left running out, writes clamped to the last slot). Planted: an EOS that does not stop its row differs."""
    from specdec.decode.engine import StepResult, _advance, _drafted_counts
    from specdec.models.cache import KVCache

    generator = torch.Generator().manual_seed(1)

    def rand(high, *shape):
        return torch.randint(high, shape, generator=generator).to(device)

    planted_differs = False
    for trial in range(100):
        batch, width, capacity = (1, 3)[trial % 2], 1 + trial % 5, (12, 20)[trial % 3 == 0]
        accepted, emitted = rand(width, batch), rand(6, batch, width)
        live = rand(5, batch) > 0
        left, eos = (rand(5, batch) + 1) * live, torch.randperm(6, generator=generator)[:trial % 3].to(device)
        state = (live, left, rand(6, batch, 20), rand(7, batch) + 3)
        state += (state[3] - 1,)  # the cache's lengths: the rows' but for the newest token

        def torch_ops(live, left, seq, seq_lens, lengths):
            cache = KVCache([], [], lengths, torch.zeros_like(lengths))
            step = StepResult(accepted, emitted[:, -1], emitted, None, emitted)
            count = _drafted_counts(step, live, left, eos)
            _advance(cache, seq, seq_lens, capacity, step, count)
            return torch.cat([accepted[None], count[None], emitted.T])

        want = [t.clone() for t in state]
        want.append(torch_ops(*want))
        got = [t.clone() for t in state]
        got.append(gpu_kernels.commit_step(accepted, emitted, got[0], got[1], eos, got[2], got[3], got[4], capacity))
        for name, a, b in zip(("live", "left", "seq", "seq_lens", "lengths", "rows"), want, got):
            assert torch.equal(a, b), (name, trial, a, b)
        planted = [t.clone() for t in state]
        planted.append(gpu_kernels.commit_step(accepted, emitted, planted[0], planted[1], eos, planted[2], planted[3],
                                               planted[4], capacity, _planted="eos_ignored"))
        planted_differs |= not torch.equal(planted[-1], want[-1])
    assert planted_differs


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_on_the_step_kernels_is_plain_decoding(device, monkeypatch):
    """Through the graphed target on the kernels (``Backend.step_kernels``: the verdict and the commit each one
    kernel), plain decoding read a step late with a row stopping at an EOS, and trees of true and wrong drafts (depth
    3 reached) read each step, give plain decoding's tokens on torch's ops; every step went through the kernels, and
    after the forward the graph runs at most three torch kernels beside them (where the verdict and commit took 18 to
    ~100). On a CPU the forward runs torch's ops (emulated graphs) and only the step's kernels the interpreter: seconds,
    not a minute."""
    from helpers import OracleTreeDrafter

    from specdec.decode import engine
    from specdec.jobs.data import left_pad
    from specdec.verify import Tree

    calls = collections.Counter()
    for name in ("greedy_verdict", "commit_step"):
        real = getattr(gpu_kernels, name)
        monkeypatch.setattr(gpu_kernels, name, lambda *a, real=real, name=name, **kw: calls.update([name]) or
                            real(*a, **kw))
    model = tiny_llama(layers=2, seed=0).to(device)
    prompts = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6]]
    ids, mask = (t.to(device) for t in left_pad(prompts))
    free = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    eos = [free.sequences[1][3]]
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos)
    if device == "cpu":
        monkeypatch.setattr(Backend, "step_kernels", lambda self, device: gpu_kernels)
    target = GraphedDecoder(as_decoder(model, backend=_backend(device) if device == "cuda" else Backend.emulated_gpu()))
    monkeypatch.setattr(engine, "PIPELINED_DEVICES", ("cpu", "cuda"))
    plain = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos)
    assert plain.sequences == ref.sequences and len(ref.sequences[1]) == 4
    assert calls["commit_step"] >= plain.stats.target_forwards and not calls["greedy_verdict"]  # + the captures
    rows = [p + s for p, s in zip(prompts, free.sequences)]
    trees = ((Tree.from_parents([-1, 0, 1, -1], device=device), [0, 1, 2, None]),
             (Tree.from_parents([-1, -1, 0, 1], device=device), [0, None, 1, None]))
    out = speculative_generate(target, OracleTreeDrafter(rows, trees), ids, attention_mask=mask, k=4,
                               max_new_tokens=8, eos_token_id=[])
    assert out.sequences == free.sequences and out.stats.accepted_per_position[2] > 0
    assert calls["greedy_verdict"] >= out.stats.target_forwards
    if device == "cpu":  # after the forward, beside the kernels: the argmax, the hidden state's gather and a clone
        from helpers import ops_after_forward

        for key, entry in target.graphs._graphs.items():
            assert sum(ops_after_forward(entry[0].ops, interpreted=True).values()) <= 3, key


def _random_sampled_step(generator, device, trial):
    """A sampled verification of a random chain (T 1..6) or tree (2..10 nodes), batch 1 or 3: drafts over the 4
    likeliest tokens, mostly the likeliest (siblings repeat tokens), logits float32 or bf16 over 5, 37 or (trials
    before the 42nd) 3,000 tokens (two blocks of the kernel's), a temperature of 0.7 or 1.3, uniforms drawn as the
    exact rule draws them, for every other chain the drafts' own q (float32, near p), top-k of 2 or 10 in two trials of
    five and top-p 0.8 in one of seven over one block: (tree or None, block, logits, temperature, uniforms, q or None,
    top_k, top_p)."""
    from specdec.verify import Tree
    from specdec.verify.rules import ExactRule
    from specdec.verify.sampling import logits_to_probs

    def pick(n):
        return int(torch.randint(n, (), generator=generator))

    batch, tree = (1, 3)[trial % 2], None
    if trial % 3:
        tree = Tree.from_parents([-1] + [pick(i + 1) - 1 for i in range(1, 1 + pick(9))], device=device)
    t = 1 + (tree.num_nodes if tree is not None else pick(6))
    vocab = (5, 37, 3000 if trial < 42 else 37)[trial % 3]
    block = torch.randint(4, (batch, t), generator=generator)
    block[torch.rand(batch, t, generator=generator) < 0.6] = 0
    logits = torch.randn(batch, t, vocab, generator=generator) * 2
    logits[..., :4] += math.log(vocab)  # the drafts' tokens likely, 0 the most: walks 0 to 3 deep and more
    logits[..., 0] += 2
    drawn = ExactRule.draw(block[:, 1:], tree, generator)
    temperature = (0.7, 1.3)[trial % 2]
    q = None
    if t > 1 and (trial % 4 < 2 if tree is None else trial % 8 == 1):  # a tree's far from p: siblings rejected
        noise = torch.randn(batch, t - 1, vocab, generator=generator) * (1 if tree is None else 3)
        q = logits_to_probs(logits[:, :-1] + noise, temperature).to(device)
    logits = logits.to((torch.float32, torch.bfloat16)[trial % 4 == 3])
    top_p = 0.8 if trial % 7 == 1 and vocab < 3000 else 1.0
    return (tree, block.to(device), logits.to(device), temperature, drawn.to(device), q, (0, 0, 0, 2, 10)[trial % 5],
            top_p)


def _torch_sampled_verdict(tree, block, logits, temperature, drawn, q=None, top_k=0, top_p=1.0):
    """What the decode loop's torch ops make of a sampled verdict (``q``: the drafts', else one-hot): num_accepted,
    next_tokens, emitted, path, at."""
    from specdec.decode.engine import _kept
    from specdec.verify.rules import ExactRule
    from specdec.verify.sampling import logits_to_probs

    nodes, accepted, next_tokens = ExactRule.verdict(tree, block[:, 1:], q, logits_to_probs(logits, temperature,
                                                                                           top_k, top_p), drawn)
    step = _kept(block[:, 1:], accepted, next_tokens, nodes, torch.zeros(*block.shape, 1, device=block.device), [])
    at = accepted if tree is None else step.path.gather(1, accepted[:, None])[:, 0]
    return accepted, next_tokens, step.emitted, step.path, at


@pytest.mark.parametrize("device", DEVICES)
def test_a_sampled_verdict_in_one_kernel_is_the_torch_ops(device, monkeypatch):
    """``sampled_verdict`` (one kernel a step where the torch ops take softmax over every position and ~50 kernels for a
    chain, ~180 for a tree) draws what the exact rule's torch ops draw from the same uniforms (rejection_sample,
    onehot_walk, walk_tree) and gives every entry of the loop's bookkeeping, over 60 random chains and trees (siblings
    repeating tokens among them; chains drafted with their own q, a draft model's, and trees drawn from theirs,
    EAGLE's sampled tree's, among them), float32 and bf16 logits, vocabularies of one and two blocks and, with blocks
    of 16 tokens, of three, with top-k, top-p, both and neither; and where round-off leaves nothing of the residual
    (two siblings holding all of p, both rejected) it draws from p, as they do. Each planted bug (no renormalisation
    after a rejected sibling; the next token drawn from p, the rejected drafts kept, a drafted chain's q not taken
    from p; top-k ignored) differs, in the random trials or in one made for it. The law itself: the torch ops'
    statistical tests, and the ``gpu`` tier's of the kernel (tests/verify/test_tree_verify.py)."""
    generator = torch.Generator().manual_seed(4)
    depths, differs = collections.Counter(), collections.Counter()
    for trial in range(60):
        if trial == 42:
            monkeypatch.setattr(gpu_kernels, "VOCAB_BLOCK", 16)
        tree, block, logits, temperature, drawn, q, top_k, top_p = _random_sampled_step(generator, device, trial)
        want = _torch_sampled_verdict(tree, block, logits, temperature, drawn, q, top_k, top_p)
        children, depth = (None, None) if tree is None else (tree.children, tree.max_depth)
        got = gpu_kernels.sampled_verdict(logits, block, drawn, temperature, children, depth, top_k=top_k,
                                          top_p=top_p, draft_probs=q)
        for name, a, b in zip(("num_accepted", "next_tokens", "emitted", "path", "at"), want, got):
            assert (a is None and b is None) or torch.equal(a, b), (name, trial, tree, block, drawn, a, b)
        depths.update(want[0].tolist())
        for planted in gpu_kernels.PLANTED_SAMPLED if trial % 2 else ():  # every other trial (batch 3)
            wrong = gpu_kernels.sampled_verdict(logits, block, drawn, temperature, children, depth, top_k=top_k,
                                                top_p=top_p, draft_probs=q, _planted=planted)
            kind = "one-hot" if q is None else "drawn chain" if tree is None else "drawn tree"
            differs[planted, kind] += not all(torch.equal(a, b) for a, b in zip(want[:2], wrong[:2]))
    from specdec.verify import Tree

    # Two children of the root, p(1) = 0.5 and p(2) = 0.3: the first rejected (u 0.9), the second accepted where it is
    # tried against the residual (u · 0.5 < 0.3 with one-hot q; u < 0.3 / 0.5 drawn from q = one-hot), not against p.
    tree, block = Tree.from_parents([-1, -1], device=device), torch.tensor([[0, 1, 2]], device=device)
    logits = torch.tensor([0.1, 0.5, 0.3, 0.1], device=device).log().expand(1, 3, 4)
    drawn = torch.tensor([[0.9, 0.45, 0.5]], dtype=torch.float64, device=device)
    for kind, q in (("one-hot", None), ("drawn tree", torch.eye(4, device=device)[[1, 2]][None])):
        accepted, _, _, path, _ = gpu_kernels.sampled_verdict(logits, block, drawn, 1.0, tree.children, 1,
                                                              draft_probs=q)
        assert accepted.item() == 1 and path[0, 1].item() == 2, (kind, accepted, path)
        wrong = gpu_kernels.sampled_verdict(logits, block, drawn, 1.0, tree.children, 1, draft_probs=q,
                                            _planted="no_renormalisation")
        differs["no_renormalisation", kind] += wrong[0].item() != 1
    assert max(depths) >= 3 and all(differs[planted, "one-hot"] for planted in gpu_kernels.PLANTED_SAMPLED), differs
    assert differs["recovered_from_p", "drawn chain"]  # a drafted chain's next token drawn from p, not max(0, p - q)
    assert differs["recovered_from_p", "drawn tree"] and differs["no_renormalisation", "drawn tree"], differs
    # a root with two children holding all of p's mass

    tree, block = Tree.from_parents([-1, -1], device=device), torch.tensor([[1, 2, 3]], device=device)
    drawn = torch.tensor([[0.999, 1 - 1e-12, 0.25]], dtype=torch.float64, device=device)
    emptied = 0
    for tenth in range(20):  # the second is tried against 1 - p(2), at times a float32 ulp above p(3): rejected too
        logits = torch.full((1, 3, 6), float("-inf"), device=device)
        logits[..., 2], logits[..., 3] = 0.0, 1.7 + tenth / 20
        accepted, token = gpu_kernels.sampled_verdict(logits, block, drawn, 1.0, tree.children, 1)[:2]
        if accepted.item() == 0:  # nothing left of the residual: the next token drawn from p, as the torch ops draw
            emptied += 1
            assert token.item() == (2 if logits[0, 0].softmax(-1)[2] > 0.25 else 3)
    assert emptied


@pytest.mark.parametrize("device", DEVICES)
def test_top_p_s_floor_in_one_kernel_keeps_what_the_torch_ops_keep(device):
    """``sampling_floors`` (a kernel a position's vocabulary, where the torch ops sort it) leaves each position's tokens
    at or above the floor it finds: the tokens logits_to_probs keeps, over 18 random pairs of rows of vocabularies of 5
    to 300 tokens, float32 and bf16 logits, top-p from 0.3 to 0.99 with top-k and without; where top-p's mass is
    reached inside a run of equal logits, all of them. Each planted bug (top-p's mass over p before top-k; before the
    temperature) differs."""
    from specdec.verify.sampling import logits_to_probs

    generator, differs = torch.Generator().manual_seed(6), collections.Counter()
    for trial in range(18):
        vocab, temperature = (5, 37, 300)[trial % 3], (0.7, 1.0, 1.3)[trial % 3]
        logits = (torch.randn(2, 2, vocab, generator=generator) * 2).to((torch.float32, torch.bfloat16)[trial % 2])
        top_k, top_p = (0, 0, 3, 20)[trial % 4] % vocab, (0.3, 0.6, 0.9, 0.99)[trial // 3 % 4]
        want = logits_to_probs(logits, temperature, top_k, top_p) > 0
        for planted in (None,) + gpu_kernels.PLANTED_FLOORS:
            floors = gpu_kernels.sampling_floors(logits.to(device), temperature, top_k, top_p, _planted=planted)
            got = (logits.float() / temperature >= floors.cpu()[..., None])
            if planted is None:
                assert torch.equal(want, got), (trial, vocab, top_k, top_p, logits, floors)
            differs[planted] += not torch.equal(want, got)
    assert all(differs[planted] >= 4 for planted in gpu_kernels.PLANTED_FLOORS), differs
    tied = torch.tensor([[2.0, 1.0, 0.0, 1.0, 1.0]], device=device)  # 2.0 holds 0.45 of p, each 1.0 0.16
    assert gpu_kernels.sampling_floors(tied, 1.0, 0, 0.6).tolist() == [1.0]
    assert gpu_kernels.sampling_floors(tied, 1.0, 0, 1.0) is None
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\] \(1 = off\), got 0"):
        gpu_kernels.sampling_floors(tied, 1.0, 0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_a_verification_s_sampled_verdict_on_the_kernel_is_the_torch_ops_whole(device):
    """The decode loop's sampled verdict (engine._sampled_verdict) through the kernel gives every output the torch ops
    give (the hidden state where the next token was predicted, the feature layers along the kept positions
    included), over 30 random chains and trees, drafted chains and trees, top-k and top-p among them."""
    from specdec.decode.engine import _sampled_verdict
    from specdec.verify.sampling import SamplingParams

    generator = torch.Generator().manual_seed(5)
    for trial in range(30):
        tree, block, logits, temperature, drawn, q, top_k, top_p = _random_sampled_step(generator, device, trial)
        batch, t = block.shape
        hidden, features = (torch.randn(batch, t, width, generator=generator).to(device) for width in (6, 12))
        children = () if tree is None else (tree.children,)
        params, drafted = SamplingParams(temperature, top_k, top_p), () if q is None else (q,)
        want, got = (_sampled_verdict(kernels, tree, params, bool(drafted), block, drawn, *children, *drafted, logits,
                                      hidden, features) for kernels in (None, gpu_kernels))
        assert len(want) == len(got) == 6 and all(torch.equal(a, b) for a, b in zip(want, got)), (trial, tree)


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_steps_on_the_step_kernels_draw_the_torch_ops_tokens(device, monkeypatch):
    """Sampling through the graphed target (temperature 0.8, one seed): plain decoding and n-gram lookup on the device
    (with top-k 5) read a step late, trees of true and wrong drafts (depth 3 reached) and a draft model's chain drawn
    from its q (the target's first layer drafting; top-p 0.9) draw on the step kernels (the verdict, the path move and
    the commit one kernel each) the tokens they draw on torch's ops, every step through the kernel; after the forward a
    graph runs at most three torch kernels beside them (where the sampled verdict took 36 to ~180)."""
    from helpers import OracleTreeDrafter

    from specdec.decode import engine
    from specdec.drafters import DraftModelDrafter
    from specdec.jobs.data import left_pad
    from specdec.verify import Tree

    calls = collections.Counter()
    real = gpu_kernels.sampled_verdict
    monkeypatch.setattr(gpu_kernels, "sampled_verdict", lambda *a, **kw: calls.update(["verdict"]) or real(*a, **kw))
    monkeypatch.setattr(engine, "PIPELINED_DEVICES", ("cpu", "cuda"))
    model = tiny_llama(layers=2, seed=0).to(device)
    with torch.no_grad():  # peaked: the drafts of the greedy rows are accepted often, 3 deep at times
        model.lm_head.weight.mul_(100)
    prompts = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6, 4, 4, 6]]
    ids, mask = (t.to(device) for t in left_pad(prompts))
    free = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    rows = [p + s for p, s in zip(prompts, free.sequences)]
    trees = ((Tree.from_parents([-1, 0, 1, -1], device=device), [0, 1, 2, None]),
             (Tree.from_parents([-1, -1, 0, 1], device=device), [0, None, 1, None]))
    runs: dict = {}
    for fused in (False, True):
        if device == "cpu":
            monkeypatch.setattr(Backend, "step_kernels", lambda self, device, fused=fused: gpu_kernels if fused
                                else None)
        backend = _backend(device) if device == "cuda" else Backend.emulated_gpu()
        target = GraphedDecoder(as_decoder(model, backend=dataclasses.replace(backend, fused_steps=fused)))

        def run(drafter, k, seed, top_k=0, top_p=1.0):
            generator, before = torch.Generator(device).manual_seed(seed), calls["verdict"]
            if drafter is None:
                out = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=10, temperature=0.8,
                                              top_k=top_k, top_p=top_p, generator=generator, eos_token_id=[])
            else:
                out = speculative_generate(target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=10,
                                           temperature=0.8, top_k=top_k, top_p=top_p, generator=generator,
                                           eos_token_id=[])
            assert calls["verdict"] - before >= fused * out.stats.target_forwards  # each step on the kernel
            return out

        runs[fused] = [run(None, 0, 1), run(NgramDrafter(2, 1, on_device=True, device=device), 3, 2, top_k=5),
                       run(OracleTreeDrafter(rows, trees), 4, 3),
                       run(DraftModelDrafter(model, num_layers=1), 3, 4, top_p=0.9)]
        if fused:
            if device == "cpu":
                from helpers import ops_after_forward

                for key, entry in target.graphs._graphs.items():
                    assert sum(ops_after_forward(entry[0].ops, interpreted=True).values()) <= 3, key
        else:
            assert not calls
    assert [out.sequences for out in runs[False]] == [out.sequences for out in runs[True]]
    assert runs[True][2].stats.accepted_per_position[2] > 0 and runs[True][3].stats.accepted_per_position[0] > 0


def _step_kernels_on(monkeypatch, device, fused: bool) -> Backend:
    """A GPU's backend with its step kernels on (``fused``) or off; on CPU the layers on torch's ops (graphs emulated)
    and ``Backend.step_kernels`` giving the kernels (under the interpreter) or not."""
    if device == "cpu":
        monkeypatch.setattr(Backend, "step_kernels", lambda self, device: gpu_kernels if fused else None)
    return dataclasses.replace(_backend(device) if device == "cuda" else Backend.emulated_gpu(), fused_steps=fused)


@pytest.mark.parametrize("device", DEVICES)
def test_eagle_s_sampled_tree_on_the_step_kernels_draws_the_torch_ops_tokens(device, monkeypatch):
    """EAGLE's tree sampled at T = 0.8 (its siblings drawn from q without replacement, each reported with its law;
    grown on the device, two left-padded rows) verified on the step kernels (``sampled_tree_drawn_kernel``, every step)
    draws the tokens it draws on torch's ops from the same seed."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter
    from specdec.jobs.data import left_pad

    calls = collections.Counter()
    real = gpu_kernels.sampled_verdict
    monkeypatch.setattr(gpu_kernels, "sampled_verdict", lambda *a, **kw: calls.update(["verdict"]) or real(*a, **kw))
    model = tiny_llama(layers=4, seed=0).to(device)
    ids, mask = (t.to(device) for t in left_pad([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6]]))
    sequences = []
    for fused in (False, True):
        backend = _step_kernels_on(monkeypatch, device, fused)
        target = GraphedDecoder(as_decoder(model, backend=backend))
        drafter = EagleDrafter(random_eagle(model).to(device), tree=True, min_confidence=0.0, depth=2, top_k=2,
                               expand=2, grow_on_device=True, backend=backend)
        drafter.runtime.replay_graphs("auto")
        out = speculative_generate(target, drafter, ids, attention_mask=mask, k=4, max_new_tokens=16, temperature=0.8,
                                   generator=torch.Generator(device).manual_seed(7), eos_token_id=[])
        assert calls["verdict"] >= fused * out.stats.target_forwards
        sequences.append(out.sequences)
    assert sequences[0] == sequences[1]


def _candidates(g, batch, top_k, expand, depth, ties):
    """A DeviceGrowth's candidates at random: confidences [C] (some tied where ``ties``), parents [C] (each level's
    ``expand`` parents among the level before's), draft ids [B, C]."""
    sizes = [top_k] + [expand * top_k] * (depth - 1)
    parent, start = [-1] * top_k, 0
    for size, before in zip(sizes[1:], sizes):
        chosen = sorted(torch.randperm(before, generator=g)[:expand].tolist())
        parent += [start + c for c in chosen for _ in range(top_k)]
        start += before
    count = len(parent)
    confidence = torch.rand(count, generator=g)
    if ties:
        confidence = (confidence * 4).floor() / 4  # few values: many ties, at the cut too
    return confidence, torch.tensor(parent), torch.randint(0, 40, (batch, count), generator=g)


@pytest.mark.parametrize("device", DEVICES)
def test_eagle_s_device_tree_chosen_in_one_kernel_is_the_torch_ops(device):
    """DeviceGrowth's choice of its tree (confidences capped at the ancestors', a stable sort's ties, the n kept in
    draw order, then Tree.on_device's parents, depths, mask and children, after a lookup chain or not) in one kernel
    equals the torch ops' in every output; with the cap planted out it differs where a child outranks its parent."""
    from types import SimpleNamespace

    from specdec.drafters.eagle.growth import DeviceGrowth

    g = torch.Generator().manual_seed(0)
    differs = 0
    for trial in range(12):
        top_k, expand, depth = (4, 4, 6) if trial % 3 == 0 else (2 + trial % 3, 1 + trial % 2, 2 + trial % 4)
        lookup, batch = (0, 3, 1, 0)[trial % 4], 1 + trial % 3
        confidence, parent, index = _candidates(g, batch, top_k, expand, depth, ties=trial % 2 == 1)
        token_ids = torch.randperm(100, generator=g)[:40].sort().values
        n = min(3 + trial, confidence.shape[0])
        drafter = SimpleNamespace(top_k=top_k, expand=expand, depth=depth, token_ids=token_ids.to(device))
        growth = DeviceGrowth(drafter, n, lookup)
        width = top_k + (1 if lookup else 0)
        expected = growth.chosen(confidence.clone().to(device), index.to(device), parent.to(device), width)
        args = (confidence.to(device), parent.to(device), index.to(device), token_ids.to(device), n, depth, width,
                lookup)
        for got, want in zip(gpu_kernels.device_tree(*args), expected):
            assert got.dtype == want.dtype and torch.equal(got, want), (trial, got, want)
        planted = gpu_kernels.device_tree(*args, _planted="confidence_uncapped")
        differs += any(not torch.equal(a, b) for a, b in zip(planted, expected))
    assert differs >= 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lookup", [0, 2])
def test_eagle_s_device_tree_grown_on_the_step_kernels_is_the_torch_ops_tree(device, lookup, monkeypatch):
    """EAGLE's fixed tree grown on the device (DeviceGrowth) with each level's bookkeeping and the final choice on the
    step kernels (``grow_level``, ``grown_level``, ``device_tree``; graphs replayed, emulated here: they refuse what a
    CUDA graph cannot capture; without a lookup chain its layer on the Triton kernels too) proposes at every step the
    tokens and shape the torch ops propose (two left-padded rows, three children a node, two expanded a level, with
    and without a lookup chain), and decodes plain decoding's greedy output."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter
    from specdec.jobs.data import left_pad

    calls = collections.Counter()
    for name in ("grow_level", "grown_level", "device_tree"):
        real = getattr(gpu_kernels, name)
        monkeypatch.setattr(gpu_kernels, name, lambda *a, real=real, name=name, **kw: calls.update([name])
                            or real(*a, **kw))
    model = tiny_llama(layers=4, seed=0).to(device)
    ids, mask = (t.to(device) for t in left_pad([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6]]))
    new = 12 if lookup else 6  # its layer under the interpreter: fewer steps
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=new, eos_token_id=[])
    proposals = []
    for fused in (False, True):
        backend = _step_kernels_on(monkeypatch, device, fused)
        layer_backend = dataclasses.replace(_backend(device), fused_steps=True) if fused and not lookup else backend
        drafter = EagleDrafter(random_eagle(model, draft_vocab=40, seed=5).to(device), tree=True, min_confidence=0.0,
                               depth=4, top_k=3, expand=2, lookup=lookup, lookup_on_device=True, grow_on_device=True,
                               backend=layer_backend)
        drafter.runtime.replay_graphs("auto")
        seen = []
        real_propose = drafter.propose_device_tree

        def recorded(*a, real_propose=real_propose, seen=seen, **kw):
            proposal = real_propose(*a, **kw)
            seen.append((proposal.tokens.tolist(), proposal.tree.parent_list))
            return proposal

        drafter.propose_device_tree = recorded
        target = GraphedDecoder(as_decoder(model, backend=backend))
        out = speculative_generate(target, drafter, ids, attention_mask=mask, k=6 + lookup, max_new_tokens=new,
                                   eos_token_id=[])
        assert out.sequences == ref.sequences
        proposals.append(seen)
    assert len(proposals[1]) > 2 and proposals[0] == proposals[1]
    assert calls["device_tree"] >= len(proposals[1]) and calls["grow_level"] == 3 * calls["device_tree"]


@pytest.mark.parametrize("device", DEVICES)
def test_eagle_s_step_with_its_logits_in_one_pass_is_the_step_then_the_logits(device):
    """EAGLE's draft step with its LM head's logits (the last residual add and the final norm inside the head's
    product) gives the step's outputs and the logits of them bit for bit, on a tree over recent slots, with its
    products' norms inside and apart; the draft cache written alike."""
    from helpers import random_eagle

    target = tiny_llama(layers=4, seed=0)
    g = torch.Generator().manual_seed(6)
    for fused_products in (True, False):
        backend = dataclasses.replace(_backend(device), fused_products=fused_products)
        model = random_eagle(target, draft_vocab=40).to(device)
        model.backend = backend
        hidden = torch.randn(2, 3, 32, generator=g).to(device)
        tokens = torch.randint(0, 64, (2, 3), generator=g).to(device)
        positions = torch.tensor([[7, 8, 8], [4, 5, 5]], device=device)
        tree = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], dtype=torch.bool, device=device)
        runs = []
        for both in (False, True):
            cache = model.new_cache(2, 16, torch.tensor([0, 2], device=device))
            cache.lengths.copy_(torch.tensor([9, 6]))
            with torch.no_grad():
                if both:
                    out, logits = model.step_logits(hidden, tokens, cache, positions, None, tree, 2)
                else:
                    out = model.step(hidden, tokens, cache, positions, None, tree, 2)
                    logits = model.logits(out)
            runs.append((out, logits, cache.stacked.clone()))
        assert all(torch.equal(x, y) for x, y in zip(*runs)), fused_products


class _LevelModel:
    """A stand-in draft layer for DeviceGrowth: its output depends on every input it is given (the entries' states,
    tokens, positions and tree mask), each call recorded."""

    def __init__(self, width, vocab, device):
        g = torch.Generator().manual_seed(1)
        self.head = torch.randn(width, vocab, generator=g).to(device)
        self.embed = torch.randn(vocab + 64, width, generator=g).to(device)
        self.calls = []

    def logits(self, hidden):
        return (hidden.float() @ self.head) * 3

    def step(self, inputs, tokens, cache, positions, kv_len, mask, drafted):
        self.calls.append([t.clone() for t in (inputs, tokens, positions, mask)] + [drafted])
        seen = mask.float() @ torch.arange(1.0, mask.shape[1] + 1, device=mask.device)  # [E]: whom each sees
        return torch.tanh(inputs + self.embed[tokens] + 0.1 * positions[..., None] + 0.05 * seen[None, :, None])

    def step_logits(self, *args):
        out = self.step(*args)
        return out, self.logits(out)


@pytest.mark.parametrize("device", DEVICES)
def test_eagle_s_device_tree_levels_on_the_kernels_feed_the_torch_ops_inputs(device):
    """Each level of DeviceGrowth on the step kernels (``grow_level`` before the draft forward, ``grown_level`` after)
    gives the forward the inputs, tokens, positions and tree mask the torch ops give it, and the same tree, on a draft
    layer whose output depends on all of them (batch 3, a padded row, top_k 3, two or three expanded a level)."""
    from types import SimpleNamespace

    from specdec.drafters.eagle.growth import DeviceGrowth

    for expand, depth in ((2, 4), (3, 3)):
        runs = []
        for kernels in (None, gpu_kernels):
            model = _LevelModel(16, 20, device)
            backend = SimpleNamespace(top_log_softmax=Backend().top_log_softmax, step_kernels=lambda d, k=kernels: k)
            cache = SimpleNamespace(lengths=torch.tensor([9, 12, 7], device=device), pad=torch.tensor([0, 3, 1],
                                    device=device), capacity=64)
            drafter = SimpleNamespace(model=model, backend=backend, cache=cache, top_k=3, expand=expand, depth=depth,
                                      token_ids=torch.arange(20, device=device) * 3 + 1)
            hidden = torch.randn(3, 16, generator=torch.Generator().manual_seed(2)).to(device)
            out = DeviceGrowth(drafter, 7, 0).run(None, hidden)
            assert cache.lengths.tolist() == [9, 12, 7]
            runs.append((out, model.calls))
        (out, calls), (kernel_out, kernel_calls) = runs
        assert len(calls) == len(kernel_calls) == depth - 1
        for call, kernel_call in zip(calls, kernel_calls):
            for a, b in zip(call[:4], kernel_call[:4]):
                assert a.shape == b.shape and torch.equal(a, b)
            assert call[4] == kernel_call[4]
        for a, b in zip(out, kernel_out):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_the_block_drafter_s_inputs_in_one_kernel_are_its_torch_ops(device):
    """``block_inputs`` (each row's block: the anchor's and the mask token's embeddings RMS-normed, the anchor's added
    to the mask positions, the row's context to all) equals DFlashModel.block_inputs' torch ops, every dtype, an
    embedding scaled as Gemma's too (the norm's mean summed in another order: a last bit)."""
    from helpers import random_dflash

    target = tiny_llama(layers=2, seed=0)
    for dtype in _dtypes(device):
        model = random_dflash(target).to(device, dtype)
        model.embed_weight = target.model.embed_tokens.weight.detach().to(device, dtype)
        with torch.no_grad():
            model.embed_norm.weight.uniform_(0.5, 1.5)
        anchors, last = torch.tensor([3, 60, 7], device=device), torch.randn(3, 32).to(device, dtype)
        for scale in (1.0, 32 ** 0.5):
            model.embed_scale = scale
            got = gpu_kernels.block_inputs(anchors, last, model.embed_weight, scale, model.cfg.block_size,
                                           model.cfg.mask_token_id, model.embed_norm.weight, model.embed_norm.eps)
            want = model.block_inputs(anchors, last)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, atol=_tolerance(dtype), rtol=_tolerance(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_eagle_s_layer_input_in_one_kernel_is_the_two_norms_side_by_side(device):
    """``embedded_norms`` (the token's embedding, scaled as Gemma's are, and the stream, each RMS-normed, side by
    side) equals the embedding, the two ``rms_norm`` kernels and their concatenation bit for bit in every dtype."""
    g = torch.Generator().manual_seed(3)
    for dtype in _dtypes(device):
        embed = torch.randn(50, 48, generator=g).to(device, dtype)
        stream = torch.randn(5, 48, generator=g).to(device, dtype)
        norms = [(torch.rand(48, generator=g) + 0.5).to(device, dtype) for _ in range(2)]
        tokens = torch.tensor([3, 49, 0, 3, 17], device=device)
        for scale in (1.0, 48 ** 0.5):
            embeds = F.embedding(tokens, embed)
            if scale != 1.0:
                embeds = embeds * torch.tensor(scale, dtype=dtype)
            expected = torch.cat([gpu_kernels.rms_norm(embeds, None, norms[0], 1e-6),
                                  gpu_kernels.rms_norm(stream.clone(), None, norms[1], 1e-5)], -1)
            got = gpu_kernels.embedded_norms(tokens, embed, scale, stream, norms[0], 1e-6, norms[1], 1e-5)
            assert got.dtype == dtype and torch.equal(got, expected), (dtype, scale)


@pytest.mark.parametrize("device", DEVICES)
def test_the_n_gram_lookup_in_one_kernel_is_the_torch_ops(device, monkeypatch):
    """``lookup_continuations`` (one program a row) gives ``device_continuations``' tokens and counts: rows of few
    distinct tokens (suffixes recur), left padding, the suffix found late, early or not at all, continuations cut by
    the row's end, n-grams of 1-2, 2-3 and 3-4 tokens, sequences longer than one block of slots. The n-gram drafter
    on the device takes it in its replayed graph: plain decoding's output, two left-padded rows."""
    from specdec.drafters.ngram import device_continuations

    g = torch.Generator().manual_seed(4)
    for trial in range(12):
        batch, capacity = 1 + trial % 4, (16, 40, 1500)[trial % 3]
        seq = torch.randint(0, 3 + trial % 5, (batch, capacity), generator=g)
        seq_lens = torch.randint(2, capacity + 1, (batch,), generator=g)
        pad = torch.minimum(torch.randint(0, 6, (batch,), generator=g), seq_lens - 1)
        min_ngram, max_ngram = ((1, 2), (2, 3), (3, 4))[trial % 3]
        max_tokens = (1, 4, 7)[trial % 3]
        args = [t.to(device) for t in (seq, seq_lens, pad)] + [max_tokens, max_ngram, min_ngram]
        expected = device_continuations(*args)
        got = gpu_kernels.lookup_continuations(*args)
        for a, b in zip(got, expected):
            assert torch.equal(a, b), (trial, a, b)
        assert trial < 6 or expected[1].sum() > 0 or batch == 1
    from specdec.jobs.data import left_pad

    calls = collections.Counter()
    real = gpu_kernels.lookup_continuations
    monkeypatch.setattr(gpu_kernels, "lookup_continuations", lambda *a: calls.update(["lookup"]) or real(*a))
    backend = _step_kernels_on(monkeypatch, device, True)
    model = tiny_llama(layers=2, seed=0).to(device)
    ids, mask = (t.to(device) for t in left_pad([[5, 9, 3, 5, 9, 3, 5, 9], [4, 4, 6, 4, 4]]))
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    drafter = NgramDrafter(on_device=True, device=device, backend=backend)
    drafter.runtime.replay_graphs("auto")
    out = speculative_generate(GraphedDecoder(as_decoder(model, backend=backend)), drafter, ids, attention_mask=mask,
                               k=3, max_new_tokens=12, eos_token_id=[])
    assert out.sequences == ref.sequences and calls["lookup"] >= out.stats.target_forwards
