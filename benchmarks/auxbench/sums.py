"""The moe_sum rows of the benchmark, beside moe_scatter_reduce's: the same tokens, topk and
model_dim, bf16 rows laid out ``[M, topk, model_dim]`` (vLLM's / SGLang's reduce input)
instead of sorted rows gathered through reverse_sorted.

* ``moe_sum``: the plain sum (vLLM's two-argument ``moe_sum``, SGLang's ``moe_sum_reduce``
  with a factor of 1.0);
* ``moe_sum_ep``: with ``topk_ids`` and an identity ``expert_map`` (vLLM's pad-aware form:
  one id and one map lookup per slot; every slot local, so the plain sum's bytes).
"""

from __future__ import annotations

import torch

from .common import ops, ref

SUM_OPS = ("moe_sum", "moe_sum_ep")
SUM_BYTES_FORMULAS = {
    "moe_sum": "2ND + 2MD   (read the bf16 [M, topk, D] input once; write out bf16: "
    "moe_scatter_reduce's rows and output without reverse_sorted and the weights)",
    "moe_sum_ep": "moe_sum + 4N + 4E   (topk_ids and the expert_map read once)",
}


def sum_bytes(op: str, s) -> int:
    """The minimum bytes of a moe_sum row (``SUM_BYTES_FORMULAS``)."""
    plain = 2 * s.n * s.d + 2 * s.m * s.d
    return plain + (4 * s.n + 4 * s.e if op == "moe_sum_ep" else 0)


def sum_input(m: int, k: int, d: int, dev, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, k, d, generator=gen, device=dev, dtype=torch.bfloat16)


def sum_spec(op: str, base: dict, s, dev, spec_type):
    """The ``spec_type`` (cases.OpSpec) of a moe_sum row."""
    kw = {}
    if op == "moe_sum_ep":
        kw = {"topk_ids": base["ids"], "expert_map": torch.arange(s.e, dtype=torch.int32,
                                                                  device=dev)}  # fmt: skip
    compiled = None if kw else (lambda c, i, o: c.call("moe_sum_out", i["x"], o["o"]))
    return spec_type(
        {"x": base["sum_in"]},
        lambda: {"o": torch.empty(s.m, s.d, dtype=torch.bfloat16, device=dev)},
        lambda i, o: ops.moe_sum_out(i["x"], o["o"], **kw),
        lambda i, o: ref.moe_sum_out(i["x"], o["o"], **kw),
        compiled,
        lambda g, w: bool(torch.equal(g["o"].view(torch.int16), w["o"].view(torch.int16))),
    )
