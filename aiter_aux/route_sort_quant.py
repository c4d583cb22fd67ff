"""``moe_route_sort_quant``: the routing preamble from router logits in one call,
``moe_route`` then ``moe_sort_quant`` on its outputs, with the bytes of the two ops.

:func:`composite` builds it over a namespace that has both ops: :mod:`aiter_aux.ops` (two
launches on the GPU, one fused launch is future work) and :mod:`aiter_aux.reference` (the
spec).  Every argument of both ops is checked before the first one runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def composite(ns: Any) -> Callable[..., tuple]:
    """``moe_route_sort_quant`` over ``ns`` (``aiter_aux.ops`` or ``aiter_aux.reference``)."""

    def moe_route_sort_quant(
        router_logits: Any,
        x: Any,
        topk: int,
        num_experts: int,
        block_m: int,
        *,
        scoring: str = "softmax",
        renormalize: bool = True,
        num_expert_group: int | None = None,
        topk_group: int | None = None,
        correction_bias: Any = None,
        routed_scaling_factor: float = 1.0,
        quant_dtype: str = "mxfp4",
        sorted_scales: Any = None,
        expert_map: Any = None,
        zero_buf: Any = None,
    ) -> tuple:
        """:func:`moe_route` of ``router_logits`` then :func:`moe_sort_quant` of its
        ``(topk_ids, topk_weights)`` with ``x``: returns ``(topk_weights, topk_ids,
        MoeSortOutput, a_q, a_scale)``, byte for byte the two calls' outputs.
        ``sorted_scales`` and ``zero_buf`` are the caller's buffers, as in
        :func:`moe_sort_quant`.  Raises the ops' ``TypeError`` / ``ValueError`` before
        either runs."""
        from .reference.route import route_outputs
        from .validation import _checks as C

        route = dict(scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
                     topk_group=topk_group, correction_bias=correction_bias,
                     routed_scaling_factor=routed_scaling_factor)  # fmt: skip
        w, ids = route_outputs(router_logits, topk, **route)  # the route's checks and sizes
        k = w.shape[1]
        sort = dict(zero_buf=zero_buf, expert_map=expert_map, sorted_scales=sorted_scales)
        getattr(C, C.select_moe_sort_quant(quant_dtype))(ids, w, x, num_experts, block_m, **sort)
        ns.moe_route_out(router_logits, k, w, ids, **route)
        out, a_q, a_scale = ns.moe_sort_quant(
            ids, w, x, num_experts, block_m, quant_dtype=quant_dtype, **sort
        )
        return w, ids, out, a_q, a_scale

    return moe_route_sort_quant
