"""The results: one :class:`Row` per op and case, the printed table, the CSV and the goals as
PASS/FAIL/SKIP lines."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from .cases import OPS, human_bytes
from .common import log

# the prefill bandwidth goals of the issue: op -> % of the copy bandwidth at M >= 4096
BANDWIDTH_GOALS = {
    "mxfp4_quant": 85,
    "mxfp8_quant": 85,  # issue 16
    "moe_scatter_reduce": 80,
    "moe_scatter_reduce_q": 70,
    "moe_sort_scales": 70,
}

# fused op -> (its parts, each benchmarked as its own op in the same run, how their times
# combine).  The `x parts` column and the CSV's fused_over_parts are ours / that combination.
# * moe_sort_quant(_fp8) is one launch meant to overlap its sort with its quant, so the
#   reference is the slower part (issue 14: "fused ops as fast as their slowest part"; issue 14
#   and 16's goal: <= 1.05 x max(moe_sort, quant) at M >= 1024).
# * decode_pipeline is one call, moe_sort_quant with sorted_scales, replacing moe_sort_quant
#   then moe_sort_scales on its outputs (which cannot start before the sort is done), so the
#   reference is the sum of those two launches, each timed as its own op: < 1 when the one call
#   saves on the two separate launches, the aim of issue 14 item 3 (fewer launches).
#   Issue 14's pipeline goal adds up the same way: 4.5 us at M <= 64, the fused op's 3.5 us plus
#   about 1 us for the sorted scales.
FUSED_PARTS = {
    "moe_sort_quant": (("moe_sort", "mxfp4_quant"), max),
    "moe_sort_quant_fp8": (("moe_sort", "mxfp8_quant"), max),
    "decode_pipeline": (("moe_sort_quant", "moe_sort_scales"), sum),
}


@dataclass
class Row:
    op: str
    shape: tuple
    tokens: int
    ours_us: float | None = None
    eager_us: float | None = None
    compiled_us: float | None = None
    compiled_note: str = ""
    bytes: int = 0
    copy_bw: float = 0.0
    check: str = ""
    notes: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    n_sets: int = 1
    copy_same_us: float | None = None  # an elementwise copy kernel of the same bytes
    parts_us: float | None = None  # a fused op's parts combined (FUSED_PARTS), same run

    @property
    def x_parts(self) -> float | None:
        """A fused op's time over its parts' (``FUSED_PARTS``); < 1 is faster than them."""
        return self.ours_us / self.parts_us if self.ours_us and self.parts_us else None

    @property
    def pct_of_same_copy(self) -> float | None:
        """Ours as a % of the speed of a copy of the same bytes (100 = as fast)."""
        if not (self.ours_us and self.copy_same_us):
            return None
        return 100.0 * self.copy_same_us / self.ours_us

    @property
    def same_copy_pct_bw(self) -> float | None:
        """The copy of the same bytes as a % of the copy bandwidth: what a copy reaches here."""
        if not self.copy_same_us:
            return None
        return 100.0 * self.bytes / (self.copy_same_us * 1e-6) / self.copy_bw

    @property
    def gbps(self) -> float | None:
        return self.bytes / (self.ours_us * 1e3) if self.ours_us else None

    @property
    def pct_copy(self) -> float | None:
        return 100.0 * self.bytes / (self.ours_us * 1e-6) / self.copy_bw if self.ours_us else None

    @property
    def floor_us(self) -> float:
        return self.bytes / self.copy_bw * 1e6

    @property
    def x_eager(self) -> float | None:
        return self.eager_us / self.ours_us if self.eager_us and self.ours_us else None

    @property
    def x_compiled(self) -> float | None:
        return self.compiled_us / self.ours_us if self.compiled_us and self.ours_us else None


def set_fused_parts(rows: list[Row]) -> None:
    """Fill ``parts_us`` of every fused op's row from the rows of its parts in the same case
    (shape and M); it stays None when a part was not benchmarked or has no time."""
    ours = {(r.op, r.shape, r.tokens): r.ours_us for r in rows if r.ours_us}
    for r in rows:
        if r.op not in FUSED_PARTS:
            continue
        parts, combine = FUSED_PARTS[r.op]
        times = [ours.get((p, r.shape, r.tokens)) for p in parts]
        r.parts_us = combine(times) if all(times) else None


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def shape_str(shape) -> str:
    return ",".join(str(x) for x in shape)


def print_table(rows: list[Row]) -> None:
    hdr = (
        f"{'op':<21} {'shape (E,D,I,K)':<17} {'tokens':>6} {'ours us':>9} {'eager us':>10} "
        f"{'compiled us':>11} {'x eager':>8} {'x comp':>7} {'bytes':>7} {'GB/s':>7} "
        f"{'%copy':>6} {'%same':>6} {'x parts':>7}  check"
    )
    log("\n" + hdr)
    log("-" * len(hdr))
    last = None
    for r in sorted(rows, key=lambda r: (OPS.index(r.op), r.shape, r.tokens)):
        if last is not None and r.op != last:
            log("")
        last = r.op
        check = r.check if r.check == "ok" else f"!!! {r.check} !!!"
        log(
            f"{r.op:<21} {shape_str(r.shape):<17} {r.tokens:>6} {fmt(r.ours_us, '.2f'):>9} "
            f"{fmt(r.eager_us):>10} {fmt(r.compiled_us):>11} {fmt(r.x_eager):>8} "
            f"{fmt(r.x_compiled):>7} {human_bytes(r.bytes):>7} {fmt(r.gbps, '.0f'):>7} "
            f"{fmt(r.pct_copy, '.0f'):>6} {fmt(r.pct_of_same_copy, '.0f'):>6} "
            f"{fmt(r.x_parts, '.2f'):>7}  {check}"
        )
    notes = sorted({r.compiled_note for r in rows if r.compiled_note})
    if notes:
        log("\ncompiled peer notes:")
        for n in notes:
            log(f"  - {n}")


CSV_FIELDS = (
    "op",
    "expert",
    "model_dim",
    "inter",
    "topk",
    "tokens",
    "block_m",
    "ours_us",
    "eager_us",
    "compiled_us",
    "compiled_note",
    "speedup_vs_eager",
    "speedup_vs_compiled",
    "bytes",
    "gb_s",
    "pct_copy_bw",
    "copy_bw_gb_s",
    "floor_us",
    "copy_same_us",
    "pct_of_same_copy",
    "parts_us",
    "fused_over_parts",
    "check",
    "timing_mode",
    "calls_per_graph",
    "samples",
    "buffer_sets",
    "notes",
)


def write_csv(path: Path, rows: list[Row], bm: int) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            e, d, i, k = r.shape
            w.writerow(
                [
                    r.op,
                    e,
                    d,
                    i,
                    k,
                    r.tokens,
                    bm,
                    _c(r.ours_us),
                    _c(r.eager_us),
                    _c(r.compiled_us),
                    r.compiled_note,
                    _c(r.x_eager),
                    _c(r.x_compiled),
                    r.bytes,
                    _c(r.gbps),
                    _c(r.pct_copy),
                    f"{r.copy_bw / 1e9:.1f}",
                    _c(r.floor_us),
                    _c(r.copy_same_us),
                    _c(r.pct_of_same_copy),
                    _c(r.parts_us),
                    _c(r.x_parts),
                    r.check,
                    r.timing.get("mode", ""),
                    r.timing.get("calls", ""),
                    r.timing.get("samples", ""),
                    r.n_sets,
                    "; ".join(r.notes),
                ]
            )


def _c(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def goal_line(name: str, sel: list[Row], value, ok, unit: str, worst_is_max: bool) -> str:
    """One goal as a PASS/FAIL/SKIP line: ``value(row)`` of each selected row (None: left
    out) must satisfy ``ok``; the line names the worst case (the largest value when
    ``worst_is_max``, else the smallest) and counts the failing cases."""
    sel = [r for r in sel if value(r) is not None]
    if not sel:
        return f"SKIP  {name}: no measured case"
    worst = (max if worst_is_max else min)(sel, key=value)
    bad = [r for r in sel if not ok(value(r))]
    where = f"{worst.op} {shape_str(worst.shape)} M={worst.tokens}"
    status = "PASS" if not bad else "FAIL"
    extra = f", {len(bad)}/{len(sel)} cases fail" if bad else f", {len(sel)} cases"
    return f"{status}  {name}: worst {value(worst):.2f}{unit} ({where}){extra}"


def goals(rows: list[Row], have_compiled: bool) -> list[str]:
    """The goals of the issue as PASS/FAIL/SKIP lines (worst case named)."""
    set_fused_parts(rows)
    lines = []

    def check(name: str, sel: list[Row], value, ok, unit: str, worst_is_max: bool) -> None:
        lines.append(goal_line(name, sel, value, ok, unit, worst_is_max))

    def sel(op: str, cond) -> list[Row]:
        return [r for r in rows if r.op == op and cond(r.tokens)]

    decode = lambda m: m <= 64  # noqa: E731
    prefill = lambda m: m >= 4096  # noqa: E731
    check(
        "decode M<=64: moe_sort_quant (fused sort+quant) <= 6 us",
        sel("moe_sort_quant", decode),
        lambda r: r.ours_us,
        lambda v: v <= 6.0,
        " us",
        True,
    )
    check(
        "decode M<=64: moe_sort_quant_fp8 (fused sort+mxfp8) <= 3.5 us",
        sel("moe_sort_quant_fp8", decode),
        lambda r: r.ours_us,
        lambda v: v <= 3.5,
        " us",
        True,
    )

    check(
        "M>=1024: moe_sort_quant_fp8 <= 1.05 x max(moe_sort, mxfp8_quant)",
        sel("moe_sort_quant_fp8", lambda m: m >= 1024),
        lambda r: r.x_parts,
        lambda v: v <= 1.05,
        "x",
        True,
    )
    check(
        "decode M<=64: moe_sort <= 4 us",
        sel("moe_sort", decode),
        lambda r: r.ours_us,
        lambda v: v <= 4.0,
        " us",
        True,
    )
    for op, pct in BANDWIDTH_GOALS.items():
        check(
            f"prefill M>=4096: {op} >= {pct}% of copy BW",
            sel(op, prefill),
            lambda r: r.pct_copy,
            lambda v, p=pct: v >= p,
            "%",
            False,
        )
        under = [r for r in sel(op, prefill) if (r.same_copy_pct_bw or 100.0) < pct]
        if under:
            cases = ", ".join(
                f"{shape_str(r.shape)} M={r.tokens}: copy {r.same_copy_pct_bw:.0f}%, "
                f"ours {r.pct_of_same_copy:.0f}% of it"
                for r in under
            )
            lines.append(
                f"NOTE    a copy of the same bytes stays under {pct}% itself in "
                f"{len(under)} case(s) ({cases})"
            )
    check(
        "moe_sort at M=16384, topk=9 <= 25 us",
        [r for r in rows if r.op == "moe_sort" and r.tokens == 16384 and r.shape[3] == 9],
        lambda r: r.ours_us,
        lambda v: v <= 25.0,
        " us",
        True,
    )
    if have_compiled:
        check(
            "every op >= 5x faster than torch.compile",
            rows,
            lambda r: r.x_compiled,
            lambda v: v >= 5.0,
            "x",
            False,
        )
    else:
        lines.append("SKIP  every op >= 5x faster than torch.compile: compiled peer not run")
    check(
        "every op never slower than eager",
        rows,
        lambda r: r.x_eager,
        lambda v: v >= 1.0,
        "x",
        False,
    )
    na = [r for r in rows if have_compiled and r.x_compiled is None]
    if have_compiled and na:
        lines.append(
            f"NOTE  {len(na)} case(s) without a compiled time (n/a) are not in the " "5x check"
        )
    return lines


# ---------------------------------------------------------------------------------------------
# issue 14 (kernels fast at every batch size): its "Goals", every threshold defined here only
# ---------------------------------------------------------------------------------------------

I14_DECODE_M = 64  # "at M <= 64"
I14_PREFILL_M = 4096  # "at M >= 4096"
I14_SORT_MAX_US = {1: 1.3, 256: 4.0, 1024: 6.0}  # moe_sort at these M, every shape
I14_SORT_VS_PEER = 0.8  # moe_sort <= 0.8 x the faster peer of I14_PEER_SORT_US
I14_SORT_MONOTONIC = 0.05  # moe_sort(M) >= (1 - 0.05) x moe_sort at every smaller M
I14_FUSED_FROM_M = 1024  # moe_sort_quant <= I14_FUSED_X x max(moe_sort, mxfp4_quant) ...
I14_FUSED_X = 1.05  # ... at every M >= I14_FUSED_FROM_M
I14_FUSED_DECODE_US = 3.5  # moe_sort_quant at M <= I14_DECODE_M
I14_PIPELINE_DECODE_US = 4.5  # decode_pipeline at M <= I14_DECODE_M
I14_REDUCE_M1_US = 1.4  # moe_scatter_reduce at M = 1
I14_REDUCE_SAME_COPY_PCT = 97.0  # moe_scatter_reduce >= 97 % of a same-bytes copy, prefill
I14_REDUCE_VS_PEER = 0.95  # moe_scatter_reduce at M = 16-1024 (not checked: no peer times)

# The peers' moe_sort figures of issue 14 (H200, us per call in CUDA-graph replay, block 32,
# Zipf routing): vLLM 0.33.0 moe_align_block_size, SGLang 0.5.23 moe_align (Triton when
# topk * M <= 64).  (E, topk) -> {peer: times at I14_PEER_M}.
I14_PEER_M = (1, 16, 64, 256, 1024, 4096, 16384, 65536)
I14_PEER_SORT_US = {
    (257, 9): {
        "vLLM": (4.10, 4.60, 4.64, 5.82, 9.87, 26.86, 121.9, 461.7),
        "SGLang": (1.56, 4.16, 4.27, 5.06, 7.59, 19.24, 93.23, 334.8),
    },
    (896, 16): {"SGLang": (1.72, 4.46, 4.54, 5.51, 10.19, 32.38, 139.3, 552.0)},
    (256, 8): {"SGLang": (1.65, 4.16, 4.28, 4.83, 7.85, 18.09, 84.58, 325.1)},
}


def faster_peer_sort_us(e: int, topk: int, m: int) -> float | None:
    """The faster peer's moe_sort time of issue 14's table at (E, topk, M); None if unlisted."""
    peers = I14_PEER_SORT_US.get((e, topk))
    if peers is None or m not in I14_PEER_M:
        return None
    return min(times[I14_PEER_M.index(m)] for times in peers.values())


def sort_drop(rows: list[Row], r: Row) -> float | None:
    """moe_sort's time at ``r``'s M over its largest time at a smaller M of the same shape
    (below 1 - I14_SORT_MONOTONIC: the time fell as M grew); None at the smallest M."""
    same = [x for x in rows if x.op == "moe_sort" and x.shape == r.shape]
    before = [x.ours_us for x in same if x.tokens < r.tokens and x.ours_us]
    return r.ours_us / max(before) if before and r.ours_us else None


def issue14_goals(rows: list[Row]) -> list[str]:
    """Issue 14's goals as PASS/FAIL/SKIP lines (the format of :func:`goals`)."""
    set_fused_parts(rows)
    lines = []

    def sel(op: str, cond) -> list[Row]:
        return [r for r in rows if r.op == op and cond(r)]

    def under(limit: float):
        return lambda v: v <= limit

    us = lambda r: r.ours_us  # noqa: E731
    decode = lambda r: r.tokens <= I14_DECODE_M  # noqa: E731
    for m, limit in I14_SORT_MAX_US.items():
        at_m = sel("moe_sort", lambda r, m=m: r.tokens == m)
        lines.append(
            goal_line(f"moe_sort at M={m} <= {limit} us", at_m, us, under(limit), " us", True)
        )
    lines.append(
        goal_line(
            f"moe_sort <= {I14_SORT_VS_PEER} x the faster peer of issue 14's table (vLLM, "
            "SGLang) at its (E, topk, M)",
            sel("moe_sort", lambda r: True),
            lambda r: (
                r.ours_us / p
                if r.ours_us and (p := faster_peer_sort_us(r.shape[0], r.shape[3], r.tokens))
                else None
            ),
            under(I14_SORT_VS_PEER),
            "x",
            True,
        )
    )
    lines.append(
        goal_line(
            f"moe_sort monotonic in M within {I14_SORT_MONOTONIC:.0%} (time / the largest "
            "time at a smaller M)",
            sel("moe_sort", lambda r: True),
            lambda r: sort_drop(rows, r),
            lambda v: v >= 1 - I14_SORT_MONOTONIC,
            "x",
            False,
        )
    )
    lines.append(
        goal_line(
            f"M>={I14_FUSED_FROM_M}: moe_sort_quant <= {I14_FUSED_X} x max(moe_sort, "
            "mxfp4_quant)",
            sel("moe_sort_quant", lambda r: r.tokens >= I14_FUSED_FROM_M),
            lambda r: r.x_parts,
            under(I14_FUSED_X),
            "x",
            True,
        )
    )
    lines.append(
        goal_line(
            f"decode M<={I14_DECODE_M}: moe_sort_quant <= {I14_FUSED_DECODE_US} us",
            sel("moe_sort_quant", decode),
            us,
            under(I14_FUSED_DECODE_US),
            " us",
            True,
        )
    )
    lines.append(
        goal_line(
            f"decode M<={I14_DECODE_M}: decode_pipeline (sort + quant + sorted scales) <= "
            f"{I14_PIPELINE_DECODE_US} us",
            sel("decode_pipeline", decode),
            us,
            under(I14_PIPELINE_DECODE_US),
            " us",
            True,
        )
    )
    lines.append(
        goal_line(
            f"moe_scatter_reduce at M=1 <= {I14_REDUCE_M1_US} us",
            sel("moe_scatter_reduce", lambda r: r.tokens == 1),
            us,
            under(I14_REDUCE_M1_US),
            " us",
            True,
        )
    )
    lines.append(
        goal_line(
            f"prefill M>={I14_PREFILL_M}: moe_scatter_reduce >= {I14_REDUCE_SAME_COPY_PCT:.0f}% "
            "of a same-bytes copy",
            sel("moe_scatter_reduce", lambda r: r.tokens >= I14_PREFILL_M),
            lambda r: r.pct_of_same_copy,
            lambda v: v >= I14_REDUCE_SAME_COPY_PCT,
            "%",
            False,
        )
    )
    lines.append(
        f"SKIP  moe_scatter_reduce <= {I14_REDUCE_VS_PEER} x vLLM / SGLang at M=16-1024: the "
        "peers' reduce times are in neither this bench nor issue 14's table"
    )
    return lines
