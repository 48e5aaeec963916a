"""What the tests share: tiny random models and tokenizers (fast unit tests), tiny training configs, the checks
several test files run (a shipped drafter on the real target, an export's --force), and the repository's paths.
Fixtures built from these live in conftest.py."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def tiny_llama(vocab_size: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=2 * hidden,
                         max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


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
