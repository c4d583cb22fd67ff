"""The one parser of shape text and integer lists (stdlib only).

A catalog shape is ``(expert, model_dim, inter, topk)``; ``inter`` is rounded up to a
multiple of 256 (:func:`round_inter`, the catalog's rule in ``codegen/catalog.py``) before
it is looked up or stored.  Text forms:

* ``"E,MODEL_DIM,INTER,TOPK"`` -- :func:`parse_shape` (``aiter-aux run --shape``,
  ``add-shape`` / ``remove-shape``); spaces are ignored, negative numbers parse (so that
  :func:`range_errors` can refuse them with a message naming the field);
* ``"E,D,I,K;E,D,I,K"`` -- :func:`parse_shapes` (e.g. ``AITER_AUX_PREBUILD_SHAPES``);
* ``"1,16,512"`` -- :func:`parse_ints` (``aiter-aux run --tokens``).

Every error is a :class:`ShapeError` (a ``ValueError``) with a one-line message.
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1
FIELDS = ("expert", "model_dim", "inter", "topk")

Shape = tuple[int, int, int, int]


class ShapeError(ValueError):
    """Shape text that does not parse, or a field out of its range."""


def parse_ints(text: str, what: str | None = None, *, lo: int | None = None,
               hi: int | None = None) -> list[int]:  # fmt: skip
    """``"1, 16,512"`` -> ``[1, 16, 512]``; refuses an empty list, an empty item
    (``"1,,2"``), a non-integer and a value outside ``[lo, hi]``.  ``what`` prefixes the
    error messages."""
    pre = f"{what}: " if what else ""
    items = [p.strip() for p in str(text).split(",")]
    if items == [""]:
        raise ShapeError(f"{pre}empty; give comma-separated integers, e.g. 1,16,512")
    values = []
    for i, item in enumerate(items, 1):
        if not item:
            raise ShapeError(f"{pre}item {i} of {text.strip()!r} is empty")
        try:
            value = int(item)
        except ValueError:
            raise ShapeError(f"{pre}{item!r} is not an integer") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
            raise ShapeError(f"{pre}{value} is outside {bounds}")
        values.append(value)
    return values


def parse_shape(text: str) -> Shape:
    """``"E,MODEL_DIM,INTER,TOPK"`` -> 4 ints, as written (``inter`` not rounded)."""
    try:
        values = parse_ints(text.replace(" ", ""))
    except ShapeError as e:
        raise ShapeError(
            f"expected E,MODEL_DIM,INTER,TOPK (4 integers), got {text!r}: {e}"
        ) from None
    if len(values) != 4:
        raise ShapeError(
            f"expected E,MODEL_DIM,INTER,TOPK (4 integers), got {len(values)} in {text!r}"
        )
    return tuple(values)  # type: ignore[return-value]


def parse_shapes(text: str, what: str = "shapes") -> list[Shape]:
    """``"256,3072,256,8;128,3072,512,4"`` (``;`` or newlines between shapes) -> shapes."""
    items = [s for s in text.replace("\n", ";").split(";") if s.strip()]
    if not items:
        raise ShapeError(f"{what} is set but names no shape")
    try:
        return [parse_shape(item) for item in items]
    except ShapeError as e:
        raise ShapeError(f"{what}: {e}") from None


def round_inter(inter: int) -> int:
    """``inter`` rounded up to a multiple of 256: ``round_inter`` of ``codegen/catalog.py``."""
    from .jit.paths import codegen_module

    return codegen_module("catalog").round_inter(inter)


def normalize(shape) -> Shape:
    """The catalog form of ``shape``: 4 ints, ``inter`` rounded up to 256."""
    e, d, inter, k = (int(v) for v in shape)
    return (e, d, round_inter(inter), k)


def range_errors(shape) -> list[str]:
    """Fields that are not positive or do not fit a C ``int`` (the kernels' template
    parameters are ints, and ``inter`` must stay one after rounding)."""
    errors = []
    for name, value in zip(FIELDS, shape, strict=True):
        stored = round_inter(value) if name == "inter" and value > 0 else value
        if value <= 0:
            errors.append(f"{name} must be positive, got {value}")
        elif stored != value and stored > INT32_MAX:
            errors.append(
                f"{name} {value} rounds up to {stored} (a multiple of 256), which does not "
                f"fit a 32-bit int (max {INT32_MAX})"
            )
        elif value > INT32_MAX:
            errors.append(f"{name} {value} does not fit a 32-bit int (max {INT32_MAX})")
    return errors
