"""The moe_route rows of the benchmark: the gate from bf16 router logits ``[M, E]`` (E and
topk of the case's shape, topk at most 16) to ``topk_weights`` / ``topk_ids``.

* ``moe_route``: softmax, renormalised (Mixtral / Qwen3's gate, vLLM's ``topk_softmax``);
* ``moe_route_grouped``: sigmoid with a correction bias, 8 groups (the largest of 8, 4, 2, 1
  dividing E) of which half are kept, renormalised, a routed scaling factor of 2.5
  (DeepSeek-V3 / Kimi-K2's gate, vLLM's ``grouped_topk``, SGLang's ``moe_fused_gate``);
* ``route_pipeline`` / ``route_pipeline_grouped``: the preamble from router logits to
  GEMM-ready a4w4 inputs, ``moe_route_sort_quant_out`` with ``sorted_scales``: that gate,
  then the decode pipeline on its outputs.
"""

from __future__ import annotations

import torch

from .common import ops, ref

ROUTE_OPS = ("moe_route", "moe_route_grouped", "route_pipeline", "route_pipeline_grouped")
PIPELINE_GATE = {"route_pipeline": "moe_route", "route_pipeline_grouped": "moe_route_grouped"}
ROUTE_BYTES_FORMULAS = {
    "moe_route": "2ME + 8MK   (read the bf16 logits; write topk_weights fp32, topk_ids int32)",
    "moe_route_grouped": "moe_route + 4E   (the fp32 correction bias read once)",
    "route_pipeline": "moe_route + decode_pipeline",
    "route_pipeline_grouped": "moe_route_grouped + decode_pipeline",
}


def route_topk(s) -> int:
    return min(s.k, 16, s.e)


def route_bytes(op: str, s) -> int:
    """The minimum bytes of a moe_route row (``ROUTE_BYTES_FORMULAS``)."""
    plain = 2 * s.m * s.e + 8 * s.m * route_topk(s)
    return plain + (4 * s.e if PIPELINE_GATE.get(op, op) == "moe_route_grouped" else 0)


def route_options(op: str, s, dev) -> dict:
    """moe_route's options of the row."""
    op = PIPELINE_GATE.get(op, op)
    if op == "moe_route":
        return {}
    groups = next(g for g in (8, 4, 2, 1) if s.e % g == 0)
    kept = max(1, groups // 2)
    while route_topk(s) > kept * (s.e // groups):
        kept += 1
    gen = torch.Generator().manual_seed(s.e)
    bias = (torch.randn(s.e, generator=gen) * 0.1).to(dev)
    return dict(scoring="sigmoid", num_expert_group=groups, topk_group=kept,
                correction_bias=bias, routed_scaling_factor=2.5)  # fmt: skip


def route_input(m: int, e: int, dev, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, e, generator=gen, device=dev, dtype=torch.bfloat16) * 2


def route_spec(op: str, base: dict, s, dev, spec_type):
    """The ``spec_type`` (cases.OpSpec) of a moe_route row."""
    k, kw = route_topk(s), route_options(op, s, dev)

    def new_out() -> dict:
        return {"w": torch.empty(s.m, k, dtype=torch.float32, device=dev),
                "ids": torch.empty(s.m, k, dtype=torch.int32, device=dev)}  # fmt: skip

    return spec_type(
        {"x": base["logits"]},
        new_out,
        lambda i, o: ops.moe_route_out(i["x"], k, o["w"], o["ids"], **kw),
        lambda i, o: ref.moe_route_out(i["x"], k, o["w"], o["ids"], **kw),
        None,
        lambda g, w: bool(torch.equal(g["w"].view(torch.int32), w["w"].view(torch.int32))
                          and torch.equal(g["ids"], w["ids"])),  # fmt: skip
    )
