"""Reference ``moe_route[_out]``: the top-k gate of a MoE layer, from router logits to
``(topk_weights, topk_ids)`` (docs/ops.md "moe_route" is the spec in words).

Every fp32 operation below is one IEEE operation rounded to nearest even (elementwise torch
ops on fp32 tensors, never fused), in an order the kernels repeat exactly:

* ``exp`` is :func:`exp_f32`, built from fp32 multiplies and adds (no libm), defined for
  arguments <= 0 (the only ones the gate needs);
* softmax: ``m`` = the largest non-NaN logit of the row (-Inf if none), ``e_i =
  exp_f32(x_i - m)``, ``s`` = the sum of :func:`row_sum` (64 partial sums over the columns
  ``i = 64 c + j`` in ``c`` order, then a halving tree), ``score_i = e_i / s``;
* sigmoid: ``1 / (1 + exp_f32(-x))`` for ``x >= 0``, ``e / (1 + e)`` with ``e = exp_f32(x)``
  for ``x < 0``;
* selection by :func:`order_key`: larger first, NaN below every number, ``-0 == +0``, ties to
  the lower index; the weights' sum is in ``k`` order from +0.0; every NaN weight is
  written as 0x7FFFFFFF.
"""

from __future__ import annotations

import torch

from aiter_aux.validation import _checks as C
from aiter_aux.validation.ints import validate_int

from . import chunks

__all__ = ["exp_f32", "moe_route", "moe_route_out", "order_key", "row_sum"]

F32 = torch.float32
#: The partial sums of :func:`row_sum` (a GPU warp holds 64 / warp size of them per lane).
SUM_LANES = 64
#: ``(t + ROUND) - ROUND`` rounds ``t`` (|t| < 2**22) to an integer, ties to even.
ROUND = 12582912.0  # 1.5 * 2**23
LOG2E = 1.44269502162933349609375  # fp32 nearest to log2(e)
LN2_HI = 0.693359375  # 355 / 512: k * LN2_HI is exact for |k| < 2**15
LN2_LO = -2.12194440e-4
#: exp(r) ~ 1 + r + r^2 * P(r) on |r| <= ln(2) / 2 (Cephes expf's coefficients), Horner.
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
            1.6666665459e-1, 5.0000001201e-1)  # fmt: skip
#: Indices are packed in the low 11 bits of the selection keys (E <= 1024 < 2**11).
INDEX_BITS = 11


def _c(v: float, like: torch.Tensor) -> torch.Tensor:
    """The fp32 constant ``v`` as a 0-dim tensor (the ops then round in fp32 only)."""
    return torch.tensor(v, dtype=F32, device=like.device)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` of fp32 ``x <= 0`` (or NaN), as every backend computes it:

    ``k = round_even(x * LOG2E)``; ``k < -126``: +0.0; else ``r = (x - k * LN2_HI) - k *
    LN2_LO``, ``p = ((P(r) * (r * r)) + r) + 1`` (Horner, each product and sum rounded) and
    the result ``p * 2**k`` (one rounding: subnormal results are kept).  NaN gives NaN;
    -Inf gives +0.0; 0 gives 1.  Within 1 ulp of the correctly rounded exp on [-87.3, 0]
    (docs/ops.md)."""
    t = x * _c(LOG2E, x)
    rnd = _c(ROUND, x)
    k = (t + rnd) - rnd
    low = ~(k >= -126.0)  # NaN too: replaced below
    k = torch.where(low, torch.zeros_like(k), k)
    r = (x - k * _c(LN2_HI, x)) - k * _c(LN2_LO, x)
    p = torch.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        p = p * r + _c(c, x)
    p = (p * (r * r) + r) + _c(1.0, x)
    scale = ((k.to(torch.int32) + 127) << 23).view(F32)  # 2**k, k in [-126, 0]
    out = p * scale
    out = torch.where(low, torch.zeros_like(out), out)
    return torch.where(torch.isnan(x), x, out)


def sigmoid_f32(x: torch.Tensor) -> torch.Tensor:
    """The gate's sigmoid of fp32 ``x`` (NaN stays NaN, +-Inf give 1 and 0)."""
    one = _c(1.0, x)
    pos = x >= 0
    e = exp_f32(torch.where(pos, -x, x))
    return torch.where(pos, one / (one + e), e / (one + e))


def row_sum(e: torch.Tensor) -> torch.Tensor:
    """The fp32 sum of each row of ``e`` [M, E] in the kernels' order: ``p_j`` (``j <
    64``) = +0.0 plus ``e[:, 64 c + j]`` for ``c = 0, 1, ...`` in order; then ``p_j = p_j +
    p_{j + h}`` for ``h = 32, 16, ..., 1``; the sum is ``p_0``."""
    m, n = e.shape
    cols = -(-n // SUM_LANES) * SUM_LANES
    pad = torch.zeros(m, cols, dtype=F32, device=e.device)
    pad[:, :n] = e
    pad = pad.view(m, cols // SUM_LANES, SUM_LANES)
    p = torch.zeros(m, SUM_LANES, dtype=F32, device=e.device)
    for c in range(pad.shape[1]):
        p = p + pad[:, c]
    h = SUM_LANES // 2
    while h:
        p = p[:, :h] + p[:, h : 2 * h]
        h //= 2
    return p[:, 0]


def order_key(v: torch.Tensor) -> torch.Tensor:
    """int64 keys that order fp32 ``v`` as the selection does: a larger number has a larger
    key, -0.0 and +0.0 the same, NaN 0 (below every number, -Inf is 0x7FFFFF)."""
    bits = (v + _c(0.0, v)).view(torch.int32).to(torch.int64)  # -0 + 0 = +0
    key = torch.where(bits >= 0, bits + (1 << 31), (1 << 31) - 1 - (bits & 0x7FFFFFFF))
    return torch.where(torch.isnan(v), torch.zeros_like(key), key)


def _select(key: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest ``key`` per row, in descending order, ties to the
    lower index (keys are made unique by the index in their low bits)."""
    idx = torch.arange(key.shape[-1], device=key.device)
    unique = (key << INDEX_BITS) | ((1 << INDEX_BITS) - 1 - idx)
    return unique.topk(k, dim=-1, sorted=True).indices


def _scores(x: torch.Tensor, scoring: int) -> torch.Tensor:
    """The fp32 scores of fp32 logits ``x``; ``scoring``: 0 softmax, 1 sigmoid, 2 none."""
    if scoring == 2:
        return x
    if scoring == 1:
        return sigmoid_f32(x)
    neg_inf = torch.full_like(x, float("-inf"))
    m = torch.where(torch.isnan(x), neg_inf, x).amax(dim=1, keepdim=True)
    e = exp_f32(x - m)
    return e / row_sum(e)[:, None]


def _route_rows(x, bias, topk, scoring, renormalize, groups, topk_group, scale):
    """``(weights, ids)`` of the fp32 logits ``x`` [m, E]."""
    m, n = x.shape
    scores = _scores(x, scoring)
    choice = scores if bias is None else scores + bias
    key = order_key(choice)
    if groups:
        size = n // groups
        gc = choice.view(m, groups, size)
        gsel = _select(key.view(m, groups, size), min(2, size) if bias is not None else 1)
        top = gc.gather(2, gsel)
        gscore = top[..., 0] + top[..., 1] if top.shape[2] == 2 else top[..., 0]
        kept = _select(order_key(gscore), topk_group)
        keep = torch.zeros(m, groups, dtype=torch.bool, device=x.device)
        keep.scatter_(1, kept, True)
        keep = keep[:, :, None].expand(m, groups, size).reshape(m, n)
        key = torch.where(keep, key, torch.full_like(key, -1))  # never selected
    ids = _select(key, topk)
    w = scores.gather(1, ids)
    if renormalize:
        s = torch.zeros(m, dtype=F32, device=x.device)
        for k in range(topk):
            s = s + w[:, k]
        w = w / s[:, None]
    w = w * _c(scale, x)
    w = w.view(torch.int32).masked_fill(torch.isnan(w), 0x7FFFFFFF).view(F32)
    return w, ids.to(torch.int32)


@torch.no_grad()
def moe_route_out(
    router_logits: torch.Tensor,
    topk: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    token_expert_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k gate of each row of ``router_logits``, into ``topk_weights`` and
    ``topk_ids``.

    ``scores`` = softmax over the row (``scoring="softmax"``) or the sigmoid of each logit
    (``"sigmoid"``), fp32 as the module docstring defines them, or the logits widened to fp32
    (``"none"``: they are scores already); ``choice = scores +
    correction_bias`` (fp32) when a bias is given, else ``scores``.  With
    ``num_expert_group`` (G, dividing E) the experts form G groups of E / G consecutive ids; a
    group's score is the sum of its two largest ``choice`` (largest first; its one ``choice``
    when E / G = 1) with a bias, else its largest ``score``; the ``topk_group`` best groups
    are kept (ties to the lower group) and the other experts are never selected.
    ``topk_ids[t]`` = the ``topk`` largest ``choice`` (NaN below every number, ties to the
    lower id) in descending order; ``topk_weights[t, k]`` = ``scores[t, topk_ids[t, k]]``,
    divided by their fp32 sum in ``k`` order when ``renormalize``, then times
    ``fp32(routed_scaling_factor)``; a NaN weight is written as 0x7FFFFFFF.

    Args:
        router_logits: float32, float16 or bfloat16 ``[M, E]``, ``1 <= E <= 1024``.
        topk: experts per token, ``1 <= topk <= min(E, 16)``.
        topk_weights: float32 ``[>= M, topk]``; the first M rows are written.
        topk_ids: int32 ``[>= M, topk]``; the first M rows are written.
        scoring: ``"softmax"``, ``"sigmoid"`` or ``"none"``.
        renormalize: divide the weights by their sum.
        num_expert_group: None, or the number of groups G (E % G == 0); needs topk_group.
        topk_group: None, or the groups kept, ``1 <= topk_group <= G`` with ``topk <=
            topk_group * E / G``; needs num_expert_group.
        correction_bias: optional float32 ``[E]``, added to the scores for the choice only.
        routed_scaling_factor: a float (rounded to fp32) multiplying every weight.
        token_expert_indices: optional int32 ``[>= M, topk]``; its first M rows are written
            ``token_expert_indices[t, k] = k * M + t`` (the row of output ``(t, k)`` in the
            expert-major order vLLM's ``topk_softmax`` names this way).

    Returns:
        ``(topk_weights, topk_ids)``.

    Raises:
        TypeError, ValueError: wrong types, dtypes or shapes, a rule above broken, mixed
            devices, an output too small or overlapping an input.
    """
    codes = C.moe_route_codes(scoring, renormalize, num_expert_group, topk_group)
    s = C.moe_route_out(
        router_logits, topk, topk_weights, topk_ids, correction_bias=correction_bias,
        scoring=codes[0], renormalize=codes[1], num_expert_group=codes[2],
        topk_group=codes[3], routed_scaling_factor=routed_scaling_factor,
        token_expert_indices=token_expert_indices,
    )  # fmt: skip
    topk, scale = validate_int(topk, "topk"), float(routed_scaling_factor)
    if token_expert_indices is not None:
        dev = token_expert_indices.device
        t = torch.arange(s.M, dtype=torch.int64, device=dev)[:, None]
        k = torch.arange(topk, dtype=torch.int64, device=dev)[None, :]
        token_expert_indices[: s.M] = (k * s.M + t).to(torch.int32)
    bias = None if correction_bias is None else correction_bias.to(F32)
    step = chunks.rows_per_chunk(s.E)
    for t0 in range(0, s.M, step):
        x = router_logits[t0 : t0 + step].to(F32)
        w, ids = _route_rows(x, bias, topk, codes[0], bool(codes[1]), codes[2],
                             codes[3], scale)  # fmt: skip
        topk_weights[t0 : t0 + x.shape[0]] = w
        topk_ids[t0 : t0 + x.shape[0]] = ids
    return topk_weights, topk_ids


def moe_route(
    router_logits: torch.Tensor,
    topk: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    token_expert_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`moe_route_out` (``token_expert_indices`` is the caller's
    buffer: written, not returned).

    Returns:
        ``(topk_weights, topk_ids)``: float32 and int32 ``[M, topk]``.

    Raises:
        TypeError, ValueError: as :func:`moe_route_out`.
    """
    route = dict(scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
                 topk_group=topk_group, correction_bias=correction_bias,
                 routed_scaling_factor=routed_scaling_factor)  # fmt: skip
    w, ids = route_outputs(router_logits, topk, **route)
    return moe_route_out(router_logits, topk, w, ids, token_expert_indices=token_expert_indices,
                         **route)  # fmt: skip


def route_outputs(
    router_logits: torch.Tensor,
    topk: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every check of :func:`moe_route` (its arguments as it takes them), then its outputs
    allocated and uninitialised: ``(topk_weights, topk_ids)``, float32 and int32 ``[M,
    topk]`` on ``router_logits``' device.  The one place of the route's output sizes in the
    reference (:func:`moe_route`; the ops take theirs from the op table)."""
    codes = C.moe_route_codes(scoring, renormalize, num_expert_group, topk_group)
    s = C.moe_route(
        router_logits, topk, correction_bias=correction_bias, scoring=codes[0],
        renormalize=codes[1], num_expert_group=codes[2], topk_group=codes[3],
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
    dev = router_logits.device
    k = validate_int(topk, "topk")
    w = torch.empty(s.M, k, dtype=F32, device=dev)
    ids = torch.empty(s.M, k, dtype=torch.int32, device=dev)
    return w, ids
