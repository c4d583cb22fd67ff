"""``vllm._custom_ops``' MoE helpers, out-parameter style: switch by changing an import.

::

    # from vllm import _custom_ops as ops
    from aiter_aux.compat.vllm import custom_ops as ops

    ops.moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids,
                             experts_ids, num_tokens_post_pad, maybe_expert_map,
                             scatter_idx=None)          # -> None
    ops.moe_sum(input, output)                          # (topk_ids=, expert_map= too)
    ops.topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output,
                     renormalize=False)                 # -> None
    ops.grouped_topk(scores, num_expert_group, topk_group, topk, renormalize,
                     routed_scaling_factor, bias, scoring_func=0)  # -> (weights, ids)

The meaning is :func:`aiter_aux.reference.compat.vllm_custom_moe_align_block_size` and
:func:`aiter_aux.reference.compat.vllm_moe_sum` (docs/compat.md).  Importing this module
builds and loads nothing.
"""

from __future__ import annotations

from .._align import vllm_custom_moe_align_block_size as moe_align_block_size
from .._route import vllm_grouped_topk as grouped_topk
from .._route import vllm_topk_softmax as topk_softmax
from .._sums import moe_sum

__all__ = ["grouped_topk", "moe_align_block_size", "moe_sum", "topk_softmax"]
