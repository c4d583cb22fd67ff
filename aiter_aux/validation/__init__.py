"""Input checks shared by the reference (:mod:`aiter_aux.reference`) and the compiled ops.

Every public op validates its arguments here *before* any computation or kernel launch, so
the reference and every backend reject exactly the same inputs with the same messages.

Conventions (see docs/ops.md):

* A tensor argument that is not a :class:`torch.Tensor` raises :class:`TypeError`.
* A tensor with the wrong dtype raises :class:`TypeError` naming the argument, the expected
  dtype and the dtype it got.
* A wrong rank or shape, a non-contiguous tensor, tensors on different devices, an int out of
  range and an output buffer that is too small raise :class:`ValueError` naming the argument
  and the rule that was broken.
* Int arguments must be Python ints (or objects with ``__index__``, such as numpy ints);
  ``bool`` and floats raise :class:`TypeError`.

Each ``validate_<op>`` function checks the inputs of one op and returns the sizes derived
from them; each ``validate_<op>_out`` function checks the caller-provided output buffers
against those sizes.  The small ``validate_<int>`` functions work on plain ints, so limits
such as ``M < 2**24`` can be checked without allocating large tensors.

One kind of check per module:

* :mod:`.tensors`: generic tensor and output-buffer checks (``check_*``).
* :mod:`.ints`: int checks and the limits they enforce (``validate_<int>``, ``MAX_*``,
  ``BLOCK_M_VALUES``).
* :mod:`.ops`: the per-op checks (``validate_<op>``, ``validate_<op>_out``).
"""

from __future__ import annotations

from .ints import (
    BLOCK_M_VALUES,
    MAX_NUM_EXPERTS,
    MAX_NUM_TOKENS,
    MAX_ROWS_LIMIT,
    MAX_TOPK,
    sort_scales_rows,
    validate_block_m,
    validate_int,
    validate_model_dim,
    validate_num_experts,
    validate_num_tokens,
    validate_scale,
    validate_sort_sizes,
    validate_topk,
)
from .ints import validate_sort_sizes as moe_sort_capacity
from .ops import (
    check_moe_scatter_reduce_call,
    check_moe_scatter_reduce_q_call,
    check_moe_sort_call,
    check_moe_sort_quant_alloc_call,
    check_moe_sort_quant_call,
    check_moe_sort_scales_call,
    check_mxfp4_quant_call,
    check_sorted_scales,
    validate_moe_scatter_reduce,
    validate_moe_scatter_reduce_out,
    validate_moe_scatter_reduce_q,
    validate_moe_sort,
    validate_moe_sort_out,
    validate_moe_sort_quant,
    validate_moe_sort_scales,
    validate_moe_sort_scales_out,
    validate_mxfp4_quant,
    validate_mxfp4_quant_out,
    validate_quant_dtype,
    validate_reverse_sorted_range,
)
from .tensors import (
    check_buffer,
    check_expert_map,
    check_no_overlap,
    check_same_device,
    check_tensor,
    check_zero_buf,
    check_zero_buf_init,
)

__all__ = [
    "BLOCK_M_VALUES",
    "MAX_NUM_EXPERTS",
    "MAX_NUM_TOKENS",
    "MAX_TOPK",
    "MAX_ROWS_LIMIT",
    "check_tensor",
    "check_same_device",
    "check_buffer",
    "check_zero_buf",
    "check_no_overlap",
    "check_expert_map",
    "check_zero_buf_init",
    "validate_scale",
    "check_moe_sort_call",
    "check_mxfp4_quant_call",
    "check_moe_sort_quant_call",
    "check_moe_sort_quant_alloc_call",
    "check_sorted_scales",
    "check_moe_sort_scales_call",
    "check_moe_scatter_reduce_call",
    "check_moe_scatter_reduce_q_call",
    "moe_sort_capacity",
    "validate_int",
    "validate_num_experts",
    "validate_block_m",
    "validate_topk",
    "validate_num_tokens",
    "validate_model_dim",
    "validate_sort_sizes",
    "sort_scales_rows",
    "validate_moe_sort",
    "validate_moe_sort_out",
    "validate_mxfp4_quant",
    "validate_mxfp4_quant_out",
    "validate_quant_dtype",
    "validate_moe_sort_quant",
    "validate_moe_sort_scales",
    "validate_moe_sort_scales_out",
    "validate_moe_scatter_reduce",
    "validate_moe_scatter_reduce_q",
    "validate_moe_scatter_reduce_out",
    "validate_reverse_sorted_range",
]
