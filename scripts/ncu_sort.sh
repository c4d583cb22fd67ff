#!/usr/bin/env bash
# ncu profiles of single moe_sort kernels (sort_sweep.cu argv mode) -> $OUT
set -u
nvcc -std=c++17 -O3 -lineinfo -arch=sm_90 -I csrc/kernels/mxfp4_moe csrc/kernels/mxfp4_moe/gpu/tests/sort_sweep.cu -o /tmp/ss || exit 1
for c in "$@"; do
  name=$(echo $c | tr ' ' _)
  ncu --set full --import-source yes --cache-control all --clock-control none -k regex:sort -s 1 -c 1 -o /tmp/r_$name /tmp/ss $c > /dev/null 2>&1
  ncu -i /tmp/r_$name.ncu-rep --page details > $OUT/d_$name.txt 2>&1
  ncu -i /tmp/r_$name.ncu-rep --page source --print-source sass --csv > /tmp/s_$name.csv 2>&1
  python3 - /tmp/s_$name.csv >> $OUT/d_$name.txt <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next((i for i, r in enumerate(rows) if "Source" in r), 0)
h = rows[hi]
rows = rows[hi:]
print("columns:", h)
def col(name):
    for i, x in enumerate(h):
        if x.startswith(name): return i
    return None
si = col("Warp Stall Sampling (All") or col("stall_sampling") or col("Warp Stall Sampling")
src = col("Source")
addr = col("Address")
if si is None: print("no stall column"); sys.exit()
body = [r for r in rows[1:] if len(r) > si]
def f(x):
    try: return float(x)
    except: return 0.0
tot = sum(f(r[si]) for r in body)
print("total samples", tot)
top = set(sorted(range(len(body)), key=lambda i: -f(body[i][si]))[:60])
for i, r in enumerate(body):
    print(f"{i:5d} {f(r[si]):7.0f} {'*' if i in top else ' '} {r[src][:100]}")
PY
done
