"""Input checks shared by the reference (:mod:`aiter_aux.reference`) and the compiled ops.

The per-op checks are generated from the op table (``codegen/ops.py``) into
:mod:`._checks`, in the same order and with the same messages as the C++ checks of the
compiled binding (also generated from the table), so the reference and every backend
reject exactly the same inputs with the same errors, before any computation or kernel.

Conventions (see docs/ops.md):

* A tensor argument that is not a :class:`torch.Tensor` raises :class:`TypeError`.
* A tensor with the wrong dtype raises :class:`TypeError` naming the argument, the expected
  dtype and the dtype it got.
* A sparse (not strided) tensor, a wrong rank or shape, a non-contiguous tensor, tensors on
  different devices, an int out of range and an output buffer that is too small raise
  :class:`ValueError` naming the argument and the rule that was broken.
* Int arguments must be Python ints (or objects with ``__index__``, such as numpy ints);
  ``bool`` and floats raise :class:`TypeError`.  Float arguments must be Python ints or
  floats; ``bool`` and tensors (0-dim included) raise :class:`TypeError`.

Modules: :mod:`._checks` (generated: ``<op>`` / ``<op>_out`` validators,
:func:`moe_sort_capacity`), :mod:`aiter_aux.limits` (generated: the limits), :mod:`.tensors`
(the tensor checks they call), :mod:`.ints` (int and float checks, the sort's size formulas).
"""

from __future__ import annotations

from ..limits import (
    BLOCK_M_VALUES,
    MAX_NUM_EXPERTS,
    MAX_NUM_TOKENS,
    MAX_ROWS_LIMIT,
    MAX_TOPK,
)
from . import _checks as checks
from ._checks import moe_sort_capacity
from .ints import sort_capacity, sort_scales_rows, validate_int, validate_scale
from .tensors import (
    check_expert_map,
    check_no_overlap,
    check_same_device,
    check_tensor,
    rows_in_range,
)

__all__ = [
    "BLOCK_M_VALUES",
    "MAX_NUM_EXPERTS",
    "MAX_NUM_TOKENS",
    "MAX_ROWS_LIMIT",
    "MAX_TOPK",
    "checks",
    "check_expert_map",
    "check_no_overlap",
    "check_same_device",
    "check_tensor",
    "moe_sort_capacity",
    "rows_in_range",
    "sort_capacity",
    "sort_scales_rows",
    "validate_int",
    "validate_scale",
]
