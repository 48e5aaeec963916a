# Source this at the start of every command of GPU work on the GPU machine (stage 3 on, experiments/gpu/README.md):
# it installs the carried wheels, rebuilds the target from the parts copied to /tmp/kit by stages 1 and 2 (once
# per machine), and points specdec at it. A command that finds a fresh machine (the parts gone) fails here,
# naming the stages to run again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || { echo "setup: no wheels under .gpu/whl: carry .gpu/whl (kit.py pack writes it)"; return 1; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
export SPECDEC_CACHE=/tmp/cache SPECDEC_CPU_KERNEL=0
python3 experiments/gpu/kit.py unpack --kit /tmp/kit --to "$SPECDEC_CACHE/smollm2-135m-instruct" \
    || { echo "setup: the target's parts are not on this machine (a fresh one?): run stages 1 and 2 again"; return 1; }
for late in /tmp/kit/assets/*/; do  # the shipped drafters stage 2 carried (kit.py's LATE), into the tree here
    # where the tree holds no file of theirs: the machine's copy of the tree can keep the empty folders of the files
    # the stages moved out (a run of 2026-11-27 found the block drafter missing so)
    name=$(basename "$late")
    if [ -d "$late" ] && [ -z "$(find "specdec/assets/$name" -type f 2>/dev/null | head -n 1)" ]; then
        rm -rf "specdec/assets/$name" && cp -r "$late" specdec/assets/
    fi
done
