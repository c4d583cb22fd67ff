"""The aux ops as torch custom ops, namespace ``aiter_aux`` (importing this module, or any
of :mod:`aiter_aux.ops`, defines them; see :mod:`._library` for how they are bound).

For every op of the op table there are two torch ops, with the schemas of
``codegen/instances.py`` (``schemas``)::

    moe_sort(Tensor topk_ids, Tensor topk_weights, int num_experts, int block_m, *,
             Tensor(z!)? zero_buf=None) -> (Tensor x 6)      # MoeSortOutput fields
    mxfp4_quant(Tensor x) -> (Tensor a_q, Tensor a_scale)
    mxfp8_quant(Tensor x) -> (Tensor a_q, Tensor a_scale)    # a_q uint8 [M, model_dim] E4M3
    moe_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, *, zero_buf=None,
                   ..., Tensor(s!)? sorted_scales=None)
        -> (Tensor x 6, Tensor a_q, Tensor a_scale)   # sorted_scales written, not returned
    moe_sort_quant_fp8(...)   # the same with MXFP8 a_q (quant_dtype="mxfp8" of the wrappers)
    moe_sort_scales(Tensor a_scale, Tensor sorted_token_ids, Tensor num_valid_ids,
                    int block_m) -> Tensor
    moe_scatter_reduce(Tensor expert_out, Tensor reverse_sorted, Tensor sorted_weights,
                       int topk) -> Tensor
    moe_scatter_reduce_q(Tensor expert_out_q, Tensor expert_out_scale, Tensor reverse_sorted,
                         Tensor sorted_weights, int topk) -> Tensor
    <op>_out(<inputs>, Tensor(a!) <each output buffer>..., *, [zero_buf, ...,
             sorted_scales]) -> ()

``torch.ops.aiter_aux.<op>`` allocates its outputs; ``torch.ops.aiter_aux.<op>_out`` writes
preallocated buffers and returns nothing.  The real kernels are C++ (torch's stable ABI),
registered for CPU and CUDA when the backend's module loads; they validate every argument
before any kernel runs and raise ``RuntimeError("<Type>: <message>")`` (the functions below
and :mod:`aiter_aux.ops` turn that into ``<Type>``).  The fake implementations check
shapes and dtypes while tracing and compute output shapes from sizes alone, so
``torch.compile(fullgraph=True, dynamic=True)`` traces a pipeline without graph breaks.
The ``_out`` ops neither allocate nor synchronise and can be captured in a CUDA graph
(call them once before capture: the first call on a backend may load or build the module).

The functions re-exported here are those of :mod:`aiter_aux.ops.aux_ops` (typed wrappers
returning a :class:`~aiter_aux.types.MoeSortOutput` where the eager ops do).
"""

from .aux_ops import (  # noqa: F401 (re-exported)
    MoeSortOutput,
    moe_scatter_reduce,
    moe_scatter_reduce_out,
    moe_scatter_reduce_q,
    moe_scatter_reduce_q_out,
    moe_sort,
    moe_sort_capacity,
    moe_sort_out,
    moe_sort_quant,
    moe_sort_quant_out,
    moe_sort_scales,
    moe_sort_scales_out,
    mxfp4_quant,
    mxfp4_quant_out,
    mxfp8_quant,
    mxfp8_quant_out,
)

__all__ = [
    "MoeSortOutput",
    "moe_sort_capacity",
    "moe_sort",
    "moe_sort_out",
    "mxfp4_quant",
    "mxfp4_quant_out",
    "mxfp8_quant",
    "mxfp8_quant_out",
    "moe_sort_quant",
    "moe_sort_quant_out",
    "moe_sort_scales",
    "moe_sort_scales_out",
    "moe_scatter_reduce",
    "moe_scatter_reduce_out",
    "moe_scatter_reduce_q",
    "moe_scatter_reduce_q_out",
]
