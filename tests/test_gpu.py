"""The same guarantees on the CUDA path (skipped where no GPU is present)."""

import pytest
import torch

from conftest import tiny_llama

from specdec.data import left_pad
from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate
from specdec.models import GraphedDecoder, as_decoder

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6], [12, 13, 14, 15, 12, 13]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_speculative_equals_plain_on_cuda(dtype):
    model = tiny_llama(layers=3).to("cuda", dtype)
    ids, mask = left_pad(PROMPTS)
    ids, mask = ids.cuda(), mask.cuda()
    ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=32, eos_token_id=[])
    for drafter in (NgramDrafter(), DraftModelDrafter(model, num_layers=1)):
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=4, max_new_tokens=32, eos_token_id=[])
        assert out.sequences == ref.sequences


def test_sampling_on_cuda_is_seeded():
    model = tiny_llama(layers=2).cuda()
    ids = torch.tensor([PROMPTS[0]], device="cuda")
    runs = [speculative_generate(model, DraftModelDrafter(model, num_layers=1), ids, k=3, max_new_tokens=20,
                                 temperature=1.0, generator=torch.Generator("cuda").manual_seed(1),
                                 eos_token_id=[]).sequences for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("min_confidence", [0.0, 0.05])
def test_greedy_medusa_with_lookup_and_auto_dtype_equals_plain_on_cuda(min_confidence, device="cuda"):
    """The default Medusa setting on CUDA: bf16 heads (dtype auto) over a float32 target, a dynamic or fixed
    tree, and the prompt-lookup branch (merged at batch 1, its own chain at batch 3)."""
    from specdec.drafters.medusa import MedusaDrafter
    from test_medusa import PATHS, random_heads

    model = tiny_llama(layers=3, seed=0).to(device)
    heads = random_heads(scale=1.0).to(device)
    for batch in (PROMPTS[:1], PROMPTS):
        ids, mask = (t.to(device) for t in left_pad(batch))
        ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=32, eos_token_id=[])
        drafter = MedusaDrafter(heads, model.lm_head.weight, PATHS, min_confidence, lookup=4, dtype="auto")
        assert device == "cpu" or drafter.dtype == torch.bfloat16
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=len(PATHS) + 4, max_new_tokens=32,
                                   eos_token_id=[])
        assert out.sequences == ref.sequences


def _graphed(model):
    return GraphedDecoder(as_decoder(model))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_give_the_eager_outputs_and_capture_each_width_once(dtype):
    """Replayed graphs equal eager forwards (greedy, chain and tree drafters, batch 1 and 3), across several
    generations of different lengths on one reused cache; a width is captured once, then only replayed."""
    from specdec.drafters.medusa import MedusaDrafter
    from test_medusa import PATHS, random_heads

    model = tiny_llama(layers=3, seed=0).to("cuda", dtype)
    graphed = _graphed(model)
    heads = random_heads(scale=1.0).to("cuda")
    for batch in (PROMPTS[:1], PROMPTS, PROMPTS[1:2]):
        ids, mask = (t.cuda() for t in left_pad(batch))
        ref = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        plain = autoregressive_generate(graphed, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        assert plain.sequences == ref.sequences
        for drafter, k in ((NgramDrafter(), 4), (DraftModelDrafter(model, num_layers=1), 3),
                           (MedusaDrafter(heads, model.lm_head.weight, PATHS, 0.05, lookup=4), len(PATHS) + 4)):
            out = speculative_generate(graphed, drafter, ids, attention_mask=mask, k=k, max_new_tokens=24,
                                       eos_token_id=[])
            assert out.sequences == ref.sequences
    captures = graphed.captures
    assert 0 < captures <= graphed.replays
    ids, mask = (t.cuda() for t in left_pad(PROMPTS[1:2]))
    autoregressive_generate(graphed, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    speculative_generate(graphed, NgramDrafter(), ids, attention_mask=mask, k=4, max_new_tokens=24, eos_token_id=[])
    assert graphed.captures == captures  # nothing new to capture for widths already seen


def test_cuda_graphs_sample_as_eager_does():
    """At T=1 the graphed target draws the same tokens as the eager one from the same seed (sampling is
    outside the graph; the forward's numbers are the same)."""
    model = tiny_llama(layers=2).cuda()
    graphed = _graphed(model)
    ids = torch.tensor([PROMPTS[0]], device="cuda")
    runs = [speculative_generate(target, DraftModelDrafter(model, num_layers=1), ids, k=3, max_new_tokens=20,
                                 temperature=1.0, generator=torch.Generator("cuda").manual_seed(1),
                                 eos_token_id=[]).sequences for target in (model, graphed)]
    assert runs[0] == runs[1]


def test_target_compile_auto_replays_graphs_on_cuda():
    from specdec.models import target_decoder

    model = tiny_llama(layers=1).cuda()
    assert isinstance(target_decoder(model, "auto"), GraphedDecoder)
    assert not isinstance(target_decoder(model, "none"), GraphedDecoder)
