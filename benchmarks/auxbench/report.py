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
# * decode_pipeline is moe_sort_quant, then moe_sort_scales on its outputs (it cannot start
#   before the sort is done), so the reference is the sum of those two launches: < 1 when the
#   pipeline saves on the two separate launches, the aim of issue 14 item 3 (fewer launches).
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


def goals(rows: list[Row], have_compiled: bool) -> list[str]:
    """The goals of the issue as PASS/FAIL/SKIP lines (worst case named)."""
    set_fused_parts(rows)
    lines = []

    def check(name: str, sel: list[Row], value, ok, unit: str, worst_is_max: bool) -> None:
        sel = [r for r in sel if value(r) is not None]
        if not sel:
            lines.append(f"SKIP  {name}: no measured case")
            return
        worst = (max if worst_is_max else min)(sel, key=value)
        bad = [r for r in sel if not ok(value(r))]
        where = f"{worst.op} {shape_str(worst.shape)} M={worst.tokens}"
        status = "PASS" if not bad else "FAIL"
        extra = f", {len(bad)}/{len(sel)} cases fail" if bad else f", {len(sel)} cases"
        lines.append(f"{status}  {name}: worst {value(worst):.2f}{unit} ({where}){extra}")

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
