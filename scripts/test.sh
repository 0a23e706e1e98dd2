#!/usr/bin/env bash
# Set up and run the whole test suite: lint, types, tests (what .ci/run calls). Unlike the quick
# start, this installs a system package: Chromium for the dashboard browser test (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_browser.sh
export OPENBLAS_NUM_THREADS=1
.venv/bin/ruff check schedule_templates workers tuner_service migrations tests bench
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
# Two pytest workers (TUNER_TEST_WORKERS=0 runs in this process: the order and -x of a plain
# run); --dist worksteal hands a finished worker tests queued for the other, so the run does not
# end on one worker's long tail. Tests are isolated (tmp dirs, free ports, a private PostgreSQL
# schema each); the PostgreSQL restart test and tests marked `alone` wait for the other worker
# through file locks (tests/conftest.py).
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${TUNER_TEST_WORKERS:-2}" \
    --dist worksteal "$@"
