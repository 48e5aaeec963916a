#!/usr/bin/env bash
# The test command of the README's Quickstart (and of .ci/run): install, then the default test tier.
# pytest's exit code 5 ("no tests collected") is an error here: a run that tests nothing must not pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
# -n: one worker a core (SPECDEC_TEST_WORKERS, default 2, the CI machine's cores; 0 = no workers; worksteal: an idle
# worker takes queued tests from a busy one, so the slow ones do not end the run on one worker). Most tests are
# a single thread's work (tiny models, Triton's interpreter, a job's imports), so two workers on two cores take ~0.6
# of one process's time. Each worker and the jobs it starts keep to one thread (conftest.py): two processes of two
# OpenMP threads each on two cores ran three times slower than one process.
# --durations: the slowest tests, so whoever meets a slow suite sees where the time goes.
python3 -m pytest -n "${SPECDEC_TEST_WORKERS:-2}" --dist worksteal --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as failure" >&2
    exit 1
fi
exit "$rc"
