# Train one learned drafter on the GPU machine in one command, within a wall budget (experiments/gpu/README.md):
#     source experiments/gpu/setup.sh && METHOD=eagle BUDGET=540 bash experiments/gpu/train.sh [overrides...]
# after stages 1 and 2, with stage train's carry (kit.py stage train: .gpu/whl, .gpu/train, and .gpu/resume to
# resume). It runs `python -m specdec.train method=$METHOD target.device=$DEVICE` on the prompts kit.py packed
# (.gpu/train/prompts.jsonl, the held-out sets beside it), the data phase then training, stopped (checkpointed) at
# stop_after_s so that the held-out evaluation, the export and the packing fit the budget; a run that stops
# short resumes from its checkpoint in a later call (its data built again there: a fresh machine has an empty disk).
# What it hands back is in $OUT as one bundle (kit.py split: METHOD.json and METHOD.part-NN, each under 16 MiB):
# a finished run's export, metrics.json, console.log (its output) and gpu.csv (the GPU's utilisation every 2 s); an unfinished
# one's checkpoint, console.log, gpu.csv and overrides.txt (the overrides it ran with, used again on resuming when
# none are given). Here: kit.py join <the call's files> --to <dir> rebuilds it, bit for bit.
# A CPU check of the same path (a tiny config; README.md here):
#     OUT=/tmp/t DEVICE=cpu METHOD=medusa BUDGET=300 bash experiments/gpu/train.sh data.num_prompts=16 ...
set -u
METHOD=${METHOD:?set METHOD: medusa, eagle, dflash or draft_model}
BUDGET=${BUDGET:-540}    # seconds, this script's whole wall time
RESERVE=${RESERVE:-75}   # of those, for the held-out evaluation, the export and the packing after training stops
DEVICE=${DEVICE:-cuda}
OUT=${OUT:?set OUT, the directory the results go to}
RUN=${RUN:-/tmp/train/$METHOD}  # output_dir: data, checkpoints, export (the data is never brought back)
TRAIN=${TRAIN:-.gpu/train}    # the prompts and held-out sets (kit.py pack)
RESUME=${RESUME:-.gpu/resume}  # a bundle to resume from (kit.py stage train --resume)
PARTS=${PARTS:-/tmp/resume}    # where its parts gather (those of the calls before this one too)
start=$SECONDS
mkdir -p "$OUT" "$RUN"
[ -f "$TRAIN/prompts.jsonl" ] || { echo "train.sh: no $TRAIN/prompts.jsonl: carry .gpu/train (kit.py stage train)"; exit 2; }

if [ -f "$RESUME/$METHOD.json" ] && [ ! -d "$RUN/checkpoints" ]; then  # a bundle an earlier call brought back
    mkdir -p "$PARTS" && cp "$RESUME"/* "$PARTS"/  # beside the parts that calls of their own put there
    python3 experiments/gpu/kit.py join "$PARTS" --name "$METHOD" --to "$RUN" || exit 2
fi
overrides=("$@")
if ((${#overrides[@]} == 0)) && [ -f "$RUN/overrides.txt" ]; then
    mapfile -t overrides <"$RUN/overrides.txt"
    echo "train.sh: resuming with the overrides it ran with: ${overrides[*]}"
fi
# kept for a resuming call, less the limits of this one (stop_after_steps, stop_after_s)
: >"$RUN/overrides.txt"
for arg in "${overrides[@]}"; do [[ $arg == stop_after_* ]] || printf '%s\n' "$arg" >>"$RUN/overrides.txt"; done

gpu_log=""
if command -v nvidia-smi >/dev/null && [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw --format=csv -l 2 \
        >"$RUN/gpu.csv" 2>/dev/null &
    gpu_log=$!
fi
held=$TRAIN/held_out
left=$((BUDGET - (SECONDS - start)))
echo "== train.sh: $METHOD on $DEVICE, ${left}s left, training stops at $((left - RESERVE))s"
timeout -k 10 $((left - 20)) python3 -m specdec.train method="$METHOD" target.device="$DEVICE" output_dir="$RUN" \
    export="$RUN/export" data.prompts_file="$TRAIN/prompts.jsonl" \
    "eval.answer_sources=[$held/mtbench.jsonl,$held/humaneval.jsonl]" "eval.text_sources=[$held/wikipedia.jsonl]" \
    stop_after_s=$((left - RESERVE)) "${overrides[@]}" >"$RUN/console.log" 2>&1
rc=$?
[ -n "$gpu_log" ] && kill "$gpu_log" 2>/dev/null
echo "== train.sh: rc $rc in $((SECONDS - start))s$( ((rc == 124)) && echo ' (out of time: nothing trained after the last checkpoint is kept)')"
grep -E "answered|stored the feature|stopping at|step [0-9]+/|Error|error" "$RUN/console.log" | tail -n 12
if [ -f "$RUN/export/provenance.json" ] && [ -f "$RUN/metrics.json" ]; then
    python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(json.dumps({k: m[k] for k in ('step',
'total_steps', 'times_s', 'score', 'decode_command') if k in m}))" "$RUN/metrics.json"
    keep=(export metrics.json console.log gpu.csv overrides.txt)
else
    keep=(checkpoints console.log gpu.csv overrides.txt)
fi
bundle=$(mktemp -d)
for name in "${keep[@]}"; do [ -e "$RUN/$name" ] && cp -r "$RUN/$name" "$bundle/"; done
python3 experiments/gpu/kit.py split "$bundle" --out "$OUT" --name "$METHOD"
status=$?
if ((status)) && [ -d "$bundle/checkpoints" ]; then  # a checkpoint larger than a call brings back (the draft model's)
    echo "train.sh: the checkpoint ($(du -sm "$bundle/checkpoints" | cut -f1) MB) cannot come back: this run cannot" \
        "resume on another machine; give it a budget it finishes in (fewer prompts or epochs)"
    python3 experiments/gpu/kit.py split "$bundle" --out "$OUT" --name "$METHOD" --exclude checkpoints
fi
rm -rf "$bundle"
echo "== train.sh: $((SECONDS - start))s of a ${BUDGET}s budget"
exit $((rc ? rc : status))
