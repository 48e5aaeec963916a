"""specdec's few-row CPU kernel (specdec/csrc/cpu_kernels.cpp): equal to torch's product, rows
bit-identical whatever their number, the forward's paths around it, and the fallback when it cannot be built."""

import logging
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import coded_weight, tiny_llama

from specdec.models import Backend, as_decoder, cpu_kernels
from specdec.models.compact import _rotate_half

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason="specdec's CPU kernel is not built here "
                                  "(not x86 with AVX2, no compiler, or SPECDEC_CPU_KERNEL=0)")
TORCH_OPS = Backend(kernels=False)  # torch's ops over oneDNN's products


@pytest.fixture(params=["avx2", "avx512"])
def isa(request):
    """The product's instruction set for the test: each one this CPU has, the default restored afterwards."""
    kernels = cpu_kernels.module()
    before = kernels.product_isa()
    try:
        kernels.product_isa(request.param)
    except RuntimeError:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    kernels.product_isa(before)


def _product(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x · weightᵀ (+ bias) through one of the kernel's two products: over the row-major weight, or over it
    packed in panels (what the compact forward uses)."""
    if kind == "rows":
        return cpu_kernels.few_rows_linear(x, weight, bias)
    return cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), bias, weight.shape[0])


@needs_kernel
@pytest.mark.parametrize("kind", ["rows", "panels"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 25, 32])
@pytest.mark.parametrize("shape", [(40, 24), (3, 577), (1001, 576), (64, 1536)])  # [N, K]: tails in N and in K
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_torch(kind, rows, shape, bias, isa):
    torch.manual_seed(rows)
    weight = torch.randn(*shape)
    b = torch.randn(shape[0]) if bias else None
    x = torch.randn(rows, shape[1])
    out = _product(kind, x, weight, b)
    assert out.shape == (rows, shape[0])
    assert torch.allclose(out, F.linear(x.double(), weight.double(), None if b is None else b.double()).float(),
                          atol=1e-4, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kind", ["rows", "panels"])
def test_kernel_rows_are_bit_identical_whatever_their_number(kind, isa):
    """A row's product does not depend on the rows computed with it: a verification step's linear layers give,
    for each position, the bits a one-token decode step gives."""
    weight, bias, x = torch.randn(203, 577), torch.randn(203), torch.randn(32, 577)
    full = _product(kind, x, weight, bias)
    for start, count in [(0, 1), (5, 1), (31, 1), (3, 2), (4, 3), (1, 4), (7, 5), (2, 6), (0, 16), (9, 23)]:
        assert torch.equal(_product(kind, x[start:start + count], weight, bias), full[start:start + count])


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 12, 13, 32])
@pytest.mark.parametrize("shape", [(40, 24), (3, 577), (1001, 576)])  # [N, K]: tails in N and in K
def test_float16_panels_give_the_float32_bits_of_the_same_values(rows, shape, isa):
    """Panels packed in float16 (half the bytes to stream) give bit for bit the float32 panels' product for a
    weight float16 holds exactly: the kernel widens each value exactly before the same multiply-adds."""
    torch.manual_seed(rows)
    weight = torch.randn(*shape).half().float()
    x, bias = torch.randn(rows, shape[1]), torch.randn(shape[0])
    panels = cpu_kernels.pack_panels(weight, half=True)
    assert panels.dtype == torch.float16 and cpu_kernels.exact_in_half(weight)
    assert torch.equal(cpu_kernels.panel_linear(x, panels, bias, shape[0]),
                       cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), bias, shape[0]))


@needs_kernel
@torch.no_grad()
def test_the_forward_packs_float16_panels_only_for_weights_float16_holds_exactly():
    exact, other = torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(24, 40, bias=False)
    exact.weight.copy_(exact.weight.half().float())
    other.weight.copy_(exact.weight)
    other.weight[3, 5] += 1e-4  # one value float16 cannot hold
    x = torch.randn(4, 24)
    for half in (True, False):
        backend = Backend(half_panels=half)
        assert backend.prepare((exact,), x)[0].dtype == (torch.float16 if half else torch.float32)
        assert backend.prepare((other,), x)[0].dtype == torch.float32
        assert torch.equal(backend.linear(x, exact), cpu_kernels.panel_linear(
            x, cpu_kernels.pack_panels(exact.weight), None, 40))


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 12, 13, 32])
@pytest.mark.parametrize("shape", [(40, 64), (1001, 576), (64, 1536)])  # [N, K]: a tail in N
def test_coded_panels_give_the_float32_bits_of_the_same_values(bits, rows, shape, isa):
    """A weight held as 4- or 8-bit codes with per-block scales (what a dequantised GGUF model is) packs as
    codes, 0.75 or 1.125 bytes a weight, and the product over them is bit for bit the float32 panels' one: the
    kernel widens the codes to the very values, in registers for one group of rows, once per block for several."""
    torch.manual_seed(rows)
    weight = coded_weight(shape, bits, seed=rows)
    x, bias = torch.randn(rows, shape[1]), torch.randn(shape[0])
    panels = cpu_kernels.pack_codes(weight)
    assert panels is not None and panels.dtype == (torch.uint8 if bits == 4 else torch.int8)
    assert panels.numel() == -(-shape[0] // 32) * shape[1] * 32 * (0.75 if bits == 4 else 1.125)
    assert torch.equal(cpu_kernels.panel_linear(x, panels, bias, shape[0]),
                       cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), bias, shape[0]))


@needs_kernel
def test_only_weights_the_codes_give_back_exactly_are_packed_as_codes():
    assert cpu_kernels.pack_codes(torch.randn(64, 64)) is None  # trained float32 values
    assert cpu_kernels.pack_codes(coded_weight((64, 64), 4)[:, :40].contiguous()) is None  # K not whole blocks
    for bits in (4, 8):
        weight = coded_weight((64, 128), bits)
        assert cpu_kernels.pack_codes(weight) is not None
        weight[40, 100] = torch.nextafter(weight[40, 100], torch.tensor(1.0))  # one value one step off
        assert cpu_kernels.pack_codes(weight) is None
    constant = torch.zeros(32, 64)
    constant[:, 32:] = 0.5  # blocks of one value: scale 0
    assert torch.equal(cpu_kernels.panel_linear(torch.ones(2, 64), cpu_kernels.pack_codes(constant), None, 32),
                       torch.full((2, 32), 16.0))


@pytest.mark.parametrize("bits", [4, 8])
def test_rounded_weights_are_codes_within_half_a_step(bits):
    """``round_to_codes`` (``drafter.weight_bits``) gives the nearest values :func:`pack_codes` takes back
    exactly, each at most half its block's step from the trained value; codes stay codes."""
    torch.manual_seed(bits)
    weight = torch.randn(70, 96) * torch.rand(70, 1)
    weight[3, 32:64] = 0.0  # a block of one value
    rounded = cpu_kernels.round_to_codes(weight, bits)
    assert rounded.shape == weight.shape and not torch.equal(rounded, weight)
    blocks, trained = rounded.view(-1, 32), weight.view(-1, 32)
    if bits == 4:
        step = (trained.amax(-1) - trained.amin(-1)) / 15
        assert torch.equal(blocks.amin(-1), trained.amin(-1))
    else:
        step = trained.abs().amax(-1) / 127
    assert ((blocks - trained).abs().amax(-1) <= step * 0.5 * (1 + 2 ** -9) + 1e-12).all()
    panels = cpu_kernels.pack_codes(rounded)
    assert panels is not None and panels.dtype == (torch.uint8 if bits == 4 else torch.int8)
    assert torch.equal(cpu_kernels.round_to_codes(rounded, bits), rounded)
    coded = coded_weight((64, 64), bits)
    assert torch.equal(cpu_kernels.round_to_codes(coded, bits), coded)


def test_rounding_to_codes_names_what_it_cannot_do():
    with pytest.raises(ValueError, match="4 or 8 bits, got 3"):
        cpu_kernels.round_to_codes(torch.randn(4, 64), 3)
    with pytest.raises(ValueError, match="multiple of 32, got 40"):
        cpu_kernels.round_to_codes(torch.randn(4, 40), 8)


@needs_kernel
@torch.no_grad()
def test_the_forward_streams_a_dequantised_model_as_its_codes():
    """A tiny Llama whose weights are 4-bit codes (the layers) and 8-bit codes (the LM head), as the embedded
    SmolLM2 target's are: on a backend of weights "codes" its products read coded panels, and its logits are bit
    for bit those of a backend of weights "float" (float32 panels), for a one-token step and a verification
    block, two decoders over the one model."""
    model = tiny_llama(layers=2, seed=4)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.copy_(coded_weight(tuple(module.weight.shape), 8 if name == "lm_head" else 4,
                                              seed=len(name)))
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 4, 4, 6]])
    logits = {}
    for coded in (True, False):
        backend = Backend(weights="codes" if coded else "float")
        decoder = as_decoder(model, backend=backend)
        kinds = {backend.prepare((layer,), torch.zeros(1, layer.in_features))[0].dtype
                 for layer in (model.model.layers[0].mlp.down_proj, model.lm_head)}
        assert kinds == ({torch.uint8, torch.int8} if coded else {torch.float32})
        cache, steps = decoder.new_cache(1, 16, torch.zeros(1, dtype=torch.long)), []
        for start, end in ((0, 7), (7, 8), (8, 10)):  # a prefill, a one-token step, a verification block
            steps += decoder(ids[:, start:end], cache)
            cache.commit(torch.full((1,), end - start))
        logits[coded] = steps
        down_panels = decoder._layer_plan()[0][0].down[0][0]  # the fused forward's plan, packed for its backend
        assert down_panels.dtype == (torch.uint8 if coded else torch.float32)
    for coded_step, float_step in zip(logits[True], logits[False]):
        assert torch.equal(coded_step, float_step)


@needs_kernel
def test_the_embedded_target_is_streamed_as_codes(real_target):
    """SmolLM2-135M-Instruct ships as a Q4_1 GGUF (a Q8_0 embedding): dequantised, its layers' weights are
    4-bit codes and its tied LM head 8-bit codes, exactly, so it streams ~112 MB a token instead of 538."""
    model, _ = real_target
    layer = model.model.layers[0]
    with torch.no_grad():
        for weight, kind in ((torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                                         layer.self_attn.v_proj.weight]), torch.uint8),
                             (layer.mlp.down_proj.weight, torch.uint8), (model.lm_head.weight, torch.int8)):
            panels = cpu_kernels.pack_codes(weight)
            assert panels is not None and panels.dtype == kind
            x = torch.randn(13, weight.shape[1])
            assert torch.equal(cpu_kernels.panel_linear(x, panels, None, weight.shape[0]),
                               cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), None, weight.shape[0]))


@needs_kernel
@torch.no_grad()
def test_rows_product_reads_a_lasting_coded_weight_from_its_codes():
    """Medusa's product over the target's LM-head rows: a weight that is codes is read from coded panels from
    its second use on (a tensor made for one call is never packed), packed again after an in-place update, and
    not at all on a backend of weights "float"; a backend without kernels leaves the product to its caller."""
    weight, x = coded_weight((64, 96), 8), torch.randn(3, 96)
    for scale in (1.0, 2.0):
        weight.mul_(scale)  # an in-place update: packed anew
        assert torch.equal(Backend().rows_product(x, weight), cpu_kernels.few_rows_linear(x, weight, None))
        assert torch.equal(Backend().rows_product(x, weight),
                           cpu_kernels.panel_linear(x, cpu_kernels.pack_codes(weight), None, 64))
        assert cpu_kernels._CODED_ROWS[id(weight)][2].dtype == torch.int8
    del cpu_kernels._CODED_ROWS[id(weight)]
    for _ in range(2):
        assert torch.equal(Backend(weights="float").rows_product(x, weight),
                           cpu_kernels.few_rows_linear(x, weight, None))
    assert id(weight) not in cpu_kernels._CODED_ROWS
    assert TORCH_OPS.rows_product(x, weight) is None
    Backend().rows_product(x, weight)
    key = id(weight)
    del weight
    assert key not in cpu_kernels._CODED_ROWS  # forgotten with the weight


@needs_kernel
def test_panel_linear_refuses_a_mismatched_packing():
    weight, x = torch.randn(40, 24), torch.randn(3, 24)
    with pytest.raises(RuntimeError, match="panels"):
        cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), None, 80)  # 2 panels hold 64 outputs at most
    with pytest.raises(RuntimeError, match="panels"):
        cpu_kernels.panel_linear(torch.randn(3, 25), cpu_kernels.pack_panels(weight), None, 40)
    coded = cpu_kernels.pack_codes(coded_weight((40, 64), 4))
    with pytest.raises(RuntimeError, match="panels"):
        cpu_kernels.panel_linear(torch.randn(3, 96), coded, None, 40)  # codes for K = 64


@needs_kernel
@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 5, cpu_kernels.MAX_ROWS + 3])  # past MAX_ROWS: oneDNN over the same weight
def test_linear_and_stacked_linears_through_the_kernel(rows):
    backend = Backend()
    layers = (torch.nn.Linear(24, 40), torch.nn.Linear(24, 8), torch.nn.Linear(24, 8))
    x = torch.randn(2, rows, 24)
    prepared = backend.prepare(layers, x)
    assert prepared is not None and not prepared[2]  # a plain stacked weight, not a packed one
    outs = backend.linears(x, layers)
    assert [tuple(o.shape) for o in outs] == [(2, rows, 40), (2, rows, 8), (2, rows, 8)]
    for out, layer in zip(outs, layers):
        assert torch.allclose(out, layer(x), atol=1e-5)
    layers[1].weight.mul_(3)  # an in-place update restacks the group
    assert torch.allclose(backend.linears(x, layers)[1], layers[1](x), atol=1e-5)
    assert torch.allclose(backend.linear(x, layers[0]), layers[0](x), atol=1e-5)
    # past MAX_ROWS without oneDNN: the plain product
    assert torch.allclose(Backend(onednn=False).linear(x, layers[0]), layers[0](x), atol=1e-5)


@needs_kernel
@torch.no_grad()
def test_forward_with_the_kernel_matches_onednn(tiny_target):
    """The compact forward, kernel on vs off (oneDNN's packed products): the same logits to float32 rounding,
    and greedy decoding gives the same tokens."""
    from specdec import autoregressive_generate

    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 1]])
    runs = {}
    for on in (True, False):
        decoder = as_decoder(tiny_target, backend=Backend(kernels=on))
        cache = decoder.new_cache(1, 64, torch.zeros(1, dtype=torch.long))
        logits, _ = decoder(ids, cache)
        runs[on] = logits, autoregressive_generate(decoder, ids, max_new_tokens=12, eos_token_id=[]).sequences
    assert torch.allclose(runs[True][0], runs[False][0], atol=1e-5)
    assert runs[True][1] == runs[False][1]


def test_a_kernel_that_cannot_be_built_falls_back_with_a_warning(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(cpu_kernels, "supported", lambda: True)
    monkeypatch.setattr(cpu_kernels, "_state", "untried")
    monkeypatch.setattr(cpu_kernels, "_module", None)
    monkeypatch.delenv("SPECDEC_CPU_KERNEL", raising=False)
    with pytest.warns(RuntimeWarning, match="could not be built.*Ninja is required.*pip install ninja"):
        assert not cpu_kernels.available()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not at every layer
        assert not cpu_kernels.available()
        layer = torch.nn.Linear(24, 40)
        x = torch.randn(1, 3, 24)
        with torch.no_grad():
            assert torch.allclose(Backend().linear(x, layer), layer(x), atol=1e-5)


def test_each_content_of_the_sources_builds_in_its_own_directory_under_torch_extensions_dir(
        monkeypatch, tmp_path):
    """TORCH_EXTENSIONS_DIR moves the build, and a changed header (which torch alone does not track) gets a
    build of its own instead of loading the stale one."""
    from torch.utils import cpp_extension

    directories = []

    def load(name, sources, build_directory, **kwargs):
        directories.append(Path(build_directory))
        raise RuntimeError("stopped before compiling")

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(cpu_kernels, "supported", lambda: True)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.delenv("SPECDEC_CPU_KERNEL", raising=False)
    header = tmp_path / "attention.h"
    for content in ("// one", "// two"):
        header.write_text(content)
        monkeypatch.setattr(cpu_kernels, "HEADERS", (*cpu_kernels.HEADERS[:-1], header))
        monkeypatch.setattr(cpu_kernels, "_state", "untried")
        with pytest.warns(RuntimeWarning, match="could not be built"):
            assert not cpu_kernels.available()
    assert [path.parent.parent for path in directories] == [tmp_path / "extensions"] * 2
    assert directories[0] != directories[1] and all(torch.__version__.split("+")[0] in p.name for p in directories)


def test_two_checkouts_with_the_same_sources_share_one_build(monkeypatch, tmp_path):
    """The sources are compiled from a copy in the build directory, so the build command (which ninja rebuilds
    on whenever it changes) does not depend on where the checkout is: two clones share one build."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    staged = []
    for clone in ("a", "b"):
        copies = [tmp_path / clone / path.name for path in (cpu_kernels.SOURCE, *cpu_kernels.HEADERS)]
        for original, copy in zip((cpu_kernels.SOURCE, *cpu_kernels.HEADERS), copies):
            copy.parent.mkdir(exist_ok=True)
            copy.write_bytes(original.read_bytes())
        monkeypatch.setattr(cpu_kernels, "SOURCE", copies[0])
        monkeypatch.setattr(cpu_kernels, "HEADERS", tuple(copies[1:]))
        staged.append(cpu_kernels._staged_source())
    assert staged[0] == staged[1] and staged[0].read_bytes() == cpu_kernels.SOURCE.read_bytes()
    assert sorted(p.name for p in staged[0].parent.iterdir()) == sorted(
        p.name for p in (cpu_kernels.SOURCE, *cpu_kernels.HEADERS))


@pytest.mark.parametrize("built", [False, True])
def test_the_build_is_announced_only_when_the_kernels_are_built(built, monkeypatch, tmp_path, caplog):
    """The "building ... ~40-90 s" line appears where torch will compile the kernels, not where their build directory
    already holds the library (every run after the first), which torch only loads."""
    from torch.utils import cpp_extension

    loaded = object()
    monkeypatch.setattr(cpp_extension, "load", lambda *args, **kwargs: loaded)
    monkeypatch.setattr(cpu_kernels, "supported", lambda: True)
    monkeypatch.setattr(cpu_kernels, "_ninja_on_path", lambda: None)
    monkeypatch.setattr(cpu_kernels, "_staged_source", lambda: tmp_path / cpu_kernels.SOURCE.name)
    monkeypatch.setattr(cpu_kernels, "_state", "untried")
    monkeypatch.setattr(cpu_kernels, "_module", None)
    monkeypatch.delenv("SPECDEC_CPU_KERNEL", raising=False)
    if built:
        (tmp_path / f"{cpu_kernels.NAME}{cpp_extension.LIB_EXT}").write_bytes(b"")
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        assert cpu_kernels.available() and cpu_kernels.module() is loaded
    assert ("building specdec's CPU kernels" in caplog.text) == (not built)


@torch.no_grad()
def test_kernels_are_never_built_for_a_backend_without_them_or_where_the_environment_skips_them(monkeypatch,
                                                                                                tiny_target):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("built although switched off"))
    monkeypatch.setattr(cpu_kernels, "_state", "untried")
    monkeypatch.setattr(cpu_kernels, "_module", None)
    decoder = as_decoder(tiny_target, backend=TORCH_OPS)
    ids = torch.tensor([[5, 9, 3, 7]])
    decoder(ids, decoder.new_cache(1, 8, torch.zeros(1, dtype=torch.long)))
    logits = torch.randn(2, 50)
    assert torch.equal(TORCH_OPS.top_log_softmax(logits, 3)[1], logits.topk(3).indices)
    assert TORCH_OPS.rows_product(torch.randn(2, 24), torch.randn(40, 24)) is None
    assert cpu_kernels._state == "untried"  # nothing asked for them
    monkeypatch.setenv("SPECDEC_CPU_KERNEL", "0")
    assert not cpu_kernels.available() and not Backend().fusable(torch.zeros(1, 4))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_fused_small_ops_match_torch(rows):
    """The C++ RMSNorm (after the residual add), SiLU·up and rotary embedding against the torch formulas of
    transformers' Llama."""
    kernels = cpu_kernels.module()
    torch.manual_seed(rows)
    hidden, eps = 577, 1e-5
    stream, delta, weight = torch.randn(rows, hidden), torch.randn(rows, hidden), torch.randn(hidden)
    expected_stream = stream + delta
    variance = expected_stream.pow(2).mean(-1, keepdim=True)
    expected = weight * (expected_stream * torch.rsqrt(variance + eps))
    normed = kernels.rms_norm(stream, delta, weight, eps)
    assert torch.equal(stream, expected_stream)  # the residual add, in place
    assert torch.allclose(normed, expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(kernels.rms_norm(stream, None, weight, eps), expected, atol=1e-5, rtol=1e-5)

    for width in (40, 1536 + 5):  # vector body (8 at a time), then a tail
        gate_up = torch.randn(rows, 2 * width) * torch.tensor([1.0, 10.0, 100.0]).repeat_interleave(
            -(-2 * width // 3))[:2 * width]  # small, large and saturating gates, both signs
        gate_up[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])
        gate, up = gate_up.split(width, -1)
        expected = (F.silu(gate.double()) * up.double()).float()
        assert torch.allclose(kernels.silu_mul(gate_up), expected, atol=1e-6, rtol=1e-6)

    for heads, kv_heads, dim in ((3, 1, 8), (9, 3, 64), (2, 1, 52)):  # scalar pairs; 8 at a time; both
        qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim)
        cos, sin = torch.randn(rows, dim), torch.randn(rows, dim)
        q, k, v = kernels.rope_qkv(qkv, cos, sin, heads, kv_heads)
        ref_q, ref_k, ref_v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
        for got, ref, count in ((q, ref_q, heads), (k, ref_k, kv_heads)):
            ref = ref.view(rows, count, dim)
            rotated = ref * cos[:, None] + _rotate_half(ref) * sin[:, None]
            assert torch.equal(got, rotated)  # the same products and sums as torch's, in the same order
        assert torch.equal(v, ref_v.view(rows, kv_heads, dim))


@needs_kernel
@pytest.mark.parametrize("rows, vocab, k", [(1, 8192, 4), (4, 8192, 4), (3, 37, 5), (2, 8, 8), (2, 1000, 20),
                                            (1, 5, 1)])
def test_top_log_softmax_is_torch_s_log_softmax_topk(rows, vocab, k):
    """The drafter's top-k of log-softmax: the same indices as torch's (vector body, tail, k = V, k > 8) and
    the values to float32 rounding; equal values give the smaller index first; the wrapper takes [..., V]
    and falls back to torch's ops where the kernel does not apply (autograd)."""
    torch.manual_seed(vocab + k)
    logits = torch.randn(rows, vocab) * 4
    logits[0, -1] = 30.0  # the largest at the last index (a tail's)
    logits[-1, min(k, vocab - 2)] = 29.0  # and just past the first k
    values, indices = cpu_kernels.module().top_log_softmax(logits, k)
    top = logits.log_softmax(-1).topk(k)
    assert torch.equal(indices, top.indices)
    assert torch.allclose(values, top.values, atol=2e-6, rtol=1e-6)
    ties = torch.zeros(2, vocab)
    ties[:, vocab // 2:] = 1.0  # the larger values in the second half, all equal
    expected = list(range(vocab // 2, vocab // 2 + min(k, vocab - vocab // 2)))
    expected += list(range(k - len(expected)))
    assert cpu_kernels.module().top_log_softmax(ties, k)[1].tolist() == [expected] * 2
    batched = logits.view(rows, 1, vocab).expand(rows, 3, vocab)  # not contiguous: copied
    wrapped = cpu_kernels.top_log_softmax(batched, k)
    assert wrapped[1].shape == (rows, 3, k) and torch.equal(wrapped[1][:, 1], indices)
    grad = logits.clone().requires_grad_()
    values_grad, _ = cpu_kernels.top_log_softmax(grad, k)
    assert values_grad.requires_grad  # torch's ops, differentiable


@needs_kernel
@torch.no_grad()
@pytest.mark.parametrize("last_only", [False, True])
def test_fused_forward_matches_the_unfused_one(last_only):
    """The forward with the fused C++ small ops (kernel on) against torch's ops over oneDNN (kernel off):
    batch 2 left-padded, a prefill then a verification block, the captured hidden states EAGLE reads."""
    from specdec.jobs.data import left_pad

    model = tiny_llama(layers=3, seed=3)
    ids, mask = left_pad([[5, 9, 3, 7, 11, 2, 8], [4, 4, 6]])
    results = {}
    for on in (True, False):
        decoder = as_decoder(model, backend=Backend(kernels=on))
        assert (decoder._fused(torch.zeros(1, 1, 32)) is not None) is on
        cache = decoder.new_cache(2, 32, (mask == 0).sum(1))
        first = decoder(ids, cache, last_only=last_only, capture=(0, 1, 3))
        cache.commit(torch.full((2,), ids.shape[1]))
        second = decoder(torch.tensor([[1, 2, 3], [7, 8, 9]]), cache, capture=(2,))
        results[on] = first + second
    for fused, unfused in zip(results[True], results[False]):
        assert fused.shape == unfused.shape
        assert torch.allclose(fused, unfused, atol=1e-5)


def _tree_mask(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: node i sees node j when j is i or one of its ancestors (parents[i] = -1: a root child)."""
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i, parent in enumerate(parents):
        while parent >= 0:
            mask[i, parent] = True
            parent = parents[parent]
    return mask


@needs_kernel
@pytest.mark.parametrize("parents,recent", [(None, 0), ([-1], 0), ([-1, 0, -1, 2, 1, 1], 0), ([-1], 4),
                                            ([-1, 0, -1, 2], 3)], ids=["chain", "one", "tree", "one-recent",
                                                                       "tree-recent"])
@pytest.mark.parametrize("dim", [16, 24, 64, 128])  # vector paths (16, 64, 128) and the scalar loop (24)
def test_cache_attention_matches_the_cache_write_and_masked_sdpa(parents, recent, dim, isa):
    """The C++ step attention writes the cache as KVCache.write does and attends as SDPA does under
    KVCache.attention_mask: 3 rows with their own committed lengths and left padding, chain or tree, and a
    tree whose mask decides the last few committed slots too (EAGLE's drafting: each new entry sees the
    draft entries of its ancestors only)."""
    from specdec.models.cache import KVCache

    torch.manual_seed(len(parents or []) + recent)
    batch, heads, kv_heads, capacity = 3, 6, 2, 40
    t = 4 if parents is None else len(parents)
    tree = None if parents is None else _tree_mask(parents)
    if recent:  # each new token sees a different subset of the recent slots
        tree = torch.cat([torch.rand(t, recent) < 0.5, tree], 1)
    caches = [KVCache.allocate(1, batch, kv_heads, capacity, dim, torch.tensor([0, 3, 5]), dtype=torch.float32,
                               device=torch.device("cpu")) for _ in range(2)]
    contents = torch.randn(2, batch, kv_heads, capacity, dim)
    for cache in caches:  # the same committed contents in both
        cache.keys[0].copy_(contents[0])
        cache.values[0].copy_(contents[1])
        cache.commit(torch.tensor([9, 20, 5]))  # row 2: padding only, nothing real committed yet
    q, k, v = torch.randn(batch * t, heads, dim), torch.randn(batch * t, kv_heads, dim), torch.randn(batch * t, kv_heads, dim)
    out = cpu_kernels.module().cache_attention(q, k, v, caches[0].keys[0], caches[0].values[0], caches[0].lengths,
                                               caches[0].pad, tree, recent)
    kv_len = 20 + t
    keys, values = caches[1].write(0, k.view(batch, t, kv_heads, dim).transpose(1, 2),
                                   v.view(batch, t, kv_heads, dim).transpose(1, 2), kv_len)
    mask = caches[1].attention_mask(t, kv_len, tree, recent)
    expected = F.scaled_dot_product_attention(q.view(batch, t, heads, dim).transpose(1, 2), keys, values,
                                              attn_mask=mask, enable_gqa=True)
    assert torch.equal(caches[0].keys[0], caches[1].keys[0]) and torch.equal(caches[0].values[0], caches[1].values[0])
    assert torch.allclose(out, expected.transpose(1, 2).reshape(batch * t, heads * dim), atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("parents", [None, [-1, 0, -1, 2, 1, 1]], ids=["chain", "tree"])
@pytest.mark.parametrize("dim", [24, 64])
def test_cache_attention_gives_a_verified_position_the_bits_of_a_one_token_step(parents, dim, isa):
    """Each query of a step over its ancestors equals, bit for bit, a one-token step made after those
    ancestors were committed one by one: verification scores a position exactly as plain decoding does."""
    from specdec.models.cache import KVCache

    torch.manual_seed(11)
    heads, kv_heads, capacity = 4, 2, 48
    t = 5 if parents is None else len(parents)
    parents = parents or [i - 1 for i in range(t)]
    new_cache = lambda: KVCache.allocate(1, 1, kv_heads, capacity, dim, torch.tensor([2]), dtype=torch.float32,
                                         device=torch.device("cpu"))
    step = new_cache()
    history = torch.randn(1, kv_heads, capacity, dim)
    step.keys[0].copy_(history)
    step.values[0].copy_(history.flip(-1))
    step.commit(torch.tensor([30]))  # 28 slots from the pad on: several score blocks
    q, k, v = torch.randn(t, heads, dim), torch.randn(t, kv_heads, dim), torch.randn(t, kv_heads, dim)
    kernels = cpu_kernels.module()
    out = kernels.cache_attention(q, k, v, step.keys[0].clone(), step.values[0].clone(), step.lengths, step.pad,
                                  _tree_mask(parents))
    for node in range(t):
        path = [node]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        alone = new_cache()
        alone.keys[0].copy_(step.keys[0])
        alone.values[0].copy_(step.values[0])
        alone.commit(step.lengths)
        for j in path:  # one-token steps along the path, each committed
            single = kernels.cache_attention(q[j:j + 1], k[j:j + 1], v[j:j + 1], alone.keys[0], alone.values[0],
                                             alone.lengths, alone.pad, None)
            alone.commit(torch.tensor([1]))
        assert torch.equal(single, out[node:node + 1])


@needs_kernel
@torch.no_grad()
def test_the_fused_forward_follows_weight_updates_and_replaced_layers():
    """The fused forward's per-layer plan (stacked weights, norms) is rebuilt when a weight changes in place, a
    parameter or a layer is replaced: each forward equals the torch-op forward over the weights of that moment."""
    model = tiny_llama(layers=2, seed=5)
    decoders = {fused: as_decoder(model, backend=Backend(kernels=fused)) for fused in (True, False)}
    ids = torch.tensor([[3, 1, 4, 1, 5]])

    def logits(fused: bool) -> torch.Tensor:
        decoder = decoders[fused]
        cache = decoder.new_cache(1, 16, torch.zeros(1, dtype=torch.long))
        return decoder(ids, cache)[0]

    assert torch.allclose(logits(True), logits(False), atol=1e-5)
    layer = model.model.layers[1]
    changes = [lambda: layer.mlp.up_proj.weight.mul_(-2.0),  # stacked with gate_proj: a copy to rebuild
               lambda: layer.post_attention_layernorm.weight.add_(0.5),
               lambda: setattr(layer.self_attn, "o_proj", torch.nn.Linear(32, 32, bias=False)),
               lambda: setattr(layer.self_attn.q_proj, "weight", torch.nn.Parameter(torch.randn(32, 32)))]
    for change in changes:
        before = logits(True)
        change()
        after = logits(True)
        assert not torch.allclose(before, after)
        assert torch.allclose(after, logits(False), atol=1e-5)
