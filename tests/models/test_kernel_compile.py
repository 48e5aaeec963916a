"""specdec's Triton kernels compiled for an H100/H200 (sm_90) by Triton's own compiler, on a machine without a GPU
(``experiments/gpu/compile_kernels.py``): the interpreter the other kernel tests run under accepts code a GPU's
compiler refuses, which a GPU run's first minutes used to find."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "gpu" / "compile_kernels.py"


def _compile_check(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # it compiles for a GPU
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


def test_every_kernel_launch_of_a_bf16_step_compiles_for_an_h100():
    """Every launch of a prefill, a one-token step, a chain and a tree at SmolLM2-135M's shape in bf16 (with and
    without exact numerics) and of the drafters' kernels compiles for sm_90 within its shared memory."""
    run = _compile_check("--quick")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "FAILED" not in run.stdout
    for kernel in ("attention_kernel", "rms_norm_kernel", "product_kernel", "top_k_kernel"):
        assert f"| {kernel} | 90 |" in run.stdout, kernel


def test_a_kernel_the_interpreter_runs_and_the_compiler_refuses_fails_the_check():
    """Planted: a loop-carried name rebound from bf16 to float32 runs under the interpreter and fails here."""
    run = _compile_check("--planted")
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    assert "| planted_rebinding_kernel | 90 |" in run.stdout and "FAILED" in run.stdout


@pytest.mark.slow  # ~2 min: every dtype, the 8B shapes, an A100's sm_80 too
def test_every_kernel_launch_compiles_for_an_a100_and_an_h100():
    run = _compile_check("--arch", "80", "90")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
