"""SGLang's MoE helper ops (sgl-kernel's) on aiter-aux's ops: switch by changing an import.

::

    # from sgl_kernel import moe_align_block_size, moe_sum, moe_sum_reduce
    from aiter_aux.compat.sglang import moe_align_block_size, moe_sum, moe_sum_reduce
    # from sgl_kernel import topk_softmax, moe_fused_gate   (the gates: docs/compat.md)
    from aiter_aux.compat.sglang import topk_softmax, moe_fused_gate
    # from sglang.srt.layers.moe.fused_moe_triton import moe_align_block_size (allocating)
    from aiter_aux.compat.sglang.srt import moe_align_block_size

``moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids=False,
ignore_invalid_expert=False)`` (sgl-kernel's out-parameter form; ``num_experts`` counts the
routed experts plus one), ``moe_sum(input, output)`` and ``moe_sum_reduce(input, output,
routed_scaling_factor=1.0)``: SGLang's signatures, outputs and meaning
(:func:`aiter_aux.reference.compat.sglang_moe_align_block_size`,
:func:`~aiter_aux.reference.compat.sglang_moe_sum` and
:func:`~aiter_aux.reference.compat.sglang_moe_sum_reduce` are the spec; docs/compat.md).
:mod:`aiter_aux.compat.sglang.srt` has the allocating form of SGLang's ``srt`` layer.  The
sort is written in SGLang's format by our sort kernels, deterministic.  Importing this
module builds and loads nothing; the first call loads (or builds) the compiled module.
"""

from __future__ import annotations

from .._align import sglang_moe_align_block_size as moe_align_block_size
from .._route import sglang_moe_fused_gate as moe_fused_gate
from .._route import sglang_topk_softmax as topk_softmax
from .._sums import moe_sum_reduce
from .._sums import sglang_moe_sum as moe_sum

__all__ = ["moe_align_block_size", "moe_fused_gate", "moe_sum", "moe_sum_reduce", "topk_softmax"]
