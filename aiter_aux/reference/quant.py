"""Reference ``mxfp4_quant[_out]`` (MXFP4 per_1x32 quantisation of bf16 rows) and the fused
``moe_sort_quant[_out]`` (``moe_sort_out`` and ``mxfp4_quant_out`` in one call)."""

from __future__ import annotations

import torch

from aiter_aux.types import MoeSortOutput
from aiter_aux.validation import _checks as C

from . import chunks
from .mxfp4 import _quant_rows
from .mxfp8 import _quant_rows_fp8
from .sort import _alloc_sort_out, _sort_into
from .sort_scales import moe_sort_scales_out

# --------------------------------------------------------------------------------------------
# mxfp4_quant
# --------------------------------------------------------------------------------------------

__all__ = [
    "moe_sort_quant",
    "moe_sort_quant_out",
    "mxfp4_quant",
    "mxfp4_quant_out",
    "mxfp8_quant",
    "mxfp8_quant_out",
]


@torch.no_grad()
def _quant_into(
    x: torch.Tensor, a_q: torch.Tensor, a_scale: torch.Tensor, fp8: bool = False
) -> None:
    m, d = x.shape
    step = chunks.rows_per_chunk(d)
    rows = _quant_rows_fp8 if fp8 else _quant_rows
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        q, s = rows(x[r0:r1])
        a_q[r0:r1].copy_(q)
        a_scale[r0:r1].copy_(s)


def mxfp4_quant_out(
    x: torch.Tensor, a_q: torch.Tensor, a_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (per_1x32) quantisation of ``x`` into ``a_q`` and ``a_scale``.

    Per block of 32 consecutive elements of a row (OCP MX spec v1.0, e2m1 + e8m0):

    * any NaN or +-Inf in the block -> scale byte 255 and the block's 16 bytes 0;
    * else ``amax = max |x|``, ``w = fp32(amax * fp32(1/6))`` (one RNE multiply),
      ``s = min(254, (bits(w) + 0x7FFFFF) >> 23)`` (the exponent of w rounded up);
    * each element: ``q = x * 2^(127 - s)`` exactly (subnormal inputs are not flushed), rounded
      to the nearest e2m1 value, ties to the even code, saturating at 6; the sign bit 0x8 is
      the sign bit of x (so -0.0 and small negatives give 0x8).

    Args:
        x: bf16 ``[M, model_dim]``, contiguous, ``model_dim`` a positive multiple of 32.
        a_q: uint8 ``[>= M, model_dim / 2]``: element ``2j`` in the low nibble of byte ``j``.
        a_scale: uint8 ``[>= M, model_dim / 32]``: e8m0 scale bytes, row-major.

    Returns:
        ``(a_q, a_scale)``; only their first M rows are written.

    Raises:
        TypeError: not tensors, or wrong dtypes.
        ValueError: wrong shapes, non-contiguous, mixed devices, model_dim % 32 != 0,
            buffers too small.
    """
    C.mxfp4_quant_out(x, a_q, a_scale)
    _quant_into(x, a_q, a_scale)
    return a_q, a_scale


def mxfp4_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`mxfp4_quant_out`.

    Args:
        x: bf16 ``[M, model_dim]``, contiguous, ``model_dim % 32 == 0``.

    Returns:
        ``(a_q, a_scale)``: uint8 ``[M, model_dim / 2]`` (e2m1 pairs) and uint8
        ``[M, model_dim / 32]`` (e8m0), on the device of ``x``.

    Raises:
        TypeError, ValueError: as :func:`mxfp4_quant_out`.
    """
    m, d = C.mxfp4_quant(x)
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=x.device)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=x.device)
    return mxfp4_quant_out(x, a_q, a_scale)


# --------------------------------------------------------------------------------------------
# mxfp8_quant
# --------------------------------------------------------------------------------------------


def mxfp8_quant_out(
    x: torch.Tensor, a_q: torch.Tensor, a_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (E4M3 elements, per_1x32 e8m0 scales) quantisation of ``x`` into ``a_q``, ``a_scale``.

    Per block of 32 consecutive elements of a row (OCP MX spec v1.0, E4M3 "fn" + e8m0):

    * any NaN or +-Inf in the block -> scale byte 255 and the block's 32 bytes 0;
    * ``amax = max |x| == 0`` -> scale 0; the elements keep their sign (-0.0 -> 0x80);
    * else ``s = clamp(((bits(fp32(amax)) + 0x1FFFFF) >> 23) - 8, 1, 254)``, which is
      ``ceil(log2(amax / 448)) + 127`` exactly: the smallest s with ``amax <= 448 * 2^(s-127)``;
    * each element: ``q = x * 2^(127 - s)`` exactly, rounded to the nearest E4M3 value
      (subnormals with step 2^-9 included), ties to the even code, the sign bit 0x80 from x,
      saturating at 448 (never reached under this scale).

    Args:
        x: bf16 ``[M, model_dim]``, contiguous, ``model_dim`` a positive multiple of 32.
        a_q: uint8 ``[>= M, model_dim]``: E4M3 bytes (``a_q.view(torch.float8_e4m3fn)``).
        a_scale: uint8 ``[>= M, model_dim / 32]``: e8m0 scale bytes, row-major.

    Returns:
        ``(a_q, a_scale)``; only their first M rows are written.

    Raises:
        TypeError, ValueError: as :func:`mxfp4_quant_out`.
    """
    C.mxfp8_quant_out(x, a_q, a_scale)
    _quant_into(x, a_q, a_scale, fp8=True)
    return a_q, a_scale


def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`mxfp8_quant_out`: returns uint8 ``a_q [M, model_dim]`` (E4M3
    bytes) and uint8 ``a_scale [M, model_dim / 32]`` (e8m0), on the device of ``x``."""
    m, d = C.mxfp8_quant(x)
    a_q = torch.empty(m, d, dtype=torch.uint8, device=x.device)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=x.device)
    return mxfp8_quant_out(x, a_q, a_scale)


# --------------------------------------------------------------------------------------------
# moe_sort_quant
# --------------------------------------------------------------------------------------------


def moe_sort_quant_out(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    *,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: torch.Tensor | None = None,
) -> tuple[MoeSortOutput, torch.Tensor, torch.Tensor]:
    """:func:`moe_sort_out` and :func:`mxfp4_quant_out` in one call (one launch on GPU);
    with ``quant_dtype="mxfp8"``, :func:`mxfp8_quant_out` instead (``a_q`` ``[M, model_dim]``).

    ``x`` is bf16 ``[M, model_dim]`` with the same M as ``topk_ids``; every other argument is
    as in the two ops, and the outputs are identical to those of the separate ops.  All
    arguments are checked before anything is written.

    ``sorted_scales`` (optional, the decode pipeline in one call): uint8
    ``[>= out_rows, model_dim / 32]``, contiguous, ``out_rows = ceil(max_rows / BM) * BM``,
    ``BM = max(32, block_m)``, ``model_dim % 256 == 0``, sharing no byte with any other
    buffer of the call.  When given, the call also writes it exactly as
    ``moe_sort_scales_out(a_scale[:M], out.sorted_token_ids[:max_rows], out.num_valid_ids,
    block_m, sorted_scales)`` would after the sort and the quant (every byte of its first
    ``out_rows`` rows; rows past them are not written).  It is not returned.

    Returns:
        ``(out, a_q, a_scale)``.

    Raises:
        TypeError, ValueError: as the two ops, plus a ValueError if ``x`` has not M rows, and
            the checks of ``sorted_scales`` (``moe_sort_quant_out`` in the generated
            ``aiter_aux/validation/_checks.py``, overlap).
    """
    which = C.select_moe_sort_quant(quant_dtype)
    fp8 = which == "moe_sort_quant_fp8"
    s = getattr(C, which + "_out")(
        topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, zero_buf=zero_buf,
        expert_map=expert_map, zero_buf_init=zero_buf_init, sorted_scales=sorted_scales,
    )  # fmt: skip
    m, max_rows, out = s.M, s.max_rows, MoeSortOutput(*out)
    _sort_into(
        topk_ids, topk_weights, int(num_experts), int(block_m), out, zero_buf, expert_map,
        zero_buf_init,
    )  # fmt: skip
    _quant_into(x, a_q, a_scale, fp8)
    if sorted_scales is not None:
        moe_sort_scales_out(
            a_scale[:m], out.sorted_token_ids[:max_rows], out.num_valid_ids, int(block_m),
            sorted_scales,
        )  # fmt: skip
    return out, a_q, a_scale


def moe_sort_quant(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x: torch.Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: torch.Tensor | None = None,
) -> tuple[MoeSortOutput, torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, a_scale)``
    shaped as by :func:`moe_sort` and :func:`mxfp4_quant` (:func:`mxfp8_quant` for
    ``quant_dtype="mxfp8"``).  ``sorted_scales`` (the caller's buffer, as in
    :func:`moe_sort_quant_out`) is written, not returned.

    Raises:
        TypeError, ValueError: as :func:`moe_sort_quant_out`.
    """
    which = C.select_moe_sort_quant(quant_dtype)
    fp8 = which == "moe_sort_quant_fp8"
    m, topk, d, max_rows = getattr(C, which)(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf=zero_buf,
        expert_map=expert_map, zero_buf_init=zero_buf_init, sorted_scales=sorted_scales,
    )  # fmt: skip
    dev = topk_ids.device
    out = _alloc_sort_out(m, topk, max_rows, int(block_m), dev)
    a_q = torch.empty(m, d if fp8 else d // 2, dtype=torch.uint8, device=dev)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=dev)
    return moe_sort_quant_out(
        topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, zero_buf=zero_buf,
        expert_map=expert_map, zero_buf_init=zero_buf_init, quant_dtype=quant_dtype,
        sorted_scales=sorted_scales,
    )  # fmt: skip
