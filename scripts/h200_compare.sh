#!/usr/bin/env bash
# On the H200: build the CUDA module of this tree (and of a reference tree in .before/, if
# present), run the GPU tests, compute-sanitizer, the host-cost benchmark and
# bench_aux --quick for both trees in the same call.  Everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} AITER_AUX_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__)" >> "$OUT/gpu.txt"
echo "== build (cuda, full catalog): this tree"
AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD /usr/bin/time -f "%e s wall" \
  python3 -m aiter_aux.cli build 2>&1 | tee "$OUT/build_after.log" | tail -4
if [ -d .before ]; then
  echo "== build: reference tree"
  (cd .before && AITER_AUX_CACHE_DIR=/tmp/c_before PYTHONPATH=$PWD/.before \
    python3 -m aiter_aux.cli build 2>&1 | tail -2)
fi
echo "== tests"
AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider \
  ${PYTEST_TARGETS:-op_tests/test_backends.py op_tests/test_torch_ops.py op_tests/test_mxfp8.py op_tests/test_binding.py op_tests/test_fuzz_ops.py op_tests/test_serving_options.py op_tests/test_compat_aiter.py} \
  2>&1 | tee "$OUT/tests.log" | tail -6
echo "== compute-sanitizer"
for tool in ${SANITIZERS:-memcheck racecheck}; do
  AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD compute-sanitizer --tool $tool --error-exitcode 9 \
    python3 scripts/gpu_sanitize.py > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
done
echo "== aiter-aux run on the GPU (serving options included)"
AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 -m aiter_aux.cli run --device cuda \
  --shape 385,7168,512,9 --tokens 1,64,4096 --ep-ranks 4 --shared-init --routed-scaling 2.5 \
  > "$OUT/run_cuda.txt" 2>&1; echo "run: $? ; $(tail -1 "$OUT/run_cuda.txt")"
AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 -m aiter_aux.cli run --device cuda \
  --shape 96,5120,2304,6 --quant mxfp8 --tokens 1,16,512,4096 --shared-init \
  > "$OUT/run_cuda_fp8.txt" 2>&1; echo "run mxfp8: $? ; $(tail -1 "$OUT/run_cuda_fp8.txt")"
if [ "${HOST:-1}" = 1 ]; then
echo "== host cost"
AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 benchmarks/bench_host.py --csv "$OUT/host.csv" \
  2>&1 | tee "$OUT/host.txt" | tail -28
if [ -d .before ]; then
  (cd .before && AITER_AUX_CACHE_DIR=/tmp/c_before PYTHONPATH=$PWD/.before python3 benchmarks/bench_host.py \
    --csv "$OUT/host_before.csv" > "$OUT/host_before.txt" 2>&1; echo "host before: $?")
fi
fi
if [ "${BENCH:-1}" = 1 ]; then
  echo "== bench_aux --quick: this tree, then the reference tree"
  AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 benchmarks/bench_aux.py --quick \
    --no-compile-peer --out "$OUT/after" > "$OUT/bench_after.txt" 2>&1; echo "after: $?"
  if [ -d .before ]; then
    (cd .before && AITER_AUX_CACHE_DIR=/tmp/c_before PYTHONPATH=$PWD python3 benchmarks/bench_aux.py \
      --quick --no-compile-peer --out "$OUT/before" > "$OUT/bench_before.txt" 2>&1; echo "before: $?")
  fi
fi
if [ "${MIDM:-0}" = 1 ]; then
  echo "== moe_sort / moe_sort_quant at every M (the peer table's shapes): this tree, then the reference tree"
  MID="--no-compile-peer --ops moe_sort moe_sort_quant --tokens 1 64 128 256 512 1024 2048 4096 16384
       --shapes 257,7168,256,9 896,3584,512,16 256,7168,256,8 513,2560,768,11"
  AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 benchmarks/bench_aux.py $MID \
    --out "$OUT/mid_after" > "$OUT/mid_after.txt" 2>&1; echo "mid after: $?"
  if [ -d .before ]; then
    (cd .before && AITER_AUX_CACHE_DIR=/tmp/c_before PYTHONPATH=$PWD python3 benchmarks/bench_aux.py \
      $MID --out "$OUT/mid_before" > "$OUT/mid_before.txt" 2>&1; echo "mid before: $?")
  fi
fi
if [ "${FP8BENCH:-1}" = 1 ]; then
  echo "== a8w4: mxfp8 against mxfp4 and the sort (the MXFP8 goals)"
  AITER_AUX_CACHE_DIR=/tmp/c_after PYTHONPATH=$PWD python3 benchmarks/bench_aux.py --no-compile-peer \
    --shapes 96,5120,2304,6 257,7168,256,9 --tokens 1 16 64 1024 4096 16384 \
    --ops moe_sort mxfp4_quant mxfp8_quant moe_sort_quant moe_sort_quant_fp8 \
    --out "$OUT/fp8" > "$OUT/fp8.txt" 2>&1; echo "fp8 bench: $?"
fi
