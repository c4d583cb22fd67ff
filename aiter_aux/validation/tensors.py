"""Generic tensor checks: type, dtype, rank, contiguity, device and output-buffer size.

Messages follow the conventions of :mod:`aiter_aux.validation`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
            than ``needed`` elements (``"buffer too small: <name> needs >= N elements, got K"``,
            and for 2-D buffers `` (>= R rows of C)``).
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
        rows = f" (>= {-(-needed // cols)} rows of {cols})" if cols else ""
        raise ValueError(
            f"buffer too small: {name} needs >= {needed} elements, got {buf.numel()}{rows}"
        )
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


def check_expert_map(expert_map: object, device: torch.device) -> torch.Tensor | None:
    """Check the optional ``expert_map`` of the sort ops: int32 1-D
    ``[num_global_experts]``, contiguous, on ``device``.  Its values are not read here: a
    value < 0 or >= num_experts makes the pair not local.

    Raises:
        TypeError: not a tensor or not int32.
        ValueError: not 1-D, not contiguous, or on another device than the inputs.
    """
    if expert_map is None:
        return None
    expert_map = check_tensor(expert_map, "expert_map", torch.int32, 1, "[num_global_experts]")
    if expert_map.device != device:
        raise ValueError(
            f"all tensors must be on one device: expert_map is on {expert_map.device}, "
            f"inputs on {device}"
        )
    return expert_map


def check_zero_buf_init(
    zero_buf_init: object, zero_buf: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """Check the optional ``zero_buf_init`` of the sort ops: bf16, contiguous, the element
    count of ``zero_buf`` (which must be given), on ``device``.  Its elements are copied
    into ``zero_buf`` (bit for bit) instead of zeros.

    Raises:
        TypeError: not a tensor or not bfloat16.
        ValueError: no ``zero_buf``, another element count, not contiguous, another device.
    """
    if zero_buf_init is None:
        return None
    if zero_buf is None:
        raise ValueError("zero_buf_init needs zero_buf (the buffer it is copied into)")
    zero_buf_init = check_tensor(zero_buf_init, "zero_buf_init", torch.bfloat16)
    if zero_buf_init.numel() != zero_buf.numel():
        raise ValueError(
            f"zero_buf_init must have the {zero_buf.numel()} elements of zero_buf, "
            f"got {zero_buf_init.numel()}"
        )
    if zero_buf_init.device != device:
        raise ValueError(
            f"all tensors must be on one device: zero_buf_init is on {zero_buf_init.device}, "
            f"inputs on {device}"
        )
    return zero_buf_init


def _span(t: torch.Tensor | None) -> tuple[torch.device, int, int] | None:
    """(device, first byte, end byte) of a contiguous tensor's memory; None when it has no
    bytes or no real storage (meta and fake tensors of a trace)."""
    if t is None or t.numel() == 0 or t.device.type == "meta" or _is_fake(t):
        return None
    start = t.data_ptr()
    return t.device, start, start + t.numel() * t.element_size()


def _is_fake(t: torch.Tensor) -> bool:
    """A FakeTensor (or functional wrapper of one) of a trace: no memory to compare."""
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def check_no_overlap(
    written: dict[str, torch.Tensor | None], read: dict[str, torch.Tensor]
) -> None:
    """Check that no written tensor (outputs, then ``zero_buf``) shares a byte with an input
    or with an earlier written tensor: an op would read what it already overwrote, or write
    one result over another.  Pairs are checked in order: each written tensor against every
    input, then against the written ones before it.

    Raises:
        ValueError: ``"<written> overlaps <other> in memory: ..."``.
    """
    spans: list[tuple[str, tuple]] = []
    inputs = [(n, sp) for n, t in read.items() if (sp := _span(t)) is not None]
    for name, t in written.items():
        mine = _span(t)
        if mine is None:
            continue
        for other, sp in inputs + spans:
            if sp[0] == mine[0] and mine[1] < sp[2] and sp[1] < mine[2]:
                raise ValueError(
                    f"{name} overlaps {other} in memory: an output (or zero_buf) must not "
                    "share memory with an input or another output"
                )
        spans.append((name, mine))
