"""Timing on one device: CUDA-graph replay of back-to-back calls and CUDA events on CUDA,
wall clock on CPU; how many rotated buffer sets a case needs; the copy bandwidth."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from .common import log

L2_FACTOR = 2.0  # rotated buffer sets exceed L2_FACTOR x L2 when memory allows
MAX_SETS = 64  # at most this many rotated buffer sets (decode: inputs stay L2-resident)
SLEEP_CYCLES = 200_000  # GPU busy-wait before each timed sample (hides the CPU launch cost)


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

    def node_floor_us(self) -> float:
        """Per-call time of the smallest kernel torch launches (``fill_`` of one element) in
        graph replay: what one graph node costs with no work."""
        if not self.cuda:
            return 0.0
        t = torch.empty(1, dtype=torch.uint8, device=self.device)
        us, _ = self.ours_us([lambda: t.fill_(0)], 2.0)
        return us

    def same_bytes_copy_us(self, nbytes: int, l2_bytes: int) -> float:
        """Per-call time of an elementwise copy kernel moving ``nbytes`` in all (half read,
        half written: ``torch.bitwise_not`` of int32, 16-byte vector accesses) in graph
        replay, buffers rotated as for ours: what a plain kernel reaches at this size.  (Not
        ``copy_``: in a graph that becomes a memcpy node, which is slower than a kernel.)"""
        n = max(1, nbytes // 8)  # int32 elements per buffer
        sets = n_buffer_sets(self, 8 * n, l2_bytes)
        bufs = [
            (
                torch.ones(n, dtype=torch.int32, device=self.device),
                torch.empty(n, dtype=torch.int32, device=self.device),
            )
            for _ in range(sets)
        ]
        calls = [(lambda s=s, d=d: torch.bitwise_not(s, out=d)) for s, d in bufs]
        calls[0]()
        self.sync()
        us, _ = self.ours_us(calls, self.once_us(calls[0]))
        del bufs, calls
        return us

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


def n_buffer_sets(timer: Timer, set_bytes: int, l2_bytes: int) -> int:
    """Enough sets to exceed L2_FACTOR x L2, at most MAX_SETS and what a quarter of the free
    memory holds."""
    if not timer.cuda:
        return 1
    want = max(1, math.ceil(L2_FACTOR * l2_bytes / max(set_bytes, 1)))
    free, _ = torch.cuda.mem_get_info(timer.device)
    fit = max(1, int(0.25 * free // max(set_bytes, 1)))
    return int(min(want, MAX_SETS, fit))
