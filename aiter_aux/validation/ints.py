"""Int and float checks, and the size formulas of the sort, on plain ints (so that limits
such as ``M < 2**24`` can be checked without allocating large tensors).

The limits themselves are the op table's (``codegen/limits.py``), generated into
:mod:`aiter_aux.limits` (``BLOCK_M_VALUES``, ``MAX_NUM_EXPERTS``, ...).  Messages follow the
conventions of :mod:`aiter_aux.validation`.
"""

from __future__ import annotations

import operator


def _kind(value: object) -> str:
    """The name of ``value``'s type in a message: a builtin's name, else qualified by its
    module (``numpy.bool``, not ``bool``)."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def validate_int(value: object, name: str) -> int:
    """Return ``value`` as an int; ``bool``, floats and other non-integers raise TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {_kind(value)}") from None


_int = validate_int


FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32


def validate_scale(value: object, name: str = "routed_scaling_factor") -> float:
    """Return ``value`` as a float: a Python int or float (or a numpy scalar of one); a
    bool, a tensor (0-dim included) or anything else raises TypeError, an int too large for
    a float, a NaN, or a value beyond float32's range (the kernels' type) ValueError (the
    binding's ``check_finite`` is the C++ twin)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        if type(value).__module__ != "numpy" or kind not in ("i", "u", "f") or getattr(
                value, "ndim", 1) != 0:  # fmt: skip
            raise TypeError(f"{name} must be a float, got {_kind(value)}")
        value = value.item()  # a numpy scalar: its Python int or float
    try:
        f = float(value)
    except OverflowError:
        raise ValueError(
            f"{name} does not fit a float: got an int of {value.bit_length()} bits"
        ) from None
    if not abs(f) <= FLOAT32_MAX:  # NaN too; the kernels compute in float32
        raise ValueError(
            f"{name} must be a finite float32 number (|x| <= {FLOAT32_MAX!r}), got {f!r}"
        )
    return f


_float = validate_scale


def sort_capacity(num_tokens: int, topk: int, num_experts: int, block_m: int) -> int:
    """``max_rows = round_up(M * topk + num_experts * (block_m - 1), block_m)``: every local
    pair takes one row and each expert's segment wastes at most ``block_m - 1`` rows of
    padding (the C twin: ``aiter_aux_sort_capacity`` of the ABI header).  Plain ints,
    unchecked; :func:`moe_sort_capacity` checks them."""
    return (num_tokens * topk + num_experts * (block_m - 1) + block_m - 1) // block_m * block_m


def vllm_align_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """vLLM's ``sorted_token_ids`` length without ``pad_sorted_ids``: ``numel + num_experts *
    (block_size - 1)``, at most ``numel * block_size`` when ``numel < num_experts`` (the C
    twin: ``aiter_aux_vllm_align_capacity``; :func:`aiter_aux.reference.compat.
    vllm_align_capacity` is the spec).  Plain ints, unchecked."""
    cap = numel + num_experts * (block_size - 1)
    return min(numel * block_size, cap) if numel < num_experts else cap


def sglang_align_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """SGLang's ``sorted_token_ids`` length: ``numel * block_size`` when ``numel <
    num_experts + 1``, else ``numel + (num_experts + 1) * (block_size - 1)`` (the C twin:
    ``aiter_aux_sglang_align_capacity``).  Plain ints, unchecked."""
    if numel < num_experts + 1:
        return numel * block_size
    return numel + (num_experts + 1) * (block_size - 1)


def sort_scales_rows(max_rows: int, block_m: int) -> int:
    """The rows ``out_rows = ceil(max_rows / BM) * BM``, ``BM = max(32, block_m)``, that
    ``moe_sort_scales`` writes for a sort of capacity ``max_rows`` (the binding's
    ``sort_scales_rows`` is the C++ twin).  Plain ints, already checked."""
    bm = max(32, block_m)
    return (max_rows + bm - 1) // bm * bm


def _choice(value: object, name: str, choices: tuple[str, ...]) -> int:
    """The code (index in ``choices``) of the str option ``value``."""
    if isinstance(value, str) and value in choices:
        return choices.index(value)
    allowed = " or ".join(repr(c) for c in choices)
    raise ValueError(f"{name} must be {allowed}, got {value!r}")


def is_bool(value: object) -> bool:
    """``value`` is a Python bool or a numpy one (``numpy.bool`` / ``numpy.bool_``), as a
    torch schema's ``bool`` takes them."""
    t = type(value)
    return t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def _flag(value: object, name: str) -> int:
    """The code (0 or 1) of the bool option ``value`` (a Python or numpy bool, or the int 0
    or 1)."""
    if is_bool(value) or (type(value) is int and value in (0, 1)):
        return int(value)
    raise TypeError(f"{name} must be a bool, got {value!r} ({_kind(value)})")


def _count(value: object, name: str) -> int:
    """The code of the optional count ``value``: 0 for None, else the int (>= 1)."""
    if value is None:
        return 0
    v = validate_int(value, name)
    if v < 1:
        raise ValueError(f"{name} must be None or an int >= 1, got {v}")
    return v
