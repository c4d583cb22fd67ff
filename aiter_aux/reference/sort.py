"""Reference ``moe_sort`` / ``moe_sort_out``: the (token, k) routing pairs sorted by expert
into block_m-padded segments, plus the allocation of the sort outputs at their capacity
(:func:`aiter_aux.types.moe_sort_capacity` rows), shared with ``moe_sort_quant``."""

from __future__ import annotations

import torch

from aiter_aux.types import MoeSortOutput, empty_moe_sort_output
from aiter_aux.validation import _checks as C

__all__ = ["moe_sort", "moe_sort_out"]


def _as_int32(v: torch.Tensor) -> torch.Tensor:
    """int64 values in [-2^31, 2^32) -> int32 with two's-complement wrap-around."""
    return torch.where(v >= (1 << 31), v - (1 << 32), v).to(torch.int32)


@torch.no_grad()
def _sort_into(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    zero_buf: torch.Tensor | None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
) -> None:
    dev = topk_ids.device
    m, topk = topk_ids.shape
    n = m * topk
    e = num_experts
    i64 = dict(dtype=torch.int64, device=dev)

    ids = local_expert_ids(topk_ids.reshape(-1), expert_map)
    local = (ids >= 0) & (ids < e)
    # Unique key: expert-major, pair index (t * topk + k) minor; non-local pairs sort last.
    key = torch.where(local, ids, e) * max(n, 1) + torch.arange(n, **i64)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(ids[local], minlength=e)[:e]  # pairs per expert
    n_local = int(counts.sum())
    padded = (counts + block_m - 1) // block_m * block_m  # rows per expert
    seg_start = torch.cumsum(padded, 0) - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    total = int(padded.sum())  # num_valid_ids[0]

    pairs = order[:n_local]  # local pair indices, in sorted order
    pe = ids[pairs]
    row = seg_start[pe] + (torch.arange(n_local, **i64) - cnt_start[pe])
    t = pairs // topk
    k = pairs % topk

    sti = torch.full((total,), m, **i64)
    sti[row] = t | (k << 24)
    sw = torch.zeros(total, dtype=torch.float32, device=dev)
    sw[row] = topk_weights.reshape(-1)[pairs]
    mi = torch.full((total,), m, **i64)
    mi[row] = t
    seid = torch.repeat_interleave(torch.arange(e, **i64), padded // block_m)
    rev = torch.full((n,), -1, **i64)
    rev[pairs] = row

    out.sorted_token_ids[:total].copy_(_as_int32(sti))
    out.sorted_weights[:total].copy_(sw)
    out.m_indices[:total].copy_(mi.to(torch.int32))
    out.sorted_expert_ids[: total // block_m].copy_(seid.to(torch.int32))
    out.num_valid_ids[:2].copy_(torch.tensor([total, m], dtype=torch.int32))
    out.reverse_sorted[:n].copy_(rev.to(torch.int32))
    if zero_buf_init is not None:
        zero_buf.view(-1).view(torch.int16).copy_(zero_buf_init.reshape(-1).view(torch.int16))
    elif zero_buf is not None:
        zero_buf.zero_()


def local_expert_ids(ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    """The local expert of each id as int64: the id itself without a map; with one,
    ``expert_map[id]`` for ids in ``[0, len(expert_map))`` and -1 for any other id.  The
    caller treats values outside ``[0, num_experts)`` as not local."""
    ids = ids.to(torch.int64)
    if expert_map is None:
        return ids
    g = expert_map.numel()
    inside = (ids >= 0) & (ids < g)
    if g == 0:
        return torch.full_like(ids, -1)
    mapped = expert_map.to(torch.int64)[ids.clamp(0, g - 1)]
    return torch.where(inside, mapped, -1)


_alloc_sort_out = empty_moe_sort_output


def moe_sort_out(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    *,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
) -> MoeSortOutput:
    """Sort the (token, k) routing pairs by expert into block_m-padded segments, into ``out``.

    A pair ``(t, k)`` with ``0 <= topk_ids[t, k] < num_experts`` is *local* and goes to that
    expert; any other id (-1, or out of range) is not placed and gets
    ``reverse_sorted[t * topk + k] = -1``.  With an ``expert_map`` (expert parallelism:
    ``topk_ids`` hold global ids), the pair's expert is ``expert_map[id]`` for ids in
    ``[0, len(expert_map))``; it is local when that value is in ``[0, num_experts)`` (a map
    value < 0 marks an expert of another rank; one >= num_experts is a caller error, treated
    as not local on every backend, unchecked).  Experts appear in ascending order; each
    expert's pairs are contiguous in ascending ``(t, k)`` order, and its segment is padded up to
    a multiple of ``block_m`` rows; an expert with no pairs takes no rows.

    Args:
        topk_ids: int32 ``[M, topk]``; ``M < 2**24``, ``1 <= topk <= 255``.
        topk_weights: float32 ``[M, topk]``.
        num_experts: ``1 <= num_experts <= 1024``.
        block_m: rows per block, one of 16, 32, 64, 128.
        out: the output buffers (see :class:`MoeSortOutput`), each exactly 1-D, contiguous,
            with at least ``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)``
            elements (``max_rows // block_m`` for sorted_expert_ids, 2 for num_valid_ids,
            ``M * topk`` for reverse_sorted).  Written: ``sorted_token_ids`` (``t | (k << 24)``,
            pad rows ``M``), ``sorted_weights`` (pad 0.0), ``m_indices`` (``t``, pad ``M``) for
            rows ``< num_valid_ids[0]``; ``sorted_expert_ids`` for blocks
            ``< num_valid_ids[0] / block_m``; ``num_valid_ids[:2] = [rows incl. padding, M]``;
            ``reverse_sorted[:M * topk]``.  Everything past that is left untouched.
        zero_buf: optional contiguous bf16 tensor (typically ``[M, model_dim]``), all of whose
            elements are set to +0.0 (or copied from ``zero_buf_init``).
        expert_map: optional int32 ``[num_global_experts]``: global id -> local expert.
        zero_buf_init: optional bf16 tensor with ``zero_buf``'s element count (e.g. the shared
            expert's output), copied bit for bit into ``zero_buf`` instead of zeros.

    Returns:
        ``out`` as a :class:`MoeSortOutput`.

    Raises:
        TypeError: a tensor argument is not a tensor or has the wrong dtype; an int is not an int.
        ValueError: wrong shape, non-contiguous, mixed devices, ints out of range, buffers too
            small.
    """
    C.moe_sort_out(
        topk_ids, topk_weights, num_experts, block_m, out, zero_buf=zero_buf,
        expert_map=expert_map, zero_buf_init=zero_buf_init,
    )  # fmt: skip
    out = MoeSortOutput(*out)
    _sort_into(
        topk_ids, topk_weights, int(num_experts), int(block_m), out, zero_buf, expert_map,
        zero_buf_init,
    )  # fmt: skip
    return out


def moe_sort(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
) -> MoeSortOutput:
    """Allocating form of :func:`moe_sort_out` (buffers from :func:`torch.empty`).

    Returns:
        A :class:`MoeSortOutput` on the device of ``topk_ids`` with ``sorted_token_ids``,
        ``sorted_weights``, ``m_indices`` of ``max_rows`` elements, ``sorted_expert_ids`` of
        ``max_rows // block_m``, ``num_valid_ids`` of 2 and ``reverse_sorted`` of ``M * topk``
        (``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)``).  Rows at or past
        ``num_valid_ids[0]`` are uninitialised.

    Raises:
        TypeError, ValueError: as :func:`moe_sort_out`.
    """
    m, topk, max_rows = C.moe_sort(
        topk_ids, topk_weights, num_experts, block_m, zero_buf=zero_buf, expert_map=expert_map,
        zero_buf_init=zero_buf_init,
    )  # fmt: skip
    out = _alloc_sort_out(m, topk, max_rows, int(block_m), topk_ids.device)
    return moe_sort_out(
        topk_ids, topk_weights, num_experts, block_m, out, zero_buf=zero_buf,
        expert_map=expert_map, zero_buf_init=zero_buf_init,
    )  # fmt: skip
