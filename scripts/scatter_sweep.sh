#!/usr/bin/env bash
# Times moe_scatter_reduce[_q]'s small-M launch shapes with PDL off and on, for both PDL
# trigger placements (gpu/tests/scatter_sweep.cu; run on the GPU machine from the repo root):
#   bash scripts/scatter_sweep.sh > scatter_sweep.csv
# Builds one binary per (trigger placement, model_dim) in parallel, then runs them one after
# another.  stdout: the CSV (one header), then every "best,..." line (the fastest shape per
# op, model_dim, topk, M, PDL setting and trigger placement).
set -eu
src=csrc/kernels/mxfp4_moe/gpu/tests/scatter_sweep.cu
dir=$(mktemp -d)
pids=()
for t in 0 1; do
  for d in 2560 3072 4096 7168; do
    nvcc -std=c++17 -O3 -arch=sm_90 -DAITER_AUX_PDL_EARLY_TRIGGER=$t -DSWEEP_DIM=$d \
      -I csrc/kernels/mxfp4_moe "$src" -o "$dir/sweep_${t}_$d" > "$dir/build_${t}_$d.log" 2>&1 &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do
  wait "$p" || { cat "$dir"/build_*.log >&2; exit 1; }
done
for t in 0 1; do
  for d in 2560 3072 4096 7168; do
    SWEEP_NO_HEADER=1 "$dir/sweep_${t}_$d" > "$dir/out_${t}_$d.csv"
  done
done
echo "op,D,topk,M,pdl,trigger,shape,us"
cat "$dir"/out_*.csv | grep -v '^best,'
cat "$dir"/out_*.csv | grep '^best,'
