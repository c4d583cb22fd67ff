"""vLLM's ``moe_sum`` and SGLang's ``moe_sum`` and ``moe_sum_reduce`` as thin adapters onto
:func:`aiter_aux.ops.moe_sum_out` (re-exported by :mod:`.vllm`, :mod:`.vllm.custom_ops` and
:mod:`.sglang`; docs/compat.md "The sums").

The peers' checks are those of :mod:`aiter_aux.reference.compat` (the same functions run
them, so a bad call raises the reference's error before anything is written); the sum is
our ``moe_sum`` op, whose bytes are the reference's: fp32 accumulation from +0.0 in ``k``
order, one rounding to the output dtype, NaN written canonically, the same on every call.
Importing this module loads nothing; torch and the compiled module are loaded on the first
call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

_INT32_MAX = (1 << 31) - 1


def _aux() -> tuple[Any, Any]:
    """(aiter_aux.ops, aiter_aux.reference.compat), imported on first use."""
    from .. import ops
    from ..reference import compat

    return ops, compat


def _scale(value: object) -> float:
    from ..validation import validate_scale

    return validate_scale(value)


def moe_sum(
    input: Tensor,
    output: Tensor,
    topk_ids: Tensor | None = None,
    expert_map: Tensor | None = None,
) -> None:
    """vLLM's ``_custom_ops.moe_sum``: ``output[t] = sum over k of input[t, k]`` (fp32 sum,
    one rounding to ``input``'s dtype), written into ``output``.

    With ``topk_ids`` (int32 or int64 ``[M, topk]``) a slot whose id is < 0 is skipped, and
    with ``expert_map`` (int32 1-D) also one whose id is >= ``expert_map.numel()`` or maps to
    < 0; ``expert_map`` without ``topk_ids`` is ignored, as in vLLM.  int64 ids are narrowed
    to int32 with ``clamp(-1, 2**31 - 1)`` first (the same slots are skipped).

    Args:
        input: float32/float16/bfloat16 ``[M, topk, hidden]``, contiguous, ``topk >= 1``.
        output: ``input``'s dtype, ``[M, hidden]``, contiguous, not overlapping an input.

    Raises:
        TypeError, ValueError: as :func:`aiter_aux.reference.compat.vllm_moe_sum`, before
            anything is written.
    """
    ops, rc = _aux()
    topk_ids, expert_map = rc.check_vllm_sum_call(input, output, topk_ids, expert_map)
    if topk_ids is not None and topk_ids.dtype != rc.ID_DTYPES[0]:
        topk_ids = topk_ids.clamp(-1, _INT32_MAX).to(rc.ID_DTYPES[0])
    if topk_ids is None:
        ops.moe_sum_out(input, output)
    else:
        ops.moe_sum_out(input, output, topk_ids=topk_ids, expert_map=expert_map)


def sglang_moe_sum(input: Tensor, output: Tensor) -> None:
    """SGLang's ``moe_sum(input, output)``: ``output[t] = round(fp32 sum over k of
    input[t, k])`` into ``output``, one rounding to ``input``'s dtype, no scaling.

    Raises:
        TypeError, ValueError: as :func:`aiter_aux.reference.compat.sglang_moe_sum`, before
            anything is written.
    """
    ops, rc = _aux()
    rc.check_sum_call(input, output)
    ops.moe_sum_out(input, output)


def moe_sum_reduce(input: Tensor, output: Tensor, routed_scaling_factor: float = 1.0) -> None:
    """SGLang's ``moe_sum_reduce``: ``output[t] = round(fp32(sum over k of input[t, k]) *
    fp32(routed_scaling_factor))`` into ``output``, one rounding to ``input``'s dtype.

    Args:
        input: float32/float16/bfloat16 ``[M, topk, hidden]``, contiguous, ``topk >= 1``.
        output: ``input``'s dtype, ``[M, hidden]``, contiguous, not overlapping ``input``.
        routed_scaling_factor: a Python int or float (rounded to fp32); 1.0 by default, as
            SGLang's JIT form (the multiply by 1.0 changes nothing).

    Raises:
        TypeError, ValueError: as :func:`aiter_aux.reference.compat.sglang_moe_sum_reduce`,
            before anything is written.
    """
    ops, rc = _aux()
    rc.check_sum_call(input, output)
    scale = _scale(routed_scaling_factor)
    ops.moe_sum_out(input, output, routed_scaling_factor=scale)
