"""AITER's ``aiter/ops/moe_mxfp4_aux.py`` API on aiter-aux's ops: switch by changing an import.

::

    # from aiter.ops.moe_mxfp4_aux import mxfp4_moe_sort, mxfp4_moe_scatter_reduce, ...
    from aiter_aux.compat.aiter import mxfp4_moe_sort, mxfp4_moe_scatter_reduce, ...

Every function has the name, argument order, defaults and argument meaning of AITER's (the
``@compile_ops("module_moe_mxfp4_aux")`` stubs, host code
``csrc/kernels/mxfp4_moe/moe_mxfp4_aux.cu``, kernels ``moe_aux/*.cuh``; docs/compat.md
names the versions read), writes into the caller's buffers and returns ``None``.  Each is a
thin adapter onto an ``_out`` op of :mod:`aiter_aux.ops`: ``cumsum_tensor`` is our
``num_valid_ids``, ``MB`` our ``block_m``, ``NE`` our ``num_experts``, ``TOPK`` our
``topk``, ``D_HIDDEN`` our ``model_dim`` (docs/compat.md has the full table).  Importing
this module builds and loads nothing; the first call loads (or builds) the compiled module.

Checks.  AITER's host code takes raw pointers and checks nothing but the instance key and
the size of ``sort3stage_ws``.  The adapters check that ``NE``/``TOPK``/``D_HIDDEN``/``MB``
are in range (``NE`` in [1, 1024], ``TOPK`` in [1, 255], ``MB`` in {16, 32, 64, 128},
``D_HIDDEN`` a positive multiple of 32) and agree with the tensors that carry them
(``topk_ids.shape[1] == TOPK``, ``a_input.shape[1] == D_HIDDEN``, ``a_scale.shape[1] ==
D_HIDDEN / 32``, ``out.shape[1] == D_HIDDEN``, ...), that every buffer holds what AITER's
kernel would write or read, and that no written buffer overlaps another buffer; a mismatch
raises ``ValueError`` (a wrong dtype or a non-tensor ``TypeError``) naming AITER's argument,
before anything is written.  Then our op validates again in C++ (its messages name our
arguments, see docs/compat.md) and raises ``ValueError``/``TypeError``, or
``UnsupportedShapeError`` (a ``ValueError``) where no instance serves the shape; AITER
raises ``RuntimeError`` from ``AITER_CHECK`` there.

Differences from AITER's current module, each with the AITER source it was read from (read,
not run: no gfx950 was at hand), are listed in docs/compat.md.  In short: the sort is
deterministic (ascending ``(t, k)`` within an expert; AITER's order is its atomics');
buffers of AITER's sort size are staged through ones of our capacity; ``sort3stage_ws`` is
checked as AITER checks it and never touched (our sort needs no scratch); ``bf16_out_init``
is our ``zero_buf_init``; ``mxfp4_moe_quant`` zero-inits with a separate launch; a few
padding, NaN/Inf and rounding details differ; ours run on CPU, CUDA and ROCm.

``prepare_mxfp4_moe_aux(shapes)`` builds or loads the module serving ``shapes`` on this
process's backend, or raises :class:`MissingInstancesError` (a ``RuntimeError``) naming the
missing instance keys and the ``aiter-aux add-shape`` command.
``is_mxfp4_moe_shape_supported(expert, model_dim, inter_dim, topk)``,
``is_mxfp4_moe_scatter_supported(model_dim, topk)`` (True when some catalog shape has that
``model_dim`` and ``topk``) and ``MXFP4_MOE_SUPPORTED_SHAPES`` have AITER's signatures and
meaning, over our catalog.  ``biased_grouped_topk`` (from ``aiter``'s top level) is the
gate: docs/compat.md "The gates".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# ``from ..ops.moe_mxfp4_aux import name`` would run that module's ``__getattr__`` for
# ``__path__``, which imports the ops (torch, the JIT); importing the module object does not.
from ..ops import moe_mxfp4_aux as _catalog
from ._aiter_args import (
    _a_input,
    _bytes2d,
    _check_sort3stage_ws,
    _contiguous,
    _flat,
    _init_source,
    _int,
    _no_overlap,
    _params,
    _q_dtypes,
    _quant_targets,
    _routing,
    _rows,
    _run,
    _scale_dtypes,
    _scatter_common,
    _sort_buffers,
    _tensor,
    _torch,
    _workspace_target,
    _zero_target,
)
from ._aiter_prepare import MissingInstancesError, prepare_mxfp4_moe_aux
from ._route import aiter_biased_grouped_topk as biased_grouped_topk

MXFP4_MOE_SUPPORTED_SHAPES = _catalog.MXFP4_MOE_SUPPORTED_SHAPES
is_mxfp4_moe_shape_supported = _catalog.is_mxfp4_moe_shape_supported
is_mxfp4_moe_scatter_supported = _catalog.is_mxfp4_moe_scatter_supported

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "MXFP4_MOE_SUPPORTED_SHAPES",
    "is_mxfp4_moe_shape_supported",
    "is_mxfp4_moe_scatter_supported",
    "prepare_mxfp4_moe_aux",
    "MissingInstancesError",
    "mxfp4_moe_sort_quant",
    "mxfp4_moe_sort",
    "mxfp4_moe_quant",
    "mxfp4_moe_sort_scales",
    "mxfp4_moe_scatter_reduce",
    "mxfp4_moe_scatter_reduce_q",
    "biased_grouped_topk",
]


# ------------------------------------------------------------------------------ the ops


def mxfp4_moe_sort_quant(
    a_input: Tensor,
    topk_ids: Tensor,
    topk_weight: Tensor,
    sorted_token_ids: Tensor,
    sorted_expert_ids: Tensor,
    cumsum_tensor: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    a_quant: Tensor,
    a_scale: Tensor,
    m_indices: Tensor,
    bf16_zero_out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Sort the routing and quantise the activations in one call (our
    :func:`aiter_aux.ops.moe_sort_quant_out`).

    Args:
        a_input: bf16 ``[M, D_HIDDEN]``; M is ``a_input.shape[0]``.
        topk_ids: int32 ``[>= M, TOPK]``; the first M rows are sorted.
        topk_weight: float32, the shape of ``topk_ids``.
        sorted_token_ids: int32, >= ``round_up(M*TOPK + min(NE, M*TOPK)*(MB-1), MB)``
            elements (``max_sorted``): ``t | k << 24`` per row, pad M.
        sorted_expert_ids: int32, >= ``max_sorted / MB``: the expert of each block.
        cumsum_tensor: int32, >= 2: ``[rows used, M]`` (our ``num_valid_ids``).
        reverse_sorted: int32, >= ``M*TOPK``: the row of pair ``(t, k)``, or -1.
        sorted_weights: float32, >= ``max_sorted``; pad 0.0.
        a_quant: uint8 (or float4_e2m1fn_x2), >= ``M*D_HIDDEN/2`` bytes, any shape: e2m1.
        a_scale: uint8 (or float8_e8m0fnu), >= ``M*D_HIDDEN/32`` bytes, any shape: e8m0.
        m_indices: int32, >= ``max_sorted``: the token of each row, pad M.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M*D_HIDDEN`` elements are
            zeroed in the same call (or set to ``bf16_out_init``'s).
        NE, TOPK, D_HIDDEN, MB: the instance: experts, top-k, hidden size, block_m.
        bf16_out_init: None, empty, or a contiguous tensor of ``bf16_zero_out``'s dtype with
            >= ``M*D_HIDDEN`` elements (e.g. the shared expert's output), whose first
            ``M*D_HIDDEN`` are copied, bit for bit, into ``bf16_zero_out`` instead of zeros
            (our ``zero_buf_init``); ignored, as in AITER, when ``bf16_zero_out`` is empty.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    x, m = _a_input(a_input, d)
    ids, w = _routing(topk_ids, topk_weight, topk, m, "M = a_input.shape[0]")
    aq, asc, zero, init = _quant_targets(a_quant, a_scale, bf16_zero_out, bf16_out_init, m, d)
    out, copies, named = _sort_buffers(m, topk, ne, mb, sorted_token_ids,
                                       sorted_weights, m_indices, sorted_expert_ids,
                                       cumsum_tensor, reverse_sorted)  # fmt: skip
    _no_overlap(
        {**named, "a_quant": aq, "a_scale": asc, "bf16_zero_out": zero},
        {"a_input": x, "topk_ids": ids, "topk_weight": w, "bf16_out_init": init},
    )
    _run("moe_sort_quant_out", ids, w, x, ne, mb, out, aq, asc, zero_buf=zero, zero_buf_init=init)
    for dst, src in copies:
        dst.copy_(src)


def mxfp4_moe_sort(
    topk_ids: Tensor,
    topk_weight: Tensor,
    sorted_token_ids: Tensor,
    sorted_expert_ids: Tensor,
    cumsum_tensor: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    m_indices: Tensor,
    bf16_zero_out: Tensor,
    bf16_zero_workspace: Tensor,
    sort3stage_ws: Tensor,
    M_logical: int,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    D_INTER: int,
    MB: int,
    prologue: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Sort the routing (our :func:`aiter_aux.ops.moe_sort_out`).

    Args:
        topk_ids: int32 ``[>= M_logical, TOPK]``; the first ``M_logical`` rows are sorted.
        topk_weight: float32, the shape of ``topk_ids``.
        sorted_token_ids, sorted_expert_ids, cumsum_tensor, reverse_sorted, sorted_weights,
            m_indices: as in :func:`mxfp4_moe_sort_quant`, with M = ``M_logical``.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M_logical*D_HIDDEN`` elements
            are zeroed (or set to ``bf16_out_init``'s) in the same call when ``prologue ==
            0`` (untouched for 1, as in AITER).
        bf16_zero_workspace: empty, or a contiguous tensor whose first
            ``floor(nbytes/16)*16`` bytes are zeroed when ``prologue == 0`` and
            ``bf16_zero_out`` is not empty (a separate ``zero_``).
        sort3stage_ws: the scratch of AITER's three-stage sort: with ``prologue == 1`` an
            int32 tensor of >= ``NE*16 + NE`` elements (AITER's check), else any tensor
            (``torch.empty(0, dtype=torch.int32)``).  Unused here (our sort needs no
            scratch): never read or written.
        M_logical: the number of tokens M, in [0, ``topk_ids.shape[0]``].
        NE, TOPK, D_HIDDEN, MB: the instance.
        D_INTER: ignored (as in AITER).
        prologue: 0 (AITER's one-CTA sort) or 1 (its three-stage sort); the outputs are the
            same, only the zero-init depends on it.
        bf16_out_init: as in :func:`mxfp4_moe_sort_quant`; used when ``bf16_zero_out`` is
            initialised (``prologue == 0``), ignored otherwise, as in AITER.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    _int(D_INTER, "D_INTER")
    pro = _int(prologue, "prologue")
    if pro not in (0, 1):
        raise ValueError(f"prologue must be 0 (one-CTA sort) or 1 (three-stage sort), got {pro}")
    m = _int(M_logical, "M_logical")
    ids, w = _routing(topk_ids, topk_weight, topk, m, "M_logical")
    zero_out = _tensor(bf16_zero_out, "bf16_zero_out")
    _tensor(bf16_zero_workspace, "bf16_zero_workspace")
    _check_sort3stage_ws(sort3stage_ws, ne, pro)
    zero = ws = None
    if pro == 0:
        zero = _zero_target(zero_out, m, d)
        if zero_out.numel() > 0:
            ws = _workspace_target(bf16_zero_workspace)
    init = _init_source(bf16_out_init, zero_out, zero)
    out, copies, named = _sort_buffers(m, topk, ne, mb, sorted_token_ids,
                                       sorted_weights, m_indices, sorted_expert_ids,
                                       cumsum_tensor, reverse_sorted)  # fmt: skip
    _no_overlap(
        {**named, "bf16_zero_out": zero, "bf16_zero_workspace": ws},
        {"topk_ids": ids, "topk_weight": w, "bf16_out_init": init},
    )
    _run("moe_sort_out", ids, w, ne, mb, out, zero_buf=zero, zero_buf_init=init)
    if ws is not None:
        ws.zero_()
    for dst, src in copies:
        dst.copy_(src)


def mxfp4_moe_quant(
    a_input: Tensor,
    a_quant: Tensor,
    a_scale: Tensor,
    bf16_zero_out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Quantise ``a_input`` to MXFP4 per 1x32 (our :func:`aiter_aux.ops.mxfp4_quant_out`).

    Args:
        a_input: bf16 ``[M, D_HIDDEN]``.
        a_quant: uint8 (or float4_e2m1fn_x2), >= ``M*D_HIDDEN/2`` bytes, any shape: e2m1,
            element 2j in the low nibble of byte j.
        a_scale: uint8 (or float8_e8m0fnu), >= ``M*D_HIDDEN/32`` bytes, any shape: e8m0,
            row-major ``[M, D_HIDDEN/32]``.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M*D_HIDDEN`` elements are
            zeroed, or set to ``bf16_out_init``'s (a separate ``zero_`` or ``copy_`` after
            the quant).
        NE, TOPK, D_HIDDEN, MB: the instance (the kernel uses D_HIDDEN only).
        bf16_out_init: as in :func:`mxfp4_moe_sort_quant`.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    x, m = _a_input(a_input, d)
    aq, asc, zero, init = _quant_targets(a_quant, a_scale, bf16_zero_out, bf16_out_init, m, d)
    _no_overlap(
        {"a_quant": aq, "a_scale": asc, "bf16_zero_out": zero},
        {"a_input": x, "bf16_out_init": init},
    )
    _run("mxfp4_quant_out", x, aq, asc)
    if init is not None:  # bit for bit, NaN payloads included
        zero.view(_torch().int16).copy_(init.view(_torch().int16))
    elif zero is not None:
        zero.zero_()


def mxfp4_moe_sort_scales(
    a_scale: Tensor,
    sorted_token_ids: Tensor,
    cumsum_tensor: Tensor,
    a_scale_sorted_shuffled: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    max_sorted: int,
) -> None:
    """Shuffle the per-token scales into the grouped GEMM's layout in sorted row order (our
    :func:`aiter_aux.ops.moe_sort_scales_out`).

    Args:
        a_scale: uint8 (or float8_e8m0fnu) ``[M, D_HIDDEN/32]`` (2-D: M is its first size).
        sorted_token_ids: int32, >= ``max_sorted`` elements (from the sort).
        cumsum_tensor: int32, >= 2 (from the sort; element 0 is read).
        a_scale_sorted_shuffled: uint8 (or float8_e8m0fnu), any shape, >=
            ``floor(max_sorted/BM)*BM*D_HIDDEN/32`` bytes with ``BM = max(32, MB)``; exactly
            that many leading bytes are written.
        NE, TOPK, D_HIDDEN, MB: the instance (D_HIDDEN a multiple of 256).
        max_sorted: the sort capacity: ``floor(max_sorted/BM)`` chunks are written; in
            [0, ``round_up(sorted_token_ids.numel(), BM)``].

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    ms = _int(max_sorted, "max_sorted")
    s = _tensor(a_scale, "a_scale")
    if s.dtype not in _scale_dtypes():
        raise TypeError(
            f"a_scale must have dtype torch.uint8 or torch.float8_e8m0fnu, got {s.dtype}"
        )
    if s.dim() != 2 or s.shape[1] != d // 32:
        raise ValueError(
            f"a_scale must be 2-D [M, D_HIDDEN/32] = [M, {d // 32}] (AITER takes M from "
            f"a_scale.size(0)), got shape {list(s.shape)}"
        )
    s = _contiguous(s, "a_scale").view(torch.uint8)
    sti = _flat(sorted_token_ids, "sorted_token_ids", torch.int32, 0, "")
    nv = _flat(cumsum_tensor, "cumsum_tensor", torch.int32, 2, "[rows, M]")
    bm = max(32, mb)
    limit = -(-sti.numel() // bm) * bm
    if not 0 <= ms <= limit:
        raise ValueError(
            f"max_sorted = {ms} must lie in [0, round_up(sorted_token_ids.numel(), BM) = "
            f"{limit}] (BM = max(32, MB) = {bm})"
        )
    rows = ms // bm * bm
    sti = sti[: min(rows, sti.numel())]  # our op writes ceil(len / BM) * BM = rows rows
    out = _bytes2d(a_scale_sorted_shuffled, "a_scale_sorted_shuffled", _scale_dtypes(),
                   rows, d // 32)  # fmt: skip
    _no_overlap(
        {"a_scale_sorted_shuffled": out},
        {"a_scale": s, "sorted_token_ids": sti, "cumsum_tensor": nv},
    )
    _run("moe_sort_scales_out", s, sti, nv, mb, out)


def mxfp4_moe_scatter_reduce(
    flat_out: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
) -> None:
    """Weighted top-k reduce of the expert rows back to tokens (our
    :func:`aiter_aux.ops.moe_scatter_reduce_out`):
    ``out[t] = bf16(sum_k flat_out[p] * sorted_weights[p])``, ``p = reverse_sorted[t*TOPK+k]``,
    skipping ``p < 0``.

    Args:
        flat_out: bf16 ``[rows, D_HIDDEN]`` in sorted row order.
        reverse_sorted: int32, >= ``M*TOPK`` elements (the first ``M*TOPK`` are read).
        sorted_weights: float32 1-D (rows past its length are never addressed).
        out: bf16 ``[M, D_HIDDEN]``; M is ``out.shape[0]``.
        NE, TOPK, D_HIDDEN, MB: the instance (the kernel uses TOPK and D_HIDDEN).

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    o, rev, sw = _scatter_common(out, reverse_sorted, sorted_weights, topk, d)
    eo = _rows(_tensor(flat_out, "flat_out"), "flat_out", d, (torch.bfloat16,))
    eo = eo[: sw.numel()]
    _no_overlap({"out": o}, {"flat_out": eo, "reverse_sorted": rev, "sorted_weights": sw})
    _run("moe_scatter_reduce_out", eo, rev, sw, topk, o)


def mxfp4_moe_scatter_reduce_q(
    flat_out_q: Tensor,
    flat_out_scale: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
) -> None:
    """:func:`mxfp4_moe_scatter_reduce` with MXFP4 expert rows (our
    :func:`aiter_aux.ops.moe_scatter_reduce_q_out`).

    Args:
        flat_out_q: uint8 (or float4_e2m1fn_x2) ``[rows, D_HIDDEN/2]``: e2m1 pairs.
        flat_out_scale: uint8 (or float8_e8m0fnu) ``[rows', D_HIDDEN/32]``, row-major e8m0;
            ``min(rows, rows', sorted_weights.numel())`` rows are addressable.
        reverse_sorted, sorted_weights, out, NE, TOPK, D_HIDDEN, MB: as in
            :func:`mxfp4_moe_scatter_reduce`.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    o, rev, sw = _scatter_common(out, reverse_sorted, sorted_weights, topk, d)
    q = _rows(_tensor(flat_out_q, "flat_out_q"), "flat_out_q", d // 2, _q_dtypes())
    s = _rows(_tensor(flat_out_scale, "flat_out_scale"), "flat_out_scale", d // 32,
              _scale_dtypes())  # fmt: skip
    rows = min(q.shape[0], s.shape[0], sw.numel())
    q = q.view(torch.uint8)[:rows]
    s = s.view(torch.uint8)[:rows]
    _no_overlap(
        {"out": o},
        {"flat_out_q": q, "flat_out_scale": s, "reverse_sorted": rev, "sorted_weights": sw},
    )
    _run("moe_scatter_reduce_q_out", q, s, rev, sw, topk, o)
