"""SGLang's MoE helper functions on aiter-aux's ops: switch by changing an import.

::

    # from sgl_kernel import moe_align_block_size
    from aiter_aux.compat.sglang import moe_align_block_size

``moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids=False)``: sgl-kernel's
out-parameter signature (``num_experts`` counts the routed experts plus one), SGLang's
format (:func:`aiter_aux.reference.compat.sglang_moe_align_block_size` is the spec;
docs/compat.md), written by our sort kernels, deterministic.  Importing this module loads
and builds nothing.
"""

from __future__ import annotations

from ._align import sglang_moe_align_block_size as moe_align_block_size

__all__ = ["moe_align_block_size"]
