"""Per-op checks: ``validate_<op>`` checks the inputs of one op and returns the sizes derived
from them; ``validate_<op>_out`` checks the caller-provided output buffers against those sizes.

Messages follow the conventions of :mod:`aiter_aux.validation`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aiter_aux.types import MoeSortOutput

from .ints import (
    sort_scales_rows,
    validate_block_m,
    validate_model_dim,
    validate_scale,
    validate_sort_sizes,
    validate_topk,
)
from .tensors import (
    _shape_str,
    check_buffer,
    check_expert_map,
    check_no_overlap,
    check_same_device,
    check_tensor,
    check_zero_buf,
    check_zero_buf_init,
)


def _check_routing(topk_ids: object, topk_weights: object) -> tuple[torch.Tensor, torch.Tensor]:
    ids = check_tensor(topk_ids, "topk_ids", torch.int32, 2, "[M, topk]")
    w = check_tensor(topk_weights, "topk_weights", torch.float32, 2, "[M, topk]")
    if w.shape != ids.shape:
        raise ValueError(
            f"topk_weights must have the shape of topk_ids {_shape_str(ids.shape)}, "
            f"got {_shape_str(w.shape)}"
        )
    return ids, w


def validate_moe_sort(
    topk_ids: object,
    topk_weights: object,
    num_experts: object,
    block_m: object,
    zero_buf: object = None,
    expert_map: object = None,
    zero_buf_init: object = None,
) -> tuple[int, int, int]:
    """Check the inputs of ``moe_sort``.

    Args:
        topk_ids: int32 ``[M, topk]``, contiguous.
        topk_weights: float32 ``[M, topk]``, contiguous, same device.
        num_experts: ``1 <= num_experts <= 1024``.
        block_m: one of 16, 32, 64, 128.
        zero_buf: None, or a contiguous bf16 tensor of any shape on the same device.
        expert_map: None, or int32 ``[num_global_experts]`` on the same device.
        zero_buf_init: None, or bf16 with ``zero_buf``'s element count (zero_buf required).

    Returns:
        ``(M, topk, max_rows)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.
    """
    ids, w = _check_routing(topk_ids, topk_weights)
    check_same_device(topk_ids=ids, topk_weights=w)
    check_zero_buf(zero_buf, ids.device)
    check_expert_map(expert_map, ids.device)
    check_zero_buf_init(zero_buf_init, zero_buf, ids.device)
    m, k = ids.shape
    max_rows = validate_sort_sizes(m, k, num_experts, block_m)
    return m, k, max_rows


_SORT_OUT_DTYPES = (
    ("sorted_token_ids", torch.int32),
    ("sorted_weights", torch.float32),
    ("m_indices", torch.int32),
    ("sorted_expert_ids", torch.int32),
    ("num_valid_ids", torch.int32),
    ("reverse_sorted", torch.int32),
)


def validate_moe_sort_out(
    out: object,
    num_tokens: int,
    topk: int,
    max_rows: int,
    block_m: int,
    device: torch.device,
) -> MoeSortOutput:
    """Check the caller-provided outputs of ``moe_sort_out`` / ``moe_sort_quant_out``.

    Every buffer must be an exactly 1-D contiguous tensor on ``device`` with at least:
    ``max_rows`` elements (sorted_token_ids int32, sorted_weights float32, m_indices int32),
    ``max_rows // block_m`` (sorted_expert_ids int32), 2 (num_valid_ids int32) and
    ``M * topk`` (reverse_sorted int32).

    Args:
        out: a :class:`MoeSortOutput` (or any sequence of the six tensors in that order).
        num_tokens, topk, max_rows, block_m: the sizes returned by :func:`validate_moe_sort`.
        device: the device of the inputs.

    Returns:
        ``out`` as a :class:`MoeSortOutput`.

    Raises:
        TypeError: ``out`` is not a sequence of six tensors, or a buffer has the wrong dtype.
        ValueError: a buffer is not 1-D, not contiguous, on another device or too small.
    """
    if not isinstance(out, Sequence) or isinstance(out, str | bytes) or len(out) != 6:
        raise TypeError(
            "out must be a MoeSortOutput (sorted_token_ids, sorted_weights, m_indices, "
            f"sorted_expert_ids, num_valid_ids, reverse_sorted), got {type(out).__name__}"
        )
    needed = (max_rows, max_rows, max_rows, max_rows // block_m, 2, num_tokens * topk)
    for buf, (name, dtype), n in zip(out, _SORT_OUT_DTYPES, needed, strict=True):
        check_buffer(buf, name, dtype, n, device, ndim=1)
    return MoeSortOutput(*out)


def validate_mxfp4_quant(x: object) -> tuple[int, int]:
    """Check the input of ``mxfp4_quant`` (and of ``mxfp8_quant``, the same checks): ``x``
    bf16 ``[M, model_dim]`` contiguous, with ``model_dim`` a positive multiple of 32.

    Returns:
        ``(M, model_dim)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.
    """
    x = check_tensor(x, "x", torch.bfloat16, 2, "[M, model_dim]")
    m, d = x.shape
    validate_model_dim(d, 32)
    return m, d


def validate_mxfp4_quant_out(
    a_q: object,
    a_scale: object,
    num_tokens: int,
    model_dim: int,
    device: torch.device,
    fp8: bool = False,
) -> None:
    """Check the outputs of ``mxfp4_quant_out``: ``a_q`` uint8 2-D ``[>= M, model_dim / 2]`` and
    ``a_scale`` uint8 2-D ``[>= M, model_dim / 32]``, contiguous, on ``device``.  With ``fp8``
    (``mxfp8_quant_out``), ``a_q`` is uint8 ``[>= M, model_dim]`` (one E4M3 byte per element).

    Raises:
        TypeError, ValueError: see :func:`check_buffer`.
    """
    cq, cs = (model_dim if fp8 else model_dim // 2), model_dim // 32
    check_buffer(a_q, "a_q", torch.uint8, num_tokens * cq, device, ndim=2, cols=cq)
    check_buffer(a_scale, "a_scale", torch.uint8, num_tokens * cs, device, ndim=2, cols=cs)


QUANT_DTYPES = ("mxfp4", "mxfp8")


def validate_quant_dtype(quant_dtype: object) -> bool:
    """Check ``quant_dtype`` of ``moe_sort_quant[_out]``: True for ``"mxfp8"``, False for
    ``"mxfp4"``; ValueError for anything else."""
    if not isinstance(quant_dtype, str) or quant_dtype not in QUANT_DTYPES:
        raise ValueError(f"quant_dtype must be 'mxfp4' or 'mxfp8', got {quant_dtype!r}")
    return quant_dtype == "mxfp8"


def validate_moe_sort_quant(
    topk_ids: object,
    topk_weights: object,
    x: object,
    num_experts: object,
    block_m: object,
    zero_buf: object = None,
    expert_map: object = None,
    zero_buf_init: object = None,
    sorted_scales: object = None,
) -> tuple[int, int, int, int]:
    """Check the inputs of ``moe_sort_quant``: those of ``moe_sort`` and ``mxfp4_quant``, with
    ``x.shape[0] == topk_ids.shape[0]`` and all tensors on one device, then the optional
    ``sorted_scales`` buffer (:func:`check_sorted_scales`; both forms take it).

    Returns:
        ``(M, topk, max_rows, model_dim)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.
    """
    ids, w = _check_routing(topk_ids, topk_weights)
    mx, d = validate_mxfp4_quant(x)
    check_same_device(topk_ids=ids, topk_weights=w, x=x)
    check_zero_buf(zero_buf, ids.device)
    check_expert_map(expert_map, ids.device)
    check_zero_buf_init(zero_buf_init, zero_buf, ids.device)
    m, k = ids.shape
    if mx != m:
        raise ValueError(f"x must have M = topk_ids.shape[0] = {m} rows, got {mx}")
    max_rows = validate_sort_sizes(m, k, num_experts, block_m)
    check_sorted_scales(sorted_scales, max_rows, int(block_m), d, ids.device)
    return m, k, max_rows, d


def check_sorted_scales(
    sorted_scales: object, max_rows: int, block_m: int, model_dim: int, device: torch.device
) -> None:
    """Check the optional ``sorted_scales`` of ``moe_sort_quant[_fp8]`` (either form), which
    the call writes as ``moe_sort_scales_out`` would from its own outputs: the buffer of
    :func:`validate_moe_sort_scales_out` (uint8 2-D ``[>= out_rows, model_dim / 32]``,
    contiguous, on ``device``; ``out_rows = ceil(max_rows / BM) * BM``, ``BM = max(32,
    block_m)``), and ``model_dim % 256 == 0`` (the GEMM scale layout).  Overlap is checked
    with the call's other buffers (:func:`check_moe_sort_quant_call`).

    Raises:
        TypeError: not a tensor, or not uint8.
        ValueError: not 2-D, not contiguous, another device, wrong column count, too few
            rows, or ``model_dim`` not a multiple of 256.
    """
    if sorted_scales is None:
        return
    validate_moe_sort_scales_out(
        sorted_scales, sort_scales_rows(max_rows, block_m), model_dim, device
    )
    if model_dim % 256 != 0:
        raise ValueError(
            f"sorted_scales needs model_dim a multiple of 256 (the layout of moe_sort_scales), "
            f"got model_dim = {model_dim}"
        )


def validate_moe_sort_scales(
    a_scale: object, sorted_token_ids: object, num_valid_ids: object, block_m: object
) -> tuple[int, int, int, int]:
    """Check the inputs of ``moe_sort_scales``.

    Args:
        a_scale: uint8 ``[M, model_dim / 32]``, contiguous, ``model_dim % 256 == 0``.
        sorted_token_ids: int32 1-D ``[max_rows]`` with ``max_rows % block_m == 0``.
        num_valid_ids: int32 1-D with at least 2 elements (only element 0 is read).
        block_m: one of 16, 32, 64, 128.

    Returns:
        ``(M, model_dim, max_rows, out_rows)`` with
        ``out_rows = ceil(max_rows / BM) * BM``, ``BM = max(32, block_m)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.
    """
    a_scale = check_tensor(a_scale, "a_scale", torch.uint8, 2, "[M, model_dim/32]")
    sti = check_tensor(sorted_token_ids, "sorted_token_ids", torch.int32, 1, "[max_rows]")
    nv = check_tensor(num_valid_ids, "num_valid_ids", torch.int32, 1, "[2]")
    if nv.numel() < 2:
        raise ValueError(f"num_valid_ids must have 2 elements, got {nv.numel()}")
    check_same_device(a_scale=a_scale, sorted_token_ids=sti, num_valid_ids=nv)
    b = validate_block_m(block_m)
    m, cols = a_scale.shape
    if cols == 0 or cols % 8 != 0:
        raise ValueError(
            f"a_scale must have model_dim/32 columns with model_dim a positive multiple of 256, "
            f"got {cols} columns (model_dim = {cols * 32})"
        )
    max_rows = sti.numel()
    if max_rows % b != 0:
        raise ValueError(
            f"sorted_token_ids length (max_rows = {max_rows}) must be a multiple of "
            f"block_m = {b}"
        )
    return m, cols * 32, max_rows, sort_scales_rows(max_rows, b)


def validate_moe_sort_scales_out(
    sorted_scales: object, out_rows: int, model_dim: int, device: torch.device
) -> None:
    """Check the output of ``moe_sort_scales_out``: uint8 2-D ``[>= out_rows, model_dim / 32]``,
    contiguous, on ``device``.  Only the first ``out_rows`` rows are written.

    Raises:
        TypeError, ValueError: see :func:`check_buffer`.
    """
    cols = model_dim // 32
    check_buffer(
        sorted_scales, "sorted_scales", torch.uint8, out_rows * cols, device, ndim=2, cols=cols
    )


def _check_scatter_routing(
    reverse_sorted: object, sorted_weights: object, topk: object, rows: int
) -> tuple[int, torch.Tensor, torch.Tensor]:
    rev = check_tensor(reverse_sorted, "reverse_sorted", torch.int32, 1, "[M*topk]")
    sw = check_tensor(sorted_weights, "sorted_weights", torch.float32, 1, "[>= rows]")
    k = validate_topk(topk)
    if rev.numel() % k != 0:
        raise ValueError(
            f"reverse_sorted length ({rev.numel()}) must be M*topk, a multiple of topk = {k}"
        )
    if sw.numel() < rows:
        raise ValueError(
            f"sorted_weights must have >= rows of expert_out = {rows} elements, got {sw.numel()}"
        )
    return rev.numel() // k, rev, sw


def validate_moe_scatter_reduce(
    expert_out: object,
    reverse_sorted: object,
    sorted_weights: object,
    topk: object,
    routed_scaling_factor: object = 1.0,
) -> tuple[int, int, int]:
    """Check the inputs of ``moe_scatter_reduce``.

    Args:
        expert_out: bf16 ``[rows, model_dim]``, contiguous, ``model_dim >= 1``.
        reverse_sorted: int32 1-D ``[M * topk]``.
        sorted_weights: float32 1-D with at least ``rows`` elements.
        topk: ``1 <= topk <= 255``.
        routed_scaling_factor: a float (int accepted) scaling each token's sum.

    Returns:
        ``(M, rows, model_dim)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.  Row indices in ``reverse_sorted``
        are not read here; see :func:`validate_reverse_sorted_range`.
    """
    eo = check_tensor(expert_out, "expert_out", torch.bfloat16, 2, "[rows, model_dim]")
    rows, d = eo.shape
    if d == 0:
        raise ValueError("expert_out must have model_dim >= 1 columns, got 0")
    m, rev, sw = _check_scatter_routing(reverse_sorted, sorted_weights, topk, rows)
    check_same_device(expert_out=eo, reverse_sorted=rev, sorted_weights=sw)
    validate_scale(routed_scaling_factor)
    return m, rows, d


def validate_moe_scatter_reduce_q(
    expert_out_q: object,
    expert_out_scale: object,
    reverse_sorted: object,
    sorted_weights: object,
    topk: object,
    routed_scaling_factor: object = 1.0,
) -> tuple[int, int, int]:
    """Check the inputs of ``moe_scatter_reduce_q``.

    Args:
        expert_out_q: uint8 ``[rows, model_dim / 2]`` (e2m1 pairs), contiguous.
        expert_out_scale: uint8 ``[rows, model_dim / 32]`` (e8m0), contiguous;
            ``model_dim`` is a positive multiple of 32.
        reverse_sorted: int32 1-D ``[M * topk]``.
        sorted_weights: float32 1-D with at least ``rows`` elements.
        topk: ``1 <= topk <= 255``.

    Returns:
        ``(M, rows, model_dim)``.

    Raises:
        TypeError, ValueError: see :mod:`aiter_aux.validation`.
    """
    q = check_tensor(expert_out_q, "expert_out_q", torch.uint8, 2, "[rows, model_dim/2]")
    s = check_tensor(expert_out_scale, "expert_out_scale", torch.uint8, 2, "[rows, model_dim/32]")
    rows, cs = s.shape
    if cs == 0:
        raise ValueError("expert_out_scale must have model_dim/32 >= 1 columns, got 0")
    if tuple(q.shape) != (rows, 16 * cs):
        raise ValueError(
            f"expert_out_q must have shape [rows, model_dim/2] = {_shape_str((rows, 16 * cs))} "
            f"to match expert_out_scale {_shape_str(s.shape)}, got {_shape_str(q.shape)}"
        )
    m, rev, sw = _check_scatter_routing(reverse_sorted, sorted_weights, topk, rows)
    check_same_device(expert_out_q=q, expert_out_scale=s, reverse_sorted=rev, sorted_weights=sw)
    validate_scale(routed_scaling_factor)
    return m, rows, 32 * cs


def validate_moe_scatter_reduce_out(
    out: object, num_tokens: int, model_dim: int, device: torch.device
) -> None:
    """Check the output of ``moe_scatter_reduce[_q]_out``: bf16 2-D ``[>= M, model_dim]``,
    contiguous, on ``device``.  Only the first ``M`` rows are written.

    Raises:
        TypeError, ValueError: see :func:`check_buffer`.
    """
    check_buffer(out, "out", torch.bfloat16, num_tokens * model_dim, device, ndim=2, cols=model_dim)


def validate_reverse_sorted_range(reverse_sorted: torch.Tensor, rows: int) -> None:
    """Check that every row index ``p`` in ``reverse_sorted`` satisfies ``p < rows``.

    Negative entries are allowed (they mark non-local pairs and are skipped).  This reads the
    tensor (a device synchronisation on GPU), so backends call it only where it is cheap
    (CPU tensors); the reference always calls it.

    Raises:
        ValueError: some ``p >= rows``.
    """
    if reverse_sorted.numel() == 0:
        return
    p = int(reverse_sorted.max())
    if p >= rows:
        raise ValueError(
            f"reverse_sorted holds row index {p}, but expert_out has only {rows} rows "
            "(every p must be < rows)"
        )


# ------------------------------------------------------------------------- whole calls
# Every check of one ``<op>_out`` call, in the order the compiled binding makes them
# (csrc/kernels/mxfp4_moe/binding/torch_binding.h): inputs, output buffers, then overlap of
# written and read memory.  The reference and the fake implementations call these.


def _sort_reads(topk_ids, topk_weights, x, expert_map, zero_buf_init) -> dict:
    reads = {"topk_ids": topk_ids, "topk_weights": topk_weights}
    if x is not None:
        reads["x"] = x
    return {**reads, "expert_map": expert_map, "zero_buf_init": zero_buf_init}


def check_moe_sort_call(
    topk_ids,
    topk_weights,
    num_experts,
    block_m,
    out,
    zero_buf=None,
    expert_map=None,
    zero_buf_init=None,
) -> tuple[int, int, int, MoeSortOutput]:
    """All checks of ``moe_sort_out``; returns ``(M, topk, max_rows, out)``."""
    m, k, max_rows = validate_moe_sort(
        topk_ids, topk_weights, num_experts, block_m, zero_buf, expert_map, zero_buf_init
    )
    out = validate_moe_sort_out(out, m, k, max_rows, block_m, topk_ids.device)
    check_no_overlap(
        {**out._asdict(), "zero_buf": zero_buf},
        _sort_reads(topk_ids, topk_weights, None, expert_map, zero_buf_init),
    )
    return m, k, max_rows, out


def check_mxfp4_quant_call(x, a_q, a_scale, fp8: bool = False) -> tuple[int, int]:
    """All checks of ``mxfp4_quant_out`` (``mxfp8_quant_out`` with ``fp8``); returns
    ``(M, model_dim)``."""
    m, d = validate_mxfp4_quant(x)
    validate_mxfp4_quant_out(a_q, a_scale, m, d, x.device, fp8)
    check_no_overlap({"a_q": a_q, "a_scale": a_scale}, {"x": x})
    return m, d


def check_moe_sort_quant_call(
    topk_ids,
    topk_weights,
    x,
    num_experts,
    block_m,
    out,
    a_q,
    a_scale,
    zero_buf=None,
    expert_map=None,
    zero_buf_init=None,
    fp8: bool = False,
    sorted_scales=None,
) -> tuple[int, int, int, int, MoeSortOutput]:
    """All checks of ``moe_sort_quant_out`` (``moe_sort_quant_fp8_out`` with ``fp8``); returns
    ``(M, topk, max_rows, model_dim, out)``."""
    m, k, max_rows, d = validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf, expert_map, zero_buf_init,
        sorted_scales,
    )  # fmt: skip
    out = validate_moe_sort_out(out, m, k, max_rows, block_m, topk_ids.device)
    validate_mxfp4_quant_out(a_q, a_scale, m, d, x.device, fp8)
    check_no_overlap(
        {**out._asdict(), "a_q": a_q, "a_scale": a_scale, "zero_buf": zero_buf,
         "sorted_scales": sorted_scales},
        _sort_reads(topk_ids, topk_weights, x, expert_map, zero_buf_init),
    )  # fmt: skip
    return m, k, max_rows, d, out


def check_moe_sort_quant_alloc_call(
    topk_ids,
    topk_weights,
    x,
    num_experts,
    block_m,
    zero_buf=None,
    expert_map=None,
    zero_buf_init=None,
    sorted_scales=None,
) -> tuple[int, int, int, int]:
    """All checks of the allocating ``moe_sort_quant`` (``moe_sort_quant_fp8``): its inputs,
    then the caller's buffers ``zero_buf`` and ``sorted_scales`` against the inputs and each
    other; returns ``(M, topk, max_rows, model_dim)``."""
    sizes = validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf, expert_map, zero_buf_init,
        sorted_scales,
    )  # fmt: skip
    check_no_overlap(
        {"zero_buf": zero_buf, "sorted_scales": sorted_scales},
        _sort_reads(topk_ids, topk_weights, x, expert_map, zero_buf_init),
    )
    return sizes


def check_moe_sort_scales_call(
    a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales
) -> tuple[int, int, int, int]:
    """All checks of ``moe_sort_scales_out``; returns ``(M, model_dim, max_rows, out_rows)``."""
    sizes = validate_moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)
    validate_moe_sort_scales_out(sorted_scales, sizes[3], sizes[1], a_scale.device)
    check_no_overlap(
        {"sorted_scales": sorted_scales},
        {"a_scale": a_scale, "sorted_token_ids": sorted_token_ids, "num_valid_ids": num_valid_ids},
    )
    return sizes


def check_moe_scatter_reduce_call(
    expert_out, reverse_sorted, sorted_weights, topk, out, routed_scaling_factor=1.0
) -> tuple[int, int, int]:
    """All checks of ``moe_scatter_reduce_out`` but the row-index range; returns
    ``(M, rows, model_dim)``."""
    m, rows, d = validate_moe_scatter_reduce(
        expert_out, reverse_sorted, sorted_weights, topk, routed_scaling_factor
    )
    validate_moe_scatter_reduce_out(out, m, d, expert_out.device)
    check_no_overlap(
        {"out": out},
        {"expert_out": expert_out, "reverse_sorted": reverse_sorted,
         "sorted_weights": sorted_weights},
    )  # fmt: skip
    return m, rows, d


def check_moe_scatter_reduce_q_call(
    expert_out_q,
    expert_out_scale,
    reverse_sorted,
    sorted_weights,
    topk,
    out,
    routed_scaling_factor=1.0,
) -> tuple[int, int, int]:
    """All checks of ``moe_scatter_reduce_q_out`` but the row-index range; returns
    ``(M, rows, model_dim)``."""
    m, rows, d = validate_moe_scatter_reduce_q(
        expert_out_q,
        expert_out_scale,
        reverse_sorted,
        sorted_weights,
        topk,
        routed_scaling_factor,
    )
    validate_moe_scatter_reduce_out(out, m, d, expert_out_q.device)
    check_no_overlap(
        {"out": out},
        {"expert_out_q": expert_out_q, "expert_out_scale": expert_out_scale,
         "reverse_sorted": reverse_sorted, "sorted_weights": sorted_weights},
    )  # fmt: skip
    return m, rows, d
