"""Input checks shared by the reference (:mod:`aiter_aux.reference`) and the compiled ops.

Every public op validates its arguments here *before* any computation or kernel launch, so
the reference and every backend reject exactly the same inputs with the same messages.

Conventions (see docs/ops.md):

* A tensor argument that is not a :class:`torch.Tensor` raises :class:`TypeError`.
* A tensor with the wrong dtype raises :class:`TypeError` naming the argument, the expected
  dtype and the dtype it got.
* A wrong rank or shape, a non-contiguous tensor, tensors on different devices, an int out of
  range and an output buffer that is too small raise :class:`ValueError` naming the argument
  and the rule that was broken.
* Int arguments must be Python ints (or objects with ``__index__``, such as numpy ints);
  ``bool`` and floats raise :class:`TypeError`.

Each ``validate_<op>`` function checks the inputs of one op and returns the sizes derived
from them; each ``validate_<op>_out`` function checks the caller-provided output buffers
against those sizes.  The small ``validate_<int>`` functions work on plain ints, so limits
such as ``M < 2**24`` can be checked without allocating large tensors.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from aiter_aux.types import MoeSortOutput

__all__ = [
    "BLOCK_M_VALUES",
    "MAX_NUM_EXPERTS",
    "MAX_NUM_TOKENS",
    "MAX_TOPK",
    "MAX_ROWS_LIMIT",
    "check_tensor",
    "check_same_device",
    "check_buffer",
    "check_zero_buf",
    "validate_int",
    "validate_num_experts",
    "validate_block_m",
    "validate_topk",
    "validate_num_tokens",
    "validate_model_dim",
    "validate_sort_sizes",
    "validate_moe_sort",
    "validate_moe_sort_out",
    "validate_mxfp4_quant",
    "validate_mxfp4_quant_out",
    "validate_moe_sort_quant",
    "validate_moe_sort_scales",
    "validate_moe_sort_scales_out",
    "validate_moe_scatter_reduce",
    "validate_moe_scatter_reduce_q",
    "validate_moe_scatter_reduce_out",
    "validate_reverse_sorted_range",
]

#: Allowed values of ``block_m`` (rows per sorted block).
BLOCK_M_VALUES: tuple[int, ...] = (16, 32, 64, 128)
#: ``num_experts`` must lie in ``[1, MAX_NUM_EXPERTS]``.
MAX_NUM_EXPERTS = 1024
#: ``topk`` must lie in ``[1, MAX_TOPK]`` (k is packed in the top 8 bits of sorted_token_ids).
MAX_TOPK = 255
#: ``M`` must be ``< MAX_NUM_TOKENS`` (t is packed in the low 24 bits of sorted_token_ids).
MAX_NUM_TOKENS = 1 << 24
#: ``max_rows`` must fit in int32 (rows are stored as int32 in reverse_sorted/num_valid_ids).
MAX_ROWS_LIMIT = (1 << 31) - 1


# --------------------------------------------------------------------------------------------
# Generic tensor checks
# --------------------------------------------------------------------------------------------


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_tensor(
    t: object,
    name: str,
    dtype: torch.dtype,
    ndim: int | None = None,
    layout: str | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a contiguous ``torch.Tensor`` of ``dtype`` (and rank ``ndim``).

    Args:
        t: the object to check.
        name: the argument name used in error messages.
        dtype: the required dtype.
        ndim: the required rank, or None for any rank.
        layout: a human-readable shape such as ``"[M, topk]"`` used in the rank message.

    Returns:
        ``t`` itself.

    Raises:
        TypeError: ``t`` is not a tensor, or has the wrong dtype.
        ValueError: ``t`` has the wrong rank or is not contiguous.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        what = f" {layout}" if layout else ""
        raise ValueError(
            f"{name} must be a {ndim}-D tensor{what}, got {t.dim()}-D shape {_shape_str(t.shape)}"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (shape {_shape_str(t.shape)}, strides {tuple(t.stride())})"
        )
    return t


def check_same_device(**tensors: torch.Tensor | None) -> torch.device | None:
    """Check that all the given (non-None) tensors live on one device.

    Args:
        **tensors: named tensors; None values are ignored.

    Returns:
        The common device, or None if no tensor was given.

    Raises:
        ValueError: two tensors are on different devices (the message lists all of them).
    """
    device = None
    for t in tensors.values():
        if t is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            where = ", ".join(f"{n} on {v.device}" for n, v in tensors.items() if v is not None)
            raise ValueError(f"all tensors must be on one device, got {where}")
    return device


def check_buffer(
    buf: object,
    name: str,
    dtype: torch.dtype,
    needed: int,
    device: torch.device,
    *,
    ndim: int | None = None,
    cols: int | None = None,
) -> torch.Tensor:
    """Check an output buffer: tensor, dtype, rank, contiguity, device and size.

    Args:
        buf: the buffer to check.
        name: the argument name used in error messages.
        dtype: the required dtype.
        needed: the minimum number of elements the op writes.
        device: the device of the op's inputs.
        ndim: the required rank, or None for any rank.
        cols: for 2-D buffers, the required size of the last dimension (rows may exceed
            what is needed; the extra rows are not written).

    Returns:
        ``buf`` itself.

    Raises:
        TypeError: not a tensor, or wrong dtype.
        ValueError: wrong rank or column count, not contiguous, on another device, or fewer
            than ``needed`` elements (``"buffer too small: <name> needs >= N elements, got K"``).
    """
    buf = check_tensor(buf, name, dtype, ndim)
    if buf.device != device:
        raise ValueError(
            f"all tensors must be on one device: {name} is on {buf.device}, inputs on {device}"
        )
    if cols is not None and buf.shape[-1] != cols:
        raise ValueError(
            f"{name} must have {cols} columns (shape [rows, {cols}]), "
            f"got shape {_shape_str(buf.shape)}"
        )
    if buf.numel() < needed:
        raise ValueError(f"buffer too small: {name} needs >= {needed} elements, got {buf.numel()}")
    return buf


def check_zero_buf(zero_buf: object, device: torch.device) -> torch.Tensor | None:
    """Check the optional ``zero_buf`` of the sort ops: bf16, contiguous, any shape, on ``device``.

    The op zeroes all ``zero_buf.numel()`` elements.

    Raises:
        TypeError: not a tensor or not bfloat16.
        ValueError: not contiguous, or on another device than the inputs.
    """
    if zero_buf is None:
        return None
    zero_buf = check_tensor(zero_buf, "zero_buf", torch.bfloat16)
    if zero_buf.device != device:
        raise ValueError(
            f"all tensors must be on one device: zero_buf is on {zero_buf.device}, "
            f"inputs on {device}"
        )
    return zero_buf


# --------------------------------------------------------------------------------------------
# Int checks (no tensors needed)
# --------------------------------------------------------------------------------------------


def validate_int(value: object, name: str) -> int:
    """Return ``value`` as an int; ``bool``, floats and other non-integers raise TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def validate_num_experts(num_experts: object) -> int:
    """Check ``1 <= num_experts <= 1024``; return it as an int (TypeError / ValueError)."""
    n = validate_int(num_experts, "num_experts")
    if not 1 <= n <= MAX_NUM_EXPERTS:
        raise ValueError(f"num_experts must be in [1, {MAX_NUM_EXPERTS}], got {n}")
    return n


def validate_block_m(block_m: object) -> int:
    """Check ``block_m in {16, 32, 64, 128}``; return it as an int (TypeError / ValueError)."""
    b = validate_int(block_m, "block_m")
    if b not in BLOCK_M_VALUES:
        raise ValueError(f"block_m must be one of {BLOCK_M_VALUES}, got {b}")
    return b


def validate_topk(topk: object) -> int:
    """Check ``1 <= topk <= 255``; return it as an int (TypeError / ValueError)."""
    k = validate_int(topk, "topk")
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk must be in [1, {MAX_TOPK}], got {k}")
    return k


def validate_num_tokens(num_tokens: object) -> int:
    """Check ``0 <= M < 2**24`` (the sort packs t in 24 bits); return it as an int.

    Raises:
        TypeError: not an int.
        ValueError: out of range.
    """
    m = validate_int(num_tokens, "num_tokens")
    if not 0 <= m < MAX_NUM_TOKENS:
        raise ValueError(f"num_tokens (M) must be in [0, 2**24), got {m}")
    return m


def validate_model_dim(model_dim: object, multiple: int) -> int:
    """Check that ``model_dim`` is a positive multiple of ``multiple`` (32 for quant, 256 for
    sort_scales); return it as an int (TypeError / ValueError)."""
    d = validate_int(model_dim, "model_dim")
    if d <= 0 or d % multiple != 0:
        raise ValueError(f"model_dim must be a positive multiple of {multiple}, got {d}")
    return d


def validate_sort_sizes(
    num_tokens: object, topk: object, num_experts: object, block_m: object
) -> int:
    """Check the sizes of a sort and return its capacity ``max_rows``.

    ``max_rows = round_up(M * topk + num_experts * (block_m - 1), block_m)``.

    Raises:
        TypeError: an argument is not an int.
        ValueError: ``M`` not in ``[0, 2**24)``, ``topk`` not in ``[1, 255]``, ``num_experts``
            not in ``[1, 1024]``, ``block_m`` not in ``{16, 32, 64, 128}``, or ``max_rows``
            does not fit in int32 (rows are stored as int32).
    """
    m = validate_num_tokens(num_tokens)
    k = validate_topk(topk)
    e = validate_num_experts(num_experts)
    b = validate_block_m(block_m)
    need = m * k + e * (b - 1)
    max_rows = (need + b - 1) // b * b
    if max_rows > MAX_ROWS_LIMIT:
        raise ValueError(
            f"max_rows = round_up(M*topk + num_experts*(block_m-1), block_m) = {max_rows} "
            f"must fit in int32 (<= {MAX_ROWS_LIMIT}); M={m}, topk={k}"
        )
    return max_rows


# --------------------------------------------------------------------------------------------
# Per-op checks
# --------------------------------------------------------------------------------------------


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
) -> tuple[int, int, int]:
    """Check the inputs of ``moe_sort``.

    Args:
        topk_ids: int32 ``[M, topk]``, contiguous.
        topk_weights: float32 ``[M, topk]``, contiguous, same device.
        num_experts: ``1 <= num_experts <= 1024``.
        block_m: one of 16, 32, 64, 128.
        zero_buf: None, or a contiguous bf16 tensor of any shape on the same device.

    Returns:
        ``(M, topk, max_rows)``.

    Raises:
        TypeError, ValueError: see the module docstring.
    """
    ids, w = _check_routing(topk_ids, topk_weights)
    check_same_device(topk_ids=ids, topk_weights=w)
    check_zero_buf(zero_buf, ids.device)
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
    """Check the input of ``mxfp4_quant``: ``x`` bf16 ``[M, model_dim]`` contiguous, with
    ``model_dim`` a positive multiple of 32.

    Returns:
        ``(M, model_dim)``.

    Raises:
        TypeError, ValueError: see the module docstring.
    """
    x = check_tensor(x, "x", torch.bfloat16, 2, "[M, model_dim]")
    m, d = x.shape
    validate_model_dim(d, 32)
    return m, d


def validate_mxfp4_quant_out(
    a_q: object, a_scale: object, num_tokens: int, model_dim: int, device: torch.device
) -> None:
    """Check the outputs of ``mxfp4_quant_out``: ``a_q`` uint8 2-D ``[>= M, model_dim / 2]`` and
    ``a_scale`` uint8 2-D ``[>= M, model_dim / 32]``, contiguous, on ``device``.

    Raises:
        TypeError, ValueError: see :func:`check_buffer`.
    """
    cq, cs = model_dim // 2, model_dim // 32
    check_buffer(a_q, "a_q", torch.uint8, num_tokens * cq, device, ndim=2, cols=cq)
    check_buffer(a_scale, "a_scale", torch.uint8, num_tokens * cs, device, ndim=2, cols=cs)


def validate_moe_sort_quant(
    topk_ids: object,
    topk_weights: object,
    x: object,
    num_experts: object,
    block_m: object,
    zero_buf: object = None,
) -> tuple[int, int, int, int]:
    """Check the inputs of ``moe_sort_quant``: those of ``moe_sort`` and ``mxfp4_quant``, with
    ``x.shape[0] == topk_ids.shape[0]`` and all tensors on one device.

    Returns:
        ``(M, topk, max_rows, model_dim)``.

    Raises:
        TypeError, ValueError: see the module docstring.
    """
    ids, w = _check_routing(topk_ids, topk_weights)
    mx, d = validate_mxfp4_quant(x)
    check_same_device(topk_ids=ids, topk_weights=w, x=x)
    check_zero_buf(zero_buf, ids.device)
    m, k = ids.shape
    if mx != m:
        raise ValueError(f"x must have M = topk_ids.shape[0] = {m} rows, got {mx}")
    max_rows = validate_sort_sizes(m, k, num_experts, block_m)
    return m, k, max_rows, d


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
        TypeError, ValueError: see the module docstring.
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
    bm = max(32, b)
    out_rows = (max_rows + bm - 1) // bm * bm
    return m, cols * 32, max_rows, out_rows


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
    expert_out: object, reverse_sorted: object, sorted_weights: object, topk: object
) -> tuple[int, int, int]:
    """Check the inputs of ``moe_scatter_reduce``.

    Args:
        expert_out: bf16 ``[rows, model_dim]``, contiguous, ``model_dim >= 1``.
        reverse_sorted: int32 1-D ``[M * topk]``.
        sorted_weights: float32 1-D with at least ``rows`` elements.
        topk: ``1 <= topk <= 255``.

    Returns:
        ``(M, rows, model_dim)``.

    Raises:
        TypeError, ValueError: see the module docstring.  Row indices in ``reverse_sorted``
        are not read here; see :func:`validate_reverse_sorted_range`.
    """
    eo = check_tensor(expert_out, "expert_out", torch.bfloat16, 2, "[rows, model_dim]")
    rows, d = eo.shape
    if d == 0:
        raise ValueError("expert_out must have model_dim >= 1 columns, got 0")
    m, rev, sw = _check_scatter_routing(reverse_sorted, sorted_weights, topk, rows)
    check_same_device(expert_out=eo, reverse_sorted=rev, sorted_weights=sw)
    return m, rows, d


def validate_moe_scatter_reduce_q(
    expert_out_q: object,
    expert_out_scale: object,
    reverse_sorted: object,
    sorted_weights: object,
    topk: object,
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
        TypeError, ValueError: see the module docstring.
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
