"""The compact decoder for the families beyond Llama (specdec.models.compact.FAMILIES), on tiny random models built
from transformers' own classes (tests/helpers.tiny_family): its logits equal transformers' forward at batch 1 and 3
(left-padded), past the sliding window, step by step; a token tree's logits equal the sequential forward of each
node's path; greedy decoding equals transformers' generate. Each check fails on a planted bug of the family's own
parts: Gemma's (1 + w) norm written as w, the sliding window ignored, Qwen3's q/k norm skipped."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from helpers import fused_backend, tiny_family
from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import NgramDrafter
from specdec.jobs.data import left_pad
from specdec.models import CompactDecoder, as_decoder
from specdec.models.cache import KVCache

FAMILIES = ("qwen3", "mistral", "gemma3")
TOLERANCE = 1e-5  # |logit difference| allowed by the equality checks; a planted bug must exceed it tenfold
PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 13, 4], [4, 4, 6], [21, 22, 23, 24, 25, 26]]  # 9 tokens: past a 4-token window


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return tiny_family(request.param)


def hf_logits(model, ids, mask):
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return model(ids, attention_mask=mask, position_ids=positions).logits


@torch.no_grad()
def largest_gap(decoder, model, prompts=PROMPTS) -> float:
    """The largest |logit difference| between ``decoder`` and ``model`` (transformers) over a left-padded batch:
    the prefill, a 3-token block, then single steps (the cache grows past the window)."""
    ids, mask = left_pad(prompts)
    cache = decoder.new_cache(ids.shape[0], 40, (mask == 0).sum(1))
    logits, _ = decoder(ids, cache)
    cache.commit(torch.full((ids.shape[0],), ids.shape[1]))
    gaps = [(logits[mask.bool()] - hf_logits(model, ids, mask)[mask.bool()]).abs().max()]
    for step in ([[1, 2, 3]] * ids.shape[0], [[4]] * ids.shape[0], [[9]] * ids.shape[0], [[17]] * ids.shape[0]):
        new = torch.tensor(step)
        ids, mask = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new)], 1)
        logits, _ = decoder(new, cache, kv_len=ids.shape[1])
        cache.commit(torch.full((ids.shape[0],), new.shape[1]))
        gaps.append((logits - hf_logits(model, ids, mask)[:, -new.shape[1]:]).abs().max())
    return float(max(gaps))


@pytest.mark.parametrize("rows", [1, 3])
def test_logits_equal_transformers_past_the_window(family_model, rows):
    decoder = as_decoder(family_model)
    assert isinstance(decoder, CompactDecoder) and any(decoder.windows)
    assert largest_gap(decoder, family_model, PROMPTS[:rows]) < TOLERANCE


@torch.no_grad()
def test_a_tree_forward_equals_the_sequential_forward_of_each_path(family_model):
    """Nodes 0 <- 1, 0 <- 2, 1 <- 3 after a 9-token prefix: each node's logits are those of its path run as a
    chain, with a 4-token window binding on the sliding layers."""
    decoder = as_decoder(family_model)
    prefix, tokens, parents = [5, 9, 3, 7, 11, 2, 8, 13, 4], [30, 31, 32, 33], [-1, 0, 0, 1]
    depths = torch.tensor([0, 1, 1, 2])
    tree = torch.eye(4, dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            tree[node, parent] = True
            parent = parents[parent]
    cache = decoder.new_cache(1, 32, torch.zeros(1, dtype=torch.long))
    decoder(torch.tensor([prefix]), cache)
    cache.commit(torch.tensor([len(prefix)]))
    logits, _ = decoder(torch.tensor([tokens]), cache, tree_mask=tree, depths=depths)
    for node in range(4):
        path, at = [], node
        while at >= 0:
            path.insert(0, tokens[at])
            at = parents[at]
        reference = family_model(torch.tensor([prefix + path])).logits[0, -1]
        assert torch.allclose(logits[0, node], reference, atol=TOLERANCE), node


def test_greedy_decoding_equals_transformers_generate_at_batch_3(family_model):
    ids, mask = left_pad(PROMPTS)
    reference = family_model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                      pad_token_id=0)[:, ids.shape[1]:].tolist()
    plain = autoregressive_generate(family_model, ids, attention_mask=mask, max_new_tokens=10)
    speculative = speculative_generate(family_model, NgramDrafter(), ids, attention_mask=mask, k=3,
                                       max_new_tokens=10)
    assert plain.sequences == speculative.sequences == reference


def _norm_as_w(norm):  # Gemma's RMSNorm scales by (1 + w): the planted bug scales by w
    def forward(x):
        normed = norm._norm(x.float())
        return (normed * norm.weight.float()).type_as(x)
    return forward


def test_planted_gemma_norm_as_w_is_caught():
    model = tiny_family("gemma3")
    planted = copy.deepcopy(model)
    for module in planted.modules():
        if type(module).__name__ == "Gemma3RMSNorm":
            module.forward = _norm_as_w(module)
    assert largest_gap(as_decoder(planted), model) > 10 * TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_planted_window_ignored_is_caught(family, monkeypatch):
    model = tiny_family(family)
    monkeypatch.setattr(KVCache, "within_window", lambda self, mask, window, depths=None: mask)
    assert largest_gap(as_decoder(model), model) > 10 * TOLERANCE


def test_planted_qwen3_qk_norm_skipped_is_caught():
    model = tiny_family("qwen3")
    decoder = as_decoder(model)
    decoder.family = dataclasses.replace(decoder.family, qk_norm=False)
    assert largest_gap(decoder, model) > 10 * TOLERANCE


@pytest.mark.parametrize("kernels", ["cpu", "triton"])
@pytest.mark.parametrize("planted", [False, True], ids=["exact", "planted-qk-norm-skipped"])
def test_qwen3_runs_the_fused_layers_with_its_qk_norms(kernels, planted, monkeypatch):
    """Qwen3's layer is Llama's with per-head q/k norms: the fused forward runs it (specdec's CPU kernels, the
    Triton kernels under the interpreter) and gives transformers' logits; its layers described without the q/k
    norms (planted) do not."""
    model = tiny_family("qwen3", window=1024)  # a window wider than the cache: no layer slides, the fused path runs
    decoder = as_decoder(model, backend=fused_backend(kernels))
    with torch.no_grad():  # as decoding runs (autograd keeps torch's ops)
        assert decoder._fused(torch.zeros(1, 1, 32)) is not None
    calls = []
    real = decoder._layer_plan

    def plan(stacked=False):
        calls.append(stacked)
        layers, final = real(stacked)
        return ([layer._replace(q_norm=None, k_norm=None) for layer in layers] if planted else layers), final

    monkeypatch.setattr(decoder, "_layer_plan", plan)
    gap = largest_gap(decoder, model)
    assert calls and (gap > 10 * TOLERANCE if planted else gap < TOLERANCE)


def test_eagle_reads_gemmas_embeddings_as_the_target_does():
    """Gemma scales its embeddings by √hidden: an EAGLE layer attached to it reads them scaled (as the target's
    embedding module gives them), a Llama-family target's as they are; EAGLE over Gemma drafts and keeps greedy."""
    from helpers import random_eagle

    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.features import embedding_scale

    model = tiny_family("gemma3")
    embedding = model.get_input_embeddings()
    eagle = random_eagle(model, aux=(0, 1, 2))
    eagle.attach(embedding.weight, embedding_scale(embedding))
    tokens = torch.tensor([[3, 9, 27]])
    assert embedding_scale(embedding) == pytest.approx(32 ** 0.5)
    assert torch.equal(eagle.embed(tokens), embedding(tokens))
    ids, mask = left_pad(PROMPTS)
    out = speculative_generate(model, EagleDrafter(eagle), ids, attention_mask=mask, k=6, max_new_tokens=10)
    assert out.sequences == autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=10).sequences
