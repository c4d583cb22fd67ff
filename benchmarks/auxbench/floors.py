"""The prefill bandwidth-floor table of docs/perf.md (``--floors``; no GPU needed)."""

from __future__ import annotations

import torch

from .cases import HBM_PEAK_BYTES_S, OPS, bytes_moved, human_bytes, routing_sizes
from .common import draw_routing, log
from .report import shape_str


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
