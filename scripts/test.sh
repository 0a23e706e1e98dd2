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
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
