#!/usr/bin/env python3
"""Benchmark of the MXFP4 MoE aux ops against their peers (docs/perf.md describes the method).

One command::

    python3 benchmarks/bench_aux.py [--shapes E,D,I,K ...] [--tokens N ...] [--ops OP ...]
                                    [--block-m 32] [--out DIR] [--no-compile-peer] [--quick]
                                    [--device cuda|cpu] [--zero-buf] [--compile-budget S]
    python3 benchmarks/bench_aux.py --floors     # print the bandwidth-floor table (no GPU)

For every shape x token count and every op (moe_sort, mxfp4_quant, moe_sort_quant,
moe_sort_scales, moe_scatter_reduce, moe_scatter_reduce_q, and decode_pipeline = fused
sort+quant then sort_scales) it measures

* ours: the ``_out`` variant of the compiled op, captured several times back to back in a
  CUDA graph (input/output buffer sets rotated so that they exceed 2x L2 when M is large),
  median over graph replays, per call;
* the peers: the torch eager reference (``aiter_aux.reference``) and ``torch.compile`` of it
  (Inductor, dynamic=True, one compiled callable per op shared across sizes), timed with CUDA
  events around each call, median;
* the minimum bytes moved (``BYTES_FORMULAS``), the achieved bandwidth and its fraction of the
  device-to-device copy bandwidth measured in the same run;
* correctness: our output (of the graph replays) against the reference, byte for byte over
  the region the spec defines.

It prints one table and the goals as PASS/FAIL lines, and writes ``results.csv``,
``meta.json`` and ``bench_aux.png`` (if matplotlib is installed) under ``--out``.  Exit status
1 when any output mismatches the reference, else 0 (goals are reported, not enforced).

``--device cpu --quick`` is a smoke test (tiny sizes, wall-clock timing, eager peer only).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

try:
    from aiter_aux import reference as ref
    from aiter_aux.ops import aux_ops as ops
    from aiter_aux.ops.moe_mxfp4_aux import is_mxfp4_moe_shape_supported
    from aiter_aux.pipeline import draw_routing
    from aiter_aux.types import MoeSortOutput
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(
        f"bench_aux: cannot import aiter_aux ({exc}).  It needs torch, jinja2, ninja and "
        "filelock (`pip install -e .` in the repository, or `pip install ninja jinja2 filelock`)."
    )

DEFAULT_SHAPES = (
    (257, 7168, 256, 9),
    (385, 7168, 512, 9),
    (513, 2560, 768, 11),
    (896, 3584, 512, 16),
)
DEFAULT_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
QUICK_SHAPES = ((257, 7168, 256, 9), (513, 2560, 768, 11))
QUICK_TOKENS_CUDA = (1, 64, 4096)
QUICK_TOKENS_CPU = (1, 16, 128)

OPS = (
    "moe_sort",
    "mxfp4_quant",
    "moe_sort_quant",
    "moe_sort_scales",
    "moe_scatter_reduce",
    "moe_scatter_reduce_q",
    "decode_pipeline",
)

# Minimum bytes moved per op: every input byte that must be read, read once, every output
# byte written once.  M tokens, K = topk, D = model_dim, N = M*K pairs, L = local pairs
# (N here: every drawn id is local), R = num_valid_ids[0] (sorted rows incl. padding),
# bm = block_m, T = tokens with at least one local pair (rows of a_scale actually read),
# R_out = ceil(max_rows / BM) * BM with BM = max(32, bm) (sort_scales writes every byte of it).
BYTES_FORMULAS = {
    "moe_sort": "12N + 12R + 4R/bm + 8   (read ids 4N + weights 4N; write sorted_token_ids, "
    "sorted_weights, m_indices 4R each, sorted_expert_ids 4R/bm, num_valid_ids 8, "
    "reverse_sorted 4N)",
    "mxfp4_quant": "2MD + MD/2 + MD/32   (read x bf16; write a_q, a_scale)",
    "moe_sort_quant": "moe_sort + mxfp4_quant  (+ 2MD with --zero-buf: zero_buf written)",
    "moe_sort_scales": "T*D/32 + 4R + 4 + R_out*D/32   (read the a_scale rows of the tokens "
    "present, sorted_token_ids of the valid rows, num_valid_ids[0]; write all of sorted_scales)",
    "moe_scatter_reduce": "4N + L*(2D + 4) + 2MD   (read reverse_sorted, the L referenced bf16 "
    "rows of expert_out and their sorted_weights; write out bf16)",
    "moe_scatter_reduce_q": "4N + L*(D/2 + D/32 + 4) + 2MD   (the same with the e2m1 rows and "
    "their e8m0 scales)",
    "decode_pipeline": "moe_sort_quant + moe_sort_scales   (a_scale is written by the first "
    "launch and read by the second)",
}

HBM_PEAK_BYTES_S = 4.3e12  # the floor used in docs/perf.md
L2_FACTOR = 2.0  # rotated buffer sets exceed L2_FACTOR x L2 when memory allows
MAX_SETS = 64  # at most this many rotated buffer sets (decode: inputs stay L2-resident)
SLEEP_CYCLES = 200_000  # GPU busy-wait before each timed sample (hides the CPU launch cost)


def log(*a) -> None:
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# sizes and bytes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    m: int
    k: int
    e: int
    d: int
    bm: int
    n_local: int  # L
    rows: int  # R = num_valid_ids[0]
    max_rows: int
    tokens_read: int  # T

    @property
    def n(self) -> int:
        return self.m * self.k

    @property
    def out_rows(self) -> int:
        big = max(32, self.bm)
        return -(-self.max_rows // big) * big


def bytes_moved(op: str, s: Sizes, zero_buf: bool = False) -> int:
    """The minimum bytes of ``op`` (see ``BYTES_FORMULAS``)."""
    m, d, n, r, ell = s.m, s.d, s.n, s.rows, s.n_local
    if op == "moe_sort":
        return 12 * n + 12 * r + 4 * (r // s.bm) + 8
    if op == "mxfp4_quant":
        return 2 * m * d + m * d // 2 + m * d // 32
    if op == "moe_sort_quant":
        z = 2 * m * d if zero_buf else 0
        return bytes_moved("moe_sort", s) + bytes_moved("mxfp4_quant", s) + z
    if op == "moe_sort_scales":
        return s.tokens_read * d // 32 + 4 * r + 4 + s.out_rows * d // 32
    if op == "moe_scatter_reduce":
        return 4 * n + ell * (2 * d + 4) + 2 * m * d
    if op == "moe_scatter_reduce_q":
        return 4 * n + ell * (d // 2 + d // 32 + 4) + 2 * m * d
    if op == "decode_pipeline":
        return bytes_moved("moe_sort_quant", s, zero_buf) + bytes_moved("moe_sort_scales", s)
    raise KeyError(op)


def routing_sizes(ids: torch.Tensor, e: int, d: int, bm: int) -> Sizes:
    """Sizes of one case from its routing (computed on the host, no op needed)."""
    m, k = ids.shape
    flat = ids.reshape(-1).to(torch.int64).cpu()
    local = (flat >= 0) & (flat < e)
    counts = torch.bincount(flat[local], minlength=e)[:e]
    rows = int(((counts + bm - 1) // bm * bm).sum())
    tokens_read = int(local.view(m, k).any(dim=1).sum()) if m else 0
    return Sizes(
        m, k, e, d, bm, int(local.sum()), rows, ref.moe_sort_capacity(m, k, e, bm), tokens_read
    )


def human_bytes(b: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g}{unit}"
    return f"{int(b)}"


def tensors_of(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_of(o)]
    return []


def footprint(*objs) -> int:
    return sum(t.numel() * t.element_size() for o in objs for t in tensors_of(o))


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------


class Timer:
    """Times callables on one device: CUDA graphs + events on CUDA, wall clock on CPU."""

    def __init__(self, device: torch.device, quick: bool):
        self.device = device
        self.cuda = device.type == "cuda"
        self.quick = quick
        self.sample_budget_s = 0.05 if quick else 0.1

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _sleep(self) -> None:
        if self.cuda and hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SLEEP_CYCLES)

    def once_us(self, fn: Callable[[], object], busy_prefix: bool = True) -> float:
        """One call, in µs: GPU time between events (behind a busy-wait so the launch cost of
        a fast op is hidden when ``busy_prefix``), or wall time on CPU."""
        if self.cuda:
            self.sync()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if busy_prefix:
                self._sleep()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    def peer_us(self, fn: Callable[[], object], est_us: float, max_reps: int) -> tuple[float, int]:
        """Median time of a peer (host syncs and launch gaps included: no busy prefix)."""
        reps = int(max(3, min(max_reps, self.sample_budget_s * 2e6 / max(est_us, 1.0))))
        times = [self.once_us(fn, busy_prefix=False) for _ in range(reps)]
        return statistics.median(times), reps

    def ours_us(self, calls: list[Callable[[], object]], est_us: float) -> tuple[float, dict]:
        """Median per-call time of ``calls`` (one per buffer set, used round robin)."""
        if not self.cuda:
            reps = int(max(3, min(200, self.sample_budget_s * 1e6 / max(est_us, 1.0))))
            times = [self.once_us(calls[i % len(calls)]) for i in range(reps)]
            return statistics.median(times), {"mode": "wall", "calls": 1, "samples": reps}
        n_calls = int(max(3, min(100, math.ceil(500.0 / max(est_us, 0.5)))))
        n_calls = max(n_calls, min(len(calls), 100))
        try:
            for fn in calls:  # warm-up outside the capture (module load, lazy kernel load)
                fn()
            self.sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(n_calls):
                    calls[i % len(calls)]()
        except Exception as exc:  # noqa: BLE001 - fall back to timed direct calls
            self.sync()
            log(f"    ! graph capture failed ({type(exc).__name__}: {exc}); timing direct calls")
            times = [self.once_us(calls[i % len(calls)]) for i in range(20)]
            return statistics.median(times), {"mode": "direct", "calls": 1, "samples": 20}
        graph.replay()
        graph.replay()
        self.sync()
        graph_us = max(self.once_us(graph.replay), 1.0)
        inner = int(max(1, min(20, math.ceil(2000.0 / graph_us))))
        samples = int(max(5, min(30, self.sample_budget_s * 1e6 / (graph_us * inner))))
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(samples):
            self._sleep()
            start.record()
            for _ in range(inner):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (inner * n_calls))
        del graph
        return statistics.median(times), {"mode": "graph", "calls": n_calls, "samples": samples}

    def copy_bandwidth(self) -> tuple[float, int]:
        """Device-to-device copy bandwidth in bytes/s (read + written), median of 10."""
        nbytes = (1 << 30) if self.cuda else (64 << 20)
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            nbytes = min(nbytes, free // 8)
        src = torch.empty(nbytes, dtype=torch.uint8, device=self.device).fill_(1)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = [self.once_us(lambda: dst.copy_(src)) for _ in range(10)]
        return 2 * nbytes / (statistics.median(times) * 1e-6), nbytes


# ---------------------------------------------------------------------------------------------
# compiled peer
# ---------------------------------------------------------------------------------------------


class CompiledPeer:
    """``torch.compile`` (Inductor, dynamic=True) of the reference ``_out`` functions, one
    callable per function shared across sizes and shapes.  The reference's row chunking (a
    Python loop that Dynamo would unroll, recompiling per token count) is disabled while a
    compiled callable runs.  Cumulative compile time is bounded by ``budget_s``: once spent,
    a call that would (re)compile raises and the case is recorded as n/a."""

    FUNCS = (
        "moe_sort_out",
        "mxfp4_quant_out",
        "moe_sort_quant_out",
        "moe_sort_scales_out",
        "moe_scatter_reduce_out",
        "moe_scatter_reduce_q_out",
    )

    def __init__(self, enabled: bool, reason: str, budget_s: float):
        self.enabled = enabled
        self.reason = reason
        self.budget_s = budget_s
        self.compile_s = 0.0
        self.frozen = False
        self.broken: dict[str, str] = {}  # function -> reason
        self.fns: dict[str, Callable] = {}
        if not enabled:
            return
        import logging

        import torch._dynamo as dynamo

        try:  # the reference's graph breaks are expected: do not print each one
            torch._logging.set_logs(dynamo=logging.ERROR)
        except Exception:  # noqa: BLE001
            logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
        cfg = dynamo.config
        for name, value in (
            ("recompile_limit", 64),
            ("cache_size_limit", 64),
            ("accumulated_recompile_limit", 4096),
            ("accumulated_cache_size_limit", 4096),
            ("fail_on_recompile_limit_hit", True),
            ("fail_on_cache_limit_hit", True),
        ):
            if hasattr(cfg, name):
                try:
                    setattr(cfg, name, value)
                except Exception:  # noqa: BLE001 - renamed/aliased options
                    pass
        for name in self.FUNCS:
            self.fns[name] = torch.compile(getattr(ref, name), dynamic=True)

    def _freeze(self) -> None:
        """No more compilation: a call that needs one raises."""
        if self.frozen:
            return
        self.frozen = True
        try:
            torch.compiler.set_stance("fail_on_recompile")
        except Exception:  # noqa: BLE001 - older torch
            import torch._dynamo as dynamo

            dynamo.config.error_on_recompile = True

    def _graphs(self) -> int:
        try:
            import torch._dynamo.utils as du

            return int(du.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001 - internal counter moved: rely on the wall time
            return 0

    def call(self, name: str, *args, **kwargs):
        if name in self.broken:
            raise RuntimeError(self.broken[name])
        if self.compile_s >= self.budget_s:
            self._freeze()
        saved = ref.chunks.CHUNK_ELEMS
        ref.chunks.CHUNK_ELEMS = 1 << 62
        before = self._graphs()
        t0 = time.perf_counter()
        try:
            return self.fns[name](*args, **kwargs)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
            if self.frozen:
                msg = f"needs a (re)compile; the compile budget ({self.budget_s:.0f} s) is spent"
            else:
                self.broken[name] = f"failed earlier: {msg}"
            raise RuntimeError(msg) from exc
        finally:
            ref.chunks.CHUNK_ELEMS = saved
            took = time.perf_counter() - t0
            if self._graphs() != before or took > 5.0:  # a (re)compile happened
                self.compile_s += took


# ---------------------------------------------------------------------------------------------
# one case: a shape at a token count
# ---------------------------------------------------------------------------------------------


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


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def same_sort(got: MoeSortOutput, want: MoeSortOutput, bm: int) -> bool:
    nv = int(want.num_valid_ids[0])
    lengths = (nv, nv, nv, nv // bm, 2, want.reverse_sorted.numel())
    return all(_same(g[:n], w[:n]) for g, w, n in zip(got, want, lengths, strict=True))


def alloc_sort(s: Sizes, dev) -> MoeSortOutput:
    i32 = dict(dtype=torch.int32, device=dev)
    return MoeSortOutput(
        torch.empty(s.max_rows, **i32),
        torch.empty(s.max_rows, dtype=torch.float32, device=dev),
        torch.empty(s.max_rows, **i32),
        torch.empty(s.max_rows // s.bm, **i32),
        torch.empty(2, **i32),
        torch.empty(s.n, **i32),
    )


def alloc_quant(s: Sizes, dev) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(s.m, s.d // 2, dtype=torch.uint8, device=dev),
        torch.empty(s.m, s.d // 32, dtype=torch.uint8, device=dev),
    )


@dataclass
class OpSpec:
    """How to run one op of a case: inputs of set 0, fresh outputs, the three runners and the
    comparison of an output set with the reference's."""

    inputs: dict
    new_outputs: Callable[[], dict]
    ours: Callable[[dict, dict], object]
    eager: Callable[[dict, dict], object]
    compiled: Callable[[CompiledPeer, dict, dict], object] | None
    same: Callable[[dict, dict], bool]


def op_spec(op: str, base: dict, s: Sizes, dev, zero_buf: bool) -> OpSpec:
    """The :class:`OpSpec` of ``op`` on the case inputs ``base``."""
    e, bm, k = s.e, s.bm, s.k

    def zb() -> dict:
        return (
            {"zero_buf": torch.empty(s.m, s.d, dtype=torch.bfloat16, device=dev)}
            if zero_buf
            else {}
        )

    def zero_ok(o: dict) -> bool:
        return not zero_buf or not bool(o["zero_buf"].view(torch.int16).any())

    if op == "moe_sort":
        return OpSpec(
            {"ids": base["ids"], "w": base["w"]},
            lambda: {"sort": alloc_sort(s, dev)},
            lambda i, o: ops.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"]),
            lambda i, o: ref.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"]),
            lambda c, i, o: c.call("moe_sort_out", i["ids"], i["w"], e, bm, o["sort"]),
            lambda g, w: same_sort(g["sort"], w["sort"], bm),
        )
    if op == "mxfp4_quant":
        return OpSpec(
            {"x": base["x"]},
            lambda: dict(zip(("q", "s"), alloc_quant(s, dev), strict=True)),
            lambda i, o: ops.mxfp4_quant_out(i["x"], o["q"], o["s"]),
            lambda i, o: ref.mxfp4_quant_out(i["x"], o["q"], o["s"]),
            lambda c, i, o: c.call("mxfp4_quant_out", i["x"], o["q"], o["s"]),
            lambda g, w: _same(g["q"], w["q"]) and _same(g["s"], w["s"]),
        )
    if op in ("moe_sort_quant", "decode_pipeline"):
        pipe = op == "decode_pipeline"

        def new_out() -> dict:
            q, sc = alloc_quant(s, dev)
            out = {"sort": alloc_sort(s, dev), "q": q, "s": sc, **zb()}
            if pipe:
                out["scales"] = torch.empty(s.out_rows, s.d // 32, dtype=torch.uint8, device=dev)
            return out

        def run(fns, i, o):
            srt, q, sc = o["sort"], o["q"], o["s"]
            fns[0](i["ids"], i["w"], i["x"], e, bm, srt, q, sc, zero_buf=o.get("zero_buf"))
            if pipe:
                fns[1](sc, srt.sorted_token_ids, srt.num_valid_ids, bm, o["scales"])

        ours_fns = (ops.moe_sort_quant_out, ops.moe_sort_scales_out)
        ref_fns = (ref.moe_sort_quant_out, ref.moe_sort_scales_out)

        def comp(c, i, o):
            fns = (
                lambda *a, **kw: c.call("moe_sort_quant_out", *a, **kw),
                lambda *a: c.call("moe_sort_scales_out", *a),
            )
            run(fns, i, o)

        def same(g, w):
            ok = same_sort(g["sort"], w["sort"], bm) and _same(g["q"], w["q"])
            ok = ok and _same(g["s"], w["s"]) and zero_ok(g)
            return ok and (not pipe or _same(g["scales"], w["scales"]))

        return OpSpec(
            {"ids": base["ids"], "w": base["w"], "x": base["x"]},
            new_out,
            lambda i, o: run(ours_fns, i, o),
            lambda i, o: run(ref_fns, i, o),
            comp,
            same,
        )
    if op == "moe_sort_scales":
        srt = base["sort"]
        return OpSpec(
            {"s": base["a_scale"], "sti": srt.sorted_token_ids, "nv": srt.num_valid_ids},
            lambda: {"o": torch.empty(s.out_rows, s.d // 32, dtype=torch.uint8, device=dev)},
            lambda i, o: ops.moe_sort_scales_out(i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda i, o: ref.moe_sort_scales_out(i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda c, i, o: c.call("moe_sort_scales_out", i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda g, w: _same(g["o"], w["o"]),
        )
    srt = base["sort"]
    new_out = lambda: {"o": torch.empty(s.m, s.d, dtype=torch.bfloat16, device=dev)}  # noqa: E731
    same = lambda g, w: _same(g["o"], w["o"])  # noqa: E731
    if op == "moe_scatter_reduce":
        return OpSpec(
            {"eo": base["expert_out"], "rev": srt.reverse_sorted, "sw": srt.sorted_weights},
            new_out,
            lambda i, o: ops.moe_scatter_reduce_out(i["eo"], i["rev"], i["sw"], k, o["o"]),
            lambda i, o: ref.moe_scatter_reduce_out(i["eo"], i["rev"], i["sw"], k, o["o"]),
            lambda c, i, o: c.call("moe_scatter_reduce_out", i["eo"], i["rev"], i["sw"], k, o["o"]),
            same,
        )
    if op == "moe_scatter_reduce_q":
        return OpSpec(
            {"q": base["eq"], "s": base["es"], "rev": srt.reverse_sorted, "sw": srt.sorted_weights},
            new_out,
            lambda i, o: ops.moe_scatter_reduce_q_out(i["q"], i["s"], i["rev"], i["sw"], k, o["o"]),
            lambda i, o: ref.moe_scatter_reduce_q_out(i["q"], i["s"], i["rev"], i["sw"], k, o["o"]),
            lambda c, i, o: c.call(
                "moe_scatter_reduce_q_out", i["q"], i["s"], i["rev"], i["sw"], k, o["o"]
            ),
            same,
        )
    raise KeyError(op)


def make_base(shape, m: int, bm: int, dev, seed: int, need: set[str]) -> tuple[dict, Sizes]:
    """Routing, activations and the reference outputs the later ops take as inputs."""
    e, d, _inter, k = shape
    gen = torch.Generator().manual_seed(seed * 1_000_003 + m * 7919 + e * 31 + k)
    ids, w = draw_routing(m, e, k, gen)
    s = routing_sizes(ids, e, d, bm)
    dgen = torch.Generator(device=dev).manual_seed(seed + m)
    base = {"ids": ids.to(dev), "w": w.to(dev)}
    base["x"] = torch.randn(m, d, generator=dgen, device=dev, dtype=torch.bfloat16) * 3
    if need & {"moe_sort_scales", "moe_scatter_reduce", "moe_scatter_reduce_q"}:
        base["sort"] = ref.moe_sort(base["ids"], base["w"], e, bm)
        assert int(base["sort"].num_valid_ids[0]) == s.rows
    if "moe_sort_scales" in need:
        base["a_scale"] = ref.mxfp4_quant(base["x"])[1]
    rows = max(s.rows, 1)
    if "moe_scatter_reduce" in need:
        base["expert_out"] = torch.randn(rows, d, generator=dgen, device=dev, dtype=torch.bfloat16)
    if "moe_scatter_reduce_q" in need:
        # random e2m1 bytes and e8m0 scales around 2^0 (no NaN scale)
        base["eq"] = torch.randint(
            0, 256, (rows, d // 2), generator=dgen, device=dev, dtype=torch.uint8
        )
        base["es"] = torch.randint(
            120, 135, (rows, d // 32), generator=dgen, device=dev, dtype=torch.uint8
        )
    return base, s


def n_buffer_sets(timer: Timer, set_bytes: int, l2_bytes: int) -> int:
    """Enough sets to exceed L2_FACTOR x L2, at most MAX_SETS and what a quarter of the free
    memory holds."""
    if not timer.cuda:
        return 1
    want = max(1, math.ceil(L2_FACTOR * l2_bytes / max(set_bytes, 1)))
    free, _ = torch.cuda.mem_get_info(timer.device)
    fit = max(1, int(0.25 * free // max(set_bytes, 1)))
    return int(min(want, MAX_SETS, fit))


def clone_inputs(inputs: dict) -> dict:
    out = {}
    for key, v in inputs.items():
        if isinstance(v, MoeSortOutput):
            out[key] = MoeSortOutput(*(t.clone() for t in v))
        else:
            out[key] = v.clone()
    return out


def run_op(
    op: str,
    spec: OpSpec,
    s: Sizes,
    row: Row,
    timer: Timer,
    peer: CompiledPeer,
    l2_bytes: int,
    big: bool,
) -> None:
    """Time ours and the peers for one op of a case; fills ``row``."""
    # eager reference: its first output is the reference bytes
    want = spec.new_outputs()
    spec.eager(spec.inputs, want)
    timer.sync()
    est = timer.once_us(lambda: spec.eager(spec.inputs, want), busy_prefix=False)
    row.eager_us, _ = timer.peer_us(lambda: spec.eager(spec.inputs, want), est, 5 if big else 10)

    # ours: rotated buffer sets, one graph of back-to-back calls
    out0 = spec.new_outputs()
    set_bytes = footprint(spec.inputs, out0)
    n_sets = n_buffer_sets(timer, set_bytes, l2_bytes)
    sets = [(spec.inputs, out0)]
    for _ in range(n_sets - 1):
        sets.append((clone_inputs(spec.inputs), spec.new_outputs()))
    row.n_sets = n_sets
    calls = [(lambda i=i, o=o: spec.ours(i, o)) for i, o in sets]
    calls[0]()
    timer.sync()
    est = timer.once_us(calls[0])
    row.ours_us, row.timing = timer.ours_us(calls, est)
    timer.sync()
    row.check = "ok" if spec.same(out0, want) else "MISMATCH"
    del sets, calls

    # torch.compile peer
    if not peer.enabled:
        row.compiled_note = peer.reason
    elif spec.compiled is None:
        row.compiled_note = "n/a"
    else:
        comp_out = spec.new_outputs()
        try:
            t0 = time.perf_counter()
            spec.compiled(peer, spec.inputs, comp_out)
            timer.sync()
            first = time.perf_counter() - t0
            fn = lambda: spec.compiled(peer, spec.inputs, comp_out)  # noqa: E731
            est = timer.once_us(fn, busy_prefix=False)
            row.compiled_us, _ = timer.peer_us(fn, est, 5 if big else 10)
            if first > 1.0:
                row.notes.append(f"compile/first call {first:.1f}s")
            if not spec.same(comp_out, want):
                row.compiled_note = "compiled output differs from the reference"
        except RuntimeError as exc:
            timer.sync()
            row.compiled_note = f"n/a: {exc}"
        del comp_out


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def shape_str(shape) -> str:
    return ",".join(str(x) for x in shape)


def print_table(rows: list[Row]) -> None:
    hdr = (
        f"{'op':<21} {'shape (E,D,I,K)':<17} {'tokens':>6} {'ours us':>9} {'eager us':>10} "
        f"{'compiled us':>11} {'x eager':>8} {'x comp':>7} {'bytes':>7} {'GB/s':>7} "
        f"{'%copy':>6}  check"
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
            f"{fmt(r.pct_copy, '.0f'):>6}  {check}"
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


def plot(path: Path, rows: list[Row], copy_bw: float, how: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (`pip install matplotlib`)"
    op_list = [op for op in OPS if any(r.op == op for r in rows)]
    cols = min(4, len(op_list))
    nrows = math.ceil(len(op_list) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    shapes = sorted({r.shape for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, op in zip(axes.flat, op_list, strict=False):
        for j, shp in enumerate(shapes):
            rs = sorted(
                (r for r in rows if r.op == op and r.shape == shp and r.ours_us),
                key=lambda r: r.tokens,
            )
            if not rs:
                continue
            c = colors[j % len(colors)]
            ax.plot(
                [r.tokens for r in rs],
                [r.ours_us for r in rs],
                "o-",
                color=c,
                ms=3,
                label=shape_str(shp),
            )
            ax.plot([r.tokens for r in rs], [r.floor_us for r in rs], "--", color=c, lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op, fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("µs")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(op_list) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, title="E,D,I,K (dashed: bytes / copy BW)", title_fontsize=7)
    fig.suptitle(f"aiter-aux ops, {how} (copy BW {copy_bw / 1e9:.0f} GB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"


def goals(rows: list[Row], have_compiled: bool) -> list[str]:
    """The goals of the issue as PASS/FAIL/SKIP lines (worst case named)."""
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
        "decode M<=64: moe_sort <= 4 us",
        sel("moe_sort", decode),
        lambda r: r.ours_us,
        lambda v: v <= 4.0,
        " us",
        True,
    )
    for op, pct in (
        ("mxfp4_quant", 85),
        ("moe_scatter_reduce", 80),
        ("moe_scatter_reduce_q", 70),
        ("moe_sort_scales", 70),
    ):
        check(
            f"prefill M>=4096: {op} >= {pct}% of copy BW",
            sel(op, prefill),
            lambda r: r.pct_copy,
            lambda v, p=pct: v >= p,
            "%",
            False,
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
# floors (docs/perf.md)
# ---------------------------------------------------------------------------------------------


def print_floors(shapes, tokens, bm: int, seed: int, zero_buf: bool) -> None:
    """Markdown table of bytes / 4.3 TB/s for the prefill cases (routing drawn as in a run)."""
    prefill_ops = [op for op in OPS if op != "decode_pipeline"]
    log(f"| shape (E,D,I,K) | M | {' | '.join(prefill_ops)} |")
    log("|---|---:|" + "---:|" * len(prefill_ops))
    for shape in shapes:
        e, d, _i, k = shape
        for m in tokens:
            if m < 4096:
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + m * 7919 + e * 31 + k)
            ids, _w = draw_routing(m, e, k, gen)
            s = routing_sizes(ids, e, d, bm)
            cells = []
            for op in prefill_ops:
                b = bytes_moved(op, s, zero_buf)
                cells.append(f"{human_bytes(b)}B / {b / HBM_PEAK_BYTES_S * 1e6:.1f} µs")
            log(f"| {shape_str(shape)} | {m} | {' | '.join(cells)} |")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_list(values, conv) -> list:
    out = []
    for v in values:
        out.extend(conv(x) for x in str(v).replace(",", " ").split())
    return out


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in text.replace("(", "").replace(")", "").split(","))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected E,MODEL_DIM,INTER,TOPK")
    return parts  # type: ignore[return-value]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=None,
        help="E,MODEL_DIM,INTER,TOPK tuples (default: the four of the issue)",
    )
    p.add_argument(
        "--tokens",
        nargs="+",
        default=None,
        help="token counts, space or comma separated (default 1 4 16 ... 65536)",
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
        if not is_mxfp4_moe_shape_supported(*shape):
            log(f"shape {shape_str(shape)} is not in the catalog (see `aiter-aux list`)")
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

    log("\ngoals:")
    for line in goals(rows, peer.enabled):
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
