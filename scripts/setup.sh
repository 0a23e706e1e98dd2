#!/usr/bin/env bash
# Create .venv and install the project with everything its tests and quick start use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# PyTorch is an optional baseline (benchmarks, exporter tests); these machines carry a local
# CPU wheel of 2.13.0. Elsewhere the tests that need it skip.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q 'torch==2.13.0' 2>/dev/null \
        || echo "setup: torch==2.13.0 not installable here; torch-based tests will skip"
fi
# The dashboard's browser test drives Debian's Chromium (Playwright's own browser download does
# not work offline). Install it when we can; the browser test skips with the reason otherwise.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
        && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
        || (apt-get update -q >/dev/null 2>&1 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) \
        || echo "setup: could not install chromium; the dashboard browser test will skip"
fi
