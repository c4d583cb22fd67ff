"""The aux ops on the compiled module ``module_moe_mxfp4_aux``: thin typed wrappers over the
torch ops ``torch.ops.aiter_aux.<op>`` / ``<op>_out`` (see :mod:`._library`).

Same API and same bytes as :mod:`aiter_aux.reference` (the spec; docs/ops.md).  Every
argument is validated in C++ by the module's binding before any kernel runs (dtype, device,
rank, sizes, contiguity, capacity, ``block_m``, int32 ranges, overlapping buffers, then the
catalog), so these wrappers do no Python validation on the hot path.  CPU tensors run on
the CPU backend; CUDA tensors on the cuda (or, under ROCm torch, rocm) backend, on the
current torch stream, without synchronising or allocating in ``_out`` variants.  The first
call on a backend loads its module (building it if needed).

Errors: ``TypeError`` / ``ValueError`` (bad input, raised before any kernel runs, with the
reference's message), :class:`UnsupportedShapeError` (a ``ValueError``: no instance for
these parameters), ``aiter_aux.jit.BuildError`` (the module failed to compile),
``RuntimeError`` (the module reported an error).  Tensors on the ``meta`` device (all of
them) run the fake implementation: shapes only, no kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .. import validation as V
from ..types import MoeSortOutput
from ..validation import moe_sort_capacity
from . import _library

__all__ = [
    "MoeSortOutput",
    "UnsupportedShapeError",
    "moe_sort_capacity",
    "moe_sort",
    "moe_sort_out",
    "mxfp4_quant",
    "mxfp4_quant_out",
    "mxfp8_quant",
    "mxfp8_quant_out",
    "moe_sort_quant",
    "moe_sort_quant_out",
    "moe_sort_scales",
    "moe_sort_scales_out",
    "moe_scatter_reduce",
    "moe_scatter_reduce_out",
    "moe_scatter_reduce_q",
    "moe_scatter_reduce_q_out",
]

Tensor = torch.Tensor


class UnsupportedShapeError(ValueError):
    """No compiled instance exists for the requested compile-time parameters."""


_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "UnsupportedShapeError": UnsupportedShapeError,
    "RuntimeError": RuntimeError,
}


def translate(error: Exception, check: Callable[[], object]) -> Exception:
    """The exception a wrapper raises for ``error`` from a torch op (the error path only).

    ``check`` (the reference's checks of the same call) runs first: where the reference
    rejects the call, its error is raised, so a wrapper names an argument exactly as the
    spec does, also for what torch's argument parser rejects before the binding sees it (an
    argument of the wrong Python type, a bool where an int belongs).  Otherwise the
    binding's message ``"<Type>: <text>"`` (csrc/kernels/mxfp4_moe/binding/checks.h) becomes
    ``<Type>(text)``, e.g. :class:`UnsupportedShapeError`; anything else is ``error``."""
    check()
    kind, sep, text = str(error).partition(": ")
    cls = _ERRORS.get(kind) if sep else None
    if cls is not None and isinstance(error, RuntimeError):
        return cls(text)
    return error


# _NO_KW: the wrappers leave out keyword options at their defaults; torch's argument parser
# spends ~0.5 µs on each keyword, even None (bench_host: moe_sort_out 6.5 -> 4.9 µs on CPU).
_library.define()
_ops = torch.ops.aiter_aux
_moe_sort = _ops.moe_sort.default
_moe_sort_out = _ops.moe_sort_out.default
_mxfp4_quant = _ops.mxfp4_quant.default
_mxfp4_quant_out = _ops.mxfp4_quant_out.default
_moe_sort_quant = _ops.moe_sort_quant.default
_moe_sort_quant_out = _ops.moe_sort_quant_out.default
_mxfp8_quant = _ops.mxfp8_quant.default
_mxfp8_quant_out = _ops.mxfp8_quant_out.default
_moe_sort_quant_fp8 = _ops.moe_sort_quant_fp8.default
_moe_sort_quant_fp8_out = _ops.moe_sort_quant_fp8_out.default
_moe_sort_scales = _ops.moe_sort_scales.default
_moe_sort_scales_out = _ops.moe_sort_scales_out.default
_scatter = _ops.moe_scatter_reduce.default
_scatter_out = _ops.moe_scatter_reduce_out.default
_scatter_q = _ops.moe_scatter_reduce_q.default
_scatter_q_out = _ops.moe_scatter_reduce_q_out.default


def moe_sort_out(
    topk_ids: Tensor,
    topk_weights: Tensor,
    num_experts: int,
    block_m: int,
    out: Sequence[Tensor],
    *,
    zero_buf: Tensor | None = None,
    expert_map: Tensor | None = None,
    zero_buf_init: Tensor | None = None,
) -> MoeSortOutput:
    """Sort token->expert pairs into ``out`` (a :class:`MoeSortOutput` of preallocated
    buffers); semantics, shapes and errors as :func:`aiter_aux.reference.moe_sort_out`.
    Rows past ``num_valid_ids[0]`` are not written.  Returns ``out``."""
    try:
        if zero_buf is None and expert_map is None and zero_buf_init is None:
            _moe_sort_out(topk_ids, topk_weights, num_experts, block_m, *out)  # _NO_KW
        else:
            _moe_sort_out(topk_ids, topk_weights, num_experts, block_m, *out, zero_buf=zero_buf,
                          expert_map=expert_map, zero_buf_init=zero_buf_init)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_sort_call(topk_ids, topk_weights, num_experts, block_m, out,
                                             zero_buf, expert_map, zero_buf_init)  # fmt: skip
        ) from None
    return out


def moe_sort(
    topk_ids: Tensor,
    topk_weights: Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: Tensor | None = None,
    expert_map: Tensor | None = None,
    zero_buf_init: Tensor | None = None,
) -> MoeSortOutput:
    """Sort token->expert pairs by expert, padded to ``block_m`` (see
    :func:`aiter_aux.reference.moe_sort`: topk_ids int32 [M, topk], topk_weights float32
    [M, topk] -> :class:`MoeSortOutput` of capacity ``moe_sort_capacity(M, topk,
    num_experts, block_m)``).  ``zero_buf`` (bf16, any shape) is zeroed in the same call, or
    set to ``zero_buf_init`` (e.g. the shared expert's output); with ``expert_map`` (int32
    ``[num_global_experts]``, expert parallelism) ``topk_ids`` hold global ids and a pair's
    expert is ``expert_map[id]`` (not local when < 0 or >= num_experts)."""
    try:
        if zero_buf is None and expert_map is None and zero_buf_init is None:
            r = _moe_sort(topk_ids, topk_weights, num_experts, block_m)
        else:
            r = _moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf=zero_buf,
                          expert_map=expert_map, zero_buf_init=zero_buf_init)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.validate_moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf,
                                           expert_map, zero_buf_init)  # fmt: skip
        ) from None
    return MoeSortOutput(*r)


def mxfp4_quant_out(x: Tensor, a_q: Tensor, a_scale: Tensor) -> tuple[Tensor, Tensor]:
    """Quantise bf16 ``x`` [M, model_dim] to MXFP4 per_1x32 into ``a_q`` uint8
    [M, model_dim/2] (e2m1, element 2j in the low nibble of byte j) and ``a_scale`` uint8
    [M, model_dim/32] (e8m0), as :func:`aiter_aux.reference.mxfp4_quant` (OCP Microscaling
    Formats v1.0).  Returns ``(a_q, a_scale)``."""
    try:
        _mxfp4_quant_out(x, a_q, a_scale)
    except (RuntimeError, TypeError) as e:
        raise translate(e, lambda: V.check_mxfp4_quant_call(x, a_q, a_scale)) from None
    return a_q, a_scale


def mxfp4_quant(x: Tensor) -> tuple[Tensor, Tensor]:
    """Allocating :func:`mxfp4_quant_out`: returns ``(a_q, a_scale)``."""
    try:
        a_q, a_scale = _mxfp4_quant(x)
    except (RuntimeError, TypeError) as e:
        raise translate(e, lambda: V.validate_mxfp4_quant(x)) from None
    return a_q, a_scale


def mxfp8_quant_out(x: Tensor, a_q: Tensor, a_scale: Tensor) -> tuple[Tensor, Tensor]:
    """Quantise bf16 ``x`` [M, model_dim] to MXFP8 per_1x32 into ``a_q`` uint8 [M, model_dim]
    (E4M3 bytes; ``a_q.view(torch.float8_e4m3fn)``) and ``a_scale`` uint8 [M, model_dim/32]
    (e8m0), as :func:`aiter_aux.reference.mxfp8_quant`.  Returns ``(a_q, a_scale)``."""
    try:
        _mxfp8_quant_out(x, a_q, a_scale)
    except (RuntimeError, TypeError) as e:
        raise translate(e, lambda: V.check_mxfp4_quant_call(x, a_q, a_scale, fp8=True)) from None
    return a_q, a_scale


def mxfp8_quant(x: Tensor) -> tuple[Tensor, Tensor]:
    """Allocating :func:`mxfp8_quant_out`: returns ``(a_q, a_scale)``."""
    try:
        a_q, a_scale = _mxfp8_quant(x)
    except (RuntimeError, TypeError) as e:
        raise translate(e, lambda: V.validate_mxfp4_quant(x)) from None
    return a_q, a_scale


def moe_sort_quant_out(
    topk_ids: Tensor,
    topk_weights: Tensor,
    x: Tensor,
    num_experts: int,
    block_m: int,
    out: Sequence[Tensor],
    a_q: Tensor,
    a_scale: Tensor,
    *,
    zero_buf: Tensor | None = None,
    expert_map: Tensor | None = None,
    zero_buf_init: Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: Tensor | None = None,
) -> tuple[MoeSortOutput, Tensor, Tensor]:
    """:func:`moe_sort_out` and :func:`mxfp4_quant_out` (``quant_dtype="mxfp8"``:
    :func:`mxfp8_quant_out`, the torch op ``moe_sort_quant_fp8_out``) in one call (one launch
    on GPU); outputs identical to the separate ops.  Returns ``(out, a_q, a_scale)``.

    ``sorted_scales`` (optional; the decode pipeline in one call instead of this op then
    :func:`moe_sort_scales_out`): uint8 2-D ``[>= out_rows, model_dim / 32]``, contiguous, on
    the inputs' device, with ``out_rows = ceil(max_rows / BM) * BM``, ``BM = max(32,
    block_m)`` and ``model_dim % 256 == 0``; it must share no byte with any other buffer of the
    call.  The call then also writes it exactly as ``moe_sort_scales_out(a_scale[:M],
    out.sorted_token_ids[:max_rows], out.num_valid_ids, block_m, sorted_scales)`` would
    (every byte of the first ``out_rows`` rows; later rows keep their bytes); it is not
    returned.  Errors: ``TypeError`` (not a tensor, not uint8), ``ValueError`` (not 2-D, not
    contiguous, another device, wrong column count, too few rows, model_dim % 256 != 0,
    overlap), before any kernel runs (see :func:`aiter_aux.reference.moe_sort_quant_out`)."""
    fp8 = V.validate_quant_dtype(quant_dtype)
    try:
        op = _moe_sort_quant_fp8_out if fp8 else _moe_sort_quant_out
        if zero_buf is None and expert_map is None and zero_buf_init is None:
            if sorted_scales is None:
                op(topk_ids, topk_weights, x, num_experts, block_m, *out, a_q, a_scale)  # _NO_KW
            else:
                op(topk_ids, topk_weights, x, num_experts, block_m, *out, a_q, a_scale,
                   sorted_scales=sorted_scales)  # fmt: skip
        else:
            op(
                topk_ids, topk_weights, x, num_experts, block_m, *out, a_q, a_scale,
                zero_buf=zero_buf, expert_map=expert_map, zero_buf_init=zero_buf_init,
                sorted_scales=sorted_scales,
            )  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_sort_quant_call(topk_ids, topk_weights, x, num_experts,
                                                   block_m, out, a_q, a_scale, zero_buf,
                                                   expert_map, zero_buf_init, fp8,
                                                   sorted_scales)
        ) from None  # fmt: skip
    return out, a_q, a_scale


def moe_sort_quant(
    topk_ids: Tensor,
    topk_weights: Tensor,
    x: Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: Tensor | None = None,
    expert_map: Tensor | None = None,
    zero_buf_init: Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: Tensor | None = None,
) -> tuple[MoeSortOutput, Tensor, Tensor]:
    """Allocating :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, a_scale)``.
    ``sorted_scales`` is the caller's buffer, checked and written as in
    :func:`moe_sort_quant_out` (like ``zero_buf``, it is not allocated or returned)."""
    op = _moe_sort_quant_fp8 if V.validate_quant_dtype(quant_dtype) else _moe_sort_quant
    try:
        if zero_buf is None and expert_map is None and zero_buf_init is None:
            if sorted_scales is None:
                r = op(topk_ids, topk_weights, x, num_experts, block_m)
            else:
                r = op(topk_ids, topk_weights, x, num_experts, block_m,
                       sorted_scales=sorted_scales)  # fmt: skip
        else:
            r = op(topk_ids, topk_weights, x, num_experts, block_m, zero_buf=zero_buf,
                   expert_map=expert_map, zero_buf_init=zero_buf_init,
                   sorted_scales=sorted_scales)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_sort_quant_alloc_call(topk_ids, topk_weights, x, num_experts,
                                                         block_m, zero_buf, expert_map,
                                                         zero_buf_init, sorted_scales)
        ) from None  # fmt: skip
    return MoeSortOutput(*r[:6]), r[6], r[7]


def moe_sort_scales_out(
    a_scale: Tensor,
    sorted_token_ids: Tensor,
    num_valid_ids: Tensor,
    block_m: int,
    sorted_scales: Tensor,
) -> Tensor:
    """Shuffle ``a_scale`` uint8 [M, model_dim/32] (e8m0) into the grouped GEMM's scale
    layout, row order given by the sort, into ``sorted_scales`` uint8
    [ceil(max_rows/BM)*BM, model_dim/32] with BM = max(32, block_m); every byte is written
    (see :func:`aiter_aux.reference.moe_sort_scales`).  Returns ``sorted_scales``."""
    try:
        _moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_sort_scales_call(a_scale, sorted_token_ids, num_valid_ids,
                                                    block_m, sorted_scales)
        ) from None  # fmt: skip
    return sorted_scales


def moe_sort_scales(
    a_scale: Tensor, sorted_token_ids: Tensor, num_valid_ids: Tensor, block_m: int
) -> Tensor:
    """Allocating :func:`moe_sort_scales_out`."""
    try:
        return _moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.validate_moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids,
                                                  block_m)
        ) from None  # fmt: skip


def moe_scatter_reduce_out(
    expert_out: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    topk: int,
    out: Tensor,
    *,
    routed_scaling_factor: float = 1.0,
) -> Tensor:
    """Weighted top-k reduce of ``expert_out`` bf16 [rows, model_dim] (sorted order) back to
    tokens: ``out`` bf16 [M, model_dim], M = reverse_sorted.numel() // topk (see
    :func:`aiter_aux.reference.moe_scatter_reduce`).  On CPU, row indices >= rows raise
    ``ValueError``; on GPU they are not read (checking would synchronise).  The fp32 sum is
    multiplied by ``routed_scaling_factor`` (fp32) before the bf16 rounding."""
    try:
        if routed_scaling_factor == 1.0:
            _scatter_out(expert_out, reverse_sorted, sorted_weights, topk, out)
        else:
            _scatter_out(expert_out, reverse_sorted, sorted_weights, topk, out,
                         routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_scatter_reduce_call(expert_out, reverse_sorted,
                                                       sorted_weights, topk, out,
                                                       routed_scaling_factor)
        ) from None  # fmt: skip
    return out


def moe_scatter_reduce(
    expert_out: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    topk: int,
    *,
    routed_scaling_factor: float = 1.0,
) -> Tensor:
    """Allocating :func:`moe_scatter_reduce_out`."""
    try:
        if routed_scaling_factor == 1.0:
            return _scatter(expert_out, reverse_sorted, sorted_weights, topk)
        return _scatter(expert_out, reverse_sorted, sorted_weights, topk,
                        routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights,
                                                     topk, routed_scaling_factor)
        ) from None  # fmt: skip


def moe_scatter_reduce_q_out(
    expert_out_q: Tensor,
    expert_out_scale: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    topk: int,
    out: Tensor,
    *,
    routed_scaling_factor: float = 1.0,
) -> Tensor:
    """:func:`moe_scatter_reduce_out` with MXFP4 ``expert_out``: e2m1 ``expert_out_q`` uint8
    [rows, model_dim/2] and e8m0 ``expert_out_scale`` uint8 [rows, model_dim/32]
    (scale 255 decodes to NaN)."""
    try:
        if routed_scaling_factor == 1.0:
            _scatter_q_out(
                expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
            )
        else:
            _scatter_q_out(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk,
                           out, routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.check_moe_scatter_reduce_q_call(expert_out_q, expert_out_scale,
                                                         reverse_sorted, sorted_weights, topk,
                                                         out, routed_scaling_factor)
        ) from None  # fmt: skip
    return out


def moe_scatter_reduce_q(
    expert_out_q: Tensor,
    expert_out_scale: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    topk: int,
    *,
    routed_scaling_factor: float = 1.0,
) -> Tensor:
    """Allocating :func:`moe_scatter_reduce_q_out`."""
    try:
        if routed_scaling_factor == 1.0:
            return _scatter_q(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk)
        return _scatter_q(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk,
                          routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    except (RuntimeError, TypeError) as e:
        raise translate(
            e, lambda: V.validate_moe_scatter_reduce_q(expert_out_q, expert_out_scale,
                                                       reverse_sorted, sorted_weights, topk,
                                                       routed_scaling_factor)
        ) from None  # fmt: skip
