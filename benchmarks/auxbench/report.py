"""The results: one :class:`Row` per op and case, the printed table, the CSV and the goals as
PASS/FAIL/SKIP lines."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from .cases import OPS, human_bytes
from .common import log

# fused op -> (its parts, each benchmarked as its own op in the same run, how their times
# combine).  The `x parts` column and the CSV's fused_over_parts are ours / that combination.
# * moe_sort_quant(_fp8) is one launch meant to overlap its sort with its quant, so the
#   reference is the slower part: a fused op should be as fast as its slowest part.
# * decode_pipeline is one call, moe_sort_quant with sorted_scales, replacing moe_sort_quant
#   then moe_sort_scales on its outputs (which cannot start before the sort is done), so the
#   reference is the sum of those two launches, each timed as its own op: < 1 when the one call
#   saves on the two separate launches.
FUSED_PARTS = {
    "moe_sort_quant": (("moe_sort", "mxfp4_quant"), max),
    "moe_sort_quant_fp8": (("moe_sort", "mxfp8_quant"), max),
    "decode_pipeline": (("moe_sort_quant", "moe_sort_scales"), sum),
    # the gate then the decode pipeline: < 1 when the call saves on the two launches
    "route_pipeline": (("moe_route", "decode_pipeline"), sum),
    "route_pipeline_grouped": (("moe_route_grouped", "decode_pipeline"), sum),
    # not fused: the peers' formats over our native sort (goal: <= 1.03 at every M)
    "moe_sum": (("moe_scatter_reduce",), max),
    "moe_align_vllm": (("moe_sort",), max),
    "moe_align_sglang": (("moe_sort",), max),
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


def read_csv(path: Path) -> list[Row]:
    """The rows of a ``results.csv`` (the fields :func:`write_csv` wrote that the goals and
    the ratios need: times, bytes, copy bandwidth, the same-bytes copy, the check)."""

    def num(v: str) -> float | None:
        return float(v) if v else None

    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            shape = tuple(int(r[k]) for k in ("expert", "model_dim", "inter", "topk"))
            rows.append(
                Row(
                    r["op"],
                    shape,
                    int(r["tokens"]),
                    ours_us=num(r["ours_us"]),
                    eager_us=num(r.get("eager_us", "")),
                    compiled_us=num(r.get("compiled_us", "")),
                    bytes=int(r.get("bytes") or 0),
                    copy_bw=float(r.get("copy_bw_gb_s") or 0.0) * 1e9,
                    check=r.get("check", ""),
                    copy_same_us=num(r.get("copy_same_us", "")),
                )
            )
    return rows
