"""Plain-PyTorch reference of the MXFP4 MoE auxiliary ops: the spec, bit for bit.

This package is the executable form of docs/ops.md: every backend must reproduce these
functions bit for bit.  The functions work on any device (CPU or CUDA tensors) with ordinary
tensor ops, vectorised and processed in chunks of rows (:mod:`.chunks`; on one CPU core,
M = 65,536 tokens with model_dim = 7168: sort < 1 s, quant ~5 s, sort_scales ~2 s,
scatter_reduce ~15 s and scatter_reduce_q ~40 s at topk = 8).  A few data-dependent sizes are
read back to the host (a synchronisation on GPU).  Subnormal fp32 values must not be flushed
(``torch.set_flush_denormal(False)``, the default).

Formats follow the OCP Microscaling (MX) Formats Specification v1.0: FP4 ``e2m1`` elements
(values ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` with a sign bit), ``e8m0`` shared scales (value
``2^(s - 127)``, ``s = 255`` is NaN), one scale per block of 32 consecutive elements of a row
(``per_1x32``).  Two e2m1 codes are packed per byte: element ``2j`` in the low nibble of byte
``j``, element ``2j + 1`` in the high nibble.

Each op has an allocating form and an ``_out`` form.  The allocating form allocates its
outputs with :func:`torch.empty` and calls the ``_out`` form, which writes only the region the
spec defines (rows of the sort outputs at or past ``num_valid_ids[0]`` keep whatever the
buffer held).  Input checks are in :mod:`aiter_aux.validation` and run before anything is
computed or written.

One op family per module (each op's table entry in codegen/ops.py names its module;
:mod:`._table`, generated from the table, imports them and exports their ops):

* :mod:`.sort`: ``moe_sort[_out]`` (routing pairs sorted by expert, block_m-padded).
* :mod:`.mxfp4`: the e2m1/e8m0 codec (quantisation of rows, decode tables, fp32 -> bf16
  round-to-nearest-even with NaN -> 0x7FC0).
* :mod:`.mxfp8`: the E4M3/e8m0 (MXFP8) codec: the scale formula, the bf16 -> E4M3 table.
* :mod:`.quant`: ``mxfp4_quant[_out]``, ``mxfp8_quant[_out]`` and the fused
  ``moe_sort_quant[_out]`` (``quant_dtype="mxfp4"`` or ``"mxfp8"``).
* :mod:`.sort_scales`: ``moe_sort_scales[_out]`` (scales in the a4w4 GEMM layout).
* :mod:`.scatter`: ``moe_scatter_reduce[_out]`` and ``moe_scatter_reduce_q[_out]``.
* :mod:`.sums`: ``moe_sum[_out]`` (each token's topk rows summed; float32/float16/bfloat16).
* :mod:`.route`: ``moe_route[_out]`` (the top-k gate from router logits).
* :mod:`.route_sort_quant`: ``moe_route_sort_quant[_out]`` (the gate, then the sort and the
  quant of its outputs).
* :mod:`.align`: ``moe_align_block_size_vllm[_out]``, ``moe_align_block_size_sglang[_out]``
  (the sort in the peers' formats, on the formats of :mod:`.compat`).
* :mod:`.chunks`: the row-chunk size of the loops (``chunks.CHUNK_ELEMS``, read at call time).
* :mod:`.compat`: the vLLM and SGLang formats of the sort and the reduce
  (``vllm_moe_align_block_size``, ``vllm_moe_sum``, ``sglang_moe_align_block_size``,
  ``sglang_moe_sum_reduce``; docs/compat.md).
"""

from __future__ import annotations

from aiter_aux.types import MoeSortOutput
from aiter_aux.validation import moe_sort_capacity

from . import _table
from . import chunks as chunks  # the chunking knob (chunks.CHUNK_ELEMS)
from . import compat as compat  # the vLLM and SGLang formats (docs/compat.md)
from ._table import *  # noqa: F403 (every op's module, both forms: from the op table)
from .mxfp4 import E2M1_VALUES
from .mxfp4 import _e2m1_lut as _e2m1_lut  # not public; read by op_tests/test_reference.py

__all__ = ["MoeSortOutput", "moe_sort_capacity", "E2M1_VALUES", *_table.__all__]
