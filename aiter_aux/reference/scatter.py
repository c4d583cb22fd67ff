"""Reference ``moe_scatter_reduce[_out]`` and ``moe_scatter_reduce_q[_out]``: the weighted sum
of each token's expert rows (bf16, or MXFP4 decoded to fp32) back in token order."""

from __future__ import annotations

import torch

from aiter_aux.validation import _checks as C

from . import chunks
from .mxfp4 import _bf16_rne, _decode_mxfp4_rows

__all__ = [
    "moe_scatter_reduce",
    "moe_scatter_reduce_out",
    "moe_scatter_reduce_q",
    "moe_scatter_reduce_q_out",
]


@torch.no_grad()
def _scatter_into(rows_fn, reverse_sorted, sorted_weights, topk, m, d, out, scale=1.0) -> None:
    """out[t] = bf16(sum_k fp32(rows(p)) * w[p]) with separately rounded fp32 mul and add.

    ``rows_fn(p)`` returns the rows ``p`` of expert_out as a new float32 tensor (modified in
    place).  A pair with ``p < 0`` contributes +0.0 instead of being skipped, which gives the
    same bits: the accumulator starts at +0.0 and an fp32 sum is -0.0 only when both operands
    are -0.0 (an exact zero sum rounds to +0.0, and sums never underflow to zero), so the
    accumulator is never -0.0 and ``acc + 0.0 == acc`` (a NaN stays a NaN, output 0x7FC0).
    """
    rev = reverse_sorted.view(m, topk).to(torch.int64)
    step = chunks.rows_per_chunk(d)
    for t0 in range(0, m, step):
        t1 = min(m, t0 + step)
        acc = torch.zeros(t1 - t0, d, dtype=torch.float32, device=out.device)
        for k in range(topk):
            p = rev[t0:t1, k]
            valid = p >= 0
            n_valid = int(valid.sum())
            if n_valid == 0:
                continue
            pc = p.clamp_min(0)  # rows >= 1 here, since some p is a valid row
            prod = rows_fn(pc).mul_(sorted_weights[pc].unsqueeze(1))  # fp32 product
            if n_valid < p.numel():
                prod.index_fill_(0, torch.nonzero(~valid).squeeze(1), 0.0)
            acc.add_(prod)  # fp32 sum: a separate op, no fused multiply-add
        if scale != 1.0:  # acc * 1.0f == acc bit for bit, NaN payloads aside (rounded away)
            acc.mul_(torch.tensor(scale, dtype=torch.float32, device=acc.device))
        out[t0:t1].copy_(_bf16_rne(acc))


def moe_scatter_reduce_out(
    expert_out: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Weighted sum of each token's expert rows back in token order, into ``out``.

    ``out[t] = bf16_rne(sum over k = 0..topk-1, in order, of fp32(expert_out[p]) *
    sorted_weights[p])`` with ``p = reverse_sorted[t*topk + k]``, skipping ``p < 0``; each
    product and each sum is rounded to fp32 separately (no fused multiply-add), starting from
    +0.0.  A token with no local pairs gets +0.0.  ``bf16_rne(NaN)`` is 0x7FC0 for every NaN
    (whatever its sign and payload).  With ``routed_scaling_factor`` (DeepSeek-style models
    scale the routed sum, e.g. by 2.5), ``out[t] = bf16_rne(fp32(acc) * fp32(factor))``, one
    more fp32 multiply of the fp32 sum; 1.0 gives the same bytes as no factor.

    Args:
        expert_out: bf16 ``[rows, model_dim]`` in sorted order.
        reverse_sorted: int32 ``[M * topk]`` from moe_sort.
        sorted_weights: float32 ``[>= rows]`` from moe_sort.
        topk: ``1 <= topk <= 255``; ``M = len(reverse_sorted) // topk``.
        out: bf16 ``[>= M, model_dim]``; the first M rows are written.

    Returns:
        ``out``.

    Raises:
        TypeError, ValueError: wrong types/dtypes/shapes, topk out of range, mixed devices,
            output too small, or some ``p >= rows`` (ValueError).
    """
    s = C.moe_scatter_reduce_out(
        expert_out, reverse_sorted, sorted_weights, topk, out,
        routed_scaling_factor=routed_scaling_factor, read_data=True,
    )  # fmt: skip
    m, d = s.M, s.model_dim
    _scatter_into(
        lambda p: torch.index_select(expert_out, 0, p).to(torch.float32),
        reverse_sorted,
        sorted_weights,
        int(topk),
        m,
        d,
        out,
        float(routed_scaling_factor),
    )
    return out


def moe_scatter_reduce(
    expert_out: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    *,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Allocating form of :func:`moe_scatter_reduce_out`.

    Returns:
        ``out``: bf16 ``[M, model_dim]``, ``M = len(reverse_sorted) // topk``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_out`.
    """
    s = C.moe_scatter_reduce(
        expert_out, reverse_sorted, sorted_weights, topk,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
    m, d = s.M, s.model_dim
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out.device)
    return moe_scatter_reduce_out(
        expert_out, reverse_sorted, sorted_weights, topk, out,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip


def moe_scatter_reduce_q_out(
    expert_out_q: torch.Tensor,
    expert_out_scale: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """:func:`moe_scatter_reduce_out` with ``expert_out`` in MXFP4.

    Each element is decoded as ``e2m1 * 2^(s - 127)`` in fp32 (one fp32 multiply; ``s = 255``
    gives NaN for the whole block, ``s = 0`` gives the fp32 subnormal 2^-127, not flushed),
    then reduced exactly as in :func:`moe_scatter_reduce_out`.

    Args:
        expert_out_q: uint8 ``[rows, model_dim / 2]`` (e2m1, element 2j in the low nibble).
        expert_out_scale: uint8 ``[rows, model_dim / 32]`` (e8m0, row-major).
        reverse_sorted: int32 ``[M * topk]``.
        sorted_weights: float32 ``[>= rows]``.
        topk: ``1 <= topk <= 255``.
        out: bf16 ``[>= M, model_dim]``; the first M rows are written.

    Returns:
        ``out``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_out`.
    """
    s = C.moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out,
        routed_scaling_factor=routed_scaling_factor, read_data=True,
    )  # fmt: skip
    m, d = s.M, s.model_dim
    _scatter_into(
        lambda p: _decode_mxfp4_rows(
            torch.index_select(expert_out_q, 0, p), torch.index_select(expert_out_scale, 0, p)
        ),
        reverse_sorted,
        sorted_weights,
        int(topk),
        m,
        d,
        out,
        float(routed_scaling_factor),
    )
    return out


def moe_scatter_reduce_q(
    expert_out_q: torch.Tensor,
    expert_out_scale: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    *,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Allocating form of :func:`moe_scatter_reduce_q_out`.

    Returns:
        ``out``: bf16 ``[M, model_dim]``, ``M = len(reverse_sorted) // topk``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_q_out`.
    """
    s = C.moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
    m, d = s.M, s.model_dim
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out_q.device)
    return moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
