"""vLLM's and SGLang's ``moe_align_block_size`` on our sort kernels (docs/compat.md).

The kernels write the peers' formats themselves (``moe_align_block_size_vllm`` /
``moe_align_block_size_sglang`` of :mod:`aiter_aux.ops`: the id encoding, the padding, the
buckets and the block labels are compile-time parameters of the sort instance); these
functions allocate what the peer allocates and call one ``_out`` torch op.  Re-exported as
``moe_align_block_size`` by :mod:`aiter_aux.compat.vllm` and :mod:`aiter_aux.compat.sglang`.
Importing this module loads nothing (torch and the ops are imported on the first call).

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
  ``ignore_invalid_experts``) run on CPU tensors: eagerly a ``ValueError`` naming the first
  bad value, under ``torch.compile`` traced into the graph (``torch._assert_async``: the
  compiled call raises ``RuntimeError`` with the rule).  On the GPU they would synchronise,
  so there the kernels drop such ids (and map values) instead of reading out of bounds.

Per call, these functions do what the peers' wrappers do (allocate, call the op) plus
plain comparisons of the int and bool arguments; the op's binding checks the tensors.  A
call as the peers' callers make it (int32 ``[M, topk]`` ids, 1-D buffers, no map) takes a
fast path: eagerly the op's C++ callable, without the reshapes of the general path.  On an
error, or an argument of another type (a numpy int), the checks of :mod:`._align_checks`
(the rules of :mod:`aiter_aux.reference.compat`) run and name what is wrong as the
reference does.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ._align_checks import SGLANG_PLUS_ONE as _SGLANG_PLUS_ONE
from ._align_checks import (
    _check_sglang_values,
    _custom_checks,
    _sglang_checks,
    _srt_checks,
    _vllm_checks,
    most_buckets,
)
from ._rename import renamed

if TYPE_CHECKING:
    import torch

__all__ = [
    "vllm_moe_align_block_size",
    "vllm_custom_moe_align_block_size",
    "sglang_moe_align_block_size",
    "sglang_srt_moe_align_block_size",
]

_ANY_SHAPE = "any catalog shape with this E serves it"


_T: list = []  # torch, torch.int32, the vLLM-format and SGLang-format _out ops
_MOST: list = []  # vLLM's num_experts, SGLang's buckets: the most the checks allow
_CAP: list = []  # the capacity functions of the reference: vLLM's, SGLang's
_ALLOC: list = []  # the allocating vLLM-format op
#: The fast paths' calls, eager only: ``torch.compiler.is_compiling``, then the C++ callables
#: (what an OpOverload calls, one Python frame less) of the vLLM-format and SGLang-format
#: ``_out`` ops and allocating ops.  Under ``torch.compile`` the general paths run (they call
#: the OpOverloads, which dynamo traces).
_FAST: list = []


def _t() -> list:
    if not _T:
        import torch

        from .. import ops  # noqa: F401 (defines the ops)
        from ..reference import compat as R

        aux = torch.ops.aiter_aux
        _MOST.extend((R.VLLM_MAX_EXPERTS, most_buckets()))
        _CAP.extend((R.vllm_align_capacity, R.sglang_align_capacity))
        _ALLOC.append(aux.moe_align_block_size_vllm.default)
        _T.extend((torch, torch.int32, aux.moe_align_block_size_vllm_out.default,
                   aux.moe_align_block_size_sglang_out.default))  # fmt: skip
        _FAST.extend([torch.compiler.is_compiling] + [
            getattr(aux, f"moe_align_block_size_{f}").default._op
            for f in ("vllm_out", "sglang_out", "vllm", "sglang")])  # fmt: skip
    return _T


def _plain(*tensors_dims) -> bool:
    """``(tensor, dims)`` pairs: each a tensor of that many dims, as the ops take them.  A
    fast path's call whose op refused such arguments stands (the general path would call the
    op with the same ones); else the general path reshapes (the op refused them before it
    looked for an instance)."""
    import torch

    return all(isinstance(t, torch.Tensor) and t.dim() == d for t, d in tensors_dims)


# the op's term for a call's tokens: topk_ids' rows, or its elements when 1-D (read flat)
_TOKENS = {"num_tokens (M)": "M (the rows of topk_ids, its elements when 1-D)"}
_EXPERTS_IDS = {"expert_ids": "experts_ids", **_TOKENS}  # and the out forms' parameter name


def _error(error: Exception, check, hint: str, names: dict[str, str] | None = None) -> Exception:
    """The exception of a failed call: ``check`` (the reference's checks) names a bad
    argument; else the op's error as the wrappers translate it (its argument names as
    ``names`` maps them to the caller's), a missing instance with ``hint``."""
    from ..ops import UnsupportedShapeError
    from ..ops._library import translate

    err = translate(error, check)
    if isinstance(err, UnsupportedShapeError):
        return UnsupportedShapeError(f"{err} ({hint})")
    return renamed(err, names) if names else err


def _ids2d(topk_ids, torch, i32):
    """int32 ``[M, topk]`` ids with the same meaning: int64 values past int32 are clamped to
    ids that are dropped as they are (-2, or 2**31 - 1) rather than wrapped; other shapes
    read as ``[numel, 1]`` (only the flat pairs matter)."""
    if topk_ids.dtype == torch.int64:
        topk_ids = topk_ids.clamp(-2, 2**31 - 1).to(i32)
    return topk_ids if topk_ids.dim() == 2 else topk_ids.reshape(-1, 1)


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
    torch, i32, op, _ = _T or _t()
    args = (topk_ids, block_size, num_experts, expert_map, pad_sorted_ids,
            ignore_invalid_experts, return_scatter_idx)  # fmt: skip
    called = False
    try:  # the fast path: vLLM's call as its callers make it; the op's binding checks the rest
        if (type(block_size) is int and type(num_experts) is int and num_experts <= _MOST[0]
                and pad_sorted_ids is False and type(ignore_invalid_experts) is bool
                and type(return_scatter_idx) is bool and expert_map is None
                and topk_ids.dtype is i32 and not _FAST[0]()):  # fmt: skip
            called = True
            out = _FAST[3](topk_ids, num_experts, block_size)
            return (*out[:3], out[3].view(-1, 1)) if return_scatter_idx else out[:3]
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        if called and _plain((topk_ids, 2)):
            raise _error(err, partial(_vllm_checks, *args), _ANY_SHAPE, _TOKENS) from None
    bs, e, pad, ignore, scatter = (block_size, num_experts, pad_sorted_ids,
                                   ignore_invalid_experts, return_scatter_idx)  # fmt: skip
    try:
        if not (type(bs) is int and type(e) is int and 1 <= bs and 1 <= e <= _MOST[0]
                and type(pad) is bool and type(ignore) is bool and type(scatter) is bool
                and expert_map is None):  # fmt: skip
            bs, e, pad, ignore, scatter = _vllm_checks(*args)
        ids = topk_ids if topk_ids.dtype == i32 and topk_ids.dim() == 2 else (
            _ids2d(topk_ids, torch, i32))  # fmt: skip
        if not pad:  # the allocating op's capacity is vLLM's without padding
            maps = {} if expert_map is None else (
                {"expert_map" if ignore else "block_expert_map": expert_map})  # fmt: skip
            sorted_ids, expert_ids, total, scatter_idx = _ALLOC[0](ids, e, bs, **maps)
        else:
            n = ids.numel()
            cap = _CAP[0](n, e, bs, pad)
            dev = ids.device
            sorted_ids = torch.empty(cap, dtype=i32, device=dev)
            expert_ids = torch.empty(-(-cap // bs), dtype=i32, device=dev)
            total = torch.empty(1, dtype=i32, device=dev)
            scatter_idx = torch.empty(n, dtype=i32, device=dev)
            if expert_map is None:
                op(ids, e, bs, sorted_ids, expert_ids, total, scatter_idx)
            elif ignore:
                op(ids, e, bs, sorted_ids, expert_ids, total, scatter_idx, expert_map=expert_map)
            else:
                op(ids, e, bs, sorted_ids, expert_ids, total, scatter_idx,
                   block_expert_map=expert_map)  # fmt: skip
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(err, partial(_vllm_checks, *args), _ANY_SHAPE, _TOKENS) from None
    if scatter:
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
    _, i32, _, _ = _T or _t()
    args = (topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
            num_tokens_post_pad, pad_sorted_token_ids, ignore_invalid_expert)  # fmt: skip
    called = False
    try:  # the fast path: SGLang's call as its callers make it (the op has SGLang's limits)
        if (type(block_size) is int and type(num_experts) is int
                and 2 <= num_experts <= _MOST[1] and type(pad_sorted_token_ids) is bool
                and ignore_invalid_expert is False and topk_ids.dtype is i32
                and not _FAST[0]()):  # fmt: skip
            n = topk_ids.numel()
            if n:
                _check_sglang_values(topk_ids, num_experts - 1, False)
            called = True
            _FAST[2](topk_ids, num_experts - 1, block_size, sorted_token_ids, experts_ids,
                     num_tokens_post_pad, topk_ids.new_empty(n))  # fmt: skip
            return
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        if called and _plain((topk_ids, 2), (sorted_token_ids, 1), (experts_ids, 1),
                             (num_tokens_post_pad, 1)):  # fmt: skip
            raise _error(err, partial(_sglang_checks, *args),
                         f"{_SGLANG_PLUS_ONE}; {_ANY_SHAPE}", _EXPERTS_IDS) from None  # fmt: skip
    _sglang_align(*args, False)


def _sglang_align(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                  num_tokens_post_pad, pad_sorted_token_ids, ignore_invalid_expert,
                  srt) -> None:  # fmt: skip
    """The general path of :func:`sglang_moe_align_block_size`; ``srt``: for the srt form
    (its checks ran; the messages name its num_experts, the routed experts, not the
    buckets)."""
    torch, i32, vllm_op, sglang_op = _T
    args = (topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
            num_tokens_post_pad, pad_sorted_token_ids, ignore_invalid_expert, srt)  # fmt: skip
    bs, e, ignore = block_size, num_experts, ignore_invalid_expert
    try:
        if not (type(bs) is int and type(e) is int and 1 <= bs and 2 <= e <= _MOST[1]
                and type(pad_sorted_token_ids) is bool and type(ignore) is bool):  # fmt: skip
            bs, e, ignore = _sglang_checks(*args)
        else:
            e -= 1  # the routed experts
            _check_sglang_values(topk_ids, e, ignore, srt)
        ids = topk_ids if topk_ids.dtype == i32 and topk_ids.dim() == 2 else (
            _ids2d(topk_ids, torch, i32))  # fmt: skip
        n = ids.numel()
        cap = _CAP[1](n, e, bs)
        if not 1 <= topk_ids.dim() <= 2 or sorted_token_ids.numel() < cap or (
                experts_ids.numel() < -(-cap // bs)):  # fmt: skip
            _sglang_checks(*args)  # with ignore_invalid_expert the op's limits are vLLM's
        if sorted_token_ids.dim() != 1:
            sorted_token_ids = sorted_token_ids.view(-1)
        if experts_ids.dim() != 1:
            experts_ids = experts_ids.view(-1)
        if num_tokens_post_pad.dim() != 1 or num_tokens_post_pad.numel() != 1:
            num_tokens_post_pad = num_tokens_post_pad.view(-1)[:1]
        scatter_idx = torch.empty(n, dtype=i32, device=ids.device)
        # Without ids < 0, bucket 0 is empty and takes no rows: the buckets, rows and labels
        # (e - 1 of bucket e) are vLLM's format of the e routed experts.
        (vllm_op if ignore else sglang_op)(ids, e, bs, sorted_token_ids, experts_ids,
                                           num_tokens_post_pad, scatter_idx)  # fmt: skip
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        hint = _ANY_SHAPE if srt else f"{_SGLANG_PLUS_ONE}; {_ANY_SHAPE}"
        names = _TOKENS if srt else _EXPERTS_IDS
        raise _error(err, partial(_sglang_checks, *args), hint, names) from None


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
    torch, i32, _, _ = _T or _t()
    called = False
    try:  # the fast path: the allocating SGLang-format op (SGLang's capacity and limits)
        if (type(block_size) is int and type(num_experts) is int
                and 1 <= num_experts < _MOST[1] and ignore_invalid_expert is False
                and topk_ids.dtype is i32 and not _FAST[0]()):  # fmt: skip
            if topk_ids.numel():
                _check_sglang_values(topk_ids, num_experts, False, True)
            called = True
            return _FAST[4](topk_ids, num_experts, block_size)[:3]
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        if called and _plain((topk_ids, 2)):
            raise _error(err, partial(_srt_checks, topk_ids, block_size, num_experts),
                         _ANY_SHAPE) from None  # fmt: skip
    bs, e = block_size, num_experts
    try:
        if not (type(bs) is int and type(e) is int and 1 <= bs and 1 <= e < _MOST[1]):
            bs, e = _srt_checks(topk_ids, block_size, num_experts)
        cap = _CAP[1](topk_ids.numel(), e, bs)
        dev = topk_ids.device
        sorted_ids = torch.empty(cap, dtype=i32, device=dev)
        expert_ids = torch.empty(-(-cap // bs), dtype=i32, device=dev)
        total = torch.empty(1, dtype=i32, device=dev)
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(err, partial(_srt_checks, topk_ids, block_size, num_experts),
                     _ANY_SHAPE) from None  # fmt: skip
    _sglang_align(topk_ids, e + 1, bs, sorted_ids, expert_ids, total, True,
                  ignore_invalid_expert, True)  # fmt: skip
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
    torch, i32, op, _ = _T or _t()
    args = (topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
            num_tokens_post_pad, maybe_expert_map, scatter_idx)  # fmt: skip
    called = False
    try:  # the fast path: vLLM's call as its callers make it; vLLM's rule on the blocks (the
        # op's is the blocks of its capacity), the op's binding checks the rest
        if (type(block_size) is int and type(num_experts) is int and num_experts <= _MOST[0]
                and maybe_expert_map is None and scatter_idx is None and topk_ids.dtype is i32
                and experts_ids.numel() * block_size >= sorted_token_ids.numel()
                and not _FAST[0]()):  # fmt: skip
            called = True
            _FAST[1](topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                     num_tokens_post_pad, topk_ids.new_empty(topk_ids.numel()))  # fmt: skip
            return
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        if called and _plain((topk_ids, 2), (sorted_token_ids, 1), (experts_ids, 1),
                             (num_tokens_post_pad, 1)):  # fmt: skip
            raise _error(err, partial(_custom_checks, *args), _ANY_SHAPE, _EXPERTS_IDS) from None
    bs, e = block_size, num_experts
    try:
        if not (type(bs) is int and type(e) is int and 1 <= bs and 1 <= e <= _MOST[0]
                and maybe_expert_map is None):  # fmt: skip
            bs, e = _custom_checks(*args)
        ids = topk_ids if topk_ids.dtype == i32 and topk_ids.dim() == 2 else (
            _ids2d(topk_ids, torch, i32))  # fmt: skip
        n = ids.numel()
        cap = sorted_token_ids.numel()
        n_blocks = -(-cap // bs)
        blocks = experts_ids.numel()
        if blocks < n_blocks or (scatter_idx is not None and scatter_idx.numel() != n):
            _custom_checks(*args)  # vLLM's rules (the op's allow more): says which
        if sorted_token_ids.dim() != 1:
            sorted_token_ids = sorted_token_ids.view(-1)
        if blocks != n_blocks or experts_ids.dim() != 1:
            experts_ids = experts_ids.view(-1)[:n_blocks]
        if num_tokens_post_pad.dim() != 1 or num_tokens_post_pad.numel() != 1:
            num_tokens_post_pad = num_tokens_post_pad.view(-1)[:1]
        sc = torch.empty(n, dtype=i32, device=ids.device) if scatter_idx is None else (
            scatter_idx.view(-1))  # fmt: skip
        if maybe_expert_map is None:
            op(ids, e, bs, sorted_token_ids, experts_ids, num_tokens_post_pad, sc)
        else:
            op(ids, e, bs, sorted_token_ids, experts_ids, num_tokens_post_pad, sc,
               expert_map=maybe_expert_map)  # fmt: skip
    except Exception as err:  # noqa: BLE001 (the checks say what was wrong)
        raise _error(err, partial(_custom_checks, *args), _ANY_SHAPE, _EXPERTS_IDS) from None
