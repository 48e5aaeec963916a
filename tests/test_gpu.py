"""The same guarantees on the CUDA path (skipped where no GPU is present)."""

import pytest
import torch

from conftest import tiny_llama

from specdec.data import left_pad
from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate

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
