"""Int checks and the limits they enforce; they work on plain ints, so limits such as
``M < 2**24`` can be checked without allocating large tensors.

Messages follow the conventions of :mod:`aiter_aux.validation`.
"""

from __future__ import annotations

import operator

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
    """Check the sizes of a sort and return its capacity ``max_rows`` (public as
    ``moe_sort_capacity``; the binding's ``sort_capacity`` is the C++ twin).

    ``max_rows = round_up(M * topk + num_experts * (block_m - 1), block_m)``: every local
    pair takes one row and each expert's segment wastes at most ``block_m - 1`` rows of
    padding, so the rows actually used (``num_valid_ids[0]``) never exceed it.

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


def sort_scales_rows(max_rows: int, block_m: int) -> int:
    """The rows ``out_rows = ceil(max_rows / BM) * BM``, ``BM = max(32, block_m)``, that
    ``moe_sort_scales`` writes for a sort of capacity ``max_rows`` (the binding's
    ``sort_scales_rows`` is the C++ twin).  Plain ints, already checked."""
    bm = max(32, block_m)
    return (max_rows + bm - 1) // bm * bm


def validate_scale(value: object, name: str = "routed_scaling_factor") -> float:
    """Return ``value`` as a float (any int or float; bool and other types raise TypeError)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)
