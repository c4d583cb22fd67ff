#!/usr/bin/env bash
# On the GPU machine: build the CUDA module for the whole catalog, run the test suite
# (GPU tests included), compute-sanitizer memcheck + racecheck on a representative run.
# Logs go to $OUT (default ./gpu_out).  Optional: wheels in .whl/ for missing packages.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export AITER_AUX_CACHE_DIR=${AITER_AUX_CACHE_DIR:-/tmp/aiter_aux_cache} MAX_JOBS=${MAX_JOBS:-$(nproc)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
echo "== build (cuda, full catalog)"
/usr/bin/time -v python3 -m aiter_aux.cli build --backend cuda 2>&1 | tee "$OUT/build.log" \
  | grep -E "instances|wall time|module|Elapsed|error|FAILED"
echo "== tests"
python3 -m pytest ${PYTEST_TARGETS:-op_tests/test_backends.py op_tests/test_torch_ops.py op_tests/test_mxfp8.py} -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | tail -25
echo "== compute-sanitizer"
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/gpu_sanitize.py \
    > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
done
