#!/usr/bin/env bash
# On the H200: ncu profiles of the decode kernels (the tiny sort with a fused quant, and with
# the sorted scales too) for a few shapes / M.  Writes text reports under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} AITER_AUX_BACKEND=cuda
export AITER_AUX_CACHE_DIR=${AITER_AUX_CACHE_DIR:-/tmp/c_after} PYTHONPATH=$PWD
python3 -m aiter_aux.cli build 2>&1 | tail -2
CASES=${CASES:-"decode_pipeline:257,7168,256,9:1 decode_pipeline:257,7168,256,9:16 moe_sort_quant:257,7168,256,9:16"}
for c in $CASES; do
  tag=$(echo "$c" | tr ':,' '__')
  ncu --clock-control none --kernel-name regex:"${KERNEL:-sort_tiny}" --launch-skip 1 --launch-count 1 \
    --set full --import-source no \
    python3 csrc/kernels/mxfp4_moe/gpu/tests/ncu_cases.py "$c" > "$OUT/ncu_$tag.txt" 2>&1
  echo "$c: $(grep -E 'Duration|Registers Per|Achieved Occupancy' "$OUT/ncu_$tag.txt" | tr -s ' ' | tr '\n' ';')"
done
