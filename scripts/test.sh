#!/usr/bin/env bash
# The test command of the README's Quickstart (and of .ci/run): install, then the default test tier.
# pytest's exit code 5 ("no tests collected") is an error here: a run that tests nothing must not pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
# --durations: the slowest tests, so whoever meets a slow suite sees where the time goes.
python3 -m pytest --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as failure" >&2
    exit 1
fi
exit "$rc"
