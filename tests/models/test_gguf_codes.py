"""Weights of GGUF's K-quants and Q5_0 (Gemma-3-270M's Q4_K_M file), dequantised by gguf-py as transformers loads
them, stream as codes (``cpu_kernels.pack_codes``): found from the float32 values alone, with float32 scales, and
the products over them bit for bit those over the float32 weight; a weight the codes do not give back exactly
keeps float panels."""

import pytest
import torch
from helpers import coded_weight, gguf_weight

from specdec.models import cpu_kernels

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason="specdec's CPU kernel is not built here "
                                  "(not x86 with AVX2, no compiler, or SPECDEC_CPU_KERNEL=0)")
SHAPE = (96, 512)  # [N, K]: three panels, two Q4_K / Q6_K superblocks a row


def _float_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # x [M, K] -> [M, N]
    return cpu_kernels.panel_linear(x, cpu_kernels.pack_panels(weight), None, weight.shape[0])


@needs_kernel
@pytest.mark.parametrize("kind, bits", [("Q4_K", 4), ("Q5_0", 8), ("Q6_K", 8)])
def test_gguf_weights_pack_as_codes_and_give_the_float32_products(kind, bits):
    """Q4_K (scale d · sc, a float32 product; offset -dmin · m), Q5_0 (codes -16..15) and Q6_K with one scale per
    block of 32 (codes -32..31, scale d · sc): each packs as codes, 0.75 or 1.125 bytes a weight, including blocks
    without code 0, with negative or zero scales, and its products are the float32 ones bit for bit."""
    weight = gguf_weight(SHAPE, kind, seed=bits, one_scale_per_32=True)
    blocks = weight.view(-1, 32)
    if kind == "Q4_K":  # the cases the fit must not assume away are there
        decreasing = blocks[:, 0] > blocks[:, 1]
        assert decreasing.any() and (blocks.amax(-1) == blocks.amin(-1)).any()
    panels = cpu_kernels.pack_codes(weight)
    assert panels is not None and panels.dtype == (torch.uint8 if bits == 4 else torch.int8)
    assert panels.numel() == weight.numel() * (0.75 if bits == 4 else 1.125)
    for rows in (1, 13):
        x = torch.randn(rows, SHAPE[1], generator=torch.Generator().manual_seed(rows))
        assert torch.equal(cpu_kernels.panel_linear(x, panels, None, SHAPE[0]), _float_product(x, weight))


def test_q4_k_offsets_are_found_where_they_are_not_the_block_minimum():
    """The fit gives back every value of a Q4_K weight, whose scales are no float16 values, and of a Q4_K block
    without code 0 whose offset (-dmin · m, some 220 of its steps from zero) cannot be stood in for by its minimum:
    the sums round, so no scale with the minimum as offset gives every value back."""
    weight = gguf_weight(SHAPE, "Q4_K", seed=4)
    scale, offset, codes = cpu_kernels._fit_codes(weight.view(-1, 32), 4)
    assert torch.equal(scale * codes + offset, weight.view(-1, 32))
    assert ((scale * codes).double() == scale.double() * codes.double()).all()  # one rounding, as the FMA's
    assert not torch.equal(scale.half().float(), scale)
    d, sc, dmin, m = torch.tensor([0.0038471221923828125, 61.0, 1.154296875, 45.0])  # d, dmin float16 values
    codes = torch.tensor([[7, 3, 3, 11, 11, 8, 9, 2, 3, 6, 3, 4, 8, 15, 12, 13, 9, 15, 10, 9, 14, 9, 4, 2, 1, 13, 13,
                           13, 1, 13, 15, 10]], dtype=torch.float32)
    block = (d * sc) * codes - dmin * m  # gguf-py's Q4_K arithmetic, in float32
    scale, offset, found = cpu_kernels._fit_codes(block, 4)
    assert torch.equal(scale * found + offset, block) and offset.item() != block.min().item()
    weight = block.repeat(32, 1)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cpu_kernels.panel_linear(x, cpu_kernels.pack_codes(weight), None, 32), _float_product(x, weight))


def test_a_weight_one_value_off_keeps_float_panels():
    for kind, bits in (("Q4_K", 4), ("Q5_0", 8), ("Q6_K", 8)):
        weight = gguf_weight(SHAPE, kind, seed=3, one_scale_per_32=True)
        assert cpu_kernels.pack_codes(weight) is not None
        weight[70, 300] = torch.nextafter(weight[70, 300], torch.tensor(1.0))  # one value one step off
        assert cpu_kernels.pack_codes(weight) is None, kind


def test_the_quick_test_for_codes_rules_out_float_weights_and_never_a_coded_one():
    """``_may_be_codes`` (which spares a float weight the ~130 scales its fits would try) holds on every block of
    weights that pack as codes, whatever their largest code (Q5_0's 15, Q6_K's 31, Q8_0's 127, a scale too small
    for float16), and rules out trained float32 values (a weight a step off is the exact fit's to refuse, below)."""
    g = torch.Generator().manual_seed(5)
    tiny = coded_weight((64, 64), 8) * 2.0 ** -30  # float32 scales below float16's smallest
    # 4-bit codes 2..11 (neither end reached) with a float32 scale far below the offset: sums rounded near the span
    far = (torch.randint(2, 12, (64, 2, 32), generator=g) * 1e-3 + 1000.0).view(64, 64)
    for weight, bits in ((gguf_weight(SHAPE, "Q4_K", seed=1, one_scale_per_32=True), 4), (coded_weight(SHAPE, 8), 8),
                         (gguf_weight(SHAPE, "Q5_0", seed=2, one_scale_per_32=True), 8), (tiny, 8), (far, 4),
                         (gguf_weight(SHAPE, "Q6_K", seed=3, one_scale_per_32=True), 8), (coded_weight(SHAPE, 4), 4)):
        assert cpu_kernels.pack_codes(weight) is not None
        assert cpu_kernels._may_be_codes(weight.reshape(-1, 32), bits), bits
    trained = torch.randn(SHAPE, generator=g)
    assert not any(cpu_kernels._may_be_codes(trained.reshape(-1, 32)[:1], bits) for bits in (4, 8))
    three = torch.tensor([[0.0, 1.0, 2 ** 0.5, 1.0] * 8])  # few values, but no whole codes for them
    assert not any(cpu_kernels._may_be_codes(three, bits) for bits in (4, 8))


def test_real_q6_k_keeps_float_panels():
    """A real Q6_K block of 32 holds two sub-blocks of 16 with scales of their own (d · sc, sc any int8): no one
    scale with 8-bit codes gives both back, so such a weight keeps float panels (a limit of the panel format)."""
    assert cpu_kernels.pack_codes(gguf_weight(SHAPE, "Q6_K", seed=4)) is None


@pytest.mark.parametrize("bits", [4, 8])
def test_float16_scales_pack_as_they_always_have(bits):
    """GGUF Q4_1 and Q8_0 blocks (the embedded SmolLM2, Gemma's embedding) fit with their own float16 scale and, for
    4 bits, the block's minimum as offset: the panels are those the first fit gave, byte for byte."""
    weight = coded_weight((64, 256), bits, seed=5)
    blocks = weight.view(-1, 32)
    if bits == 4:
        offset = blocks.amin(-1, keepdim=True)
        scale = ((blocks.amax(-1, keepdim=True) - offset) / 15).half().float()
    else:
        offset = torch.zeros_like(blocks[:, :1])
        scale = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
    codes = torch.round((blocks - offset) / scale)
    expected = cpu_kernels._coded_panels(weight.view(2, 32, 8, 32), scale, offset, codes, bits)
    assert torch.equal(cpu_kernels.pack_codes(weight).view(torch.uint8), expected.view(torch.uint8))


def _greedy(decoder, prompt: list[int], new: int) -> tuple[torch.Tensor, list[int]]:
    """(the prefill's logits [1, T, V], ``new`` greedy tokens) of one decoder, one token a step."""
    cache = decoder.new_cache(1, len(prompt) + new, torch.zeros(1, dtype=torch.long))
    logits, _ = decoder(torch.tensor([prompt]), cache)
    cache.commit(torch.full((1,), len(prompt)))
    prefill, tokens = logits, [int(logits[0, -1].argmax())]
    for _ in range(new - 1):
        logits, _ = decoder(torch.tensor([[tokens[-1]]]), cache)
        cache.commit(torch.ones(1, dtype=torch.long))
        tokens.append(int(logits[0, -1].argmax()))
    return prefill, tokens


@needs_kernel
@pytest.mark.slow
@pytest.mark.real_model
@torch.no_grad()
def test_gemma3_streams_as_codes_with_the_float32_logits():
    """Gemma-3-270M (Q4_K_M: Q8_0 embedding tied to the LM head, Q5_0 q/k/gate/up, Q8_0 or Q5_0 v, Q4_K o and half
    the down projections, Q6_K the other half): on a backend of weights "codes" every product but the Q6_K ones reads
    codes, and a prefill's logits (within the few-row kernel's rows) and a greedy continuation are those of a
    backend of weights "float", bit for bit."""
    from specdec.models import Backend, as_decoder
    from specdec.models.loading import load_target

    model, tokenizer = load_target("gemma3")
    prompt = tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n").input_ids
    assert len(prompt) <= cpu_kernels.MAX_ROWS  # the prefill runs through the panels too
    results = {}
    for weights in ("codes", "float"):
        backend = Backend(weights=weights)
        results[weights] = _greedy(as_decoder(model, backend=backend), prompt, 6)
        streamed = sum(backend.streamed_bytes().values())
        assert streamed == (326_615_040 if weights == "codes" else 1_072_168_960)  # bytes a decode step
    layer = model.model.layers[2]  # a layer with a Q4_K down projection
    kinds = [Backend().prepare(layers, torch.zeros(1, 640))[0].dtype
             for layers in ((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                            (layer.self_attn.o_proj,), (layer.mlp.gate_proj, layer.mlp.up_proj),
                            (layer.mlp.down_proj,), (model.lm_head,))]
    assert kinds == [torch.int8, torch.uint8, torch.int8, torch.uint8, torch.int8]
    assert torch.equal(results["codes"][0], results["float"][0])
    assert results["codes"][1] == results["float"][1]
