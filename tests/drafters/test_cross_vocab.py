"""Cross-vocabulary drafting (specdec/drafters/draft_model/cross_vocab.py): a draft model with another tokenizer.

A tiny pair stands in for Gemma-3 + SmolLM2: the bigram target of tests/helpers.py over 64 tokens spelled by a
SentencePiece-style tokenizer (▁ for the space, <0xNN> byte fallback), and a draft with a byte-level BPE tokenizer
(GPT-2's alphabet, Ġ for the space) that spells the same characters under other ids, plus 200 tokens the target
cannot spell. The draft is the target's bigram written over its own ids (flatter), with mass on those 200 tokens:
so sampling really draws from the intersection, renormalised, and a wrong renormalisation biases the output.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import (CROSS_TARGET_TOKENS, VOCAB, cross_draft_tokenizer, cross_target_tokenizer, cross_vocab_draft,
                     make_markov_target, random_prompts, sample_and_score)

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.drafters.draft_model.vocab_map import VocabMap, complete_utf8, token_bytes
from specdec.exactness.stats import exactness_test

@pytest.fixture(scope="module")
def pair():
    """(target, target tokenizer, draft model, draft tokenizer, vocabulary map)."""
    target, t_tok, d_tok = make_markov_target(), cross_target_tokenizer(), cross_draft_tokenizer()
    draft = cross_vocab_draft(target, d_tok, scale=0.6)
    return target, t_tok, draft, d_tok, VocabMap(d_tok, t_tok)


def test_token_bytes_follow_each_tokenizers_conventions(pair):
    _, t_tok, _, d_tok, vocab_map = pair
    target = token_bytes(t_tok)
    assert target[CROSS_TARGET_TOKENS.index("▁x")] == b" x"  # ▁ is the space
    assert target[CROSS_TARGET_TOKENS.index("<0xC3>")] == b"\xc3"  # byte fallback: the byte, not the six characters
    assert target[CROSS_TARGET_TOKENS.index("é")] == "é".encode()
    draft = token_bytes(d_tok)
    assert draft[d_tok.convert_tokens_to_ids("Ġx")] == b" x"  # Ġ is the space
    assert draft[d_tok.convert_tokens_to_ids("Ã")] == b"\xc3"  # a token holding half of a UTF-8 character
    assert draft[d_tok.convert_tokens_to_ids("<|endoftext|>")] is None  # special tokens spell nothing


def test_the_map_pairs_tokens_by_their_bytes_never_by_ids_or_neighbours(pair):
    _, t_tok, _, d_tok, vocab_map = pair
    pairs = vocab_map.draft_to_target

    def counterpart(draft_token):
        target_id = int(pairs[d_tok.convert_tokens_to_ids(draft_token)])
        return None if target_id < 0 else CROSS_TARGET_TOKENS[target_id]

    assert counterpart("a") == "a" and counterpart("Ġx") == "▁x" and counterpart("Ã©") == "é"
    assert counterpart("Ã") == "<0xC3>" and counterpart("Ċ") == "<0x0A>"  # bytes meet byte fallback
    assert counterpart("x") == "x" and counterpart("Ġ") is None  # ' ' has no token of its own: no neighbour
    assert counterpart("<|endoftext|>") is None and counterpart("7") is None  # special; not in the target
    assert vocab_map.num_shared == 64  # every target token, once
    vocab_map.check()


def test_an_intersection_built_from_ids_or_stripped_strings_is_refused(pair):
    """Planted mapping bugs: the map's check names the first pair that spells other bytes."""
    _, t_tok, draft, d_tok, vocab_map = pair
    by_ids = VocabMap(d_tok, t_tok)
    by_ids.draft_to_target = torch.where(torch.arange(len(by_ids.draft_to_target)) < VOCAB,
                                         torch.arange(len(by_ids.draft_to_target)), -1)
    with pytest.raises(ValueError, match="spells other bytes"):
        by_ids.check()
    stripped = VocabMap(d_tok, t_tok)
    stripped.draft_to_target[d_tok.convert_tokens_to_ids("Ġ")] = CROSS_TARGET_TOKENS.index("▁x")  # ' ' -> ' x'
    with pytest.raises(ValueError, match="draft token .* spells other bytes"):
        CrossVocabDrafter(draft, d_tok, t_tok, vocab_map=stripped)


def test_a_rule_that_cannot_be_exact_is_refused(pair):
    target, t_tok, draft, d_tok, _ = pair
    with pytest.raises(ValueError, match="drafter.cross_vocab must be one of"):
        CrossVocabDrafter(draft, d_tok, t_tok, rule="nearest")
    with pytest.raises(ValueError, match="greedy decoding only.*intersection or auto"):
        speculative_generate(target, CrossVocabDrafter(draft, d_tok, t_tok, rule="string"), random_prompts(1, None),
                             k=4, max_new_tokens=4, temperature=1.0, eos_token_id=[])


def test_partial_utf8_waits_for_the_byte_that_completes_it():
    assert complete_utf8("aé".encode()[:-1]) == ("a", 1)
    assert complete_utf8("a€".encode()[:-1]) == ("a", 2)
    assert complete_utf8("aé".encode()) == ("aé", 0)
    assert complete_utf8(b"a\xa9b") == ("a\ufffdb", 0)  # a stray continuation byte is not held back


def test_the_draft_reads_the_committed_text_with_its_own_bos_and_waits_for_a_whole_character(pair):
    """The draft's context is the target's text as the draft tokenises it: ' x' and é become the draft's merged
    tokens, a special token (BOS) of the draft's tokenizer comes first where it adds one, and an é whose second
    byte is not committed yet is left out until it is."""
    from tokenizers.processors import TemplateProcessing

    _, t_tok, draft, d_tok, _ = pair
    ids = [CROSS_TARGET_TOKENS.index(t) for t in ("a", "▁x", "é", "<0xC3>")]  # 'a x' 'é' then half an é
    drafter = CrossVocabDrafter(draft, d_tok, t_tok)
    context = drafter._contexts(SimpleNamespace(tokens=[ids]))[0]
    assert d_tok.convert_ids_to_tokens(context) == ["a", "Ġx", "Ã©"]
    ids.append(CROSS_TARGET_TOKENS.index("<0xA9>"))  # the byte that completes it
    context = drafter._contexts(SimpleNamespace(tokens=[ids]))[0]
    assert d_tok.convert_ids_to_tokens(context) == ["a", "Ġx", "Ã©", "Ã©"]
    with_bos = cross_draft_tokenizer()
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A",
                                                                   special_tokens=[("<|endoftext|>", 0)])
    drafter = CrossVocabDrafter(draft, with_bos, t_tok)
    assert with_bos.convert_ids_to_tokens(drafter._contexts(SimpleNamespace(tokens=[ids[:2]]))[0]) == [
        "<|endoftext|>", "a", "Ġx"]


def test_the_draft_cache_after_a_catch_up_gives_the_models_own_logits():
    """Rolled back to the prefix it shares with the new text, then fed the rest: the draft's logits equal a forward of
    the whole text from scratch (the bigram pair's attention writes nothing, so this pair has real attention)."""
    from helpers import tiny_llama

    from specdec.verify.sampling import SamplingParams

    t_tok, d_tok = cross_target_tokenizer(), cross_draft_tokenizer()
    draft = cross_vocab_draft(tiny_llama(vocab_size=VOCAB, seed=3), d_tok)
    drafter = CrossVocabDrafter(draft, d_tok, t_tok)
    drafter.start(SimpleNamespace(seq=torch.zeros(2, 1, dtype=torch.long), capacity=64,
                                  sampling=SamplingParams(0.0)))
    first = [d_tok.encode("abcdefgh"), d_tok.encode("xyz x")]
    drafter._catch_up(first)
    drafter._step(torch.tensor([5, 6]), max(map(len, first)) + 1)  # drafts the next text will not keep
    drafter._drafted([torch.tensor([5, 6])])
    second = [first[0][:5] + d_tok.encode("QRS"), first[1] + d_tok.encode("é a")]  # one row forks, one grows
    logits = drafter._catch_up(second)
    for row, context in enumerate(second):
        with torch.no_grad():
            expected = draft(torch.tensor([context])).logits[0, -1]
        torch.testing.assert_close(logits[row], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rule", ["string", "intersection"])
def test_greedy_output_equals_the_target_alone(pair, rule):
    target, t_tok, draft, d_tok, _ = pair
    drafter = CrossVocabDrafter(draft, d_tok, t_tok, rule=rule)
    ids = random_prompts(12, torch.Generator().manual_seed(0))
    taus = []
    for row in ids:
        plain = autoregressive_generate(target, row[None], max_new_tokens=24, eos_token_id=[]).sequences
        out = speculative_generate(target, drafter, row[None], k=4, max_new_tokens=24, eos_token_id=[])
        assert out.sequences == plain
        taus.append(out.stats.mean_accepted_length)
    assert sum(taus) / len(taus) > 1.5  # drafts are accepted: the comparison really runs through them


@pytest.mark.parametrize("rule", ["string", "intersection"])
def test_a_left_padded_batch_gives_each_rows_plain_output(pair, rule):
    """Rows of unequal lengths: each row's draft cache catches up on its own text (right-padded blocks)."""
    target, t_tok, draft, d_tok, _ = pair
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 7, 5)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    out = speculative_generate(target, CrossVocabDrafter(draft, d_tok, t_tok, rule=rule), ids, attention_mask=mask,
                               k=4, max_new_tokens=20, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences):
        assert sequence == autoregressive_generate(target, row[None], max_new_tokens=20, eos_token_id=[]).sequences[0]
    assert out.stats.mean_accepted_length > 1.5


@pytest.mark.parametrize("rule", ["string", "intersection"])
def test_a_window_reads_the_prompts_last_tokens_and_keeps_the_output(pair, rule):
    """drafter.window: the draft's first forward covers the prompt's last N tokens of its own, not the whole prompt;
    the origin stays for the generation, so later steps feed only what is new; greedy output is the target's."""
    target, t_tok, draft, d_tok, _ = pair
    prompt = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(2))
    whole, windowed = (CrossVocabDrafter(draft, d_tok, t_tok, rule=rule, window=n) for n in (0, 12))
    state = SimpleNamespace(tokens=prompt.tolist())
    assert windowed._contexts(state)[0] == whole._contexts(state)[0][-12:]
    fed = []
    feed = windowed._feed
    windowed._feed = lambda rows, kv_len: fed.append(max(map(len, rows))) or feed(rows, kv_len)
    plain = autoregressive_generate(target, prompt, max_new_tokens=24, eos_token_id=[]).sequences
    out = speculative_generate(target, windowed, prompt, k=4, max_new_tokens=24, eos_token_id=[])
    assert out.sequences == plain and out.stats.mean_accepted_length > 1.5
    assert fed[0] == 12 and max(fed[1:]) < 12  # the window, then each step's new text only (the origin stays)
    with pytest.raises(ValueError, match="drafter.window must be an integer >= 0"):
        CrossVocabDrafter(draft, d_tok, t_tok, window=-1)


def test_a_draft_with_another_tokenizer_streams_its_codes_whatever_the_targets_format(pair):
    """target.coded_weights=false sets the target's weights to float32 values; the draft model, a model of its own, is
    built on the codes backend all the same (the same products: only its step's cost changes); window passes through,
    and a same-tokenizer draft refuses a window."""
    from specdec.drafters.draft_model.drafter import DraftModelDrafter
    from specdec.errors import VocabMismatchError
    from specdec.models.backend import Backend

    _, t_tok, draft, d_tok, _ = pair
    config = DraftModelDrafter.Config(path="a-draft", window=5)
    drafter = DraftModelDrafter._cross_vocab(config, "a-draft", draft, d_tok, t_tok, VocabMismatchError("differ"),
                                             Backend(weights="float"))
    assert drafter.decoder.backend.weights == "codes" and drafter.window == 5
    with pytest.raises(ValueError, match="drafter.window=5 applies to a draft with another tokenizer"):
        DraftModelDrafter._no_window(config, "a-draft")


def test_sampling_through_the_intersection_is_exact(pair):
    target, t_tok, draft, d_tok, _ = pair
    drafter = CrossVocabDrafter(draft, d_tok, t_tok, rule="intersection")
    tokens, probs, positions, stats = sample_and_score(target, drafter, rows=400, new=8, k=4)
    verdict = exactness_test(probs, tokens, rng=__import__("numpy").random.default_rng(0), alpha=0.01,
                             positions=positions)
    assert stats.mean_accepted_length > 1.5  # the rule is really exercised
    assert not verdict.reject, verdict


def test_a_draft_renormalised_over_the_wrong_set_is_caught(pair):
    """Planted bug: drafts drawn from the shared tokens, renormalised, but q reported as the draft's law over its
    whole vocabulary (the mass off the shared tokens forgotten): accepted too often, the output biased."""
    from specdec.exactness.planted import CrossVocabWrongSet

    target, t_tok, draft, d_tok, _ = pair
    drafter = CrossVocabWrongSet(draft, d_tok, t_tok, rule="intersection")
    tokens, probs, positions, _ = sample_and_score(target, drafter, rows=400, new=8, k=4)
    verdict = exactness_test(probs, tokens, rng=__import__("numpy").random.default_rng(0), alpha=0.01,
                             positions=positions)
    assert verdict.reject, verdict


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_drafts_for_gemma3_through_the_config_and_keeps_its_greedy_output():
    """The real pair: ``drafter=cross_vocab`` builds SmolLM2-135M-Instruct drafting for Gemma-3-270M; every token
    of both vocabularies spells what its tokenizer decodes it to; greedy output (string and intersection rules,
    batch 1 and a left-padded batch of 3) equals the target alone; cross_vocab=off refuses, naming both."""
    from specdec.drafters import build_drafter
    from specdec.errors import VocabMismatchError
    from specdec.jobs.data import left_pad
    from specdec.models.loading import load_target

    model, tokenizer = load_target("gemma3")
    from specdec.drafters.draft_model.drafter import DraftModelDrafter

    config = DraftModelDrafter.Config(path="smollm2-135m-instruct", k=4, draft_vocab=0)
    drafter = build_drafter(config, model, tokenizer)
    assert isinstance(drafter, CrossVocabDrafter) and drafter.map.num_shared > 40000
    for table, tok in ((drafter.map.target_bytes, tokenizer), (drafter.map.draft_bytes, drafter.tokenizer)):
        for token_id, spelled in enumerate(table):
            try:
                text = spelled.decode() if spelled is not None else None
            except UnicodeDecodeError:  # part of a character: decode() cannot say which bytes
                continue
            assert text is None or tok.decode([token_id]) == text, token_id
    texts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "The capital of France is",
             "Once upon a time, in a small village,"]
    ids = [tokenizer(text).input_ids for text in texts]
    singles = [autoregressive_generate(model, torch.tensor([p]), max_new_tokens=32).sequences[0] for p in ids]
    for rule in ("string", "intersection"):
        drafter = CrossVocabDrafter(drafter.decoder, drafter.tokenizer, tokenizer, rule=rule, vocab_map=drafter.map)
        outs = [speculative_generate(model, drafter, torch.tensor([p]), k=4, max_new_tokens=32) for p in ids]
        assert [out.sequences[0] for out in outs] == singles
        assert sum(out.stats.mean_accepted_length for out in outs) / len(outs) > 1.5
        x, mask = left_pad(ids)
        assert speculative_generate(model, drafter, x, attention_mask=mask, k=4, max_new_tokens=32).sequences == singles
    with pytest.raises(VocabMismatchError, match="smollm2.*gemma3.*drafter.cross_vocab=off"):
        build_drafter(DraftModelDrafter.Config(path="smollm2-135m-instruct", draft_vocab=0, cross_vocab="off"),
                      model, tokenizer)
