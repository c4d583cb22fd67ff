"""The numbers of ``aiter-aux run``: per-op statistics, bytes moved, the table, CSV and JSON.

Each op is timed ``n`` times after one untimed call (the call whose output is checked).  The
table shows the median, the spread p10-p90 (nearest-rank over the samples; with fewer than
10 samples, min-max), the bytes the op must move and those bytes divided by the median.
Stdlib only.

Bytes (the one minimum-traffic model; ``benchmarks/auxbench/cases.py`` builds on it): M
tokens, K = topk, D = model_dim, N = M*K pairs, L = local pairs (N unless told),
R = num_valid_ids[0] (sorted rows with padding), bm = block_m, T = tokens with a local pair,
R_out = ceil(max_rows / BM) * BM with BM = max(32, bm):

* moe_route: M*E*2 + 8N (bf16 logits read, topk_weights and topk_ids written; N = M*K of
  the routed top-k), + 4E with a correction bias;
* moe_sort: 12N + 12R + 4R/bm + 8 (ids and weights read; sorted_token_ids, sorted_weights,
  m_indices, sorted_expert_ids, num_valid_ids and reverse_sorted written);
* mxfp4_quant: 2MD + MD/2 + MD/32 (x read; a_q, a_scale written);
* moe_sort_quant: moe_sort + mxfp4_quant (+ 2MD with a zero_buf written);
* mxfp8_quant: 2MD + MD + MD/32 (E4M3: one byte per element);
* moe_sort_quant_fp8: moe_sort + mxfp8_quant (+ 2MD with a zero_buf written);
* moe_sort_scales: T*D/32 + 4R + 4 + R_out*D/32;
* moe_route_sort_quant[_fp8] with sorted scales: moe_route + moe_sort_quant[_fp8] +
  R_out*D/32 (the sorted scales written);
* moe_scatter_reduce: 4N + L*(2D + 4) + 2MD;
* moe_scatter_reduce_q: 4N + L*(D/2 + D/32 + 4) + 2MD.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import statistics
from dataclasses import dataclass

COLUMNS = ("tokens", "op", "sizes", "median_us", "p10_us", "p90_us", "min_us", "max_us", "n",
           "bytes", "gb_s", "check")  # fmt: skip


@dataclass(frozen=True)
class Stats:
    """Summary of one op's samples, in microseconds."""

    n: int
    median: float
    p10: float
    p90: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        s = sorted(samples)
        if not s:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)

        def rank(p: float) -> float:  # nearest rank
            return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

        return cls(len(s), statistics.median(s), rank(0.1), rank(0.9), s[0], s[-1])

    def spread(self) -> str:
        """``"p10-p90"`` (or ``"min-max"`` under 10 samples) as text."""
        lo, hi = (self.p10, self.p90) if self.n >= 10 else (self.min, self.max)
        return f"{_us(lo)}-{_us(hi)}"


@dataclass(frozen=True)
class Sizes:
    """What the bytes model needs (see the module docstring)."""

    m: int
    k: int
    d: int
    bm: int
    rows: int  # R
    max_rows: int
    tokens_read: int  # T
    n_local: int | None = None  # L (None: every pair is local)
    e: int = 0  # num_experts (the benchmarks' expert_map rows)

    @property
    def n(self) -> int:
        return self.m * self.k

    @property
    def local(self) -> int:
        return self.n if self.n_local is None else self.n_local

    @property
    def out_rows(self) -> int:
        big = max(32, self.bm)
        return -(-self.max_rows // big) * big


def bytes_moved(op: str, s: Sizes, zero_buf: bool = False, bias: bool = False) -> int:
    """The minimum bytes of ``op`` (the module docstring's model)."""
    m, d, n, r, ell = s.m, s.d, s.n, s.rows, s.local
    if op == "moe_route":
        return m * s.e * 2 + 8 * n + (4 * s.e if bias else 0)
    if op == "moe_sort":
        return 12 * n + 12 * r + 4 * (r // s.bm) + 8
    if op == "mxfp4_quant":
        return 2 * m * d + m * d // 2 + m * d // 32
    if op == "moe_sort_quant":
        z = 2 * m * d if zero_buf else 0
        return bytes_moved("moe_sort", s) + bytes_moved("mxfp4_quant", s) + z
    if op == "mxfp8_quant":
        return 2 * m * d + m * d + m * d // 32
    if op == "moe_sort_quant_fp8":
        z = 2 * m * d if zero_buf else 0
        return bytes_moved("moe_sort", s) + bytes_moved("mxfp8_quant", s) + z
    if op in ("moe_route_sort_quant", "moe_route_sort_quant_fp8"):
        fused = "moe_sort_quant" + op[len("moe_route_sort_quant") :]
        route = bytes_moved("moe_route", s, bias=bias)
        return route + bytes_moved(fused, s) + s.out_rows * d // 32
    if op == "moe_sort_scales":
        return s.tokens_read * d // 32 + 4 * r + 4 + s.out_rows * d // 32
    if op == "moe_scatter_reduce":
        return 4 * n + ell * (2 * d + 4) + 2 * m * d
    if op == "moe_scatter_reduce_q":
        return 4 * n + ell * (d // 2 + d // 32 + 4) + 2 * m * d
    raise KeyError(op)


def _us(v: float) -> str:
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def human_bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{int(b)} B"


def gb_s(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e3) if us > 0 else math.nan


def _num(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 3)


def record(tokens: int, row) -> dict:
    """One CSV/JSON record of a ``pipeline.Row`` (times in µs; ``None`` for no value)."""
    st = row.stats
    return dict(tokens=tokens, op=row.op, sizes=row.sizes, median_us=_num(st.median),
                p10_us=_num(st.p10), p90_us=_num(st.p90), min_us=_num(st.min),
                max_us=_num(st.max), n=st.n, bytes=row.nbytes,
                gb_s=_num(gb_s(row.nbytes, st.median)),
                check="ok" if row.ok else "MISMATCH")  # fmt: skip


def table(rows) -> list[str]:
    """The lines of one token count's table (at most 100 columns: the op column is as wide as
    its longest name, 24 characters at most, plus one)."""
    w = max([21] + [len(r.op) + 1 for r in rows])
    head = (f"  {'op':<{w}}{'sizes':<17}{'median us':>10}{'p10-p90 us':>16}{'n':>4}"
            f"{'bytes':>11}{'GB/s':>8}  check")  # fmt: skip
    lines = [head]
    for r in rows:
        st = r.stats
        rate = gb_s(r.nbytes, st.median)
        lines.append(
            f"  {r.op:<{w}}{r.sizes:<17}{_us(st.median):>10}{st.spread():>16}{st.n:>4}"
            f"{human_bytes(r.nbytes):>11}{rate:>8.2f}  {'ok' if r.ok else 'MISMATCH'}"
        )
    return lines


FUSED_PATH = ("moe_route", "moe_sort_quant", "moe_sort_scales", "moe_scatter_reduce_q")
# a8w4: MXFP8 activations, bf16 GEMM2 output reduced by moe_scatter_reduce
FUSED_PATH_FP8 = ("moe_route", "moe_sort_quant_fp8", "moe_sort_scales", "moe_scatter_reduce")


def summary(tokens: int, rows, block_s: float) -> str:
    """One line: the checks, the medians of the fused path a serving engine runs
    (route when the run routed logits, sort+quant, sort_scales, scatter_reduce_q; with MXFP8
    activations sort+quant_fp8, sort_scales, scatter_reduce) added up, and the block's wall
    time (the reference and the checks included)."""
    bad = sum(not r.ok for r in rows)
    fp8 = any(r.op == "moe_sort_quant_fp8" for r in rows)
    ops, name = (FUSED_PATH_FP8, "sort_quant_fp8+sort_scales+scatter") if fp8 else (
        FUSED_PATH, "sort_quant+sort_scales+scatter_q")  # fmt: skip
    first: dict[str, float] = {}  # the plain pipeline's row of each op (option rows follow)
    for r in rows:
        first.setdefault(r.op, r.stats.median)
    path = sum(v for op, v in first.items() if op in ops)
    name = ("route+" if "moe_route" in first else "") + name
    verdict = f"all {len(rows)} outputs match" if not bad else f"{bad} of {len(rows)} MISMATCH"
    return f"  tokens={tokens}: {verdict}; {name} {_us(path)} us; block {block_s:.1f} s"


@contextlib.contextmanager
def _output(path: str, **kwargs):
    """``path`` open for writing; an ``OSError`` without a file name (a full disk, /dev/full:
    the write or the close fails) is raised again naming ``path``."""
    try:
        with open(path, "w", **kwargs) as f:
            yield f
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_csv(path: str, meta: dict, records: list[dict]) -> None:
    """One row per (tokens, op); the run's settings repeated in leading columns."""
    keys = [k for k in meta if not isinstance(meta[k], list | dict)]
    with _output(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*keys, *COLUMNS])
        w.writeheader()
        for rec in records:
            w.writerow({**{k: meta[k] for k in keys}, **rec})


def write_json(path: str, meta: dict, records: list[dict]) -> None:
    with _output(path) as f:
        json.dump({"run": meta, "rows": records}, f, indent=1, allow_nan=False)
        f.write("\n")
