#!/usr/bin/env bash
# Create .venv-zoo: the exporter environment for bench/zoo.py.
#
# PyPI's torchvision wheels need the torch release they were built against; the main .venv
# carries torch 2.13 (a baseline for the benchmarks), which no current torchvision imports
# beside. The zoo exports its models with this separate interpreter (in a subprocess), so the
# main environment stays as it is. About 5.5 GB; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${ZOO_VENV:-.venv-zoo}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
if "$VENV/bin/python" -c 'import torch, torchvision, transformers, onnx, onnxscript' 2>/dev/null; then
    echo "zoo_env: $VENV is ready"
    exit 0
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q 'torch==2.14.1' 'torchvision==0.29.1' \
    'transformers>=4.40' onnx onnxscript numpy
"$VENV/bin/python" -c 'import torch, torchvision, transformers, onnx, onnxscript' \
    && echo "zoo_env: $VENV is ready"
