"""Shared fixtures: tiny random Llama models (fast unit tests) and the real default target (integration)."""

from __future__ import annotations

import os
import shutil

# Without a GPU specdec's Triton kernels run in Triton's interpreter, which Triton reads when it is imported (torch
# and transformers may import it): set before them. nvidia-smi stands for a CUDA device (torch is not imported yet).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A pytest-xdist worker (scripts/test.sh runs one a core) keeps to one thread, and so do the jobs it starts: OpenMP's
# threads of two workers sharing two cores spin against each other (three times slower than one process).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch
from helpers import make_markov_target, tiny_llama, tiny_train_pair
from transformers import LlamaForCausalLM

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


def _dot_a_row_at_a_time() -> None:
    """Triton's interpreter computes ``tl.dot`` with numpy's matmul, whose order of sums for a row depends on the
    row's place in the tile on some hosts (OpenBLAS's AVX2 kernels: a row in a tile's first place and the same row
    in its eighth differ in the last bit); a GPU's MMA gives a row the same bits wherever it sits, which
    ``target.exact_numerics``' kernels rely on. Under the interpreter each row is multiplied alone, as on a GPU."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    whole = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        rows = [whole(self, interpreter.TensorHandle(a.data[..., i:i + 1, :], a.dtype), b,
                      interpreter.TensorHandle(d.data[..., i:i + 1, :], d.dtype), input_precision,
                      max_num_imprecise_acc) for i in range(a.data.shape[-2])]
        return interpreter.TensorHandle(np.concatenate([row.data for row in rows], axis=-2), rows[0].dtype)

    interpreter.InterpreterBuilder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET") == "1":
    _dot_a_row_at_a_time()


@pytest.fixture(scope="session")
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(layers=3, seed=0)


@pytest.fixture(scope="session")
def tiny_draft() -> LlamaForCausalLM:
    return tiny_llama(hidden=16, layers=1, heads=2, kv_heads=1, seed=1)


@pytest.fixture(scope="module")
def tiny_pair():
    """The tiny target and tokenizer the training tests use (a fresh pair per module: tests set its chat template)."""
    return tiny_train_pair()


@pytest.fixture(scope="module")
def markov_target():
    """A bigram Llama (:func:`helpers.make_markov_target`): exactness tests sample through it."""
    return make_markov_target()


@pytest.fixture(scope="session")
def real_target():
    """SmolLM2-135M-Instruct, the embedded default (converted once to a local safetensors cache)."""
    from specdec.models.loading import load_target

    return load_target()


@pytest.fixture(scope="session")
def real_prompts(real_target):
    """Token ids of a few real prompts: MT-Bench questions (chat template) and HumanEval problems."""
    from specdec.jobs.data import encode_prompt, load_prompt_mix

    _, tokenizer = real_target
    rows = load_prompt_mix(["mtbench", "humaneval"], 3)
    return [encode_prompt(tokenizer, row) for row in rows]


def pytest_collection_modifyitems(config, items):
    """GPU tests run where CUDA is present and are skipped (not failed) elsewhere, e.g. in CI."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
