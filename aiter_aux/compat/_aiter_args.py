"""Argument checks and buffer views shared by the adapters of :mod:`aiter_aux.compat.aiter`.

Each helper checks one AITER argument (raising ``TypeError`` / ``ValueError`` that names it)
and returns the view of it that our op takes.  Imports torch and the ops lazily: importing
:mod:`aiter_aux.compat.aiter` must load and build nothing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def _torch() -> Any:
    import torch

    return torch


def _ops() -> Any:
    # Imported on first call: importing this module must build and load nothing.
    from .. import ops as aux_ops

    return aux_ops


def _int(value: object, name: str) -> int:
    from ..validation import validate_int

    return validate_int(value, name)


def _params(NE: object, TOPK: object, D_HIDDEN: object, MB: object) -> tuple[int, int, int, int]:
    from ..validation import BLOCK_M_VALUES, MAX_NUM_EXPERTS, MAX_TOPK

    ne, topk, d, mb = (_int(v, n) for v, n in ((NE, "NE"), (TOPK, "TOPK"),
                                               (D_HIDDEN, "D_HIDDEN"), (MB, "MB")))  # fmt: skip
    if not 1 <= ne <= MAX_NUM_EXPERTS:
        raise ValueError(f"NE (number of experts) must be in [1, {MAX_NUM_EXPERTS}], got {ne}")
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"TOPK must be in [1, {MAX_TOPK}], got {topk}")
    if d <= 0 or d % 32 != 0:
        raise ValueError(f"D_HIDDEN must be a positive multiple of 32, got {d}")
    if mb not in BLOCK_M_VALUES:
        raise ValueError(f"MB (block_m) must be one of {BLOCK_M_VALUES}, got {mb}")
    return ne, topk, d, mb


def _tensor(t: object, name: str) -> Tensor:
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        from ..validation.ints import _kind

        raise TypeError(f"{name} must be a torch.Tensor, got {_kind(t)}")
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got {t.layout}")
    return t


#: Our ops' argument names -> AITER's (docs/compat.md, "Argument mapping").
_AITER_NAMES = {"x": "a_input", "topk_weights": "topk_weight", "a_q": "a_quant",
                "zero_buf": "bf16_zero_out", "zero_buf_init": "bf16_out_init",
                "num_valid_ids": "cumsum_tensor", "expert_out": "flat_out",
                "expert_out_q": "flat_out_q", "expert_out_scale": "flat_out_scale"}  # fmt: skip
_OUR_NAME = re.compile(r"\b(" + "|".join(_AITER_NAMES) + r")\b(?= (?:must|is|has)\b)")


def _aiter_error(e: Exception) -> Exception:
    """``e`` (a TypeError / ValueError of our op) naming AITER's arguments where it names
    ours (``x must have dtype ...`` -> ``a_input must have dtype ...``)."""
    if type(e) not in (TypeError, ValueError):
        return e
    text = _OUR_NAME.sub(lambda m: _AITER_NAMES[m.group(1)], str(e))
    return e if text == str(e) else type(e)(text)


def _run(op: str, *args: Any, **kwargs: Any) -> None:
    """Our op ``op`` of :mod:`aiter_aux.ops` on ``args``; its TypeError / ValueError
    re-raised naming AITER's arguments (:func:`_aiter_error`)."""
    try:
        getattr(_ops(), op)(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise _aiter_error(e) from None


def _contiguous(t: Tensor, name: str) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (shape {list(t.shape)}, strides {tuple(t.stride())})"
        )
    return t


def _too_small(t: Tensor, name: str, what: str) -> ValueError:
    """The error of a buffer ``t`` that holds fewer elements than ``what`` says it needs."""
    return ValueError(f"{name} is too small: {what}, got {t.numel()} (shape {list(t.shape)})")


def _flat(t: object, name: str, dtype: Any, need: int, what: str) -> Tensor:
    """``t`` (dtype ``dtype``, contiguous, any shape, >= ``need`` elements) as 1-D."""
    t = _tensor(t, name)
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    _contiguous(t, name)
    if t.numel() < need:
        raise _too_small(t, name, f"{what} needs >= {need} elements")
    return t.view(-1)


def _bytes2d(t: object, name: str, allowed: tuple[Any, ...], rows: int, cols: int) -> Tensor:
    """The first ``rows * cols`` bytes of ``t`` (a contiguous 1-byte tensor of one of the
    ``allowed`` dtypes, any shape) as a uint8 ``[rows, cols]`` view."""
    torch = _torch()
    t = _tensor(t, name)
    if t.dtype not in allowed:
        names = " or ".join(str(a) for a in allowed)
        raise TypeError(f"{name} must have dtype {names}, got {t.dtype}")
    _contiguous(t, name)
    need = rows * cols
    if t.numel() < need:
        raise _too_small(t, name, f"[{rows}, {cols}] needs >= {need} bytes")
    return t.view(torch.uint8).view(-1)[:need].view(rows, cols)


def _q_dtypes() -> tuple[Any, ...]:
    torch = _torch()
    return (torch.uint8, torch.float4_e2m1fn_x2)


def _scale_dtypes() -> tuple[Any, ...]:
    torch = _torch()
    return (torch.uint8, torch.float8_e8m0fnu)


def _zero_target(buf: object, m: int, d: int, name: str = "bf16_zero_out") -> Tensor | None:
    """The first ``m * d`` elements of ``buf`` as a flat bf16 view, or None where ``buf`` is
    empty (AITER: ``numel() == 0`` means no zero-init)."""
    torch = _torch()
    buf = _tensor(buf, name)
    if buf.numel() == 0:
        return None
    if buf.element_size() != 2:
        raise TypeError(f"{name} must have a 2-byte dtype (bfloat16), got {buf.dtype}")
    _contiguous(buf, name)
    need = m * d
    if buf.numel() < need:
        raise _too_small(buf, name, f"AITER zeroes M * D_HIDDEN = {m} * {d} = {need} elements")
    if need == 0:
        return None
    return buf.view(-1)[:need].view(torch.bfloat16)


def _a_input(a_input: object, d: int) -> tuple[Tensor, int]:
    """``a_input`` (``[M, D_HIDDEN]``) and its M."""
    x = _tensor(a_input, "a_input")
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"a_input must be [M, D_HIDDEN] with D_HIDDEN = {d}, got {list(x.shape)}")
    return x, x.shape[0]


def _quant_targets(a_quant: object, a_scale: object, bf16_zero_out: object,
                   bf16_out_init: object, m: int, d: int) -> tuple[Any, ...]:  # fmt: skip
    """The quant's outputs ``(a_quant, a_scale)`` as uint8 ``[M, D_HIDDEN/2]`` and ``[M,
    D_HIDDEN/32]`` views, then the zero-init's target and source
    (:func:`_zero_target`, :func:`_init_source`)."""
    aq = _bytes2d(a_quant, "a_quant", _q_dtypes(), m, d // 2)
    asc = _bytes2d(a_scale, "a_scale", _scale_dtypes(), m, d // 32)
    zero = _zero_target(bf16_zero_out, m, d)
    return aq, asc, zero, _init_source(bf16_out_init, bf16_zero_out, zero)


def _workspace_target(ws: object) -> Tensor | None:
    """The bytes of ``bf16_zero_workspace`` AITER zeroes (the first ``floor(nbytes/16)*16``)."""
    torch = _torch()
    ws = _tensor(ws, "bf16_zero_workspace")
    if ws.numel() == 0:
        return None
    _contiguous(ws, "bf16_zero_workspace")
    n = ws.numel() * ws.element_size() // 16 * 16
    return ws.view(-1).view(torch.uint8)[:n] if n else None


# AITER's three-stage sort (``prologue == 1``) takes its scratch from ``sort3stage_ws``: int32
# block offsets of kSplitSortCtas CTAs per expert, then one count per expert; kSplitSortCtas is
# 16 (csrc/kernels/mxfp4_moe/moe_aux/codegen/mxfp4_moe_aux_dispatch.h).
SORT3STAGE_CTAS = 16


def _check_sort3stage_ws(ws: object, ne: int, prologue: int) -> None:
    """AITER's check of ``sort3stage_ws``: with ``prologue == 1`` an int32 tensor of at least
    ``NE * 16 + NE`` elements; otherwise any tensor (AITER does not touch it).  Our sort
    needs no scratch: the buffer is never read or written here."""
    torch = _torch()
    ws = _tensor(ws, "sort3stage_ws")
    if prologue != 1:
        return
    if ws.dtype != torch.int32:
        raise TypeError(f"sort3stage_ws must have dtype torch.int32, got {ws.dtype}")
    need = ne * SORT3STAGE_CTAS + ne
    if ws.numel() < need:
        raise _too_small(ws, "sort3stage_ws", f"prologue = 1 (AITER's three-stage sort) "
                         f"needs >= NE*{SORT3STAGE_CTAS} + NE = {need} int32 elements with "
                         f"NE = {ne}")  # fmt: skip


def _init_source(init: object, zero_out: Tensor, zero: Tensor | None) -> Tensor | None:
    """The first ``zero.numel()`` (``M*D_HIDDEN``) elements of ``bf16_out_init`` as a flat bf16
    view: what AITER copies into ``bf16_zero_out`` instead of zeros.  None where AITER zeroes
    (``bf16_out_init`` None or empty) or initialises nothing (``zero`` None: ``bf16_zero_out``
    empty, ``M == 0``, or the three-stage sort); ``bf16_out_init`` is then only type-checked."""
    torch = _torch()
    if init is None:
        return None
    init = _tensor(init, "bf16_out_init")
    if zero is None or init.numel() == 0:
        return None
    if init.dtype != zero_out.dtype:
        raise TypeError(
            f"bf16_out_init must have the dtype of bf16_zero_out ({zero_out.dtype}), "
            f"got {init.dtype}"
        )
    _contiguous(init, "bf16_out_init")
    need = zero.numel()
    if init.numel() < need:
        raise _too_small(init, "bf16_out_init", f"its first M*D_HIDDEN = {need} elements "
                         "are copied into bf16_zero_out")  # fmt: skip
    if init.device != zero.device:
        raise ValueError(
            f"bf16_out_init is on {init.device}, bf16_zero_out on {zero.device}: both must be "
            "on one device"
        )
    return init.view(-1)[:need].view(torch.bfloat16)


def _routing(topk_ids: object, topk_weight: object, topk: int, m: int, m_name: str) -> tuple:
    ids = _tensor(topk_ids, "topk_ids")
    w = _tensor(topk_weight, "topk_weight")
    if ids.dim() != 2 or ids.shape[1] != topk:
        raise ValueError(
            f"topk_ids must be [M, TOPK] with TOPK = {topk}, got shape {list(ids.shape)}"
        )
    if w.shape != ids.shape:
        raise ValueError(
            f"topk_weight must have the shape of topk_ids {list(ids.shape)}, got {list(w.shape)}"
        )
    if not 0 <= m <= ids.shape[0]:
        raise ValueError(
            f"{m_name} = {m} must lie in [0, topk_ids.shape[0] = {ids.shape[0]}]: AITER sorts "
            f"the first {m_name} rows of topk_ids"
        )
    return ids[:m], w[:m]


def _aiter_capacity(m: int, topk: int, ne: int, mb: int) -> int:
    """The sort capacity AITER's callers allocate (fused_moe._adaptive_moe_sort)."""
    pairs = m * topk
    return (pairs + min(ne, pairs) * (mb - 1) + mb - 1) // mb * mb


def _sort_buffers(
    m: int,
    topk: int,
    ne: int,
    mb: int,
    sorted_token_ids: object,
    sorted_weights: object,
    m_indices: object,
    sorted_expert_ids: object,
    cumsum_tensor: object,
    reverse_sorted: object,
) -> tuple[Any, list[tuple[Tensor, Tensor]], dict[str, Tensor]]:
    """Our ``MoeSortOutput`` for AITER's sort buffers, the (caller, scratch) pairs to copy
    back after the op (docs/compat.md, "Sort capacity"), and the caller's buffers by name."""
    torch = _torch()
    ops = _ops()
    cap = ops.moe_sort_capacity(m, topk, ne, mb)
    tight = _aiter_capacity(m, topk, ne, mb)
    i32, f32 = torch.int32, torch.float32
    spec = (
        ("sorted_token_ids", sorted_token_ids, i32, cap, tight),
        ("sorted_weights", sorted_weights, f32, cap, tight),
        ("m_indices", m_indices, i32, cap, tight),
        ("sorted_expert_ids", sorted_expert_ids, i32, cap // mb, tight // mb),
    )
    bufs: list[Tensor] = []
    copies: list[tuple[Tensor, Tensor]] = []
    named: dict[str, Tensor] = {}
    for name, buf, dtype, need, least in spec:
        what = f"round_up(M*TOPK + min(NE, M*TOPK)*(MB-1), MB){' / MB' if need != cap else ''}"
        flat = _flat(buf, name, dtype, least, f"M={m}, TOPK={topk}, NE={ne}, MB={mb}: {what}")
        named[name] = flat
        if flat.numel() >= need:
            bufs.append(flat)
            continue
        scratch = torch.empty(need, dtype=dtype, device=flat.device)
        scratch[: flat.numel()].copy_(flat)
        copies.append((flat, scratch[: flat.numel()]))
        bufs.append(scratch)
    named["cumsum_tensor"] = _flat(cumsum_tensor, "cumsum_tensor", i32, 2, "[rows, M]")
    named["reverse_sorted"] = _flat(reverse_sorted, "reverse_sorted", i32, m * topk, "M*TOPK")
    out = ops.MoeSortOutput(
        bufs[0], bufs[1], bufs[2], bufs[3], named["cumsum_tensor"], named["reverse_sorted"]
    )
    return out, copies, named


def _no_overlap(written: dict[str, Tensor | None], read: dict[str, Tensor]) -> None:
    from ..validation import check_no_overlap

    check_no_overlap(written, read)


def _scatter_common(
    out: object, reverse_sorted: object, sorted_weights: object, topk: int, d: int
) -> tuple[Tensor, Tensor, Tensor]:
    torch = _torch()
    o = _tensor(out, "out")
    if o.dim() != 2 or o.shape[1] != d:
        raise ValueError(f"out must be [M, D_HIDDEN] with D_HIDDEN = {d}, got {list(o.shape)}")
    m = o.shape[0]
    rev = _flat(reverse_sorted, "reverse_sorted", torch.int32, m * topk,
                f"M*TOPK with M = out.shape[0] = {m}")[: m * topk]  # fmt: skip
    sw = _flat(sorted_weights, "sorted_weights", torch.float32, 0, "")
    return o, rev, sw


def _rows(t: Tensor, name: str, cols: int, dtype_ok: tuple[Any, ...]) -> Tensor:
    """``t`` (contiguous, last size ``cols``, any rank) as a 2-D ``[rows, cols]`` view."""
    if t.dtype not in dtype_ok:
        names = " or ".join(str(a) for a in dtype_ok)
        raise TypeError(f"{name} must have dtype {names}, got {t.dtype}")
    _contiguous(t, name)
    if t.dim() < 1 or t.shape[-1] != cols:
        raise ValueError(f"{name} must be [rows, {cols}], got shape {list(t.shape)}")
    return t.view(-1, cols)
