"""aiter-aux: the auxiliary kernels of the MXFP4 MoE path (routing sort, MXFP4 / MXFP8
activation quant, scale shuffle, weighted top-k scatter-reduce), JIT-specialised per model
shape.

The public API is importable from here: the ops (``moe_sort``, ``moe_sort_quant``, ...,
each with its ``_out`` form; :mod:`aiter_aux.ops`), the dispatcher predicates
(``is_mxfp4_moe_shape_supported``: prebuilt; ``mxfp4_moe_shape_status``: servable at all,
built on demand) and the catalog,
``MoeSortOutput``, ``moe_sort_capacity``, ``UnsupportedShapeError`` and
``JitDisabledError``.  The ops are ``torch.ops.aiter_aux.*`` custom ops: they are defined
when :mod:`aiter_aux.ops` is imported, which ``import aiter_aux`` does at once in a process
that has imported torch (else on first use of an op), so the command-line tool starts without
torch.  No
compiled module is loaded before the first op call (:mod:`aiter_aux.jit`).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_PREDICATES = ("MXFP4_MOE_SUPPORTED_SHAPES", "is_mxfp4_moe_shape_supported",
               "is_mxfp4_moe_scatter_supported", "round_inter_dim",
               "mxfp4_moe_shape_status", "ShapeStatus")  # fmt: skip

if TYPE_CHECKING:  # (the wrappers from _ops itself: its __all__ is a literal list)
    from .ops import *  # noqa: F403
    from .ops._ops import *  # noqa: F403
    from .ops.moe_mxfp4_aux import (  # noqa: F401
        MXFP4_MOE_SUPPORTED_SHAPES,
        ShapeStatus,
        is_mxfp4_moe_scatter_supported,
        is_mxfp4_moe_shape_supported,
        mxfp4_moe_shape_status,
        round_inter_dim,
    )


def _submodules() -> frozenset[str]:
    global _SUBMODULES
    if _SUBMODULES is None:
        import pkgutil

        _SUBMODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))  # noqa: F405
    return _SUBMODULES


_SUBMODULES: frozenset[str] | None = None


def __getattr__(name: str):
    # `from . import env` asks for the attribute before importing the submodule: a
    # submodule's name (or a dunder) must not import the ops (and torch)
    if name == "__all__":  # `from aiter_aux import *`: the public API (imports the ops)
        return sorted({*_PREDICATES, *importlib.import_module(".ops", __name__).__all__})
    if name.startswith("__") or name in _submodules():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _PREDICATES:
        return getattr(importlib.import_module(".ops.moe_mxfp4_aux", __name__), name)
    ops = importlib.import_module(".ops", __name__)  # not `from . import`: that looks us up
    if name in ops.__all__:
        return getattr(ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    ops = importlib.import_module(".ops", __name__)
    return sorted({*globals(), *_PREDICATES, *ops.__all__})


if "torch" in sys.modules:  # a torch process gets torch.ops.aiter_aux.* at import
    importlib.import_module(".ops", __name__)
