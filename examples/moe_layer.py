"""A whole MXFP4 MoE layer forward (a4w4 and a8w4) built from the aux ops of aiter_aux.

    route            moe_route: the model's top-k gate of the router logits -> topk_ids,
                     topk_weights (the router's options from its config.json fields)
    moe_sort_quant   group the (token, k) pairs by expert, each expert's rows padded to
                     block_m, and quantise x per token (MXFP4, or MXFP8 for a8w4)
    GEMM 1           per expert, over its sorted rows: [rows, 2 * inter_dim] (w1, w3 fused)
    activation       SiLU(gate) * up, bf16, quantised again (mxfp4_quant / mxfp8_quant)
    GEMM 2           per expert: expert_out bf16 [rows, model_dim]
    scatter-reduce   moe_scatter_reduce: out[t] = routed_scaling_factor * sum_k w * row

The router is a shipped model's (``--router``, default DeepSeek-V3: sigmoid scores, a
correction bias drawn at random, 4 of 8 expert groups, renormalised, times 2.5), its
options derived from the config by aiter_aux.router_config.router_from_config.  A shape
with a fused shared expert (an odd E, as DeepSeek-V3's 257) routes the other E - 1 experts
and appends the shared one to every token with weight 1.0.
The grouped GEMMs are plain PyTorch on dequantised operands; a real engine calls its MXFP4
GEMM there, which reads a_q / a_scale and the sort outputs itself.  Expert weights are
random bf16 quantised to MXFP4 (mxfp4_quant; the reference's under AITER_AUX_DISABLE_JIT=1
where no instance serves the row width), one expert on first use: a CPU run then draws only
the routed experts.  Any shape the aux ops serve runs (mxfp4_moe_shape_status); one the
catalog lacks is built on demand by its first calls.

Accuracy, measured by compare() against dense_moe_reference (fp32, the same dequantised
weights, no aux op) with the relative norm ||y - y_ref|| / ||y_ref|| over the output:

* against the unquantised MoE, the cost of quantising the activations (x and the
  intermediate): one MXFP4 rounding of N(0, 1) rows is off by 11.5 % (relative norm),
  the SiLU-gated intermediate by 15 %, and the
  error of x reaches both gate and up, so a4w4 lands near 0.23; E4M3 keeps 3 mantissa bits
  (2.7 % per rounding), a8w4 near 0.05.  Measured on the default shape with the default
  router (DeepSeek-V3's), CPU, M = 2, 4, 8, 16, 64, seeds 0-4: a4w4 0.217-0.257 (M = 1:
  0.214-0.233), a8w4 0.045-0.060 (M = 1: 0.041-0.053).  TOLERANCE bounds any M, one token
  included, with margin.
* against the MoE that quantises x per token and the intermediate per pair exactly as
  moe_forward does, what is left is bf16 rounding (expert_out, out): 0.0023-0.0024 in the
  same runs, for both formats.  PLUMBING_TOLERANCE = 0.01 catches a misplaced row, weight or
  scale that the quantisation noise above would hide.

    python examples/moe_layer.py --device cpu --quant mxfp4 --tokens 1,4,16
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import aiter_aux
from aiter_aux import reference
from aiter_aux.router_config import Router, router_for

TOLERANCE = {"mxfp4": 0.4, "mxfp8": 0.075}  # ||y - y_ref|| / ||y_ref||, unquantised y_ref
PLUMBING_TOLERANCE = 0.01  # the same, y_ref with moe_forward's activation quantisation
# (num_experts, model_dim, inter_dim, topk): MiniMax-M2 at TP8 (inter 1536 / 8; catalog 256)
DEFAULT_SHAPE = (256, 3072, 192, 8)
BLOCK_M = 32
DEFAULT_ROUTER = "DeepSeek-V3"  # 256 routed experts, top-8: the default shape's

_E2M1 = torch.tensor(reference.E2M1_VALUES)  # the value of each 4-bit e2m1 code
E2M1_PAIRS = torch.stack((_E2M1[torch.arange(256) & 0xF], _E2M1[torch.arange(256) >> 4]), 1)
E8M0 = torch.tensor([math.ldexp(1.0, s - 127) for s in range(255)] + [math.nan])  # 2^(s-127)


def dequant(q: torch.Tensor, scale: torch.Tensor, quant: str) -> torch.Tensor:
    """MX bytes [n, k/2] (mxfp4: two e2m1 per byte, element 2j in the low nibble) or [n, k]
    (mxfp8: E4M3), and e8m0 scales [n, k/32] -> float32 [n, k]."""
    if quant == "mxfp4":
        vals = E2M1_PAIRS.to(q.device)[q.long()].flatten(-2)
    else:
        vals = q.view(torch.float8_e4m3fn).float()
    s = E8M0.to(q.device)[scale.long()]
    return (vals.unflatten(-1, (-1, 32)) * s.unsqueeze(-1)).flatten(-2)


def quantise(x: torch.Tensor, quant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp4_quant / mxfp8_quant of bf16 rows.  The compiled quant is specialised by the row
    width: a width the catalog lacks (GEMM 1's inter_dim, usually) is built on demand by
    its first call.  Under AITER_AUX_DISABLE_JIT=1 such rows are quantised by the
    reference, which gives the same bytes."""
    try:
        return getattr(aiter_aux, f"{quant}_quant")(x)
    except aiter_aux.UnsupportedShapeError:
        return getattr(reference, f"{quant}_quant")(x)


class Mxfp4Experts:
    """The experts' weights in MXFP4, blocks of 32 along the reduction dim as a checkpoint
    stores them: w13 [2 * inter_dim, model_dim] (w1 = gate rows, then w3 = up rows) and w2
    [model_dim, inter_dim] per expert.  Expert e is drawn in bf16 from N(0, 1/fan_in) seeded
    by (seed, e) and quantised on first use; w13(e) / w2(e) return it dequantised (kept as
    bf16, which holds every e2m1 value times its power-of-two scale exactly)."""

    def __init__(self, num_experts, model_dim, inter_dim, device, seed=0):
        self.num_experts, self.model_dim, self.inter_dim = num_experts, model_dim, inter_dim
        self.device, self.seed, self._weights = device, seed, {}

    def _expert(self, e: int) -> list[torch.Tensor]:
        if e not in self._weights:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + e)
            w13 = torch.randn(2 * self.inter_dim, self.model_dim, generator=g)
            w2 = torch.randn(self.model_dim, self.inter_dim, generator=g)
            self._weights[e] = []
            for w in (w13, w2):
                q, scale = quantise(
                    (w / w.shape[1] ** 0.5).to(self.device, torch.bfloat16), "mxfp4"
                )
                self._weights[e].append(dequant(q, scale, "mxfp4").to(torch.bfloat16))
        return self._weights[e]

    def w13(self, e: int) -> torch.Tensor:
        return self._expert(e)[0].float()

    def w2(self, e: int) -> torch.Tensor:
        return self._expert(e)[1].float()


def routed_experts(num_experts: int, topk: int) -> int:
    """The experts the router scores: all of them, or, where the shape holds a fused shared
    expert (an odd E with topk > 1, as ``aiter-aux run`` reads the catalog), all but that one,
    the last, which every token takes."""
    return num_experts - 1 if num_experts % 2 == 1 and topk > 1 else num_experts


def route(router_logits: torch.Tensor, topk: int, options: dict | None = None,
          num_experts: int | None = None):  # fmt: skip
    """moe_route with a router's options (``Router.options``; None: moe_route's defaults,
    softmax renormalised) -> (topk_ids int32, topk_weights float32) ``[M, topk]``.  When the
    router scores one expert fewer than ``num_experts``, it picks ``topk - 1`` and the fused
    shared expert (``num_experts - 1``) is the last column, weight 1.0."""
    shared = num_experts is not None and router_logits.shape[1] == num_experts - 1
    topk_weights, topk_ids = aiter_aux.moe_route(router_logits, topk - shared, **(options or {}))
    if shared:
        m = topk_ids.shape[0]
        topk_ids = torch.cat([topk_ids, topk_ids.new_full((m, 1), num_experts - 1)], 1)
        topk_weights = torch.cat([topk_weights, topk_weights.new_ones(m, 1)], 1)
    return topk_ids, topk_weights


def expert_segments(sorted_expert_ids, rows: int, block_m: int) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of each expert's segment: the sort places an expert's rows
    contiguously, padded to block_m, and sorted_expert_ids has the expert of each block."""
    experts, blocks = sorted_expert_ids[: rows // block_m].unique_consecutive(return_counts=True)
    ends = blocks.cumsum(0) * block_m
    return list(
        zip(experts.tolist(), (ends - blocks * block_m).tolist(), ends.tolist(), strict=True)
    )


def grouped_gemm(rows: torch.Tensor, weight, segments) -> torch.Tensor:
    """fp32 rows[r] @ weight(e).T for the rows r of each expert e's segment."""
    return torch.cat([rows[start:end] @ weight(e).T for e, start, end in segments])


def moe_forward(x, router_logits, experts, topk, quant="mxfp4", routed_scaling_factor=1.0,
                block_m=BLOCK_M, router_options=None):  # fmt: skip
    """bf16 x [M, model_dim] -> bf16 [M, model_dim], and (topk_ids, topk_weights)."""
    M, model_dim = x.shape
    topk_ids, topk_weights = route(router_logits, topk, router_options, experts.num_experts)

    # Sort + activation quant in one call.  a_q / a_scale are per token; sort row r holds the
    # pair (t, k) with t = sorted_token_ids[r] & 0xFFFFFF (= m_indices[r]), M on padding rows.
    sort, a_q, a_scale = aiter_aux.moe_sort_quant(
        topk_ids, topk_weights, x, experts.num_experts, block_m, quant_dtype=quant
    )
    rows = int(sort.num_valid_ids[0])  # rows including padding (a GPU GEMM reads it on device)
    token_of_row = sort.sorted_token_ids[:rows] & 0xFFFFFF
    segments = expert_segments(sort.sorted_expert_ids, rows, block_m)

    # GEMM 1 on each row's token, dequantised; padding rows read a zero row and stay zero.
    x_dq = dequant(a_q, a_scale, quant)
    a_rows = torch.cat([x_dq, x_dq.new_zeros(1, model_dim)])[token_of_row]
    gate, up = grouped_gemm(a_rows, experts.w13, segments).chunk(2, dim=-1)
    h = (F.silu(gate) * up).to(torch.bfloat16)  # GEMM 1's epilogue writes bf16

    # The intermediate is quantised like x, then GEMM 2 writes bf16 rows in sorted order.
    h_q, h_scale = quantise(h, quant)
    expert_out = grouped_gemm(dequant(h_q, h_scale, quant), experts.w2, segments)
    expert_out = expert_out.to(torch.bfloat16)

    # Back to tokens: the topk_weights (sorted_weights) and the scaling are applied here.
    out = aiter_aux.moe_scatter_reduce(
        expert_out, sort.reverse_sorted, sort.sorted_weights, topk,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
    return out, (topk_ids, topk_weights)


def dense_moe_reference(x, topk_ids, topk_weights, experts, routed_scaling_factor=1.0,
                        quant=None):  # fmt: skip
    """fp32 MoE on the dequantised weights, token by token (each token's pairs, grouped by
    expert), no aux op.  quant=None: x and the intermediate unquantised (the accuracy check);
    "mxfp4" / "mxfp8": both quantised as moe_forward does, per token and per pair (the check
    of the plumbing: sort, gathers, weights, reduce)."""

    def act(v):  # the activation as the GEMM sees it
        return v.float() if quant is None else dequant(*quantise(v, quant), quant)

    xf = act(x)
    y = torch.zeros_like(xf)
    for e in topk_ids.unique().tolist():
        t, k = (topk_ids == e).nonzero(as_tuple=True)
        gate, up = (xf[t] @ experts.w13(e).T).chunk(2, dim=-1)
        h = F.silu(gate) * up
        h = act(h if quant is None else h.to(torch.bfloat16))
        y.index_add_(0, t, topk_weights[t, k, None] * (h @ experts.w2(e).T))
    return routed_scaling_factor * y


def router_options(router: Router | None, num_experts: int, device, g) -> dict | None:
    """moe_route's keyword arguments of ``router``, a correction bias drawn (N(0, 0.05),
    float32 [E]) when the model has one; None for moe_route's defaults."""
    if router is None:
        return None
    bias = torch.randn(num_experts, generator=g) * 0.05 if router.correction_bias else None
    return router.options(None if bias is None else bias.to(device))


def compare(experts, num_tokens, topk, quant, routed_scaling_factor=1.0, seed=0,
            router: Router | None = None) -> dict:  # fmt: skip
    """moe_forward on random tokens against dense_moe_reference: rel_err, the relative norm of
    the difference (and its worst token) from the unquantised MoE, which TOLERANCE bounds, and
    plumbing_err, that from the MoE with the same activation quantisation (bf16 roundings).
    The routing is moe_route's of random logits with ``router`` (None: its defaults), over
    the routed experts (``routed_experts``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, experts.model_dim, generator=g).to(experts.device, torch.bfloat16)
    scored = routed_experts(experts.num_experts, topk)
    router_logits = torch.randn(num_tokens, scored, generator=g).to(experts.device)
    options = router_options(router, scored, experts.device, g)
    y, (topk_ids, topk_weights) = moe_forward(
        x, router_logits, experts, topk, quant, routed_scaling_factor, router_options=options
    )
    args = (x, topk_ids, topk_weights, experts, routed_scaling_factor)
    y_ref = dense_moe_reference(*args)
    y_same_quant = dense_moe_reference(*args, quant=quant)
    err = y.float() - y_ref
    r = {
        "rel_err": float(err.norm() / y_ref.norm()),
        "worst_token_rel_err": float((err.norm(dim=1) / y_ref.norm(dim=1)).max()),
        "plumbing_err": float((y.float() - y_same_quant).norm() / y_same_quant.norm()),
    }
    r["ok"] = r["rel_err"] < TOLERANCE[quant] and r["plumbing_err"] < PLUMBING_TOLERANCE
    return r


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int_list, default=[1, 4, 16], help="token counts, e.g. 1,4,16")
    p.add_argument("--quant", choices=("mxfp4", "mxfp8"), default="mxfp4",
                   help="activation format: mxfp4 (a4w4) or mxfp8 (a8w4)")  # fmt: skip
    p.add_argument("--shape", type=int_list, default=list(DEFAULT_SHAPE),
                   help="E,MODEL_DIM,INTER_DIM,TOPK, a shape the aux ops serve (a catalog "
                   "shape, aiter-aux list, is prebuilt; another is built on demand)")  # fmt: skip
    p.add_argument("--routed-scaling-factor", type=float, default=1.0,
                   help="applied by the scatter-reduce, on top of the router's own")  # fmt: skip
    p.add_argument("--router", default=DEFAULT_ROUTER,
                   help="a shipped model's router (aiter-aux list --models), a config.json or "
                   f"'default' (softmax, renormalize); default {DEFAULT_ROUTER}")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch sees no CUDA device")
    if len(args.shape) != 4:
        p.error(f"--shape wants 4 integers E,MODEL_DIM,INTER_DIM,TOPK, got {args.shape}")
    if min(args.tokens) < 1:
        p.error(f"--tokens wants token counts >= 1, got {args.tokens}")
    num_experts, model_dim, inter_dim, topk = args.shape
    status = aiter_aux.mxfp4_moe_shape_status(*args.shape)
    if not status.servable:
        p.error(f"shape {tuple(args.shape)} cannot be served: {status.reason}")
    try:
        router = router_for(args.router)
    except ValueError as e:
        p.error(str(e))
    experts = Mxfp4Experts(num_experts, model_dim, inter_dim, args.device, args.seed)
    name = {"mxfp4": "a4w4", "mxfp8": "a8w4"}[args.quant]
    print(f"{name}, shape {tuple(args.shape)}, {args.device}, tolerance {TOLERANCE[args.quant]}")
    print(f"router: {router.describe()}")
    ok = True
    for m in args.tokens:
        try:
            r = compare(experts, m, topk, args.quant, args.routed_scaling_factor, args.seed,
                        router)  # fmt: skip
        except ValueError as e:  # a router that cannot route this shape (moe_route's checks)
            p.error(f"--router {args.router}: {e}")
        ok &= r["ok"]
        print(f"  M={m:<5} ||y - y_ref|| / ||y_ref|| = {r['rel_err']:.4f} (worst token "
              f"{r['worst_token_rel_err']:.4f}); same quant {r['plumbing_err']:.5f}   "
              f"{'ok' if r['ok'] else 'FAIL'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
