"""SGLang's ``srt`` layer ``moe_align_block_size``, the allocating form: switch by changing
an import.

::

    # from sglang.srt.layers.moe.fused_moe_triton.fused_moe import moe_align_block_size
    # (0.5.x: sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size)
    from aiter_aux.compat.sglang.srt import moe_align_block_size

    sorted_ids, expert_ids, num_tokens_post_pad = moe_align_block_size(
        topk_ids, block_size, num_experts, ignore_invalid_expert=False)

``num_experts`` is the routed experts (the srt layer passes ``num_experts + 1`` buckets to
sgl-kernel).  The meaning is
:func:`aiter_aux.reference.compat.sglang_moe_align_block_size` (docs/compat.md).  Importing
this module builds and loads nothing.
"""

from __future__ import annotations

from .._align import sglang_srt_moe_align_block_size as moe_align_block_size

__all__ = ["moe_align_block_size"]
