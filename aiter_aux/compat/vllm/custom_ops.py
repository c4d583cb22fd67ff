"""``vllm._custom_ops``' MoE helpers, out-parameter style: switch by changing an import.

::

    # from vllm import _custom_ops as ops
    from aiter_aux.compat.vllm import custom_ops as ops

    ops.moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids,
                             experts_ids, num_tokens_post_pad, maybe_expert_map,
                             scatter_idx=None)          # -> None
    ops.moe_sum(input, output)                          # (topk_ids=, expert_map= too)

The meaning is :func:`aiter_aux.reference.compat.vllm_custom_moe_align_block_size` and
:func:`aiter_aux.reference.compat.vllm_moe_sum` (docs/compat.md).  Importing this module
builds and loads nothing.
"""

from __future__ import annotations

from .._align import vllm_custom_moe_align_block_size as moe_align_block_size
from .._sums import moe_sum

__all__ = ["moe_align_block_size", "moe_sum"]
