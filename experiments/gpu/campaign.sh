# The GPU campaign in one command, on a GPU machine after stages 1 and 2 (README.md here):
#     source experiments/gpu/setup.sh && BUDGET=560 bash experiments/gpu/campaign.sh
# runs the GPU tests (the training's last), the benchmark (plain decoding eager, on graphs with specdec's Triton
# kernels and with torch's ops, transformers' peers, and each drafter on graphs) in bf16 at batch 1 and 8, the same with
# target.exact_numerics (its cost, and which outputs still differ from plain decoding), specdec's rows sampled at
# T=1 (SAMPLED_PROMPTS, 4 by default; at top-p SAMPLED_TOP_P, 1 by default), a profile of plain
# decoding's loop (the host's work a step), a profile of the target's step (its kernels, a graph's replay), the
# step's cost curves at Llama-3.1-8B's and Qwen3-8B's shapes (random weights) and the drafters' steps at the
# former's width, profiles of Medusa's and EAGLE's fixed trees (drafted on the device), and the benchmark in float32
# with compiled graphs, in that order. Each step has its own time
# limit, and all of them end within BUDGET seconds (a step that would start with under 30 s left is skipped);
# logs and results go to $OUT as they are written, so what finished comes back even when a later step ran out of
# time; at the end they are packed into $OUT/campaign.tar.gz (a device call brings back 8 files at most; the
# machine and the tables are printed too). PROMPTS and NEW shrink the benchmark (a CPU check:
# PROMPTS=1 BF16_PROMPTS=1 NEW=8 STEP_COSTS="--shape llama-3.2-1b --layers 1 --widths 1 2 --batch 1 --repeats 2"
# QWEN_COSTS="--shape qwen3-8b --layers 1 --widths 1 --batch 1 --repeats 2" DRAFT_COSTS="--shape llama-3.2-1b
# --layers 1 --widths 1 --batch 1 --repeats 2 --drafters eagle medusa dflash draft_model --draft-shape
# specdec/assets/draft_model/smollm2-135m/config.json"
# OUT=/tmp/c \
# bash experiments/gpu/campaign.sh). STEPS, when set, names the steps to run (e.g.
# STEPS="bench_bf16 bench_exact tests"), in the order below.
set -u
BUDGET=${BUDGET:-560}
PROMPTS=${PROMPTS:-6}
NEW=${NEW:-128}
BF16_PROMPTS=${BF16_PROMPTS:-8}
OUT=${OUT:?set OUT, the directory the results go to}
mkdir -p "$OUT"
start=$SECONDS

step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND with its output in $OUT/NAME.log, within the budget
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    if [[ -n ${STEPS:-} && " $STEPS " != *" $name "* ]]; then echo "== $name: not in STEPS"; return; fi
    local left=$((BUDGET - (SECONDS - start) - 5))
    ((left < limit)) && limit=$left
    if ((limit < 30)); then echo "== $name: skipped, ${left}s of the budget left"; return; fi
    echo "== $name (at most ${limit}s): $*"
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - began))s$( ((rc == 124)) && echo ' (out of time)')"
    tail -n 14 "$OUT/$name.log"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU"
    python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} | tee "$OUT/machine.txt"

bench=(python3 experiments/benchmarks/gpu.py --prompt-file .gpu/prompts.json --prompts "$PROMPTS" --new "$NEW")
# SKIP: the benchmark's methods left out, by word (the drafters' eager variants by default; the draft model's chain
# replays one graph a step)
read -r -a skip <<<"${SKIP:-eager}"
# -v: each test's verdict is in the log as it runs, so a step stopped at its limit still says what passed
step tests 120 python3 -m pytest -v --tb=short -m gpu tests --ignore=tests/training -p no:cacheprovider
step bench_bf16 300 "${bench[@]}" --prompts "$BF16_PROMPTS" --batch 8 --dtype bfloat16 --skip "${skip[@]}" \
    --out "$OUT/bf16"
step bench_exact 180 "${bench[@]}" --prompts "${EXACT_PROMPTS:-$BF16_PROMPTS}" --batch 8 --dtype bfloat16 \
    --exact-numerics --skip eager draft_model transformers torch read K=15 --out "$OUT/exact"
# sampled at T=1: the exact rule's verdict inside the target's graph (uniforms drawn before it), every drafter
step bench_sampled 150 "${bench[@]}" --prompts "${SAMPLED_PROMPTS:-4}" --batch 0 --dtype bfloat16 --temperature 1 \
    --top-p "${SAMPLED_TOP_P:-1}" --skip eager draft_model torch read K=15 --out "$OUT/sampled"
step profile_plain 60 python3 experiments/gpu/profile_draft.py --prompt-file .gpu/prompts.json --prompts 2 \
    --new "$NEW" --drafter none --out "$OUT/profile_plain"
step profile_step 120 python3 experiments/gpu/profile_step.py --out "$OUT/profile_step"
read -r -a costs <<<"${STEP_COSTS:---shape llama-3.1-8b}"  # step_costs.py's arguments (a CPU check: a small shape)
step step_costs 120 python3 experiments/benchmarks/step_costs.py "${costs[@]}" --out "$OUT/step_costs"
read -r -a qwen <<<"${QWEN_COSTS:---shape qwen3-8b --widths 1 4 16 64 --repeats 20}"
step step_costs_qwen3 90 python3 experiments/benchmarks/step_costs.py "${qwen[@]}" --out "$OUT/step_costs_qwen3"
read -r -a drafts <<<"${DRAFT_COSTS:---shape llama-3.1-8b --widths 1 --repeats 20 --drafters eagle medusa dflash \
draft_model --draft-shape llama-3.2-1b}"
# into the target's curve where step_costs wrote it (the same shape and settings): one file for replay's costs=
into=()
for curve in "$OUT"/step_costs/step_costs_*.json; do [[ -f $curve ]] && into=(--into "$curve"); done
step step_costs_drafters 90 python3 experiments/benchmarks/step_costs.py "${drafts[@]}" "${into[@]}" \
    --out "$OUT/step_costs_drafters"
step profile_medusa 60 python3 experiments/gpu/profile_draft.py --prompt-file .gpu/prompts.json --prompts 2 \
    --new 64 --drafter medusa --fixed-tree --out "$OUT/profile_medusa"
step profile_eagle 60 python3 experiments/gpu/profile_draft.py --prompt-file .gpu/prompts.json --prompts 2 \
    --new 64 --drafter eagle --fixed-tree --out "$OUT/profile_eagle"
step tests_training 120 python3 -m pytest -v --tb=short -m gpu tests/training -p no:cacheprovider
step bench_float32 200 "${bench[@]}" --batch 0 --dtype float32 --compile --skip "${skip[@]}" --out "$OUT/float32"
echo "== campaign: $((SECONDS - start))s of a ${BUDGET}s budget"
# packed outside $OUT first: tar reading the folder it writes into fails ("file changed as we read it")
pack=$(mktemp -d)
tar czf "$pack/campaign.tar.gz" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$pack/campaign.tar.gz" "$OUT/"
