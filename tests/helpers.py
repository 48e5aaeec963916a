"""What the tests share: tiny random models and tokenizers (fast unit tests), tiny training configs, the checks
several test files run (a shipped drafter on the real target, an export's --force), and the repository's paths.
Fixtures built from these live in conftest.py."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.eagle import EagleConfig, EagleModel
from specdec.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec.exactness.stats import exactness_test
from specdec.verify import ExactRule, verify_tree
from specdec.verify.sampling import logits_to_probs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def tiny_llama(vocab_size: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=2 * hidden,
                         max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def noisy_copy(model, scale=0.05, seed=1):
    """A deep copy of ``model`` with every parameter perturbed by ``scale`` of its own spread: a draft close to, not
    equal to, the target."""
    import copy

    copied = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copied.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * scale)
    return copied


def tiny_family(family: str, *, window: int = 4, seed: int = 0):
    """A tiny random model of another family built from transformers' own classes, with sliding-window layers of
    ``window`` tokens (short, so that tests run past it): "qwen3" (q/k norms; layers 1.. sliding), "mistral" (every
    layer sliding) or "gemma3" (q/k norms, four norms a layer with (1 + w) weights, the embedding scaled by
    √hidden, GELU-tanh, a scale of query_pre_attn_scalar^-½ unlike 1/√head_dim, sliding and global layers
    alternating with their own RoPE bases, 4 query heads over 1 KV head). The norms' weights are drawn too (HF
    initialises Gemma's to 0, where (1 + w) and w would differ by a constant)."""
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, intermediate_size=64,
                  max_position_embeddings=512, sliding_window=window, pad_token_id=0, eos_token_id=None,
                  bos_token_id=None)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                             use_sliding_window=True, max_window_layers=1, **common))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(num_attention_heads=4, num_key_value_heads=2, **common))
    elif family == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                                   sliding_window_pattern=2, query_pre_attn_scalar=16, **common))
    else:
        raise ValueError(f"family must be qwen3, mistral or gemma3, got {family!r}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3, generator=generator)
    return model.eval()


def coded_weight(shape: tuple[int, int], bits: int, seed: int = 0) -> torch.Tensor:
    """Values as a GGUF model dequantised to float32 holds them: in each block of 32 along k, 4-bit codes with a
    float16 scale and offset (Q4_1: the block's smallest value has code 0, its largest 15) or 8-bit codes with a
    float16 scale (Q8_0: the largest magnitude has code ±127)."""
    generator = torch.Generator().manual_seed(seed)
    n, k = shape
    scale = (torch.rand(n, k // 32, 1, generator=generator) * 0.02).half().float()
    if bits == 4:
        codes = torch.randint(0, 16, (n, k // 32, 32), generator=generator).float()
        codes[..., 5], codes[..., 17] = 0, 15
        offset = (-torch.rand(n, k // 32, 1, generator=generator) * 0.1).half().float()
        return (scale * codes + offset).view(n, k)
    codes = torch.randint(-127, 128, (n, k // 32, 32), generator=generator).float()
    codes[..., 9] = -127
    return (scale * codes).view(n, k)


def word_tokenizer(words: list[str], *, pad: bool = False, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``words``: ``words[0]`` is the unknown token, ``words[1]`` the EOS
    (and, with ``pad``, the padding)."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], eos_token=words[1],
                                        **({"pad_token": words[1]} if pad else {}))
    tokenizer.chat_template = chat_template
    return tokenizer


# --- a tiny pair of tokenizers for cross-vocabulary drafting ----------------------------------------------
# The target's 64 tokens, SentencePiece-style (Gemma's conventions): 59 characters, a word with a leading space (▁),
# é as a word and é's two bytes as byte-fallback tokens (the target spells é two ways), and the newline byte.
CROSS_TARGET_TOKENS = [*"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456", "▁x", "é", "<0xC3>", "<0xA9>",
                       "<0x0A>"]
CROSS_SPACED = "abcdefgh"  # the draft also has "Ġa" .. "Ġh" (no merge makes them): ' a' .. ' h', unknown to the target


def cross_target_tokenizer() -> PreTrainedTokenizerFast:
    """The 64-token SentencePiece-style tokenizer of CROSS_TARGET_TOKENS (spaces normalised to ▁, byte fallback)."""
    from tokenizers import decoders, normalizers

    vocab = {token: i for i, token in enumerate(CROSS_TARGET_TOKENS)}
    backend = Tokenizer(models.BPE(vocab, [], byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def cross_draft_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (SmolLM2's conventions): a special end-of-text token, every byte in GPT-2's alphabet (ids
    in another order than the target's: none agrees by accident), merges for ' x' and 'é', and ' a' .. ' h'."""
    from tokenizers import decoders

    from specdec.drafters.draft_model.vocab_map import _byte_level_alphabet

    alphabet = sorted(_byte_level_alphabet(), key=lambda ch: -ord(ch))
    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(alphabet)}}
    for token in ["Ġx", "Ã©", *("Ġ" + ch for ch in CROSS_SPACED)]:
        vocab[token] = len(vocab)
    backend = Tokenizer(models.BPE(vocab, [("Ġ", "x"), ("Ã", "©")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def cross_vocab_draft(model: LlamaForCausalLM, draft_tokenizer, scale: float = 1.0) -> LlamaForCausalLM:
    """``model`` (over CROSS_TARGET_TOKENS' 64 ids) written over ``draft_tokenizer``'s ids: a token spelling a
    target token gets that token's embedding and LM-head row (times ``scale``), "Ġa" .. "Ġh" those of "a" .. "h"
    (so the draft puts mass on text the target cannot spell in one token), every other token token 0's embedding
    and 0.8 times the LM-head row of target token (its id mod 64): much of the draft's mass lies off the shared
    tokens, which the intersection renormalises away (and a bug that forgets to is plain to see)."""
    from specdec.drafters.draft_model.vocab_map import VocabMap

    pairs = VocabMap(draft_tokenizer, cross_target_tokenizer()).draft_to_target[: len(draft_tokenizer)].clone()
    rows = pairs.clone()
    for ch in CROSS_SPACED:
        rows[draft_tokenizer.convert_tokens_to_ids("Ġ" + ch)] = CROSS_TARGET_TOKENS.index(ch)
    config = model.config.to_dict()
    config.update(vocab_size=len(draft_tokenizer), tie_word_embeddings=False)
    draft = LlamaForCausalLM(type(model.config)(**config)).eval()
    state = {k: v for k, v in model.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    draft.load_state_dict(state, strict=False)
    known = rows >= 0
    with torch.no_grad():
        embed, head = model.get_input_embeddings().weight, model.lm_head.weight
        draft.model.embed_tokens.weight.copy_(embed[0].expand_as(draft.model.embed_tokens.weight))
        draft.model.embed_tokens.weight[known] = embed[rows[known]]
        draft.lm_head.weight.copy_(0.8 * scale * head[torch.arange(len(rows)) % head.shape[0]])
        draft.lm_head.weight[known] = scale * head[rows[known]]
    return draft


# --- training on a tiny model ------------------------------------------------------------------------------

TRAIN_WORDS = ["[UNK]", "<eos>", "<|im_start|>", "<|im_end|>", "user", "assistant",
               "the", "of", "and", "a", "to", "in", "is", "was", "for", "on", "as", "by", "with", "that",
               "def", "return", "self", "import", "=", "(", ")", ":", "if", "not", "write", "what", "explain", "code"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def tiny_train_pair() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The tiny target and tokenizer the training tests train drafters for (a 34-word vocabulary)."""
    return (tiny_llama(vocab_size=len(TRAIN_WORDS), hidden=16, layers=1, heads=2, kv_heads=1, seed=4),
            word_tokenizer(TRAIN_WORDS, pad=True))


def tiny_config(out: Path, **method):
    """A Medusa training config small enough to train in seconds on :func:`tiny_train_pair`."""
    from specdec.config import TargetConfig
    from specdec.training.config import TrainConfig
    from specdec.training.methods.medusa import MedusaMethodConfig

    method = {"num_heads": 3, "tree_nodes": 5, "draft_vocab": None, **method}  # the 34-token vocabulary, all of it
    cfg = TrainConfig(method=MedusaMethodConfig(**method), target=TargetConfig(name="tiny"), output_dir=str(out),
                      save_every=2, log_every=1)
    cfg.data.num_prompts, cfg.data.max_new_tokens, cfg.data.batch_size, cfg.data.text_seq_len = 6, 10, 4, 64
    cfg.eval.limit_per_source, cfg.eval.max_new_tokens = 2, 6
    cfg.optim.epochs, cfg.optim.batch_size, cfg.optim.warmup_steps, cfg.optim.lr = 3, 8, 2, 1e-2
    return cfg


# --- drafters on tiny targets, and sampling through the engine scored against the target's conditionals ------


PATHS = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]


VOCAB, SIGMA_LOGIT, TAU_LOGIT = 64, 6.07, 4.82


def random_heads(hidden=32, vocab=64, num_heads=3, seed=1, scale=0.3, token_ids=None) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads, token_ids=token_ids)
    for block in heads.blocks:
        torch.nn.init.normal_(block.linear.weight, std=scale)
    return heads.eval().requires_grad_(False)


def random_token_aware_heads(num_heads=3, seed=2, scale=0.3, hidden=32) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, VOCAB, num_heads, token_aware=True)
    for block in heads.blocks:
        torch.nn.init.normal_(block.linear.weight, std=scale)
    return heads.eval().requires_grad_(False)


def successor(token, shift: int):  # σ: a fixed permutation of the vocabulary
    return (token * 5 + 3 * shift) % VOCAB if shift == 1 else successor(successor(token, 1), shift - 1)


def make_markov_target():
    """A real Llama whose attention and MLP write nothing, so it is a bigram model: after token a it
    puts ~0.7 on σ(a), ~0.2 on τ(a) = σ(a) + 1 and the rest on the others. Its final hidden state is e_a."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=VOCAB, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=32, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(VOCAB))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(VOCAB ** -0.5)  # RMSNorm(e_a) = sqrt(V)·e_a, so the hidden state is e_a
        lm_head = torch.zeros(VOCAB, VOCAB)
        a = torch.arange(VOCAB)
        lm_head[successor(a, 1), a] = SIGMA_LOGIT
        lm_head[(successor(a, 1) + 1) % VOCAB, a] = TAU_LOGIT
        model.lm_head.weight.copy_(lm_head)
    return model


def markov_heads(num_heads: int = 3, token_ids: torch.Tensor | None = None, strength: float = 20.0) -> MedusaHeads:
    """Head i maps e_a to ~e_{σ^(i+1)(a)}: its candidates are the likely successors of σ^(i+1)(a), i.e.
    the target's best guesses for the token i+2 steps ahead. Good but imperfect drafts: the tree's first
    candidate is often rejected and the second often accepted, so the sibling rule is exercised.
    ``token_ids``: a draft vocabulary (q is 0 outside it)."""
    heads = MedusaHeads(VOCAB, VOCAB, num_heads, token_ids=token_ids)
    a = torch.arange(VOCAB)
    with torch.no_grad():
        for i, block in enumerate(heads.blocks):
            block.linear.weight.zero_()
            block.linear.weight[successor(a, i + 1), a] = strength
    return heads.eval().requires_grad_(False)


def random_prompts(rows: int, generator: torch.Generator) -> torch.Tensor:  # [rows, 4]
    return torch.randint(0, VOCAB, (rows, 4), generator=generator)


def markov_draft(markov_target):
    """The bigram target with a flatter LM head: q differs from p, so sampled drafts are really verified."""
    import copy

    draft = copy.deepcopy(markov_target)
    with torch.no_grad():
        draft.lm_head.weight.mul_(0.6)
    return draft


def markov_prompts(rows: int, generator: torch.Generator) -> torch.Tensor:
    """[rows, 6]: a σ-run a σa σ²a σ³a, then a σa again, so the lookup proposes σ²a σ³a a σa — good drafts
    for the bigram target (it puts ~0.7 on σ), often accepted, sometimes not."""
    a = torch.randint(0, VOCAB, (rows,), generator=generator)
    run = [a, successor(a, 1), successor(a, 2), successor(a, 3)]
    return torch.stack(run + run[:2], 1)


def drafter_k(drafter: MedusaDrafter) -> int:
    return len(drafter.paths) + drafter.lookup if drafter.paths is not None else drafter.heads.num_heads


def sample_and_score(target, drafter, rows=400, new=8, seed=0, prompts=random_prompts, batch=None, rule=None,
                     k=None, decoder=None):
    """Emitted tokens [N], the target's exact conditionals of their prefixes [N, V], positions [N], stats.
    ``prompts(rows, generator)`` makes the prompts; ``batch`` rows are generated at a time (None = all);
    ``rule``: the acceptance rule (None = the drafter's own); ``k``: the lookahead (None = a Medusa drafter's
    whole proposal); ``decoder``: what generates (None = ``target``, which scores)."""
    g = torch.Generator().manual_seed(seed)
    ids = prompts(rows, g)  # [R, P]
    sequences, stats = [], None
    for start in range(0, rows, batch or rows):
        part = ids[start: start + (batch or rows)]
        out = speculative_generate(decoder or target, drafter, part, attention_mask=torch.ones_like(part),
                                   k=k or drafter_k(drafter),
                                   max_new_tokens=new, temperature=1.0, generator=g, eos_token_id=[], rule=rule)
        sequences += out.sequences
        stats = out.stats if stats is None else stats.merge(out.stats)
    seqs = torch.cat([ids, torch.tensor(sequences)], 1)  # [R, P + new]
    with torch.no_grad():  # [R, new, V]: p of each emitted token
        probs = logits_to_probs(target(seqs).logits[:, ids.shape[1] - 1: -1], 1.0)
    return (seqs[:, ids.shape[1]:].reshape(-1).numpy(), probs.reshape(-1, probs.shape[-1]).numpy(),
            np.tile(np.arange(new), rows), stats)


def exact_verdict(target, drafter, k, seed=1, rule=None):
    tokens, probs, positions, stats = sample_and_score(target, drafter, seed=seed, rule=rule, k=k)
    return exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions), stats


class NoRenormalisation(ExactRule):
    """Planted bug: a tree's next sibling is tested against max(0, p − q) without renormalising it."""

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return verify_tree(tree, draft_tokens, draft_probs, target_probs, generator,
                           residual=lambda p, q: (p - q).clamp(min=0))


def random_eagle(target, draft_vocab=None, seed=0, aux=(1, 2, 3)) -> EagleModel:
    return randomised(EagleModel(EagleConfig.for_target(target.config, draft_vocab, aux)), target, draft_vocab, seed)


def randomised(model, target, draft_vocab, seed):
    """A feature drafter ``model`` (EAGLE's, the block drafter's) for ``target`` with random weights, ``draft_vocab`` of
    the target's tokens drawn where given, attached to the target's embeddings."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    if draft_vocab:
        model.set_token_ids(torch.randperm(target.config.vocab_size, generator=gen)[:draft_vocab].sort().values)
    return model.attach(target.get_input_embeddings().weight)


# --- checks several test files run -------------------------------------------------------------------------


def shipped_drafter_taus(real_target, real_prompts, cfg) -> list[float]:
    """A shipped drafter (``cfg``) on the real target, batch 1 then batch 2 (left-padded), 24 tokens: asserts
    greedy output equal to plain decoding's and returns τ of each batch."""
    from specdec import autoregressive_generate, speculative_generate
    from specdec.drafters import build_drafter
    from specdec.jobs.data import left_pad

    model, tokenizer = real_target
    drafter = build_drafter(cfg, model, tokenizer)
    tau = []
    for batch in ([real_prompts[0]], [real_prompts[1], real_prompts[2]]):
        ids, mask = left_pad(batch, tokenizer.pad_token_id)
        reference = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=24)
        out = speculative_generate(model, drafter, ids, attention_mask=mask, k=cfg.k, max_new_tokens=24)
        assert out.sequences == reference.sequences
        tau.append(out.stats.mean_accepted_length)
    return tau


def check_export_force(kind: str, source, tmp_path, capsys) -> list[str]:
    """``python -m specdec.export <kind> --model source --force``: refused over a model directory holding a
    config.json and NOTES.md (``tmp_path / "target"``, the target, saved there by the caller) and over the
    --model directory however spelled (or a directory holding it), those files left as they were; a new --out
    written and then replaced, its config.json naming the source. Returns the arguments before the --out value."""
    import json

    from specdec.export import main

    (tmp_path / "target" / "NOTES.md").write_text("mine")
    dirs = ("target", source.name)
    before = {p.name: p.read_bytes() for d in dirs for p in (tmp_path / d).iterdir()}
    args = [kind, "--model", str(source), "--target", str(tmp_path / "target"), "--force", "--out"]
    capsys.readouterr()
    assert main(args + [str(tmp_path / "target")]) == 2
    assert "is not a directory this command wrote" in capsys.readouterr().err
    for out in (source, tmp_path / "target" / ".." / source.name, tmp_path):
        assert main(args + [str(out)]) == 2
        assert "is (or holds) the drafter being exported" in capsys.readouterr().err
    assert before == {p.name: p.read_bytes() for d in dirs for p in (tmp_path / d).iterdir()}
    assert main(args + [str(tmp_path / "out")]) == 0 and main(args + [str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["specdec"]["exported_from"] == str(source)
    return args


def gguf_weight(shape: tuple[int, int], kind: str, seed: int = 0, *, one_scale_per_32: bool = False) -> torch.Tensor:
    """Values [N, K] of a GGUF tensor of type ``kind`` ("Q4_K", "Q5_0" or "Q6_K") as gguf-py dequantises it (what
    transformers loads, so what a converted cache holds): random bytes for the codes and the sub-block scales, the
    float16 superblock scales of either sign and some zero, and in Q4_K blocks without code 0 (their offset is not
    their minimum, and with offsets far from the codes' range the sums round so that it cannot stand in for it),
    blocks of odd codes only, blocks without codes 13-15. ``one_scale_per_32``: Q6_K's two
    16-value sub-blocks of each block of 32 share their scale (real Q6_K blocks have two)."""
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[kind]
    size, nbytes = GGML_QUANT_SIZES[qtype]
    n, k = shape
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n * k // size, nbytes), dtype=np.uint8)
    scales = rng.uniform(-0.002, 0.004, (len(raw), 2)).astype(np.float16)  # d (and Q4_K's dmin)
    scales[::7] = 0
    scales[1::2, 1] = scales[1::2, 0] * 100  # offsets far from the codes: the sums round
    if kind == "Q4_K":  # d, dmin, 12 bytes of 6-bit sc and m, codes: bytes 32j.. hold blocks 2j (low), 2j + 1 (high)
        raw[:, :4] = scales.view(np.uint8)
        codes = raw[:, 16:].reshape(-1, 4, 32)
        codes[::3, 0] = np.maximum(codes[::3, 0] & 0x0F, 1) | (codes[::3, 0] & 0xF0)  # block 0: no code 0
        codes[::3, 1] |= 0x01  # block 2: odd codes only
        codes[::3, 2] = np.minimum(codes[::3, 2] >> 4, 12) << 4 | (codes[::3, 2] & 0x0F)  # block 5: no 13-15
    elif kind == "Q5_0":  # d, 4 bytes of high bits, 16 bytes of low nibbles
        raw[:, :2] = scales[:, :1].view(np.uint8)
    elif kind == "Q6_K":  # 128 + 64 bytes of codes, 16 int8 scales (one per 16 values), d
        raw[:, 208:] = scales[:, :1].view(np.uint8)
        if one_scale_per_32:
            raw[:, 193:208:2] = raw[:, 192:208:2]
    else:
        raise ValueError(f"kind must be Q4_K, Q5_0 or Q6_K, got {kind!r}")
    return torch.from_numpy(dequantize(raw, qtype).reshape(n, k).copy())


# --- the block drafter on the bigram target --------------------------------------------------------------

from specdec.drafters.dflash import DFlashConfig, DFlashModel  # noqa: E402


def random_dflash(target, draft_vocab=None, seed=0, block_size=5, layers=2, aux=(1, 2, 3)) -> DFlashModel:
    """A block drafter of random weights for ``target`` (``draft_vocab``: that many of its tokens, drawn)."""
    cfg = DFlashConfig.for_target(target.config, num_layers=layers, block_size=block_size, mask_token_id=63,
                                  aux_layers=aux, draft_vocab_size=draft_vocab)
    return randomised(DFlashModel(cfg), target, draft_vocab, seed)


class MarkovBlocks(DFlashModel):
    """A block drafter whose masked position i outputs e_{σ^(i-1)(anchor)} (the cache written as usual), over an LM
    head that is the target's made flatter: position i's candidates are the target's likely tokens i steps ahead,
    good but imperfect, so both acceptance and rejection happen."""

    def draft_block(self, anchors, last, cache, kv_len=None):
        super().draft_block(anchors, last, cache, kv_len)
        chain = [anchors, anchors] + [successor(anchors, i) for i in range(1, self.cfg.block_size - 1)]
        return self.embed_weight[torch.stack(chain, 1)]


def markov_blocks(target, draft_vocab=None) -> MarkovBlocks:
    cfg = DFlashConfig.for_target(target.config, num_layers=1, block_size=5, mask_token_id=0, aux_layers=(0,),
                                  draft_vocab_size=None if draft_vocab is None else len(draft_vocab))
    model = MarkovBlocks(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
        model.norm.weight.fill_(VOCAB ** -0.5)
        ids = torch.arange(VOCAB) if draft_vocab is None else draft_vocab
        model.lm_head.weight.copy_((target.lm_head.weight * 0.6)[ids])
    if draft_vocab is not None:
        model.set_token_ids(draft_vocab)
    return model.attach(target.get_input_embeddings().weight)


def feature_batch(model, positions: int, tokens: int, capacity: int):
    """For a drafter over the target's features (EAGLE's, the block drafter's model): a cache of two rows, the second
    left-padded by 2, and random features [2, positions, L*H] and tokens [2, tokens] (seeded)."""
    gen = torch.Generator().manual_seed(1)
    cache = model.new_cache(2, capacity, torch.tensor([0, 2]))
    width = len(model.cfg.aux_layers) * model.cfg.target_hidden_size
    return (cache, torch.randn(2, positions, width, generator=gen),
            torch.randint(0, model.cfg.vocab_size, (2, tokens), generator=gen))


def fused_backend(kernels: str):
    """The backend whose fused forwards run ``kernels``: "cpu" (specdec's CPU kernels) or "triton" (its Triton
    kernels, under Triton's interpreter on CPU); skips the test where that set cannot run here."""
    import pytest

    from specdec.models import Backend, cpu_kernels, gpu_kernels

    if kernels == "cpu":
        if not cpu_kernels.available():
            pytest.skip("specdec's CPU kernels are not built here")
        return Backend()
    if not (gpu_kernels.available() and gpu_kernels.interpreted()):
        pytest.skip("Triton's interpreter is not on here (Triton missing, or a GPU present)")
    return Backend.interpreted_gpu()


def read_late_and_each_step(monkeypatch, target, drafter, ids, mask, k, eos, max_new_tokens=12, **sampling):
    """A speculative run read back each step, then one read a step late (engine._pipelined_steps, as on a GPU): each
    run's outputs and the counts that do not depend on the clock. ``sampling`` with a temperature: each run draws
    from its own generator seeded alike."""
    from specdec.decode import engine

    runs = []
    for devices in ((), ("cpu", "cuda")):
        monkeypatch.setattr(engine, "PIPELINED_DEVICES", devices)
        seeded = {"generator": torch.Generator(ids.device).manual_seed(3)} if sampling else {}
        out = speculative_generate(target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=max_new_tokens,
                                   eos_token_id=eos, **sampling, **seeded)
        stats = out.stats
        runs.append((out.sequences, (stats.target_forwards, stats.new_tokens, stats.verify_steps,
                                     stats.verified_tokens, stats.accepted_tokens, stats.proposed_tokens)))
    return runs


def check_read_late_as_each_step(monkeypatch, target, drafter, ids, mask, k, max_new_tokens=12) -> None:
    """Read a step late (engine._pipelined_steps, as on a GPU), ``drafter`` gives the outputs and counts of the loop
    that reads each step: greedy (plain decoding's output), with an EOS from the output, and sampled."""
    free = autoregressive_generate(target, ids, max_new_tokens=max_new_tokens, attention_mask=mask, eos_token_id=[])
    for eos, sampling in (([], {}), ([free.sequences[0][5]], {}), ([], {"temperature": 1.0})):
        each_step, read_late = read_late_and_each_step(monkeypatch, target, drafter, ids, mask, k, eos, max_new_tokens,
                                                       **sampling)
        assert read_late == each_step, (eos, sampling)
        if not eos and not sampling:
            assert each_step[0] == free.sequences


class OracleTreeDrafter(Drafter):
    """Drafts each row's true continuation (``rows``: prompt and greedy output) into two trees of four nodes in turn,
    ``(tree, lines)``: node i drafts the true token ``lines[i]`` places ahead (None: a wrong token)."""

    def __init__(self, rows, trees):
        super().__init__()
        self.rows, self.trees, self.turn = rows, trees, 0

    @classmethod
    def from_config(cls, cfg, target, tokenizer=None, backend=None):
        raise NotImplementedError

    def propose(self, state, k):
        tree, lines = self.trees[self.turn % 2]
        self.turn += 1
        ahead = [(row[len(seen):] + [0] * 4)[:4] for row, seen in zip(self.rows, state.tokens)]
        return Proposal(tokens=torch.tensor([[0 if i is None else a[i] for i in lines] for a in ahead],
                                            device=state.seq.device), tree=tree)

    def observe(self, state):
        pass


def ops_after_forward(ops: list[tuple], interpreted: bool = False) -> collections.Counter:
    """The torch ops that launch a kernel (not views, not allocations) among a captured graph's ``ops`` after the
    target's forward, whose last op is its LM head's product (a matrix product of the tiny Llama's; the verdict and
    the commit have none). ``interpreted``: Triton's interpreter ran kernels in it, whose copies of their tensors
    (``copy_``, ``set_``) are left out."""
    last = max(i for i, op in enumerate(ops) if op[0].split(".")[1] in ("mm", "addmm", "bmm"))
    skip = {"empty", "new_empty", "empty_like"} | ({"copy_", "set_"} if interpreted else set())
    counts: collections.Counter = collections.Counter()
    for name, *_ in ops[last + 1:]:
        namespace, op, overload = name.split(".")
        if op not in skip and not getattr(getattr(getattr(torch.ops, namespace), op), overload).is_view:
            counts[op] += 1
    return counts
