"""Markdown tables (rows: E of the shape, columns: M) of bench_aux's results.csv files.

    python benchmarks/perf_tables.py docs/bench/h200_run18.csv
    python benchmarks/perf_tables.py --goals run/results.csv run_fp8/results.csv  # goal lines

The files are merged (a later file's row wins), so a fused op's parts may come from another
invocation of the same run.  For each op: its time in µs; for each fused op of
``FUSED_PARTS`` whose parts are all present: its time over theirs combined (max or sum, as
bench_aux's own ratio column).  ``--ops`` picks and orders the ops.  ``--goals`` prints the
goals of ``benchmarks/goals.json`` checked against the merged rows instead, as bench_aux
does.  This is how the tables of docs/perf.md are made.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from auxbench.goals import evaluate  # noqa: E402
from auxbench.report import FUSED_PARTS, read_csv  # noqa: E402


def load(paths: list[Path]) -> dict[tuple[str, int, int], float]:
    times: dict[tuple[str, int, int], float] = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["ours_us"]:
                    times[(r["op"], int(r["expert"]), int(r["tokens"]))] = float(r["ours_us"])
    return times


def table(heading: str, es: list[int], ms: list[int], cell) -> str:
    lines = [heading, "", "| E \\ M | " + " | ".join(map(str, ms)) + " |"]
    lines.append("|---" * (len(ms) + 1) + "|")
    for e in es:
        lines.append(f"| {e} | " + " | ".join(cell(e, m) for m in ms) + " |")
    return "\n".join(lines) + "\n"


def tables(times: dict[tuple[str, int, int], float], ops: list[str] | None) -> str:
    present = sorted({k[0] for k in times}, key=lambda o: (o not in FUSED_PARTS, o))
    out = []
    for op in ops or present:
        es = sorted({e for (o, e, _) in times if o == op})
        ms = sorted({m for (o, _, m) in times if o == op})
        if not es:
            continue

        def us(e: int, m: int, op: str = op) -> str:
            v = times.get((op, e, m))
            return "" if v is None else f"{v:.2f}"

        out.append(table(f"**{op}** (µs)", es, ms, us))
        if op not in FUSED_PARTS:
            continue
        parts, combine = FUSED_PARTS[op]
        name = "max" if combine is max else "sum"

        def ratio(e: int, m: int, op: str = op, parts=parts, combine=combine) -> str:
            t = [times.get((p, e, m)) for p in parts]
            v = times.get((op, e, m))
            return "" if v is None or not all(t) else f"{v / combine(t):.2f}"

        if all(any(k[0] == p for k in times) for p in parts):
            out.append(table(f"**{op} / {name}({', '.join(parts)})**", es, ms, ratio))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", type=Path, help="bench_aux results.csv files")
    ap.add_argument("--ops", nargs="+", help="ops to print, in this order (default: all)")
    ap.add_argument("--goals", action="store_true", help="print the goal lines instead")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.csv if not p.is_file()]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    if args.goals:
        print(goal_report(args.csv))
    else:
        print(tables(load(args.csv), args.ops))
    return 0


def goal_report(paths: list[Path]) -> str:
    """The goal lines of bench_aux for the merged rows of ``paths`` (a later file's row of
    the same op, shape and M wins)."""
    merged = {}
    for path in paths:
        for r in read_csv(path):
            merged[(r.op, r.shape, r.tokens)] = r
    rows = list(merged.values())
    out = []
    for title, lines in evaluate(rows, any(r.compiled_us for r in rows)):
        out += [f"{title}:"] + [f"  {ln}" for ln in lines] + [""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
