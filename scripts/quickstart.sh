#!/usr/bin/env bash
# The quick start: install into .venv (nothing outside it; a C compiler must be there), write a
# ResNet-18 generated in code, tune it on this machine with a small budget (an embedded SQLite
# server and one local CPU worker), then build the model with the default and the tuned configs
# and time both against onnxruntime. Everything stays in .tuner/quickstart/; run it again to
# resume an interrupted run or to see the summary of a finished one without measuring again.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    echo "quickstart: needs a C compiler (cc or gcc) to link kernels; install gcc first" >&2
    exit 2
fi
bash scripts/setup.sh quickstart
DIR=.tuner/quickstart
mkdir -p "$DIR"
[ -f "$DIR/resnet18.onnx" ] || .venv/bin/tuner sample-model resnet18 -o "$DIR/resnet18.onnx"
exec .venv/bin/tuner tune "$DIR/resnet18.onnx" -o "$DIR/resnet18-tuned" \
    --trials "${TRIALS:-16}" --compare "$@"
