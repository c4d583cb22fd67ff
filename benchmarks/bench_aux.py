#!/usr/bin/env python3
"""Benchmark of the MXFP4 MoE aux ops against their peers (docs/perf.md describes the method).

One command::

    python3 benchmarks/bench_aux.py [--shapes E,D,I,K ...] [--tokens N ...] [--ops OP ...]
                                    [--block-m 32] [--out DIR] [--no-compile-peer] [--quick]
                                    [--device cuda|cpu] [--zero-buf] [--compile-budget S]
    python3 benchmarks/bench_aux.py --floors     # print the bandwidth-floor table (no GPU)

For every shape x token count and every op (moe_sort, mxfp4_quant, moe_sort_quant,
moe_sort_scales, moe_scatter_reduce, moe_scatter_reduce_q, and decode_pipeline = one call
of fused sort+quant writing the sorted scales too, ``moe_sort_quant_out(..., sorted_scales=)``)
it measures

* ours: the ``_out`` variant of the compiled op, captured several times back to back in a
  CUDA graph (input/output buffer sets rotated so that they exceed 2x L2 when M is large),
  median over graph replays, per call;
* the peers: the torch eager reference (``aiter_aux.reference``) and ``torch.compile`` of it
  (Inductor, dynamic=True, one compiled callable per op shared across sizes), timed with CUDA
  events around each call, median;
* the minimum bytes moved (``BYTES_FORMULAS``), the achieved bandwidth and its fraction of the
  device-to-device copy bandwidth measured in the same run;
* correctness: our output (of the graph replays) against the reference, byte for byte over
  the region the spec defines;
* for the fused ops, ours over their parts' times in the same run (``x parts``):
  moe_sort_quant / max(moe_sort, mxfp4_quant), moe_sort_quant_fp8 / max(moe_sort,
  mxfp8_quant), decode_pipeline / (moe_sort_quant + moe_sort_scales), the two launches the
  one call replaces, each timed as its own op (``FUSED_PARTS``).

It prints one table and the goals of ``benchmarks/goals.json`` as PASS/FAIL lines, and
writes ``results.csv``, ``meta.json`` and ``bench_aux.png`` (if matplotlib is installed) under
``--out``.  Exit status 1 when any output mismatches the reference, else 0 (goals are
reported, not enforced).

``--device cpu --quick`` is a smoke test (tiny sizes, wall-clock timing, eager peer only).

The stages live in the package ``benchmarks/auxbench/`` (one module per job, see its
``__init__``); this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (REPO, HERE):  # aiter_aux without installing it; auxbench next to this file
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from auxbench.cases import (  # noqa: E402
    BYTES_FORMULAS,
    DEFAULT_SHAPES,
    DEFAULT_TOKENS,
    OPS,
    QUICK_SHAPES,
    QUICK_TOKENS_CPU,
    QUICK_TOKENS_CUDA,
    bytes_moved,
    make_base,
    op_spec,
)
from auxbench.common import log, mxfp4_moe_shape_status, ops  # noqa: E402
from auxbench.floors import print_floors  # noqa: E402
from auxbench.goals import evaluate  # noqa: E402
from auxbench.measure import run_op  # noqa: E402
from auxbench.peers import CompiledPeer  # noqa: E402
from auxbench.plot import plot  # noqa: E402
from auxbench.report import (  # noqa: E402
    Row,
    fmt,
    print_table,
    set_fused_parts,
    shape_str,
    write_csv,
)
from auxbench.timing import Timer  # noqa: E402


def parse_list(values, conv) -> list:
    out = []
    for v in values:
        out.extend(conv(x) for x in str(v).replace(",", " ").split())
    return out


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``E,MODEL_DIM,INTER,TOPK`` (parentheses allowed) through the package's one shape
    parser, :func:`aiter_aux.shapes.parse_shape`."""
    from aiter_aux.shapes import parse_shape as parse

    try:
        return parse(text.replace("(", "").replace(")", ""))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"shape {text!r}: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=None,
        help="E,MODEL_DIM,INTER,TOPK tuples (default: DEFAULT_SHAPES in auxbench/cases.py, five)",
    )
    p.add_argument(
        "--tokens",
        nargs="+",
        default=None,
        help="token counts, space or comma separated (default 1 2 4 ... 4096 16384 65536)",
    )
    p.add_argument("--ops", nargs="+", default=None, help=f"subset of {', '.join(OPS)}")
    p.add_argument("--block-m", type=int, default=32)
    p.add_argument("--out", default="bench_out", help="output directory (default ./bench_out)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--no-compile-peer", action="store_true", help="skip the torch.compile peer")
    p.add_argument(
        "--cpu-compile-peer",
        action="store_true",
        help="run the torch.compile peer on cpu too (slow; tests its code path)",
    )
    p.add_argument(
        "--compile-budget",
        type=float,
        default=150.0,
        help="seconds of torch.compile compilation allowed in total (default 150); "
        "later cases that need a (re)compile report n/a",
    )
    p.add_argument(
        "--zero-buf",
        action="store_true",
        help="moe_sort_quant / decode_pipeline also zero a [M, model_dim] bf16 buffer",
    )
    p.add_argument("--quick", action="store_true", help="few small cases (smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--floors",
        action="store_true",
        help="print the prefill bandwidth-floor table (bytes / 4.3 TB/s) and exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    cuda = dev.type == "cuda"
    if args.quick:
        shapes = args.shapes or list(QUICK_SHAPES)
        tokens = (
            parse_list(args.tokens, int)
            if args.tokens
            else list(QUICK_TOKENS_CUDA if cuda else QUICK_TOKENS_CPU)
        )
    else:
        shapes = args.shapes or list(DEFAULT_SHAPES)
        tokens = parse_list(args.tokens, int) if args.tokens else list(DEFAULT_TOKENS)
    op_list = parse_list(args.ops, str) if args.ops else list(OPS)
    unknown = [o for o in op_list if o not in OPS]
    if unknown:
        log(f"unknown op(s) {unknown}; choose from {', '.join(OPS)}")
        return 2
    for shape in shapes:
        status = mxfp4_moe_shape_status(*shape)
        if not status.servable:
            log(f"shape {shape_str(shape)}: {status.reason}")
            return 2
    if args.floors:
        print_floors(shapes, tokens, args.block_m, args.seed, args.zero_buf)
        return 0

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = Timer(dev, args.quick)
    if args.no_compile_peer:
        peer = CompiledPeer(False, "skipped (--no-compile-peer)", 0)
    elif not cuda and not args.cpu_compile_peer:
        peer = CompiledPeer(False, "skipped on cpu (eager peer only)", 0)
    else:
        peer = CompiledPeer(True, "", args.compile_budget)

    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(dev) if cuda else None
    l2 = int(getattr(props, "L2_cache_size", 50 << 20)) if cuda else 0
    name = props.name if cuda else platform.processor() or platform.machine()
    log(
        f"device {dev} ({name}), torch {torch.__version__}"
        + (f", L2 {l2 / 2**20:.0f} MiB, {props.total_memory / 2**30:.0f} GiB" if cuda else "")
    )
    log(
        f"shapes {[shape_str(s) for s in shapes]}, tokens {tokens}, block_m {args.block_m}, "
        f"ops {op_list}, compile peer: {'on' if peer.enabled else peer.reason}"
    )

    # the module: loaded (or built: the first cuda build compiles every catalog instance)
    t0 = time.perf_counter()
    log("loading the compiled module (builds it on first use) ...")
    warm_x = torch.zeros(1, shapes[0][1], dtype=torch.bfloat16, device=dev)
    ops.mxfp4_quant(warm_x)
    timer.sync()
    log(f"  module ready in {time.perf_counter() - t0:.1f} s")

    copy_bw, copy_bytes = timer.copy_bandwidth()
    log(
        f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (dst.copy_(src), {copy_bytes >> 20} MiB, "
        "read + written, median of 10)"
    )

    node_us = timer.node_floor_us()
    if cuda:
        log(f"node floor: {node_us:.2f} us per graph node (fill_ of one element)")

    rows: list[Row] = []
    cases = [(shape, m) for shape in shapes for m in tokens]
    for ci, (shape, m) in enumerate(cases):
        tc = time.perf_counter()
        big = m >= 4096
        try:
            base, s = make_base(shape, m, args.block_m, dev, args.seed, set(op_list))
        except torch.cuda.OutOfMemoryError as exc:  # pragma: no cover - very large cases
            log(f"[{ci + 1}/{len(cases)}] {shape_str(shape)} M={m}: out of memory ({exc})")
            continue
        log(
            f"[{ci + 1}/{len(cases)}] shape {shape_str(shape)} M={m}: rows {s.rows}, "
            f"max_rows {s.max_rows} (setup {time.perf_counter() - tc:.1f} s)"
        )
        for op in op_list:
            to = time.perf_counter()
            row = Row(op, tuple(shape), m, bytes=bytes_moved(op, s, args.zero_buf), copy_bw=copy_bw)
            try:
                spec = op_spec(op, base, s, dev, args.zero_buf)
                run_op(op, spec, s, row, timer, peer, l2, big)
                del spec
            except Exception as exc:  # noqa: BLE001 - report and go on
                timer.sync()
                row.check = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                traceback.print_exc()
            rows.append(row)
            cmp = fmt(row.compiled_us) if row.compiled_us else (row.compiled_note or "n/a")
            flag = "" if row.check == "ok" else f"   !!! {row.check} !!!"
            log(
                f"    {op:<21} ours {fmt(row.ours_us, '.2f'):>9} us  eager {fmt(row.eager_us)}"
                f" us  compiled {cmp}  ({time.perf_counter() - to:.1f} s){flag}"
            )
        del base
        if cuda:
            torch.cuda.empty_cache()

    set_fused_parts(rows)
    print_table(rows)
    (out_dir / "results.csv").parent.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "results.csv", rows, args.block_m)
    meta = {
        "device": str(dev),
        "name": name,
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "l2_bytes": l2,
        "copy_bw_bytes_s": copy_bw,
        "copy_bytes": copy_bytes,
        "node_floor_us": node_us,
        "block_m": args.block_m,
        "zero_buf": args.zero_buf,
        "compile_s": peer.compile_s,
        "seed": args.seed,
        "bytes_formulas": BYTES_FORMULAS,
        "wall_s": time.perf_counter() - t_start,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"\ncsv: {out_dir / 'results.csv'}")
    how = "CUDA-graph replay time per call" if cuda else "wall time per call (cpu)"
    log(plot(out_dir / "bench_aux.png", rows, copy_bw, how))

    for title, lines in evaluate(rows, peer.enabled):
        log(f"\n{title}:")
        for line in lines:
            log(f"  {line}")
    bad = [r for r in rows if r.check != "ok"]
    if peer.enabled:
        log(
            f"\ntorch.compile compilation time: {peer.compile_s:.0f} s "
            f"(budget {peer.budget_s:.0f} s)"
        )
        skipped = sum("budget" in r.compiled_note for r in rows)
        if skipped:
            log(
                f"  {skipped} case(s) report compiled n/a because the budget was spent; "
                "rerun with a larger --compile-budget for full coverage (Inductor's on-disk "
                "cache makes a second run compile much faster)"
            )
    if cuda:
        log(f"peak memory allocated: {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB")
    log(f"total wall time: {time.perf_counter() - t_start:.0f} s")
    if bad:
        log(
            f"\n!!! {len(bad)} case(s) do NOT match the reference (or failed): "
            + ", ".join(f"{r.op} {shape_str(r.shape)} M={r.tokens}" for r in bad)
        )
        return 1
    log("all checked outputs match the reference")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
