"""What every stage needs: the repository root on ``sys.path`` (so that aiter_aux imports
without being installed), the aiter_aux names and ``log``."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

try:
    from aiter_aux import mxfp4_moe_shape_status, ops
    from aiter_aux import reference as ref
    from aiter_aux.pipeline import draw_routing
    from aiter_aux.types import MoeSortOutput
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(
        f"bench_aux: cannot import aiter_aux ({exc}).  It needs torch, jinja2, ninja and "
        "filelock (`pip install -e .` in the repository, or `pip install ninja jinja2 filelock`)."
    )

__all__ = [
    "REPO",
    "MoeSortOutput",
    "draw_routing",
    "mxfp4_moe_shape_status",
    "log",
    "ops",
    "ref",
]


def log(*a) -> None:
    print(*a, flush=True)
