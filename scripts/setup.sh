#!/usr/bin/env bash
# Create .venv and install the project. Touches nothing outside the repository:
#   bash scripts/setup.sh              everything the tests, benchmarks and quick start use
#   bash scripts/setup.sh quickstart   only what the quick start needs (server + onnxruntime)
# The dashboard's browser test also needs Chromium from the system: scripts/test.sh installs it
# (scripts/install_browser.sh, which asks apt-get), or run that script yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-dev}
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if [ "$PROFILE" = quickstart ]; then
    # -qq: errors only (no notes about the editable build or the package index setup)
    .venv/bin/python -m pip install -qq --disable-pip-version-check -e '.[server]' \
        'onnxruntime>=1.17'
    exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# PyTorch is an optional baseline (benchmarks, exporter tests); these machines carry a local
# CPU wheel of 2.13.0. Elsewhere the tests that need it skip.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q 'torch==2.13.0' 2>/dev/null \
        || echo "setup: torch==2.13.0 not installable here; torch-based tests will skip"
fi
