"""Tensor checks: the helpers the generated validators (:mod:`._checks`) call, one per kind
of check, each the Python twin of a function of csrc/kernels/mxfp4_moe/binding/checks.h
with the same message.

Messages follow the conventions of :mod:`aiter_aux.validation`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ints import _kind

_i32, _f32, _bf16, _u8 = torch.int32, torch.float32, torch.bfloat16, torch.uint8
_floats = (torch.float32, torch.float16, torch.bfloat16)  # the table's dtype "float"
_ids = (torch.int32, torch.int64)  # the ids the wrappers take (codegen/checks.py WIDE_IDS)


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_tensor(
    t: object,
    name: str,
    dtype: torch.dtype | tuple[torch.dtype, ...],
    ndim: int | None = None,
    layout: str | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a dense (strided), contiguous ``torch.Tensor`` of ``dtype`` (or of
    one of the dtypes of a tuple) and,
    unless ``ndim`` is None, of rank ``ndim`` (``layout``, e.g. ``"[M, topk]"``, names the
    expected shape in the message).  Returns ``t``.

    Raises:
        TypeError: ``t`` is not a tensor, or has the wrong dtype.
        ValueError: ``t`` is sparse (or another non-strided layout), has the wrong rank or is
            not contiguous.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_kind(t)}")
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if isinstance(dtype, tuple):
        if t.dtype not in dtype:
            want = ", ".join(str(d) for d in dtype[:-1]) + f" or {dtype[-1]}"
            raise TypeError(f"{name} must have dtype {want}, got {t.dtype}")
    elif t.dtype != dtype:
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


_tensor = check_tensor


def _same_device(t: torch.Tensor, name: str, first: torch.Tensor, first_name: str) -> None:
    if t.device != first.device:
        raise ValueError(
            f"all tensors must be on one device: {name} is on {t.device}, {first_name} is on "
            f"{first.device}"
        )


def check_same_device(**tensors: torch.Tensor | None) -> torch.device | None:
    """Check that all the given (non-None) tensors live on one device; returns it."""
    first_name, first = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first = name, t
        else:
            _same_device(t, name, first, first_name)
    return None if first is None else first.device


def _check_shape(t: torch.Tensor, name: str, shape: tuple, layout: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {layout} = {_shape_str(shape)}, got {_shape_str(t.shape)}"
        )


def _buffer(
    buf: object,
    name: str,
    dtype: torch.dtype,
    needed: int,
    first: torch.Tensor,
    first_name: str,
    ndim: int,
    cols: int | None = None,
) -> torch.Tensor:
    """An output buffer: :func:`check_tensor`, on ``first``'s device, ``cols`` columns (2-D)
    and at least ``needed`` elements (rows beyond what is needed are not written)."""
    buf = check_tensor(buf, name, dtype, ndim)
    _same_device(buf, name, first, first_name)
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


def _group(value: object, name: str, type_name: str, members: tuple[str, ...]) -> tuple:
    """The tensors of an output group passed as one object (``out: MoeSortOutput``)."""
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str | bytes)
        or len(value) != len(members)
    ):
        raise TypeError(f"{name} must be a {type_name} ({', '.join(members)}), got {_kind(value)}")
    return tuple(value)


def _span(t: torch.Tensor | None) -> tuple[object, int, int] | None:
    """(where, first byte, end byte) of a contiguous tensor's memory: where is its device,
    or for a fake tensor of a trace its storage (views of one buffer share it); None when it
    has no bytes or no storage to compare (meta tensors, functional wrappers)."""
    if t is None or t.numel() == 0 or t.device.type == "meta":
        return None
    if _is_fake(t):
        try:
            where: object = ("storage", t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return None
        start = t.storage_offset() * t.element_size()
    else:
        where, start = t.device, t.data_ptr()
    return where, start, start + t.numel() * t.element_size()


def _is_fake(t: torch.Tensor) -> bool:
    """A FakeTensor (or functional wrapper of one) of a trace: no memory to compare."""
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def check_no_overlap(
    written: dict[str, torch.Tensor | None], read: dict[str, torch.Tensor | None]
) -> None:
    """Check that no written tensor (outputs, then written options) shares a byte with a
    read one or with an earlier written one: an op would read what it already overwrote,
    or write one result over another.  Pairs are checked in order: each written tensor
    against every read one, then against the written ones before it.

    While ``torch.compile`` traces Python code nothing is checked here; the ops' fake kernels
    check the fake tensors they are given by their storages (views of one buffer share one),
    so buffers that alias each other inside a compiled function are refused while tracing.

    Raises:
        ValueError: ``"<written> overlaps <other> in memory: ..."``.
    """
    if torch.compiler.is_dynamo_compiling():
        return
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


_no_overlap = check_no_overlap


def rows_in_range(reverse_sorted: torch.Tensor, rows: int) -> None:
    """Check that every row index ``p`` in ``reverse_sorted`` satisfies ``p < rows``
    (negative entries mark pairs that are not local).  Reads the tensor (a device
    synchronisation on GPU): the reference always runs it, the CPU binding too, the GPU
    binding never.

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


def check_expert_map(expert_map: object, device: torch.device) -> torch.Tensor | None:
    """The optional ``expert_map`` of the sort ops: int32 1-D, contiguous, on ``device``."""
    if expert_map is None:
        return None
    expert_map = check_tensor(expert_map, "expert_map", _i32, 1, "[num_global_experts]")
    if expert_map.device != device:
        raise ValueError(
            f"all tensors must be on one device: expert_map is on {expert_map.device}, "
            f"the inputs are on {device}"
        )
    return expert_map
