"""Runs a few aux-op cases 3 times each (inputs as in benchmarks/bench_aux.py), for
`ncu --clock-control none` profiles of single kernels.  Usage (repo root, GPU machine):
    python3 csrc/kernels/mxfp4_moe/gpu/tests/ncu_cases.py op:E,D,I,K:M [...]"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
from auxbench import cases as B  # noqa: E402


def main(argv):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for case in argv:
        op, shape, m = case.split(":")
        shape = tuple(int(v) for v in shape.split(","))
        m = int(m)
        base, s = B.make_base(shape, m, 32, dev, 0, {op})
        spec = B.op_spec(op, base, s, dev, False)
        out = spec.new_outputs()
        for _ in range(3):
            spec.ours(spec.inputs, out)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        want = spec.new_outputs()
        spec.eager(spec.inputs, want)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(case, "rows", s.rows, "same" if spec.same(out, want) else "MISMATCH", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
