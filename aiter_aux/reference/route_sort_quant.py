"""Reference of ``moe_route_sort_quant``: the routing preamble from router logits, defined as
:func:`~aiter_aux.reference.moe_route_out` of the logits then
:func:`~aiter_aux.reference.moe_sort_quant_out` of its ``(topk_ids, topk_weights)`` with ``x``
(docs/ops.md).  Every argument of both is checked (the generated validators, one set for the
pair) before anything is written.
"""

from __future__ import annotations

import torch

from aiter_aux.types import MoeSortOutput
from aiter_aux.validation import _checks as C

from .quant import moe_sort_quant_out
from .route import moe_route_out
from .sort import _alloc_sort_out

__all__ = ["moe_route_sort_quant", "moe_route_sort_quant_out"]


def moe_route_sort_quant_out(
    router_logits: torch.Tensor,
    x: torch.Tensor,
    topk: int,
    num_experts: int,
    block_m: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    out: MoeSortOutput,
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, MoeSortOutput, torch.Tensor, torch.Tensor]:
    """:func:`moe_route_out` of ``router_logits`` (float32/float16/bfloat16 ``[M, E]``) into
    ``topk_weights`` (float32) and ``topk_ids`` (int32), both ``[M, topk]``, then
    :func:`moe_sort_quant_out` of those with ``x`` (bf16 ``[M, model_dim]``, the same M) into
    ``out``, ``a_q`` and ``a_scale`` (and ``sorted_scales`` when given), ``quant_dtype``
    picking MXFP4 or MXFP8.  The route's options are :func:`moe_route_out`'s, the others
    :func:`moe_sort_quant_out`'s; ``num_experts`` is the sort's (local experts with an
    ``expert_map``).

    Returns:
        ``(topk_weights, topk_ids, out, a_q, a_scale)``.

    Raises:
        TypeError, ValueError: the checks of both ops (``moe_route_sort_quant_out`` of the
            generated ``aiter_aux/validation/_checks.py``), before anything is written.
    """
    which = C.select_moe_route_sort_quant(quant_dtype)
    codes = C.moe_route_sort_quant_codes(scoring, renormalize, num_expert_group, topk_group)
    m = getattr(C, which + "_out")(
        router_logits, x, topk, num_experts, block_m, topk_weights, topk_ids, out, a_q, a_scale,
        scoring=codes[0], renormalize=codes[1], num_expert_group=codes[2], topk_group=codes[3],
        correction_bias=correction_bias, routed_scaling_factor=routed_scaling_factor,
        zero_buf=zero_buf, expert_map=expert_map, zero_buf_init=zero_buf_init,
        sorted_scales=sorted_scales,
    ).M  # fmt: skip
    route = dict(scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
                 topk_group=topk_group, correction_bias=correction_bias,
                 routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    moe_route_out(router_logits, topk, topk_weights, topk_ids, **route)
    out, a_q, a_scale = moe_sort_quant_out(
        topk_ids[:m], topk_weights[:m], x, num_experts, block_m, out, a_q, a_scale,
        zero_buf=zero_buf, expert_map=expert_map, zero_buf_init=zero_buf_init,
        quant_dtype=quant_dtype, sorted_scales=sorted_scales,
    )  # fmt: skip
    return topk_weights, topk_ids, out, a_q, a_scale


def moe_route_sort_quant(
    router_logits: torch.Tensor,
    x: torch.Tensor,
    topk: int,
    num_experts: int,
    block_m: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    zero_buf: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    zero_buf_init: torch.Tensor | None = None,
    quant_dtype: str = "mxfp4",
    sorted_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, MoeSortOutput, torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`moe_route_sort_quant_out`: returns ``(topk_weights, topk_ids,
    MoeSortOutput, a_q, a_scale)``, shaped as by :func:`moe_route` and
    :func:`moe_sort_quant`.  ``zero_buf`` and ``sorted_scales`` are the caller's buffers
    (written, not returned).

    Raises:
        TypeError, ValueError: as :func:`moe_route_sort_quant_out`.
    """
    which = C.select_moe_route_sort_quant(quant_dtype)
    codes = C.moe_route_sort_quant_codes(scoring, renormalize, num_expert_group, topk_group)
    s = getattr(C, which)(
        router_logits, x, topk, num_experts, block_m, scoring=codes[0], renormalize=codes[1],
        num_expert_group=codes[2], topk_group=codes[3], correction_bias=correction_bias,
        routed_scaling_factor=routed_scaling_factor, zero_buf=zero_buf, expert_map=expert_map,
        zero_buf_init=zero_buf_init, sorted_scales=sorted_scales,
    )  # fmt: skip
    m, k, d, dev = s.M, int(topk), x.shape[1], router_logits.device
    fp8 = which == "moe_route_sort_quant_fp8"
    w = torch.empty(m, k, dtype=torch.float32, device=dev)
    ids = torch.empty(m, k, dtype=torch.int32, device=dev)
    out = _alloc_sort_out(m, k, s.max_rows, int(block_m), dev)
    a_q = torch.empty(m, d if fp8 else d // 2, dtype=torch.uint8, device=dev)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=dev)
    return moe_route_sort_quant_out(
        router_logits, x, topk, num_experts, block_m, w, ids, out, a_q, a_scale,
        scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
        topk_group=topk_group, correction_bias=correction_bias,
        routed_scaling_factor=routed_scaling_factor, zero_buf=zero_buf, expert_map=expert_map,
        zero_buf_init=zero_buf_init, quant_dtype=quant_dtype, sorted_scales=sorted_scales,
    )  # fmt: skip
