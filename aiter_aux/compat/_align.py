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
plain comparisons of the int and bool arguments; the op's binding checks the tensors.  On
an error, or an argument of another type (a numpy int), the checks of
:mod:`aiter_aux.reference.compat` run and name what is wrong as the reference does.
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

_SGLANG_PLUS_ONE = "E is SGLang's num_experts - 1"
_ANY_SHAPE = "any catalog shape with this E serves it"


_T: list = []  # torch, torch.int32, the vLLM-format and SGLang-format _out ops
_MOST: list = []  # vLLM's num_experts, SGLang's buckets: the most the checks allow
_CAP: list = []  # the capacity functions of the reference: vLLM's, SGLang's
_ALLOC: list = []  # the allocating vLLM-format op


def _t() -> list:
    if not _T:
        import torch

        from .. import ops  # noqa: F401 (defines the ops)
        from ..reference import compat as R
        from ..validation import MAX_NUM_EXPERTS

        aux = torch.ops.aiter_aux
        _MOST.extend((R.VLLM_MAX_EXPERTS, min(R.SGLANG_MAX_EXPERTS + 1, MAX_NUM_EXPERTS)))
        _CAP.extend((R.vllm_align_capacity, R.sglang_align_capacity))
        _ALLOC.append(aux.moe_align_block_size_vllm.default)
        _T.extend((torch, torch.int32, aux.moe_align_block_size_vllm_out.default,
                   aux.moe_align_block_size_sglang_out.default))  # fmt: skip
    return _T


def _error(error: Exception, check, hint: str) -> Exception:
    """The exception of a failed call: ``check`` (the reference's checks) names a bad
    argument; else the op's error as the wrappers translate it, a missing instance with
    ``hint``."""
    from ..ops import UnsupportedShapeError
    from ..ops._library import translate

    err = translate(error, check)
    if isinstance(err, UnsupportedShapeError):
        return UnsupportedShapeError(f"{err} ({hint})")
    return err


def _ids2d(topk_ids, torch, i32):
    """int32 ``[M, topk]`` ids with the same meaning: int64 values past int32 are clamped to
    ids that are dropped as they are (-2, or 2**31 - 1) rather than wrapped; other shapes
    read as ``[numel, 1]`` (only the flat pairs matter)."""
    if topk_ids.dtype == torch.int64:
        topk_ids = topk_ids.clamp(-2, 2**31 - 1).to(i32)
    return topk_ids if topk_ids.dim() == 2 else topk_ids.reshape(-1, 1)


def _checking_values(t) -> bool:
    """Whether the value checks run eagerly: on CPU tensors, outside a ``torch.compile``
    trace (there :func:`_traced_check` puts them into the graph)."""
    import torch

    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _traced_check(t, lo: int | None, hi: int, message: str) -> None:
    """Under ``torch.compile``, on CPU tensors: the value check ``lo <= t < hi`` (``lo``
    None: ``t < hi``) traced into the graph as ``torch._assert_async``, so that the compiled
    call raises (``RuntimeError(message)``) where the eager one raises ``ValueError``.
    Nothing elsewhere: on the GPU the check would synchronise (eager does not make it)."""
    import torch

    if t.device.type == "cpu" and torch.compiler.is_compiling():
        ok = t < hi if lo is None else (t >= lo) & (t < hi)
        torch._assert_async(ok.all(), message)


def _vllm_checks(topk_ids, block_size, num_experts, expert_map, pad, ignore, scatter):
    """The reference's checks of vLLM's function; returns ``(block_size, num_experts, pad,
    ignore, scatter)`` as plain ints and bools."""
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    pad = R._check_flag(pad, "pad_sorted_ids")
    ignore = R._check_flag(ignore, "ignore_invalid_experts")
    scatter = R._check_flag(scatter, "return_scatter_idx")
    bs, e, _ = R._check_sizes(
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
        elif ignore:
            _traced_check(expert_map[:e], -1, e, f"expert_map values must be -1 or in [0, {e})")
    if scatter and expert_map is not None and not ignore:
        raise ValueError("scatter_idx with expert_map requires ignore_invalid_experts")
    return bs, e, pad, ignore, scatter


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
    bs, e, pad, ignore, scatter = (block_size, num_experts, pad_sorted_ids,
                                   ignore_invalid_experts, return_scatter_idx)  # fmt: skip
    args = (topk_ids, block_size, num_experts, expert_map, pad_sorted_ids,
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
        raise _error(err, lambda: _vllm_checks(*args), _ANY_SHAPE) from None
    if scatter:
        return sorted_ids, expert_ids, total, scatter_idx.view(-1, 1)
    return sorted_ids, expert_ids, total


def _sglang_checks(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                   num_tokens_post_pad, pad, ignore) -> tuple:  # fmt: skip
    """The reference's checks of sgl-kernel's function (``num_experts``: the buckets);
    returns ``(block_size, routed experts, ignore)``."""
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
    R._check_flag(pad, "pad_sorted_token_ids")
    ignore = R._check_flag(ignore, "ignore_invalid_expert")
    R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, cap), ("experts_ids", experts_ids, -(-cap // bs)),
         ("num_tokens_post_pad", num_tokens_post_pad, 1)), bs)  # fmt: skip
    _check_sglang_values(topk_ids, e, ignore)
    return bs, e, ignore


def _check_sglang_values(topk_ids, e: int, ignore: bool) -> None:
    if not topk_ids.numel():
        return
    if not _checking_values(topk_ids):
        rule = f"< {e}" if ignore else f"in [-1, {e})"
        message = f"topk_ids values must be {rule} ({_SGLANG_PLUS_ONE})"
        _traced_check(topk_ids, None if ignore else -1, e, message)
    else:
        from ..reference import compat as R

        try:
            R.check_sglang_ids(topk_ids, e, ignore)
        except ValueError as err:
            raise ValueError(f"{err} ({_SGLANG_PLUS_ONE})") from None


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
    torch, i32, vllm_op, sglang_op = _T or _t()
    bs, e, ignore = block_size, num_experts, ignore_invalid_expert
    args = (topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
            num_tokens_post_pad, pad_sorted_token_ids, ignore_invalid_expert)  # fmt: skip
    try:
        if not (type(bs) is int and type(e) is int and 1 <= bs and 2 <= e <= _MOST[1]
                and type(pad_sorted_token_ids) is bool and type(ignore) is bool):  # fmt: skip
            bs, e, ignore = _sglang_checks(*args)
        else:
            e -= 1  # the routed experts
            _check_sglang_values(topk_ids, e, ignore)
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
        raise _error(err, lambda: _sglang_checks(*args),
                     f"{_SGLANG_PLUS_ONE}; {_ANY_SHAPE}") from None  # fmt: skip


def _srt_checks(topk_ids, block_size, num_experts) -> tuple[int, int]:
    from ..reference import compat as R

    topk_ids = R._check_ids(topk_ids, (1, 2))
    bs, e, _ = R._check_sizes(topk_ids, block_size, num_experts, R.SGLANG_MAX_EXPERTS,
                              R.sglang_align_capacity)  # fmt: skip
    return bs, e


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
        raise _error(err, lambda: _srt_checks(topk_ids, block_size, num_experts),
                     _ANY_SHAPE) from None  # fmt: skip
    sglang_moe_align_block_size(topk_ids, e + 1, bs, sorted_ids, expert_ids, total, None, True,
                                ignore_invalid_expert)  # fmt: skip
    return sorted_ids, expert_ids, total


def _custom_checks(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                   num_tokens_post_pad, maybe_expert_map, scatter_idx) -> tuple:  # fmt: skip
    """The reference's checks of ``vllm._custom_ops.moe_align_block_size``; returns
    ``(block_size, num_experts)`` as ints."""
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    bs, e, _ = R._check_sizes(topk_ids, block_size, num_experts, R.VLLM_MAX_EXPERTS,
                              R.vllm_align_capacity)  # fmt: skip
    n = topk_ids.numel()
    R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, R.vllm_align_capacity(n, e, bs)),
         ("experts_ids", experts_ids, None), ("num_tokens_post_pad", num_tokens_post_pad, 1)),
        bs)  # fmt: skip
    if scatter_idx is not None:
        R.check_align_buffers((("scatter_idx", scatter_idx, n),), bs)
        if scatter_idx.numel() != n:
            raise ValueError(
                f"scatter_idx must have topk_ids.numel() = {n} elements, got {scatter_idx.numel()}"
            )
    if maybe_expert_map is not None:
        emap = check_expert_map(maybe_expert_map, topk_ids.device)
        if emap.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {emap.numel()}"
            )
        if _checking_values(emap):
            R._check_values(emap[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
        else:
            _traced_check(emap[:e], -1, e, f"expert_map values must be -1 or in [0, {e})")
    return bs, e


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
    bs, e = block_size, num_experts
    args = (topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
            num_tokens_post_pad, maybe_expert_map, scatter_idx)  # fmt: skip
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
        raise _error(err, lambda: _custom_checks(*args), _ANY_SHAPE) from None
