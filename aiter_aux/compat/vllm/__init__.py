"""vLLM's MoE helper ops on aiter-aux's ops: switch by changing an import.

::

    # from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    # from vllm._custom_ops import moe_sum
    from aiter_aux.compat.vllm import moe_align_block_size, moe_sum
    # from vllm._custom_ops import topk_softmax, grouped_topk   (the gates: docs/compat.md)
    from aiter_aux.compat.vllm import topk_softmax, grouped_topk
    # from vllm import _custom_ops as ops   (moe_align_block_size's out-parameter form)
    from aiter_aux.compat.vllm import custom_ops as ops

``moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None,
pad_sorted_ids=False, ignore_invalid_experts=False, return_scatter_idx=False)`` and
``moe_sum(input, output, topk_ids=None, expert_map=None)``: vLLM's signatures, outputs and
meaning (:func:`aiter_aux.reference.compat.vllm_moe_align_block_size` and
:func:`aiter_aux.reference.compat.vllm_moe_sum` are the spec; docs/compat.md lists the rules,
their sources and every difference).  Any ``num_experts`` in [1, 992], any ``block_size``
in [1, 65536], ``topk_ids`` of any shape read as a flat array, int32 or int64.
:mod:`aiter_aux.compat.vllm.custom_ops` has ``vllm._custom_ops``' out-parameter forms.  The
sort is written in vLLM's format by our sort kernels, with a fixed order inside an expert
(deterministic).  Importing this module builds and loads nothing; the first call loads (or
builds) the compiled module.
"""

from __future__ import annotations

from .._align import vllm_moe_align_block_size as moe_align_block_size
from .._route import vllm_grouped_topk as grouped_topk
from .._route import vllm_topk_softmax as topk_softmax
from .._sums import moe_sum

__all__ = ["grouped_topk", "moe_align_block_size", "moe_sum", "topk_softmax"]
