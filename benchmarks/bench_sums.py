"""moe_sum at the peers' reduce shapes: bf16 ``[M, topk, model_dim]`` rows summed into
``[M, model_dim]`` (vLLM's ``moe_sum``, SGLang's ``moe_sum_reduce``), for any ``model_dim``
(bench_aux.py times the sums at catalog shapes only).  CUDA-graph replay of back-to-back
calls with the input rotated over more than twice the L2 (auxbench/timing.py, as
bench_aux.py), beside an elementwise copy of the same bytes in the same run::

    python3 benchmarks/bench_sums.py                       # the default grid
    python3 benchmarks/bench_sums.py --sizes 8,7168 4,2880 --tokens 1 64 1024

Prints one line per case: topk, model_dim, M, µs (median; spread = max/min of 3 repeats),
bytes moved, TB/s and that as % of the same-bytes copy; ``--csv`` writes the rows.
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch
from auxbench.common import log, ops, ref
from auxbench.timing import Timer, n_buffer_sets

SIZES = ("8,7168", "8,4096", "4,2880", "8,2048")  # (topk, model_dim)
TOKENS = (1, 4, 64, 256, 1024, 4096, 16384)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), help="TOPK,MODEL_DIM pairs")
    p.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    p.add_argument("--csv", default=None, help="write the rows to this CSV file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        log("bench_sums: needs a CUDA GPU")
        return 2
    dev = torch.device("cuda")
    timer = Timer(dev, quick=False)
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20))
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    log(
        f"copy bandwidth {timer.copy_bandwidth()[0] / 1e12:.2f} TB/s; node floor "
        f"{timer.node_floor_us():.2f} us"
    )
    log("topk  model_dim      M        us  spread      bytes   TB/s  %copy")
    for size in args.sizes:
        k, d = (int(v) for v in size.split(","))
        for m in args.tokens:
            nbytes = 2 * m * k * d + 2 * m * d
            sets = n_buffer_sets(timer, nbytes, l2)
            bufs = [
                (
                    torch.randn(m, k, d, generator=gen, device=dev, dtype=torch.bfloat16),
                    torch.empty(m, d, device=dev, dtype=torch.bfloat16),
                )
                for _ in range(sets)
            ]
            calls = [(lambda x=x, o=o: ops.moe_sum_out(x, o)) for x, o in bufs]
            x0, o0 = bufs[0]
            ops.moe_sum_out(x0, o0)
            if m <= 1024:  # the output equals the reference's bytes (the spec)
                want = ref.moe_sum(x0.cpu()).view(torch.int16)
                assert torch.equal(o0.cpu().view(torch.int16), want), (k, d, m)
            est = timer.once_us(calls[0])
            reps = [timer.ours_us(calls, est)[0] for _ in range(3)]
            us = sorted(reps)[1]
            copy_us = timer.same_bytes_copy_us(nbytes, l2)
            tbs = nbytes / (us * 1e-6) / 1e12
            row = {
                "topk": k, "model_dim": d, "M": m, "us": round(us, 3),
                "spread": round(max(reps) / min(reps), 3), "bytes": nbytes,
                "tb_s": round(tbs, 3), "pct_copy": round(100 * copy_us / us, 1),
            }  # fmt: skip
            rows.append(row)
            log(f"{k:4d} {d:10d} {m:6d} {us:9.3f} {row['spread']:7.3f} {nbytes:10d} "
                f"{tbs:6.2f} {row['pct_copy']:6.1f}")  # fmt: skip
            del bufs, calls
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
