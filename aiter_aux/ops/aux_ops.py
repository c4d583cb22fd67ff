"""The aux ops on the compiled module ``module_moe_mxfp4_aux``.

Same API and same bytes as :mod:`aiter_aux.reference` (the spec; docs/ops.md).  Each op
validates its arguments with :mod:`aiter_aux.validation`, checks that the catalog has an
instance for the compile-time parameters it needs (else :class:`UnsupportedShapeError`),
and only then loads the module (lazily: built on first use) and runs the instance.
CPU tensors run on the CPU backend; CUDA tensors on the cuda (or, under ROCm torch, rocm)
backend, on the current torch stream, without synchronising or allocating in ``_out``
variants.

Errors: ``TypeError`` / ``ValueError`` (bad input, raised before any kernel runs),
:class:`UnsupportedShapeError` (a ``ValueError``: no instance for these parameters),
``aiter_aux.jit.BuildError`` (the module failed to compile), ``RuntimeError`` (the module
reported an error).
"""

from __future__ import annotations

import torch

from .. import validation as V
from ..jit import abi
from ..jit.module import load_module
from ..jit.paths import codegen_module
from ..types import MoeSortOutput, empty_moe_sort_output, moe_sort_capacity
from .moe_mxfp4_aux import MXFP4_MOE_SUPPORTED_SHAPES

__all__ = [
    "MoeSortOutput",
    "UnsupportedShapeError",
    "moe_sort_capacity",
    "moe_sort",
    "moe_sort_out",
    "mxfp4_quant",
    "mxfp4_quant_out",
    "moe_sort_quant",
    "moe_sort_quant_out",
    "moe_sort_scales",
    "moe_sort_scales_out",
    "moe_scatter_reduce",
    "moe_scatter_reduce_out",
    "moe_scatter_reduce_q",
    "moe_scatter_reduce_q_out",
]


class UnsupportedShapeError(ValueError):
    """No compiled instance exists for the requested compile-time parameters."""


_CATALOG_KEYS: dict[str, set[tuple[int, ...]]] | None = None


def _catalog_values(op: str) -> set[tuple[int, ...]]:
    global _CATALOG_KEYS
    if _CATALOG_KEYS is None:
        inst = codegen_module("instances")
        table: dict[str, set[tuple[int, ...]]] = {}
        for shape in MXFP4_MOE_SUPPORTED_SHAPES:
            for i in inst.instances_for_shape(shape):
                table.setdefault(i.op, set()).add(i.values)
        _CATALOG_KEYS = table
    return _CATALOG_KEYS.get(op, set())


def _key(op: str, **params: int) -> str:
    inst = codegen_module("instances")
    spec = inst.OPS[op]
    values = tuple(int(params[p]) for p in spec.params)
    key = inst.instance_key(op, **params)
    if values not in _catalog_values(op):
        supported = ", ".join(str(v) for v in sorted(_catalog_values(op)))
        raise UnsupportedShapeError(
            f"no instance {key!r}: the shape catalog has no shape with "
            f"{', '.join(f'{p}={v}' for p, v in zip(spec.params, values, strict=True))}. "
            f"Supported ({', '.join(spec.params)}): {supported}. "
            "To add a model shape: `aiter-aux add-shape E,MODEL_DIM,INTER,TOPK` (or add the "
            "tuple to SHAPES in codegen/gen_instances.py and MXFP4_MOE_SUPPORTED_SHAPES in "
            "aiter_aux/ops/moe_mxfp4_aux.py), then `aiter-aux build`."
        )
    return key


def _backend(device: torch.device, name: str = "the tensors") -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    raise ValueError(f"{name} is on {device}: the compiled ops take cpu or cuda tensors only")


def _run(key: str, device: torch.device, args, name: str = "the tensors") -> None:
    module = load_module(_backend(device, name), key)
    stream = None
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device).cuda_stream
    module.call(key, args, stream)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None or t.numel() == 0 else t.data_ptr()


def _sort_args(topk_ids, topk_weights, m, k, num_experts, block_m, max_rows, out, zero_buf):
    return abi.SortArgs(
        _ptr(topk_ids), _ptr(topk_weights), m, int(num_experts), k, int(block_m), 0, max_rows,
        _ptr(out.sorted_token_ids), _ptr(out.sorted_weights), _ptr(out.m_indices),
        _ptr(out.sorted_expert_ids), _ptr(out.num_valid_ids), _ptr(out.reverse_sorted),
        _ptr(zero_buf), 0 if zero_buf is None else zero_buf.numel(),
    )  # fmt: skip


_alloc_sort = empty_moe_sort_output


def moe_sort_out(topk_ids, topk_weights, num_experts, block_m, out, *, zero_buf=None):
    """Sort token->expert pairs into ``out`` (a :class:`MoeSortOutput` of preallocated
    buffers); semantics, shapes and errors as :func:`aiter_aux.reference.moe_sort_out`.
    Rows past ``num_valid_ids[0]`` are not written.  Returns ``out``."""
    m, k, max_rows = V.validate_moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf)
    out = V.validate_moe_sort_out(out, m, k, max_rows, block_m, topk_ids.device)
    key = _key("moe_sort", num_experts=num_experts, topk=k)
    args = _sort_args(topk_ids, topk_weights, m, k, num_experts, block_m, max_rows, out, zero_buf)
    _run(key, topk_ids.device, args, "topk_ids")
    return out


def moe_sort(topk_ids, topk_weights, num_experts, block_m, *, zero_buf=None) -> MoeSortOutput:
    """Sort token->expert pairs by expert, padded to ``block_m`` (see
    :func:`aiter_aux.reference.moe_sort`: topk_ids int32 [M, topk], topk_weights float32
    [M, topk] -> :class:`MoeSortOutput` of capacity ``moe_sort_capacity(M, topk,
    num_experts, block_m)``).  ``zero_buf`` (bf16, any shape) is zeroed in the same call."""
    m, k, max_rows = V.validate_moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf)
    out = _alloc_sort(m, k, max_rows, int(block_m), topk_ids.device)
    return moe_sort_out(topk_ids, topk_weights, num_experts, block_m, out, zero_buf=zero_buf)


def _quant_args(x, m, d, a_q, a_scale):
    return abi.QuantArgs(_ptr(x), m, d, 0, _ptr(a_q), _ptr(a_scale))


def mxfp4_quant_out(x, a_q, a_scale):
    """Quantise bf16 ``x`` [M, model_dim] to MXFP4 per_1x32 into ``a_q`` uint8
    [M, model_dim/2] (e2m1, element 2j in the low nibble of byte j) and ``a_scale`` uint8
    [M, model_dim/32] (e8m0), as :func:`aiter_aux.reference.mxfp4_quant` (OCP MX v1.0
    formats).  Returns ``(a_q, a_scale)``."""
    m, d = V.validate_mxfp4_quant(x)
    V.validate_mxfp4_quant_out(a_q, a_scale, m, d, x.device)
    key = _key("mxfp4_quant", model_dim=d)
    _run(key, x.device, _quant_args(x, m, d, a_q, a_scale), "x")
    return a_q, a_scale


def mxfp4_quant(x):
    """Allocating :func:`mxfp4_quant_out`: returns ``(a_q, a_scale)``."""
    m, d = V.validate_mxfp4_quant(x)
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=x.device)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=x.device)
    return mxfp4_quant_out(x, a_q, a_scale)


def moe_sort_quant_out(
    topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, *, zero_buf=None
):
    """:func:`moe_sort_out` and :func:`mxfp4_quant_out` in one call (one launch on GPU);
    outputs identical to the separate ops.  Returns ``(out, a_q, a_scale)``."""
    m, k, max_rows, d = V.validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf
    )
    out = V.validate_moe_sort_out(out, m, k, max_rows, block_m, topk_ids.device)
    V.validate_mxfp4_quant_out(a_q, a_scale, m, d, x.device)
    key = _key("moe_sort_quant", num_experts=num_experts, topk=k, model_dim=d)
    args = abi.SortQuantArgs(
        _sort_args(topk_ids, topk_weights, m, k, num_experts, block_m, max_rows, out, zero_buf),
        _quant_args(x, m, d, a_q, a_scale),
    )
    _run(key, x.device, args, "x")
    return out, a_q, a_scale


def moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, *, zero_buf=None):
    """Allocating :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, a_scale)``."""
    m, k, max_rows, d = V.validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf
    )
    out = _alloc_sort(m, k, max_rows, int(block_m), x.device)
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=x.device)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=x.device)
    return moe_sort_quant_out(
        topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, zero_buf=zero_buf
    )


def moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales):
    """Shuffle ``a_scale`` uint8 [M, model_dim/32] (e8m0) into the grouped GEMM's scale
    layout, row order given by the sort, into ``sorted_scales`` uint8
    [ceil(max_rows/BM)*BM, model_dim/32] with BM = max(32, block_m); every byte is written
    (see :func:`aiter_aux.reference.moe_sort_scales`).  Returns ``sorted_scales``."""
    m, d, max_rows, out_rows = V.validate_moe_sort_scales(
        a_scale, sorted_token_ids, num_valid_ids, block_m
    )
    V.validate_moe_sort_scales_out(sorted_scales, out_rows, d, a_scale.device)
    key = _key("moe_sort_scales", model_dim=d)
    args = abi.SortScalesArgs(
        _ptr(a_scale), m, d, int(block_m), _ptr(sorted_token_ids), _ptr(num_valid_ids),
        max_rows, _ptr(sorted_scales),
    )  # fmt: skip
    _run(key, a_scale.device, args, "a_scale")
    return sorted_scales


def moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m):
    """Allocating :func:`moe_sort_scales_out`."""
    _m, d, _max_rows, out_rows = V.validate_moe_sort_scales(
        a_scale, sorted_token_ids, num_valid_ids, block_m
    )
    out = torch.empty(out_rows, d // 32, dtype=torch.uint8, device=a_scale.device)
    return moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, out)


def _scatter(key_op, expert_out, q, s, reverse_sorted, sorted_weights, topk, m, rows, d, out):
    if reverse_sorted.device.type == "cpu":
        V.validate_reverse_sorted_range(reverse_sorted, rows)
    key = _key(key_op, model_dim=d, topk=int(topk))
    args = abi.ScatterArgs(
        _ptr(expert_out), _ptr(q), _ptr(s), rows, _ptr(reverse_sorted), _ptr(sorted_weights),
        m, d, int(topk), _ptr(out),
    )  # fmt: skip
    _run(key, reverse_sorted.device, args, "reverse_sorted")
    return out


def moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out):
    """Weighted top-k reduce of ``expert_out`` bf16 [rows, model_dim] (sorted order) back to
    tokens: ``out`` bf16 [M, model_dim], M = reverse_sorted.numel() // topk (see
    :func:`aiter_aux.reference.moe_scatter_reduce`).  On CPU, row indices >= rows raise
    ``ValueError``; on GPU they are not read (checking would synchronise)."""
    m, rows, d = V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    V.validate_moe_scatter_reduce_out(out, m, d, expert_out.device)
    return _scatter(
        "moe_scatter_reduce", expert_out, None, None, reverse_sorted, sorted_weights, topk,
        m, rows, d, out,
    )  # fmt: skip


def moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk):
    """Allocating :func:`moe_scatter_reduce_out`."""
    m, _rows, d = V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out.device)
    return moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out)


def moe_scatter_reduce_q_out(
    expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
):
    """:func:`moe_scatter_reduce_out` with MXFP4 ``expert_out``: e2m1 ``expert_out_q`` uint8
    [rows, model_dim/2] and e8m0 ``expert_out_scale`` uint8 [rows, model_dim/32]
    (scale 255 decodes to NaN)."""
    m, rows, d = V.validate_moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )
    V.validate_moe_scatter_reduce_out(out, m, d, expert_out_q.device)
    return _scatter(
        "moe_scatter_reduce_q", None, expert_out_q, expert_out_scale, reverse_sorted,
        sorted_weights, topk, m, rows, d, out,
    )  # fmt: skip


def moe_scatter_reduce_q(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk):
    """Allocating :func:`moe_scatter_reduce_q_out`."""
    m, _rows, d = V.validate_moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out_q.device)
    return moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
    )
