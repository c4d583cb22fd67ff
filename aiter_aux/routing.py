"""The routing of ``aiter-aux run``: random router logits and their routing by a model's
router (:mod:`aiter_aux.router_config`), or routing drawn without a router.

Logits: bf16 ``[M, routed experts]``, N(0, 1) plus the log of each expert's skewed,
Zipf-like popularity, and a correction bias N(0, ``BIAS_STD``) per expert when the router
has one.  An odd ``expert`` with ``topk > 1`` holds a fused shared expert (the last): the
router routes the others with ``topk - 1`` and every token takes the shared one with
weight 1.
"""

from __future__ import annotations

import textwrap
from typing import NamedTuple

import torch

from . import reference as ref
from .router_config import Router, router_for, router_of_shape

ZIPF_S = 1.1  # the skew of the experts' popularity
BIAS_STD = 0.05  # a drawn correction bias: N(0, BIAS_STD) per expert


def routed(expert: int, topk: int) -> tuple[int, int, bool]:
    """``(routed experts, routed topk, fused shared)``: an odd ``expert`` with ``topk > 1``
    holds a fused shared expert (the last), which every token takes."""
    shared = expert % 2 == 1 and topk > 1
    return (expert - 1, topk - 1, True) if shared else (expert, topk, False)


def _popularity(routed_e: int, gen: torch.Generator, zipf_s: float) -> torch.Tensor:
    ranks = torch.randperm(routed_e, generator=gen).double() + 1.0
    return ranks.pow(-zipf_s)


def _with_shared(ids, weights, expert: int, shared: bool):
    if shared:
        m = ids.shape[0]
        ids = torch.cat([ids, torch.full((m, 1), expert - 1, dtype=ids.dtype)], dim=1)
        weights = torch.cat([weights, torch.ones(m, 1, dtype=weights.dtype)], dim=1)
    return ids.to(torch.int32).contiguous(), weights.float().contiguous()


def draw_routing(
    num_tokens: int, expert: int, topk: int, gen: torch.Generator, zipf_s: float = ZIPF_S
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router-like ``(topk_ids int32 [M, topk], topk_weights float32 [M, topk])`` drawn
    without a router: each token ``topk`` distinct experts of skewed popularity."""
    routed_e, routed_k, shared = routed(expert, topk)
    popularity = _popularity(routed_e, gen, zipf_s)
    ids = torch.multinomial(
        popularity.expand(max(num_tokens, 1), routed_e), routed_k, replacement=False, generator=gen
    )[:num_tokens]
    logits = torch.randn(num_tokens, routed_k, generator=gen)
    return _with_shared(ids, torch.softmax(logits, dim=-1), expert, shared)


class Logits(NamedTuple):
    """Random router logits and what ``moe_route`` needs besides them (CPU tensors)."""

    router_logits: torch.Tensor  # bf16 [M, routed experts]
    topk: int  # the routed top-k
    options: dict  # moe_route's keyword arguments, the drawn correction_bias included


def draw_logits(num_tokens: int, expert: int, topk: int, router: Router, gen: torch.Generator,
                zipf_s: float = ZIPF_S) -> Logits:  # fmt: skip
    """bf16 router logits ``[M, routed experts]``: N(0, 1) plus the log of each expert's
    skewed popularity, and a correction bias N(0, BIAS_STD) when ``router`` has one."""
    routed_e, routed_k, _ = routed(expert, topk)
    offset = _popularity(routed_e, gen, zipf_s).log().float()
    logits = (torch.randn(num_tokens, routed_e, generator=gen) + offset).bfloat16()
    bias = torch.randn(routed_e, generator=gen) * BIAS_STD if router.correction_bias else None
    return Logits(logits, routed_k, router.options(bias))


def route_problem(router: Router, expert: int, topk: int) -> str | None:
    """Why ``router`` cannot route a shape of ``expert`` experts and ``topk`` (moe_route's
    own message), or None."""
    logits = draw_logits(0, expert, topk, router, torch.Generator().manual_seed(0))
    try:
        ref.moe_route(logits.router_logits, logits.topk, **logits.options)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def route_logits(logits: Logits, expert: int, ns=ref) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_ids, topk_weights)`` of the whole shape: ``ns.moe_route`` of ``logits``
    (``ns`` is :mod:`aiter_aux.reference` or :mod:`aiter_aux.ops`), then the fused shared
    expert's column when the shape has one."""
    weights, ids = ns.moe_route(logits.router_logits, logits.topk, **logits.options)
    shared = logits.router_logits.shape[1] == expert - 1
    return _with_shared(ids.cpu(), weights.cpu(), expert, shared)


def resolve_router(shape, text: str) -> tuple[Router | None, str]:
    """``(router, line)``: the router ``--router`` names (``auto``: the shape's model), and
    the line that says which and how; None (routing drawn) where moe_route cannot route the
    shape and ``auto`` chose.  A named router that cannot route the shape, or an unknown
    name, is a ValueError."""
    expert, _d, _i, topk = shape
    if text == "auto":
        router, why = router_of_shape(shape)
    else:
        router, why = router_for(text), f"--router {text}"
    problem = route_problem(router, expert, topk)
    if problem and text != "auto":
        raise ValueError(f"--router {text}: moe_route cannot route this shape: {problem}")
    if problem:
        return None, _wrap(f"router: none, routing drawn (moe_route: {problem})")
    routed_e, routed_k, shared = routed(expert, topk)
    fused = ", and the fused shared expert with weight 1" if shared else ""
    text = (f"router: {router.describe()}: {why}; moe_route of random bf16 logits over "
            f"{routed_e} experts, top-{routed_k}{fused}.")  # fmt: skip
    return router, _wrap(" ".join([text, *(f"Note: {n}." for n in router.notes)]))


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 100, subsequent_indent="  ", break_on_hyphens=False))
