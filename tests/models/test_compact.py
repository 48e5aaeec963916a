"""The per-row static cache and the compact forward: equal to HF's logits, O(1) rollback."""

import inspect

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from specdec.jobs.data import left_pad
from specdec.models import Backend, CompactDecoder, HFDecoder, as_decoder
from specdec.models import backend as backend_module
from specdec.models.cache import KVCache
from specdec.models.hf import cache_keyword


def hf_logits(model, ids, mask):
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return model(ids, attention_mask=mask, position_ids=positions).logits


@torch.no_grad()
def test_compact_llama_matches_hf_with_padding_and_incremental_steps(tiny_target):
    ids, mask = left_pad([[5, 9, 3, 7, 11, 2, 8], [4, 4, 6]])
    decoder = as_decoder(tiny_target)
    assert isinstance(decoder, CompactDecoder)
    cache = decoder.new_cache(2, 32, (mask == 0).sum(1))
    logits, _ = decoder(ids, cache)
    cache.commit(torch.full((2,), ids.shape[1]))
    ref = hf_logits(tiny_target, ids, mask)
    assert torch.allclose(logits[mask.bool()], ref[mask.bool()], atol=1e-5)
    for step in ([[1, 2, 3], [7, 8, 9]], [[4], [5]]):  # a verify block, then a single decode step
        new = torch.tensor(step)
        ids, mask = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new)], 1)
        logits, _ = decoder(new, cache, kv_len=ids.shape[1])
        cache.commit(torch.full((2,), new.shape[1]))
        assert torch.allclose(logits, hf_logits(tiny_target, ids, mask)[:, -new.shape[1]:], atol=1e-5)


@torch.no_grad()
def test_rollback_is_a_pointer_move_and_stale_slots_are_invisible(tiny_target):
    decoder = as_decoder(tiny_target)
    cache = decoder.new_cache(1, 32, torch.zeros(1, dtype=torch.long))
    decoder(torch.tensor([[3, 4, 5]]), cache)
    cache.commit(torch.tensor([3]))
    pointers = [k.data_ptr() for k in cache.keys]
    decoder(torch.tensor([[9, 9, 9, 9]]), cache)  # four drafts scored ...
    cache.commit(torch.tensor([1]))  # ... one kept
    assert cache.lengths.tolist() == [4] and [k.data_ptr() for k in cache.keys] == pointers
    logits, _ = decoder(torch.tensor([[6]]), cache)
    ref = tiny_target(torch.tensor([[3, 4, 5, 9, 6]])).logits[:, -1]
    assert torch.allclose(logits[:, -1], ref, atol=1e-5)  # the three stale drafts are not attended to
    cache.rollback_to(torch.tensor([2]))
    logits, _ = decoder(torch.tensor([[7]]), cache)
    assert torch.allclose(logits[:, -1], tiny_target(torch.tensor([[3, 4, 7]])).logits[:, -1], atol=1e-5)


def test_per_row_commit_and_compact():
    cache = KVCache.allocate(1, 2, 1, 8, 1, torch.zeros(2, dtype=torch.long), dtype=torch.float32,
                             device=torch.device("cpu"))
    cache.write(0, torch.arange(4.0).view(1, 1, 4, 1).expand(2, 1, 4, 1), torch.zeros(2, 1, 4, 1))
    cache.commit(torch.tensor([1, 3]))  # rows accept different numbers of tokens
    assert cache.lengths.tolist() == [1, 3]
    cache.write(0, torch.tensor([10.0, 11, 12]).view(1, 1, 3, 1).expand(2, 1, 3, 1), torch.zeros(2, 1, 3, 1))
    cache.compact(torch.tensor([[0, 2], [1, 2]]), torch.tensor([2, 1]))  # keep tree nodes (0, 2) / (1)
    assert cache.lengths.tolist() == [3, 4]
    assert cache.keys[0][0, 0, :3, 0].tolist() == [0.0, 10.0, 12.0]
    assert cache.keys[0][1, 0, :4, 0].tolist() == [0.0, 1.0, 2.0, 11.0]


def test_the_key_length_bound_holds_on_cpu_only():
    """On CPU a forward attends over ``kv_len`` slots (less work); elsewhere over the whole cache, one key length
    per generation, since SDPA plans its kernel anew for each new length (cuDNN's planning cost an EAGLE draft
    step ~80 ms a step on a GPU). The meta device stands for a GPU here: nothing is computed on it."""
    for device, expected in ((torch.device("cpu"), 5), (torch.device("meta"), 8)):
        cache = KVCache.allocate(1, 1, 1, 8, 1, torch.zeros(1, dtype=torch.long), dtype=torch.float32, device=device)
        keys, values = cache.write(0, torch.ones(1, 1, 2, 1, device=device), torch.ones(1, 1, 2, 1, device=device),
                                   kv_len=5)
        assert keys.shape[2] == values.shape[2] == cache.attention_mask(2, kv_len=5).shape[-1] == expected
        assert cache.key_length(None) == 8


def test_tree_mask_limits_attention_to_ancestors():
    cache = KVCache.allocate(1, 1, 1, 8, 1, torch.zeros(1, dtype=torch.long), dtype=torch.float32,
                             device=torch.device("cpu"))
    cache.commit(torch.tensor([2]))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 0 with children 1, 2
    mask = cache.attention_mask(3, kv_len=5, tree_mask=tree)[0, 0]
    assert mask.tolist() == [[True, True, True, False, False],
                             [True, True, True, True, False],
                             [True, True, True, False, True]]


def test_a_mask_over_recent_slots_decides_them_too():
    """With recent = R the tree mask's first R columns are the last R committed slots (an EAGLE tree's
    draft entries, seen by their descendants only); the slots before them are seen by every new token."""
    cache = KVCache.allocate(1, 2, 1, 9, 1, torch.tensor([0, 1]), dtype=torch.float32, device=torch.device("cpu"))
    cache.commit(torch.tensor([5, 5]))  # 3 slots before the recent 2 (row 1: one of them padding)
    tree = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)  # 2 recent slots, then 2 new tokens
    mask = cache.attention_mask(2, kv_len=8, tree_mask=tree, recent=2)[:, 0]
    assert mask[0].tolist() == [[True, True, True, True, False, True, False, False],
                                [True, True, True, False, True, False, True, False]]
    assert mask[1].tolist() == [[False, True, True, True, False, True, False, False],
                                [False, True, True, False, True, False, True, False]]
    with pytest.raises(ValueError, match="recent slots need a tree_mask"):
        cache.attention_mask(2, recent=2)


@torch.no_grad()
def test_early_exit_decoder_uses_first_layers(tiny_target):
    decoder = as_decoder(tiny_target, num_layers=1)
    assert len(decoder.layers) == 1 and decoder.layers[0] is tiny_target.model.layers[0]
    with pytest.raises(ValueError, match=r"num_layers must be in \[1, 3\]"):
        as_decoder(tiny_target, num_layers=7)


def test_a_decoder_keeps_the_backend_it_was_built_on(tiny_target):
    """as_decoder(model, backend=...): the decoder holds the backend it was built on (the default: specdec's kernels
    over the weights' codes); given again it is returned as it is, and another backend for it is refused; a weight
    format that does not exist is named."""
    decoder = as_decoder(tiny_target, backend=Backend(weights="float"))
    assert decoder.backend == Backend(weights="float") and as_decoder(tiny_target).backend == Backend()
    assert as_decoder(decoder) is decoder and as_decoder(decoder, backend=Backend(weights="float")) is decoder
    with pytest.raises(ValueError, match="built on Backend.*weights='float'.*pass its HF model"):
        as_decoder(decoder, backend=Backend())
    with pytest.raises(ValueError, match="weights='int4'.*'codes'.*'float'"):
        Backend(weights="int4")


@torch.no_grad()
def test_generic_fallback_for_other_architectures():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=128)).eval()
    decoder = as_decoder(gpt2)
    assert isinstance(decoder, HFDecoder)
    from specdec import NgramDrafter, autoregressive_generate, speculative_generate

    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    ref = gpt2.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 8:].tolist()
    assert autoregressive_generate(gpt2, ids, max_new_tokens=20, eos_token_id=[]).sequences[0] == ref
    assert speculative_generate(gpt2, NgramDrafter(), ids, k=3, max_new_tokens=20, eos_token_id=[]).sequences[0] == ref
    with pytest.raises(NotImplementedError, match="batch size 1 only"):
        autoregressive_generate(gpt2, ids.repeat(2, 1), attention_mask=torch.ones(2, 8, dtype=torch.long),
                                max_new_tokens=4)


def test_the_fallback_names_the_cache_as_the_model_s_forward_does():
    # transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns until removed).
    class Renamed(torch.nn.Module):
        def forward(self, input_ids, cache=None, position_ids=None, use_cache=None, output_hidden_states=None):
            raise AssertionError("not called")

    class Before(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, position_ids=None, **kwargs):
            raise AssertionError("not called")

    assert cache_keyword(Renamed()) == "cache"
    assert cache_keyword(Before()) == "past_key_values"
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=16))
    assert cache_keyword(gpt2) in inspect.signature(gpt2.forward).parameters


# specdec's few-row kernel off, so the packed oneDNN path is the one tested (the kernel's tests: test_cpu_kernels.py)
ONEDNN, PLAIN = Backend(kernels=False), Backend(kernels=False, onednn=False)
needs_onednn = pytest.mark.skipif(not backend_module._onednn_available(), reason="this torch build has no oneDNN linear")


def _packed_for_onednn(backend: Backend, layer: torch.nn.Linear, x: torch.Tensor) -> bool:
    prepared = backend.prepare((layer,), x)
    return prepared is not None and prepared[2]


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_the_plain_product(rows, bias):
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(2, rows, 24)
    with torch.no_grad():
        fast = ONEDNN.linear(x, layer)
        assert _packed_for_onednn(ONEDNN, layer, x)  # the packed path ran
        assert not _packed_for_onednn(PLAIN, layer, x)
        plain = PLAIN.linear(x, layer)
    assert fast.shape == plain.shape == (2, rows, 40)
    assert torch.allclose(fast, plain, atol=1e-5) and torch.allclose(fast, layer(x), atol=1e-5)


@needs_onednn
@torch.no_grad()
def test_onednn_packed_weight_follows_the_weight():
    """A packed copy that outlived an in-place update (a fine-tune step, a load_state_dict) would silently
    compute with the old weights: the copy is checked against the weight's identity and version."""
    layer = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8)
    before = ONEDNN.linear(x, layer)
    assert _packed_for_onednn(ONEDNN, layer, x)
    layer.weight.mul_(2)  # in place: same storage, new version
    assert torch.allclose(ONEDNN.linear(x, layer), 2 * before, atol=1e-5)
    old = layer.weight
    layer.weight = torch.nn.Parameter(torch.zeros(8, 8))  # another tensor
    assert ONEDNN.linear(x, layer).abs().max() == 0
    del old  # freed: a new weight may take its address (an address key would then go stale)
    layer.weight = torch.nn.Parameter(torch.ones(8, 8))
    assert torch.allclose(ONEDNN.linear(x, layer), x.sum(1, keepdim=True).expand(4, 8), atol=1e-5)


def test_onednn_path_leaves_autograd_to_torch():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    ONEDNN.linear(x, layer).sum().backward()  # the packed op has no backward: the plain path runs
    assert x.grad is not None and layer.weight.grad is not None


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_stacked_linears_match_one_by_one(rows, bias):
    """q/k/v (and gate/up) run as one packed product over the stacked weights, split back per layer."""
    layers = (torch.nn.Linear(24, 40, bias=bias), torch.nn.Linear(24, 8, bias=bias), torch.nn.Linear(24, 8, bias=bias))
    x = torch.randn(2, rows, 24)
    outs = ONEDNN.linears(x, layers)
    assert [tuple(o.shape) for o in outs] == [(2, rows, 40), (2, rows, 8), (2, rows, 8)]
    for out, layer in zip(outs, layers):
        assert torch.allclose(out, layer(x), atol=1e-5)
    layers[1].weight.mul_(3)  # an in-place update of one of them repacks the group
    assert torch.allclose(ONEDNN.linears(x, layers)[1], layers[1](x), atol=1e-5)
    if bias:
        layers[2].bias = torch.nn.Parameter(torch.ones(8))  # another bias tensor
        assert torch.allclose(ONEDNN.linears(x, layers)[2], layers[2](x), atol=1e-5)
    mixed = (torch.nn.Linear(24, 4, bias=True), torch.nn.Linear(24, 4, bias=False))  # computed one by one
    assert all(torch.allclose(o, layer(x), atol=1e-5) for o, layer in zip(ONEDNN.linears(x, mixed), mixed))
