"""vLLM's ``moe_sum`` and SGLang's ``moe_sum`` and ``moe_sum_reduce`` as thin adapters onto
:func:`aiter_aux.ops.moe_sum_out` (re-exported by :mod:`.vllm`, :mod:`.vllm.custom_ops` and
:mod:`.sglang`; docs/compat.md "The sums").

Each calls the ``moe_sum_out`` torch op, whose binding checks the call before anything is
written, as the peers' own wrappers call theirs; when it raises, the checks of
:mod:`aiter_aux.reference.compat` name what is wrong as the reference does.  The bytes are
the reference's: fp32 accumulation from +0.0 in ``k`` order, one rounding to the output
dtype, NaN written canonically, the same on every call.
Importing this module loads nothing; torch and the compiled module are loaded on the first
call.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

_INT32_MAX = (1 << 31) - 1
#: Once imported: the ``moe_sum_out`` OpOverload, its C++ callable and
#: ``torch.compiler.is_compiling``.  Eagerly the drop-ins call the C++ callable (what the
#: OpOverload calls, one Python frame less); under ``torch.compile`` the OpOverload, which
#: dynamo traces.
_OP: list = []


def _op() -> list:
    """``_OP``, filled on the first call (importing :mod:`aiter_aux.ops` defines the op)."""
    if not _OP:
        import torch

        from .. import ops  # noqa: F401

        op = torch.ops.aiter_aux.moe_sum_out.default
        _OP.extend((op, op._op, torch.compiler.is_compiling))
    return _OP


def _error(error: Exception, check) -> Exception:
    """The exception for a failed call: the reference's checks (``check``) name what is
    wrong as the peer's arguments; else the op's own error, translated as the wrappers'."""
    from ..ops._library import translate

    return translate(error, check)


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

    The op's binding checks the call; only ``output``'s row count, which the op lets exceed
    M, is compared here.  On an error the reference's checks name the argument.

    Args:
        input: float32/float16/bfloat16 ``[M, topk, hidden]``, contiguous, ``topk >= 1``.
        output: ``input``'s dtype, ``[M, hidden]``, contiguous, not overlapping an input.

    Raises:
        TypeError, ValueError: as :func:`aiter_aux.reference.compat.vllm_moe_sum`, before
            anything is written.
    """
    op, raw, compiling = _OP or _op()
    try:
        if output.shape[0] != input.shape[0]:
            raise ValueError("output rows")  # the reference's check says it in full
        if topk_ids is None:
            (op if compiling() else raw)(input, output)  # each argument costs
        else:
            topk_ids = _narrow(topk_ids)
            (op if compiling() else raw)(input, output, topk_ids, expert_map)
    except Exception as e:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(e, partial(_vllm_checks, input, output, topk_ids, expert_map)) from None


def _vllm_checks(input, output, topk_ids, expert_map) -> None:
    from ..reference import compat

    compat.check_vllm_sum_call(input, output, topk_ids, expert_map)


def _narrow(topk_ids: Tensor) -> Tensor:
    """int64 ids as int32 skipping the same slots (other dtypes are left to the checks)."""
    import torch

    if topk_ids.dtype != torch.int64:
        return topk_ids
    return topk_ids.clamp(-1, _INT32_MAX).to(torch.int32)


def sglang_moe_sum(input: Tensor, output: Tensor) -> None:
    """SGLang's ``moe_sum(input, output)``: ``output[t] = round(fp32 sum over k of
    input[t, k])`` into ``output``, one rounding to ``input``'s dtype, no scaling.

    Raises:
        TypeError, ValueError: as :func:`aiter_aux.reference.compat.sglang_moe_sum`, before
            anything is written.
    """
    op, raw, compiling = _OP or _op()
    try:
        if output.shape[0] != input.shape[0]:
            raise ValueError("output rows")  # the reference's check says it in full
        (op if compiling() else raw)(input, output)
    except Exception as e:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(e, partial(_sglang_checks, input, output, 1.0)) from None


def _sglang_checks(input, output, routed_scaling_factor) -> None:
    from ..reference import compat

    compat.check_sum_call(input, output)
    _scale(routed_scaling_factor)


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
    op, raw, compiling = _OP or _op()
    try:
        if output.shape[0] != input.shape[0]:
            raise ValueError("output rows")  # the reference's check says it in full
        if type(routed_scaling_factor) is not float:
            routed_scaling_factor = _scale(routed_scaling_factor)
        if routed_scaling_factor == 1.0:
            (op if compiling() else raw)(input, output)  # each argument costs
        else:  # by position: a keyword costs ~0.5 us more
            (op if compiling() else raw)(input, output, None, None, routed_scaling_factor)
    except Exception as e:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(e, partial(_sglang_checks, input, output, routed_scaling_factor)) from None
