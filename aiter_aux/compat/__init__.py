"""Drop-in entry points with other libraries' signatures, as thin adapters onto
:mod:`aiter_aux.ops`.

* :mod:`aiter_aux.compat.aiter`: AITER's ``aiter/ops/moe_mxfp4_aux.py``
  (``mxfp4_moe_sort_quant``, ``mxfp4_moe_sort``, ... with ``NE``/``TOPK``/``D_HIDDEN``/``MB``).
* :mod:`aiter_aux.compat.vllm`: vLLM's ``moe_sum``.
* :mod:`aiter_aux.compat.sglang`: SGLang's ``moe_sum_reduce``.
* :mod:`aiter_aux.compat.vllm`: vLLM's ``moe_align_block_size`` (fused_moe).
* :mod:`aiter_aux.compat.sglang`: sgl-kernel's ``moe_align_block_size`` (out-parameter form).

Importing these modules loads and builds nothing; the compiled module is loaded on the first
call (docs/compat.md).
"""
