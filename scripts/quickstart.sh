#!/usr/bin/env bash
# Set up and run the main job on the embedded default: a SQLite server, one local CPU worker,
# a ResNet-18 generated in code, tuned with a small budget; ends with a per-task GFLOPS table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tuner up --model resnet18 --trials-per-task "${TRIALS:-16}" "$@"
