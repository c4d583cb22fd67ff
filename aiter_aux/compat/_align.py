"""vLLM's and SGLang's ``moe_align_block_size`` on our sort kernels (docs/compat.md).

The kernels write the peers' formats themselves (``moe_align_block_size_vllm`` /
``moe_align_block_size_sglang`` of :mod:`aiter_aux.ops`: the id encoding, the padding, the
buckets and the block labels are compile-time parameters of the sort instance); these
functions only check the arguments as the references do, allocate what the peer allocates
and call one ``_out`` op.  Re-exported as ``moe_align_block_size`` by
:mod:`aiter_aux.compat.vllm` and :mod:`aiter_aux.compat.sglang`.  Importing this module
loads nothing (torch and the ops are imported on the first call).

Beyond the references' rules:

* ``block_size`` must be in [1, 65536] (the peers take any; past 2**16 their int32 row
  arithmetic overflows too), else ``ValueError``.
* The instances are keyed on ``num_experts`` alone (SGLang: the routed experts,
  ``num_experts - 1`` of its argument; with ``ignore_invalid_expert`` the vLLM-format
  instance of that count, whose buckets are the same); where JIT builds are disabled, a
  ``num_experts`` with no instance raises ``UnsupportedShapeError`` (a ``ValueError``).
* int64 ``topk_ids`` are converted to int32 first (one more kernel on the GPU; values past
  int32 clamped, so that they are dropped as before).
* The checks that read tensor values (SGLang ids in ``[-1, E)``, vLLM map values with
  ``ignore_invalid_experts``) run on CPU tensors; on the GPU they would synchronise, and
  under ``torch.compile`` they cannot be traced, so there the kernels drop such ids (and
  map values) instead of reading out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "vllm_moe_align_block_size",
    "vllm_custom_moe_align_block_size",
    "sglang_moe_align_block_size",
    "sglang_srt_moe_align_block_size",
]

_SGLANG_PLUS_ONE = (
    "SGLang's num_experts counts the routed experts plus one, the bucket of the -1 ids: "
    "pass E + 1 for E routed experts (under expert parallelism, E is this rank's local count "
    "and topk_ids hold local ids)"
)
_ANY_SHAPE = (
    "the align ops are keyed on num_experts alone: any catalog shape with that E serves "
    "them, so `aiter-aux add-shape` with the model's (E, model_dim, inter, topk) adds it"
)


def _ids32(topk_ids):
    """int32 ids with the same meaning: int64 values past int32 are clamped to ids that are
    dropped as they are (-2, or 2**31 - 1) rather than wrapped."""
    import torch

    if topk_ids.dtype == torch.int32:
        return topk_ids
    return topk_ids.clamp(-2, 2**31 - 1).to(torch.int32)


def _checking_values(t) -> bool:
    """Whether the value checks run: on CPU tensors, outside a ``torch.compile`` trace."""
    import torch

    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def vllm_moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    pad_sorted_ids: bool = False,
    ignore_invalid_experts: bool = False,
    return_scatter_idx: bool = False,
) -> tuple[torch.Tensor, ...]:
    """vLLM's ``moe_align_block_size`` (``vllm/model_executor/layers/fused_moe/
    moe_align_block_size.py``): same signature, outputs and meaning as
    :func:`aiter_aux.reference.compat.vllm_moe_align_block_size`, with ascending pair index
    inside an expert (deterministic): ``topk_ids`` of any shape (read as a flat array), int32
    or int64, any ``num_experts`` in [1, 992] and ``block_size`` in [1, 65536].

    Returns:
        ``(sorted_ids, expert_ids, num_tokens_post_pad[, scatter_idx])``, every element
        written (``scatter_idx`` int32 ``[topk_ids.numel(), 1]``).
    """
    import torch

    from ..ops import UnsupportedShapeError, moe_align_block_size_vllm_out
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    pad = R._check_flag(pad_sorted_ids, "pad_sorted_ids")
    ignore = R._check_flag(ignore_invalid_experts, "ignore_invalid_experts")
    want_scatter = R._check_flag(return_scatter_idx, "return_scatter_idx")
    bs, e, cap = R._check_sizes(
        topk_ids, block_size, num_experts, R.VLLM_MAX_EXPERTS,
        lambda n, e, b: R.vllm_align_capacity(n, e, b, pad),
    )  # fmt: skip
    if expert_map is not None:
        expert_map = check_expert_map(expert_map, topk_ids.device)
        if expert_map.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {expert_map.numel()}"
            )
        if ignore and _checking_values(expert_map):
            R._check_values(expert_map[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
    if want_scatter and expert_map is not None and not ignore:
        raise ValueError("scatter_idx with expert_map requires ignore_invalid_experts")
    ids = _ids32(topk_ids)
    ids = ids if ids.dim() == 2 else ids.reshape(-1, 1)  # M and topk as the caller's
    kw = dict(dtype=torch.int32, device=ids.device)
    sorted_ids = torch.empty(cap, **kw)
    expert_ids = torch.empty(-(-cap // bs), **kw)
    total = torch.empty(1, **kw)
    scatter_idx = torch.empty(ids.numel(), **kw)
    maps = {}
    if expert_map is not None:
        maps["expert_map" if ignore else "block_expert_map"] = expert_map
    try:
        moe_align_block_size_vllm_out(ids, e, bs, sorted_ids, expert_ids, total, scatter_idx,
                                      **maps)  # fmt: skip
    except UnsupportedShapeError as err:
        raise UnsupportedShapeError(f"{err} ({_ANY_SHAPE})") from None
    if want_scatter:
        return sorted_ids, expert_ids, total, scatter_idx.view(-1, 1)
    return sorted_ids, expert_ids, total


def sglang_moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor | None = None,
    pad_sorted_token_ids: bool = False,
    ignore_invalid_expert: bool = False,
) -> None:
    """sgl-kernel's ``moe_align_block_size`` (``sgl_kernel/moe.py``), out-parameter style:
    ``num_experts`` counts the buckets, the routed experts plus one for the -1 ids, as
    SGLang's callers pass it (``num_experts + 1``); ``topk_ids`` 1-D or 2-D.  Writes
    ``sorted_token_ids`` (every element: ``pad_sorted_token_ids`` is accepted and the
    padding written either way), ``experts_ids`` (every block: -1 past the used ones) and
    ``num_tokens_post_pad`` as :func:`aiter_aux.reference.compat.sglang_moe_align_block_size`
    defines them for ``num_experts - 1`` routed experts and ``ignore_invalid_expert`` (ids
    < 0 skipped instead of counted in bucket 0).  ``cumsum_buffer`` is not touched (our
    sort needs no scratch of the caller's).

    Raises:
        TypeError, ValueError: before anything is written; a ``sorted_token_ids`` shorter
            than SGLang's capacity, or an ``experts_ids`` shorter than its blocks, is a
            ``ValueError`` (sgl-kernel writes past them).
    """
    import torch

    from ..ops import (
        UnsupportedShapeError,
        moe_align_block_size_sglang_out,
        moe_align_block_size_vllm_out,
    )
    from ..reference import compat as R
    from ..validation import MAX_NUM_EXPERTS, validate_int

    topk_ids = R._check_ids(topk_ids, (1, 2))
    buckets = validate_int(num_experts, "num_experts")
    most = min(R.SGLANG_MAX_EXPERTS + 1, MAX_NUM_EXPERTS)  # buckets: routed + 1
    if not 2 <= buckets <= most:
        raise ValueError(
            f"num_experts must be in [2, {most}] (SGLang's num_experts + 1: the routed "
            f"experts, at most {most - 1} in our sort, plus one), got {buckets}"
        )
    bs, e, cap = R._check_sizes(topk_ids, block_size, buckets - 1, R.SGLANG_MAX_EXPERTS,
                                R.sglang_align_capacity)  # fmt: skip
    R._check_flag(pad_sorted_token_ids, "pad_sorted_token_ids")
    ignore = R._check_flag(ignore_invalid_expert, "ignore_invalid_expert")
    R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, cap), ("experts_ids", experts_ids, -(-cap // bs)),
         ("num_tokens_post_pad", num_tokens_post_pad, 1)), bs)  # fmt: skip
    if _checking_values(topk_ids):
        try:
            R.check_sglang_ids(topk_ids, e, ignore)
        except ValueError as err:
            raise ValueError(f"{err} ({_SGLANG_PLUS_ONE})") from None
    ids = _ids32(topk_ids)
    ids = ids if ids.dim() == 2 else ids.reshape(-1, 1)  # M and topk as the caller's
    scatter_idx = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
    # Without ids < 0, bucket 0 is empty and takes no rows: the buckets, rows and labels
    # (e - 1 of bucket e) are vLLM's format of the e routed experts.
    op = moe_align_block_size_vllm_out if ignore else moe_align_block_size_sglang_out
    try:
        op(ids, e, bs, sorted_token_ids.view(-1), experts_ids.view(-1),
           num_tokens_post_pad.view(-1)[:1], scatter_idx)  # fmt: skip
    except UnsupportedShapeError as err:
        raise UnsupportedShapeError(f"{err} ({_SGLANG_PLUS_ONE}; {_ANY_SHAPE})") from None


def sglang_srt_moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    ignore_invalid_expert: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's ``srt`` layer ``moe_align_block_size`` (the allocating form over
    sgl-kernel's): ``num_experts`` routed experts; buffers of SGLang's capacity
    (:func:`aiter_aux.reference.compat.sglang_align_capacity`), every element written.

    Returns:
        ``(sorted_ids, expert_ids, num_tokens_post_pad)`` as
        :func:`aiter_aux.reference.compat.sglang_moe_align_block_size`.
    """
    import torch

    from ..reference import compat as R

    topk_ids = R._check_ids(topk_ids, (1, 2))
    bs, e, cap = R._check_sizes(topk_ids, block_size, num_experts, R.SGLANG_MAX_EXPERTS,
                                R.sglang_align_capacity)  # fmt: skip
    kw = dict(dtype=torch.int32, device=topk_ids.device)
    sorted_ids = torch.empty(cap, **kw)
    expert_ids = torch.empty(-(-cap // bs), **kw)
    total = torch.empty(1, **kw)
    sglang_moe_align_block_size(topk_ids, e + 1, bs, sorted_ids, expert_ids, total, None, True,
                                ignore_invalid_expert)  # fmt: skip
    return sorted_ids, expert_ids, total


def vllm_custom_moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    maybe_expert_map: torch.Tensor | None,
    scatter_idx: torch.Tensor | None = None,
) -> None:
    """``vllm._custom_ops.moe_align_block_size``: writes every element of
    ``sorted_token_ids``, the first ``ceil(len(sorted_token_ids) / block_size)`` blocks of
    ``experts_ids``, ``num_tokens_post_pad[0]`` and (when given) ``scatter_idx``, as
    :func:`aiter_aux.reference.compat.vllm_custom_moe_align_block_size`; returns None.

    Raises:
        TypeError, ValueError: before anything is written (as the reference).
    """
    import torch

    from ..ops import UnsupportedShapeError, moe_align_block_size_vllm_out
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    bs, e, _ = R._check_sizes(topk_ids, block_size, num_experts, R.VLLM_MAX_EXPERTS,
                              R.vllm_align_capacity)  # fmt: skip
    n = topk_ids.numel()
    cap = R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, R.vllm_align_capacity(n, e, bs)),
         ("experts_ids", experts_ids, None), ("num_tokens_post_pad", num_tokens_post_pad, 1)),
        bs)  # fmt: skip
    if scatter_idx is not None:
        R.check_align_buffers((("scatter_idx", scatter_idx, n),), bs)
        if scatter_idx.numel() != n:
            raise ValueError(
                f"scatter_idx must have topk_ids.numel() = {n} elements, got {scatter_idx.numel()}"
            )
    maps = {}
    if maybe_expert_map is not None:
        emap = check_expert_map(maybe_expert_map, topk_ids.device)
        if emap.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {emap.numel()}"
            )
        if _checking_values(emap):
            R._check_values(emap[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
        maps["expert_map"] = emap
    ids = _ids32(topk_ids)
    ids = ids if ids.dim() == 2 else ids.reshape(-1, 1)  # M and topk as the caller's
    sc = (
        scatter_idx.view(-1)
        if scatter_idx is not None
        else torch.empty(n, dtype=torch.int32, device=ids.device)
    )
    try:
        moe_align_block_size_vllm_out(ids, e, bs, sorted_token_ids.view(-1),
                                      experts_ids.view(-1)[: -(-cap // bs)],
                                      num_tokens_post_pad.view(-1)[:1], sc, **maps)  # fmt: skip
    except UnsupportedShapeError as err:
        raise UnsupportedShapeError(f"{err} ({_ANY_SHAPE})") from None
