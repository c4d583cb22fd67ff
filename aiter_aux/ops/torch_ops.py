"""The aux ops as ``torch.library`` custom ops, namespace ``aiter_aux``.

Importing this module registers, for every public op of :mod:`aiter_aux.ops.aux_ops`, a
functional op ``torch.ops.aiter_aux.<op>`` (allocates its outputs) and an out op
``torch.ops.aiter_aux.<op>_out`` (writes preallocated buffers, declared in ``mutates_args``;
returns nothing).  Both are opaque to ``torch.compile`` (no graph break) and carry fake
(meta) implementations that compute output shapes from sizes alone, e.g. the capacity
``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)`` of ``moe_sort``.  The out
ops neither allocate nor synchronise, so they can be captured in a CUDA graph (load the
module first: the first call of a key may compile it).  Real implementations call
:mod:`aiter_aux.ops.aux_ops` (CPU or CUDA tensors; same bytes as :mod:`aiter_aux.reference`).

Schemas (``int`` arguments are SymInt; ``zero_buf`` is zeroed unless None; it has no
default because torch < 2.13 mishandles an omitted optional mutated argument)::

    moe_sort(Tensor topk_ids, Tensor topk_weights, int num_experts, int block_m,
             Tensor(a!)? zero_buf) -> (Tensor x 6)      # MoeSortOutput fields
    mxfp4_quant(Tensor x) -> (Tensor a_q, Tensor a_scale)
    moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, zero_buf)
        -> (Tensor x 6, Tensor a_q, Tensor a_scale)
    moe_sort_scales(Tensor a_scale, Tensor sorted_token_ids, Tensor num_valid_ids,
                    int block_m) -> Tensor
    moe_scatter_reduce(Tensor expert_out, Tensor reverse_sorted, Tensor sorted_weights,
                       int topk) -> Tensor
    moe_scatter_reduce_q(Tensor expert_out_q, Tensor expert_out_scale, Tensor reverse_sorted,
                         Tensor sorted_weights, int topk) -> Tensor
    <op>_out(<inputs>, Tensor(a!) <each output buffer>..., [zero_buf]) -> ()

Shapes and dtypes are those of :mod:`aiter_aux.reference` (docs/ops.md).  The Python
wrappers below (same signatures as the ops in :mod:`aiter_aux.ops.aux_ops`) return a
:class:`~aiter_aux.types.MoeSortOutput` where the eager ops do.  Errors: ``TypeError`` /
``ValueError`` for bad input (raised while tracing too, by the fake implementations),
``UnsupportedShapeError`` for shapes outside the catalog (at run time).
"""

from collections.abc import Sequence

import torch

from .. import validation as V
from ..types import MoeSortOutput, moe_sort_capacity
from . import aux_ops

T = torch.Tensor
SORT_FIELDS = MoeSortOutput._fields
_SORT6 = tuple[T, T, T, T, T, T]

__all__ = [
    "MoeSortOutput",
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


def _static(*tensors: T | None) -> bool:
    """True when every size is a plain int (not a SymInt of a dynamic-shape trace)."""
    return all(isinstance(s, int) for t in tensors if t is not None for s in t.shape)


def _fake_sort(ids: T, w: T, num_experts: int, block_m: int, zero_buf: T | None = None) -> _SORT6:
    """Empty sort outputs of the right sizes; full input checks when sizes are static."""
    if _static(ids, w, zero_buf):
        m, k, max_rows = V.validate_moe_sort(ids, w, num_experts, block_m, zero_buf)
    else:  # symbolic M: the same formula as moe_sort_capacity, without int() guards
        V.check_tensor(ids, "topk_ids", torch.int32, 2, "[M, topk]")
        V.check_tensor(w, "topk_weights", torch.float32, 2, "[M, topk]")
        m, k = ids.shape
        b = V.validate_block_m(block_m)
        max_rows = (m * k + V.validate_num_experts(num_experts) * (b - 1) + b - 1) // b * b
    i32 = ids.new_empty
    return (
        i32(max_rows),
        w.new_empty(max_rows),
        i32(max_rows),
        i32(max_rows // block_m),
        i32(2),
        i32(m * k),
    )


def _fake_quant(x: T) -> tuple[T, T]:
    if _static(x):
        V.validate_mxfp4_quant(x)
    else:
        V.check_tensor(x, "x", torch.bfloat16, 2, "[M, model_dim]")
    m, d = x.shape
    return x.new_empty(m, d // 2, dtype=torch.uint8), x.new_empty(m, d // 32, dtype=torch.uint8)


# ------------------------------------------------------------------------- functional ops
@torch.library.custom_op("aiter_aux::moe_sort", mutates_args=("zero_buf",))
def _moe_sort(
    topk_ids: T, topk_weights: T, num_experts: int, block_m: int, zero_buf: T | None
) -> _SORT6:
    return tuple(aux_ops.moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf=zero_buf))


_moe_sort.register_fake(_fake_sort)


@torch.library.custom_op("aiter_aux::mxfp4_quant", mutates_args=())
def _mxfp4_quant(x: T) -> tuple[T, T]:
    return aux_ops.mxfp4_quant(x)


_mxfp4_quant.register_fake(_fake_quant)


@torch.library.custom_op("aiter_aux::moe_sort_quant", mutates_args=("zero_buf",))
def _moe_sort_quant(
    topk_ids: T, topk_weights: T, x: T, num_experts: int, block_m: int, zero_buf: T | None
) -> tuple[T, T, T, T, T, T, T, T]:
    out, a_q, a_scale = aux_ops.moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf=zero_buf
    )
    return (*out, a_q, a_scale)


@_moe_sort_quant.register_fake
def _(topk_ids, topk_weights, x, num_experts, block_m, zero_buf=None):
    if _static(topk_ids, topk_weights, x, zero_buf):
        V.validate_moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, zero_buf)
    return (*_fake_sort(topk_ids, topk_weights, num_experts, block_m, None), *_fake_quant(x))


@torch.library.custom_op("aiter_aux::moe_sort_scales", mutates_args=())
def _moe_sort_scales(a_scale: T, sorted_token_ids: T, num_valid_ids: T, block_m: int) -> T:
    return aux_ops.moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)


@_moe_sort_scales.register_fake
def _(a_scale, sorted_token_ids, num_valid_ids, block_m):
    if _static(a_scale, sorted_token_ids, num_valid_ids):
        V.validate_moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)
    bm = max(32, V.validate_block_m(block_m))
    out_rows = (sorted_token_ids.shape[0] + bm - 1) // bm * bm
    return a_scale.new_empty(out_rows, a_scale.shape[1])


@torch.library.custom_op("aiter_aux::moe_scatter_reduce", mutates_args=())
def _moe_scatter_reduce(expert_out: T, reverse_sorted: T, sorted_weights: T, topk: int) -> T:
    return aux_ops.moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)


@_moe_scatter_reduce.register_fake
def _(expert_out, reverse_sorted, sorted_weights, topk):
    if _static(expert_out, reverse_sorted, sorted_weights):
        V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    m = reverse_sorted.shape[0] // V.validate_topk(topk)
    return expert_out.new_empty(m, expert_out.shape[1])


@torch.library.custom_op("aiter_aux::moe_scatter_reduce_q", mutates_args=())
def _moe_scatter_reduce_q(
    expert_out_q: T, expert_out_scale: T, reverse_sorted: T, sorted_weights: T, topk: int
) -> T:
    return aux_ops.moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )


@_moe_scatter_reduce_q.register_fake
def _(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk):
    if _static(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights):
        V.validate_moe_scatter_reduce_q(
            expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
        )
    m = reverse_sorted.shape[0] // V.validate_topk(topk)
    d = expert_out_scale.shape[1] * 32
    return expert_out_q.new_empty(m, d, dtype=torch.bfloat16)


# ------------------------------------------------------------------------------- out ops
# Each writes its buffers in place and returns nothing; the fake implementations have
# nothing to compute (the real ones validate every buffer before any kernel runs).
_SORT_MUT = (*SORT_FIELDS, "zero_buf")


@torch.library.custom_op("aiter_aux::moe_sort_out", mutates_args=_SORT_MUT)
def _moe_sort_out(
    topk_ids: T, topk_weights: T, num_experts: int, block_m: int,
    sorted_token_ids: T, sorted_weights: T, m_indices: T, sorted_expert_ids: T,
    num_valid_ids: T, reverse_sorted: T, zero_buf: T | None,
) -> None:  # fmt: skip
    out = MoeSortOutput(sorted_token_ids, sorted_weights, m_indices, sorted_expert_ids,
                        num_valid_ids, reverse_sorted)  # fmt: skip
    aux_ops.moe_sort_out(topk_ids, topk_weights, num_experts, block_m, out, zero_buf=zero_buf)


@torch.library.custom_op("aiter_aux::mxfp4_quant_out", mutates_args=("a_q", "a_scale"))
def _mxfp4_quant_out(x: T, a_q: T, a_scale: T) -> None:
    aux_ops.mxfp4_quant_out(x, a_q, a_scale)


@torch.library.custom_op(
    "aiter_aux::moe_sort_quant_out", mutates_args=(*SORT_FIELDS, "a_q", "a_scale", "zero_buf")
)
def _moe_sort_quant_out(
    topk_ids: T, topk_weights: T, x: T, num_experts: int, block_m: int,
    sorted_token_ids: T, sorted_weights: T, m_indices: T, sorted_expert_ids: T,
    num_valid_ids: T, reverse_sorted: T, a_q: T, a_scale: T, zero_buf: T | None,
) -> None:  # fmt: skip
    out = MoeSortOutput(sorted_token_ids, sorted_weights, m_indices, sorted_expert_ids,
                        num_valid_ids, reverse_sorted)  # fmt: skip
    aux_ops.moe_sort_quant_out(
        topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, zero_buf=zero_buf
    )


@torch.library.custom_op("aiter_aux::moe_sort_scales_out", mutates_args=("sorted_scales",))
def _moe_sort_scales_out(
    a_scale: T, sorted_token_ids: T, num_valid_ids: T, block_m: int, sorted_scales: T
) -> None:
    aux_ops.moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)


@torch.library.custom_op("aiter_aux::moe_scatter_reduce_out", mutates_args=("out",))
def _moe_scatter_reduce_out(
    expert_out: T, reverse_sorted: T, sorted_weights: T, topk: int, out: T
) -> None:
    aux_ops.moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out)


@torch.library.custom_op("aiter_aux::moe_scatter_reduce_q_out", mutates_args=("out",))
def _moe_scatter_reduce_q_out(
    expert_out_q: T, expert_out_scale: T, reverse_sorted: T, sorted_weights: T, topk: int, out: T
) -> None:
    aux_ops.moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
    )


for _op in (_moe_sort_out, _mxfp4_quant_out, _moe_sort_quant_out, _moe_sort_scales_out,
            _moe_scatter_reduce_out, _moe_scatter_reduce_q_out):  # fmt: skip
    _op.register_fake(lambda *args, **kwargs: None)


# ------------------------------------------------------------------------ Python wrappers
_ops = torch.ops.aiter_aux


def _sort_buffers(out: object) -> MoeSortOutput:
    if not isinstance(out, Sequence) or len(out) != 6:
        raise TypeError(f"out must be a MoeSortOutput of six tensors, got {type(out).__name__}")
    return MoeSortOutput(*out)


def moe_sort(topk_ids, topk_weights, num_experts, block_m, *, zero_buf=None) -> MoeSortOutput:
    """``torch.ops.aiter_aux.moe_sort`` as a :class:`MoeSortOutput` (see aux_ops.moe_sort)."""
    return MoeSortOutput(*_ops.moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf))


def moe_sort_out(topk_ids, topk_weights, num_experts, block_m, out, *, zero_buf=None):
    """``torch.ops.aiter_aux.moe_sort_out``; returns ``out`` as a :class:`MoeSortOutput`."""
    out = _sort_buffers(out)
    _ops.moe_sort_out(topk_ids, topk_weights, num_experts, block_m, *out, zero_buf)
    return out


def mxfp4_quant(x):
    """``torch.ops.aiter_aux.mxfp4_quant``: bf16 [M, d] -> (uint8 [M, d/2], uint8 [M, d/32])."""
    return tuple(_ops.mxfp4_quant(x))


def mxfp4_quant_out(x, a_q, a_scale):
    """``torch.ops.aiter_aux.mxfp4_quant_out``; returns ``(a_q, a_scale)``."""
    _ops.mxfp4_quant_out(x, a_q, a_scale)
    return a_q, a_scale


def moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, *, zero_buf=None):
    """``torch.ops.aiter_aux.moe_sort_quant``: ``(MoeSortOutput, a_q, a_scale)``."""
    r = _ops.moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, zero_buf)
    return MoeSortOutput(*r[:6]), r[6], r[7]


def moe_sort_quant_out(
    topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, *, zero_buf=None
):
    """``torch.ops.aiter_aux.moe_sort_quant_out``; returns ``(out, a_q, a_scale)``."""
    out = _sort_buffers(out)
    _ops.moe_sort_quant_out(
        topk_ids, topk_weights, x, num_experts, block_m, *out, a_q, a_scale, zero_buf
    )
    return out, a_q, a_scale


def moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m):
    """``torch.ops.aiter_aux.moe_sort_scales``: uint8 [ceil(max_rows/BM)*BM, d/32]."""
    return _ops.moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)


def moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales):
    """``torch.ops.aiter_aux.moe_sort_scales_out``; returns ``sorted_scales``."""
    _ops.moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)
    return sorted_scales


def moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk):
    """``torch.ops.aiter_aux.moe_scatter_reduce``: bf16 [M, model_dim]."""
    return _ops.moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)


def moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out):
    """``torch.ops.aiter_aux.moe_scatter_reduce_out``; returns ``out``."""
    _ops.moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out)
    return out


def moe_scatter_reduce_q(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk):
    """``torch.ops.aiter_aux.moe_scatter_reduce_q``: bf16 [M, model_dim]."""
    return _ops.moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )


def moe_scatter_reduce_q_out(
    expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
):
    """``torch.ops.aiter_aux.moe_scatter_reduce_q_out``; returns ``out``."""
    _ops.moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
    )
    return out
