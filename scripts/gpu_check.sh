#!/usr/bin/env bash
# The CUDA checks in one pass, on a lent GPU machine (docs/cuda.md): the GPU tests, then our
# kernels tuned on the GPU against cuBLAS/cuDNN. Writes logs to $OUT (or /tmp/gpu-check).
#
#   bash scripts/gpu_check.sh [TRIALS] [ONLY...]
#
# The machine is offline: .whl/ must hold what docs/cuda.md lists (pytools, platformdirs, mako,
# siphash24, pycuda as a wheel built elsewhere for cp312 or as its source distribution) and
# llvmlite 0.50 for cp312 (a wheel, or the wheel's contents as llvmlite.tar.xz).
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
site=/tmp/site
mkdir -p "$site"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/steps.log"; }

log "install"
[ -f .whl/llvmlite.tar.xz ] && tar xJf .whl/llvmlite.tar.xz -C "$site"
for wheel in .whl/*.whl; do python3 -m zipfile -e "$wheel" "$site"; done
export PYTHONPATH="$site:$PWD" CUDA_ROOT=/usr/local/cuda PATH="/usr/local/cuda/bin:$PATH"
if ! python3 -c "import pycuda.driver" 2>>"$OUT/steps.log"; then
    log "building pycuda from source"
    python3 -m pip install -q --no-build-isolation --no-index --no-deps --target "$site" \
        .whl/pycuda-*.tar.gz >"$OUT/pycuda-build.log" 2>&1
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -1
    python3 -c "import llvmlite, numpy, torch; print('llvmlite', llvmlite.__version__,
        'numpy', numpy.__version__, 'torch', torch.__version__)"
    python3 -c "import pycuda.autoinit, pycuda.driver as d; dev = d.Device(0);
print(dev.name(), dev.compute_capability(), 'SMs', dev.get_attribute(d.device_attribute.MULTIPROCESSOR_COUNT))"
} 2>&1 | tee "$OUT/machine.txt"

trials=${1:-12}
shift || true
only=()
for key in "$@"; do only+=(--only "$key"); done

log "pytest tests/cuda (background)"
(timeout 240 python3 -m pytest -q -n 6 -p no:cacheprovider -rs tests/cuda \
    >"$OUT/pytest.log" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.log") &

log "bench/kernels.py --target cuda, $trials trials"
timeout "${KERNELS_TIMEOUT:-330}" python3 bench/kernels.py --target "cuda -arch=sm_90" \
    --trials "$trials" --tuner "${TUNER:-random}" --json "${only[@]}" 2>"$OUT/kernels.err" | tee "$OUT/kernels.jsonl"
log "kernels rc ${PIPESTATUS[0]}"
wait
tail -5 "$OUT/pytest.log"
tail -20 "$OUT/kernels.err"
log "done"
