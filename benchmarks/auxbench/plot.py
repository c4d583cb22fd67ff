"""The optional figure: time vs tokens per op (matplotlib; skipped when not installed)."""

from __future__ import annotations

import math
from pathlib import Path

from .cases import OPS
from .report import Row, shape_str


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
