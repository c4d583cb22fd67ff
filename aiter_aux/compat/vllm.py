"""vLLM's MoE helper functions on aiter-aux's ops: switch by changing an import.

::

    # from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    from aiter_aux.compat.vllm import moe_align_block_size

``moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None,
pad_sorted_ids=False, ignore_invalid_experts=False, return_scatter_idx=False)``: vLLM's
signature, outputs and meaning (:func:`aiter_aux.reference.compat.vllm_moe_align_block_size`
is the spec; docs/compat.md lists the rules and their sources), written by our sort kernels
in vLLM's format, deterministic.  Importing this module loads and builds nothing.
"""

from __future__ import annotations

from ._align import vllm_moe_align_block_size as moe_align_block_size

__all__ = ["moe_align_block_size"]
