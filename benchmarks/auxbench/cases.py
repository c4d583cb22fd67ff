"""The cases: default shapes and token counts, the ops, the sizes of a case and the minimum
bytes each op moves, the case inputs and the :class:`OpSpec` of each op (how to run ours and
the reference on them, and how to compare their outputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aiter_aux.run_report import Sizes
from aiter_aux.run_report import bytes_moved as op_bytes

from .common import MoeSortOutput, draw_routing, ops, ref
from .route import (
    PIPELINE_GATE,
    ROUTE_BYTES_FORMULAS,
    ROUTE_OPS,
    route_bytes,
    route_input,
    route_options,
    route_spec,
    route_topk,
)
from .sums import SUM_BYTES_FORMULAS, SUM_OPS, sum_bytes, sum_input, sum_spec

if TYPE_CHECKING:
    from .peers import CompiledPeer

DEFAULT_SHAPES = (
    (257, 7168, 256, 9),
    (385, 7168, 512, 9),
    (513, 2560, 768, 11),
    (896, 3584, 512, 16),
    (256, 7168, 256, 8),  # DeepSeek-V3/R1 TP8, shared expert not fused
)
# every power of two from 1 to 4096 (decode, MTP and chunked prefill), then prefill
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536)
QUICK_SHAPES = ((257, 7168, 256, 9), (513, 2560, 768, 11))
QUICK_TOKENS_CUDA = (1, 64, 4096)
QUICK_TOKENS_CPU = (1, 16, 128)

OPS = (
    "moe_sort",
    "mxfp4_quant",
    "moe_sort_quant",
    "mxfp8_quant",  # a8w4: MXFP8 activations, E4M3 elements
    "moe_sort_quant_fp8",
    "moe_sort_scales",
    "moe_scatter_reduce",
    "moe_sum",  # vLLM's / SGLang's reduce layout: the scatter's traffic (auxbench/sums.py)
    "moe_scatter_reduce_q",
    "decode_pipeline",
    # the serving options, each beside its plain op: an identity expert_map, the
    # fused op initialising zero_buf from zero_buf_init, a routed scaling factor of 2.5
    "moe_sort_ep",
    "moe_sort_quant_init",
    "moe_scatter_reduce_scaled",
    "moe_sum_ep",
    "moe_scatter_reduce_q_scaled",
    # the sort in vLLM's / SGLang's format (moe_align_block_size_vllm / _sglang), beside
    # moe_sort: ``x parts`` is their time over moe_sort's in the same run (FUSED_PARTS)
    "moe_align_vllm",
    "moe_align_sglang",
    # the gate from router logits (auxbench/route.py): softmax, and DeepSeek-V3's grouped one
    "moe_route",
    "moe_route_grouped",
    # from router logits to GEMM-ready a4w4 inputs: the gate, then decode_pipeline
    "route_pipeline",
    "route_pipeline_grouped",
)
ALIGN_OPS = {"moe_align_vllm": "moe_align_block_size_vllm",
             "moe_align_sglang": "moe_align_block_size_sglang"}  # fmt: skip
# variant -> (plain op, what it adds)
VARIANTS = {
    "moe_sort_ep": ("moe_sort", "expert_map"),
    "moe_sort_quant_init": ("moe_sort_quant", "zero_buf_init"),
    "moe_scatter_reduce_scaled": ("moe_scatter_reduce", "routed_scaling_factor"),
    "moe_scatter_reduce_q_scaled": ("moe_scatter_reduce_q", "routed_scaling_factor"),
}
ROUTED_SCALING = 2.5

# Minimum bytes moved per op: every input byte that must be read, read once, every output
# byte written once.  M tokens, K = topk, D = model_dim, N = M*K pairs, L = local pairs
# (N here: every drawn id is local), R = num_valid_ids[0] (sorted rows incl. padding),
# bm = block_m, T = tokens with at least one local pair (rows of a_scale actually read),
# R_out = ceil(max_rows / BM) * BM with BM = max(32, bm) (sort_scales writes every byte of it).
BYTES_FORMULAS = {
    "moe_sort": "12N + 12R + 4R/bm + 8   (read ids 4N + weights 4N; write sorted_token_ids, "
    "sorted_weights, m_indices 4R each, sorted_expert_ids 4R/bm, num_valid_ids 8, "
    "reverse_sorted 4N)",
    "mxfp4_quant": "2MD + MD/2 + MD/32   (read x bf16; write a_q, a_scale)",
    "moe_sort_quant": "moe_sort + mxfp4_quant  (+ 2MD with --zero-buf: zero_buf written)",
    "mxfp8_quant": "2MD + MD + MD/32   (read x bf16; write a_q E4M3, a_scale)",
    "moe_sort_quant_fp8": "moe_sort + mxfp8_quant  (+ 2MD with --zero-buf)",
    "moe_sort_scales": "T*D/32 + 4R + 4 + R_out*D/32   (read the a_scale rows of the tokens "
    "present, sorted_token_ids of the valid rows, num_valid_ids[0]; write all of sorted_scales)",
    "moe_scatter_reduce": "4N + L*(2D + 4) + 2MD   (read reverse_sorted, the L referenced bf16 "
    "rows of expert_out and their sorted_weights; write out bf16)",
    "moe_scatter_reduce_q": "4N + L*(D/2 + D/32 + 4) + 2MD   (the same with the e2m1 rows and "
    "their e8m0 scales)",
    "decode_pipeline": "moe_sort_quant + moe_sort_scales   (one call, moe_sort_quant_out with "
    "sorted_scales: the bytes of the two ops, a_scale written and read back counted as in them)",
    "moe_sort_ep": "moe_sort + 4E   (the expert_map read once)",
    "moe_sort_quant_init": "moe_sort_quant + 4MD   (zero_buf_init read, zero_buf written)",
    "moe_scatter_reduce_scaled": "moe_scatter_reduce",
    "moe_scatter_reduce_q_scaled": "moe_scatter_reduce_q",
    **SUM_BYTES_FORMULAS,
    **ROUTE_BYTES_FORMULAS,
    "moe_align_vllm": "8N + 4C + 4C/bm + 4   (read ids 4N; write sorted_token_ids over all C = "
    "N + E*(bm-1) rows (every element), expert_ids, num_tokens_post_pad, scatter_idx 4N)",
    "moe_align_sglang": "moe_align_vllm with C = N + (E+1)*(bm-1)",
}

HBM_PEAK_BYTES_S = 4.3e12  # the floor used in docs/perf.md


# ---------------------------------------------------------------------------------------------
# sizes and bytes
# ---------------------------------------------------------------------------------------------


def bytes_moved(op: str, s: Sizes, zero_buf: bool = False) -> int:
    """The minimum bytes of ``op`` (see ``BYTES_FORMULAS``): the package's model
    (:func:`aiter_aux.run_report.bytes_moved`) plus the benchmark's composite ops."""
    if op == "decode_pipeline":
        return bytes_moved("moe_sort_quant", s, zero_buf) + op_bytes("moe_sort_scales", s)
    if op == "moe_sort_ep":
        return op_bytes("moe_sort", s) + 4 * s.e
    if op == "moe_sort_quant_init":
        return op_bytes("moe_sort_quant", s) + 4 * s.m * s.d
    if op in VARIANTS:
        return op_bytes(VARIANTS[op][0], s)
    if op in SUM_OPS:
        return sum_bytes(op, s)
    if op in PIPELINE_GATE:
        return route_bytes(op, s) + bytes_moved("decode_pipeline", s, zero_buf)
    if op in ROUTE_OPS:
        return route_bytes(op, s)
    if op in ALIGN_OPS:
        cap = align_capacity(op, s)
        return 8 * s.n + 4 * cap + 4 * -(-cap // s.bm) + 4
    return op_bytes(op, s, zero_buf)


def align_capacity(op: str, s: Sizes) -> int:
    """The peer's sorted_token_ids length for the case (vLLM without pad_sorted_ids)."""
    if op == "moe_align_vllm":
        return ref.compat.vllm_align_capacity(s.n, s.e, s.bm)
    return ref.compat.sglang_align_capacity(s.n, s.e, s.bm)


def routing_sizes(ids: torch.Tensor, e: int, d: int, bm: int) -> Sizes:
    """Sizes of one case from its routing (computed on the host, no op needed)."""
    m, k = ids.shape
    flat = ids.reshape(-1).to(torch.int64).cpu()
    local = (flat >= 0) & (flat < e)
    counts = torch.bincount(flat[local], minlength=e)[:e]
    rows = int(((counts + bm - 1) // bm * bm).sum())
    tokens_read = int(local.view(m, k).any(dim=1).sum()) if m else 0
    return Sizes(
        m=m,
        k=k,
        d=d,
        bm=bm,
        rows=rows,
        max_rows=ref.moe_sort_capacity(m, k, e, bm),
        tokens_read=tokens_read,
        n_local=int(local.sum()),
        e=e,
    )


def human_bytes(b: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g}{unit}"
    return f"{int(b)}"


def tensors_of(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_of(o)]
    return []


def footprint(*objs) -> int:
    return sum(t.numel() * t.element_size() for o in objs for t in tensors_of(o))


# ---------------------------------------------------------------------------------------------
# inputs, outputs and the op specs
# ---------------------------------------------------------------------------------------------


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def same_sort(got: MoeSortOutput, want: MoeSortOutput, bm: int) -> bool:
    nv = int(want.num_valid_ids[0])
    lengths = (nv, nv, nv, nv // bm, 2, want.reverse_sorted.numel())
    return all(_same(g[:n], w[:n]) for g, w, n in zip(got, want, lengths, strict=True))


def alloc_sort(s: Sizes, dev) -> MoeSortOutput:
    i32 = dict(dtype=torch.int32, device=dev)
    return MoeSortOutput(
        torch.empty(s.max_rows, **i32),
        torch.empty(s.max_rows, dtype=torch.float32, device=dev),
        torch.empty(s.max_rows, **i32),
        torch.empty(s.max_rows // s.bm, **i32),
        torch.empty(2, **i32),
        torch.empty(s.n, **i32),
    )


def alloc_quant(s: Sizes, dev, fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(s.m, s.d if fp8 else s.d // 2, dtype=torch.uint8, device=dev),
        torch.empty(s.m, s.d // 32, dtype=torch.uint8, device=dev),
    )


@dataclass
class OpSpec:
    """How to run one op of a case: inputs of set 0, fresh outputs, the three runners and the
    comparison of an output set with the reference's."""

    inputs: dict
    new_outputs: Callable[[], dict]
    ours: Callable[[dict, dict], object]
    eager: Callable[[dict, dict], object]
    compiled: Callable[[CompiledPeer, dict, dict], object] | None
    same: Callable[[dict, dict], bool]


def op_spec(op: str, base: dict, s: Sizes, dev, zero_buf: bool) -> OpSpec:
    """The :class:`OpSpec` of ``op`` on the case inputs ``base``."""
    if op in VARIANTS:
        return _variant_spec(op, base, s, dev, zero_buf)
    if op in SUM_OPS:
        return sum_spec(op, base, s, dev, OpSpec)
    if op in PIPELINE_GATE:
        return _pipeline_spec(op, base, s, dev)
    if op in ROUTE_OPS:
        return route_spec(op, base, s, dev, OpSpec)
    e, bm, k = s.e, s.bm, s.k
    if op in ALIGN_OPS:
        name = ALIGN_OPS[op] + "_out"
        cap = align_capacity(op, s)

        def new_align() -> dict:
            i32 = dict(dtype=torch.int32, device=dev)
            sizes = (cap, -(-cap // bm), 1, s.n)
            return {"a": [torch.empty(n, **i32) for n in sizes]}

        return OpSpec(
            {"ids": base["ids"]},
            new_align,
            lambda i, o: getattr(ops, name)(i["ids"], e, bm, *o["a"]),
            lambda i, o: getattr(ref, name)(i["ids"], e, bm, *o["a"]),
            lambda c, i, o: c.call(name, i["ids"], e, bm, *o["a"]),
            lambda g, w: all(_same(x, y) for x, y in zip(g["a"], w["a"], strict=True)),
        )

    def zb() -> dict:
        return (
            {"zero_buf": torch.empty(s.m, s.d, dtype=torch.bfloat16, device=dev)}
            if zero_buf
            else {}
        )

    def zero_ok(o: dict) -> bool:
        return not zero_buf or not bool(o["zero_buf"].view(torch.int16).any())

    if op == "moe_sort":
        return OpSpec(
            {"ids": base["ids"], "w": base["w"]},
            lambda: {"sort": alloc_sort(s, dev)},
            lambda i, o: ops.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"]),
            lambda i, o: ref.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"]),
            lambda c, i, o: c.call("moe_sort_out", i["ids"], i["w"], e, bm, o["sort"]),
            lambda g, w: same_sort(g["sort"], w["sort"], bm),
        )
    if op in ("mxfp4_quant", "mxfp8_quant"):
        ours_q, ref_q, fn = getattr(ops, op + "_out"), getattr(ref, op + "_out"), op + "_out"
        return OpSpec(
            {"x": base["x"]},
            lambda: dict(zip(("q", "s"), alloc_quant(s, dev, op == "mxfp8_quant"), strict=True)),
            lambda i, o: ours_q(i["x"], o["q"], o["s"]),
            lambda i, o: ref_q(i["x"], o["q"], o["s"]),
            lambda c, i, o: c.call(fn, i["x"], o["q"], o["s"]),
            lambda g, w: _same(g["q"], w["q"]) and _same(g["s"], w["s"]),
        )
    if op in ("moe_sort_quant", "moe_sort_quant_fp8", "decode_pipeline"):
        pipe = op == "decode_pipeline"
        qd = "mxfp8" if op == "moe_sort_quant_fp8" else "mxfp4"

        def new_out() -> dict:
            q, sc = alloc_quant(s, dev, qd == "mxfp8")
            out = {"sort": alloc_sort(s, dev), "q": q, "s": sc, **zb()}
            if pipe:
                out["scales"] = torch.empty(s.out_rows, s.d // 32, dtype=torch.uint8, device=dev)
            return out

        def run(fn, i, o):
            # decode_pipeline: ONE call, moe_sort_quant_out with sorted_scales
            kw = {"sorted_scales": o["scales"]} if pipe else {}
            fn(i["ids"], i["w"], i["x"], e, bm, o["sort"], o["q"], o["s"],
               zero_buf=o.get("zero_buf"), quant_dtype=qd, **kw)  # fmt: skip

        def comp(c, i, o):
            run(lambda *a, **kw: c.call("moe_sort_quant_out", *a, **kw), i, o)

        def same(g, w):
            ok = same_sort(g["sort"], w["sort"], bm) and _same(g["q"], w["q"])
            ok = ok and _same(g["s"], w["s"]) and zero_ok(g)
            return ok and (not pipe or _same(g["scales"], w["scales"]))

        return OpSpec(
            {"ids": base["ids"], "w": base["w"], "x": base["x"]},
            new_out,
            lambda i, o: run(ops.moe_sort_quant_out, i, o),
            lambda i, o: run(ref.moe_sort_quant_out, i, o),
            comp,
            same,
        )
    if op == "moe_sort_scales":
        srt = base["sort"]
        return OpSpec(
            {"s": base["a_scale"], "sti": srt.sorted_token_ids, "nv": srt.num_valid_ids},
            lambda: {"o": torch.empty(s.out_rows, s.d // 32, dtype=torch.uint8, device=dev)},
            lambda i, o: ops.moe_sort_scales_out(i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda i, o: ref.moe_sort_scales_out(i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda c, i, o: c.call("moe_sort_scales_out", i["s"], i["sti"], i["nv"], bm, o["o"]),
            lambda g, w: _same(g["o"], w["o"]),
        )
    srt = base["sort"]
    new_out = lambda: {"o": torch.empty(s.m, s.d, dtype=torch.bfloat16, device=dev)}  # noqa: E731
    same = lambda g, w: _same(g["o"], w["o"])  # noqa: E731
    if op == "moe_scatter_reduce":
        return OpSpec(
            {"eo": base["expert_out"], "rev": srt.reverse_sorted, "sw": srt.sorted_weights},
            new_out,
            lambda i, o: ops.moe_scatter_reduce_out(i["eo"], i["rev"], i["sw"], k, o["o"]),
            lambda i, o: ref.moe_scatter_reduce_out(i["eo"], i["rev"], i["sw"], k, o["o"]),
            lambda c, i, o: c.call("moe_scatter_reduce_out", i["eo"], i["rev"], i["sw"], k, o["o"]),
            same,
        )
    if op == "moe_scatter_reduce_q":
        return OpSpec(
            {"q": base["eq"], "s": base["es"], "rev": srt.reverse_sorted, "sw": srt.sorted_weights},
            new_out,
            lambda i, o: ops.moe_scatter_reduce_q_out(i["q"], i["s"], i["rev"], i["sw"], k, o["o"]),
            lambda i, o: ref.moe_scatter_reduce_q_out(i["q"], i["s"], i["rev"], i["sw"], k, o["o"]),
            lambda c, i, o: c.call(
                "moe_scatter_reduce_q_out", i["q"], i["s"], i["rev"], i["sw"], k, o["o"]
            ),
            same,
        )
    raise KeyError(op)


def _variant_spec(op: str, base: dict, s: Sizes, dev, zero_buf: bool) -> OpSpec:
    """A serving-option variant: its plain op's spec with the option added to every call."""
    plain, option = VARIANTS[op]
    e, bm, k = s.e, s.bm, s.k
    if option == "expert_map":  # identity map: the plain op's outputs, plus one lookup per id
        emap = torch.arange(e, dtype=torch.int32, device=dev)
        spec = op_spec(plain, base, s, dev, zero_buf)
        return OpSpec(
            spec.inputs,
            spec.new_outputs,
            lambda i, o: ops.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"], expert_map=emap),
            lambda i, o: ref.moe_sort_out(i["ids"], i["w"], e, bm, o["sort"], expert_map=emap),
            None,
            spec.same,
        )
    if option == "zero_buf_init":
        init = torch.randn(s.m, s.d, device=dev).to(torch.bfloat16)
        spec = op_spec(plain, base, s, dev, True)

        def run(fn, i, o):
            fn(i["ids"], i["w"], i["x"], e, bm, o["sort"], o["q"], o["s"], zero_buf=o["zero_buf"],
               zero_buf_init=init)  # fmt: skip

        def same(g, w):
            return spec.same({**g, "zero_buf": torch.zeros_like(init)}, w) and _same(
                g["zero_buf"], init
            )

        return OpSpec(spec.inputs, spec.new_outputs,
                      lambda i, o: run(ops.moe_sort_quant_out, i, o),
                      lambda i, o: run(ref.moe_sort_quant_out, i, o), None, same)  # fmt: skip
    spec = op_spec(plain, base, s, dev, zero_buf)
    f = ROUTED_SCALING
    if plain == "moe_scatter_reduce":
        ours = lambda i, o: ops.moe_scatter_reduce_out(  # noqa: E731
            i["eo"], i["rev"], i["sw"], k, o["o"], routed_scaling_factor=f
        )
        eager = lambda i, o: ref.moe_scatter_reduce_out(  # noqa: E731
            i["eo"], i["rev"], i["sw"], k, o["o"], routed_scaling_factor=f
        )
    else:
        ours = lambda i, o: ops.moe_scatter_reduce_q_out(  # noqa: E731
            i["q"], i["s"], i["rev"], i["sw"], k, o["o"], routed_scaling_factor=f
        )
        eager = lambda i, o: ref.moe_scatter_reduce_q_out(  # noqa: E731
            i["q"], i["s"], i["rev"], i["sw"], k, o["o"], routed_scaling_factor=f
        )
    return OpSpec(spec.inputs, spec.new_outputs, ours, eager, None, spec.same)


def _pipeline_spec(op: str, base: dict, s: Sizes, dev) -> OpSpec:
    """route_pipeline(_grouped): ``moe_route_sort_quant_out`` with sorted_scales: the gate of
    router logits, then the decode pipeline on its topk_ids / topk_weights."""
    k, kw = route_topk(s), route_options(op, s, dev)

    def new_out() -> dict:
        q, sc = alloc_quant(s, dev)
        u8 = dict(dtype=torch.uint8, device=dev)
        return {"w": torch.empty(s.m, k, dtype=torch.float32, device=dev),
                "ids": torch.empty(s.m, k, dtype=torch.int32, device=dev),
                "sort": alloc_sort(s, dev), "q": q, "s": sc,
                "scales": torch.empty(s.out_rows, s.d // 32, **u8)}  # fmt: skip

    def run(ns, i, o):
        ns.moe_route_sort_quant_out(
            i["logits"], i["x"], k, s.e, s.bm, o["w"], o["ids"], o["sort"], o["q"], o["s"],
            sorted_scales=o["scales"], **kw,
        )  # fmt: skip

    def same(g, w) -> bool:
        ok = _same(g["w"].view(torch.int32), w["w"].view(torch.int32))
        ok = ok and torch.equal(g["ids"], w["ids"]) and same_sort(g["sort"], w["sort"], s.bm)
        return (
            ok
            and _same(g["q"], w["q"])
            and _same(g["s"], w["s"])
            and _same(g["scales"], w["scales"])
        )

    return OpSpec({"logits": base["logits"], "x": base["x"]}, new_out,
                  lambda i, o: run(ops, i, o), lambda i, o: run(ref, i, o), None, same)  # fmt: skip


def make_base(shape, m: int, bm: int, dev, seed: int, need: set[str]) -> tuple[dict, Sizes]:
    """Routing, activations and the reference outputs the later ops take as inputs."""
    e, d, _inter, k = shape
    need = need | {VARIANTS[op][0] for op in need if op in VARIANTS}
    gen = torch.Generator().manual_seed(seed * 1_000_003 + m * 7919 + e * 31 + k)
    ids, w = draw_routing(m, e, k, gen)
    s = routing_sizes(ids, e, d, bm)
    dgen = torch.Generator(device=dev).manual_seed(seed + m)
    base = {"ids": ids.to(dev), "w": w.to(dev)}
    base["x"] = torch.randn(m, d, generator=dgen, device=dev, dtype=torch.bfloat16) * 3
    if need & {"moe_sort_scales", "moe_scatter_reduce", "moe_scatter_reduce_q"}:
        base["sort"] = ref.moe_sort(base["ids"], base["w"], e, bm)
        assert int(base["sort"].num_valid_ids[0]) == s.rows
    if "moe_sort_scales" in need:
        base["a_scale"] = ref.mxfp4_quant(base["x"])[1]
    rows = max(s.rows, 1)
    if "moe_scatter_reduce" in need:
        base["expert_out"] = torch.randn(rows, d, generator=dgen, device=dev, dtype=torch.bfloat16)
    if need & set(SUM_OPS):
        base["sum_in"] = sum_input(m, k, d, dev, dgen)
    if need & set(ROUTE_OPS):
        base["logits"] = route_input(m, e, dev, dgen)
    if "moe_scatter_reduce_q" in need:
        # random e2m1 bytes and e8m0 scales around 2^0 (no NaN scale)
        base["eq"] = torch.randint(
            0, 256, (rows, d // 2), generator=dgen, device=dev, dtype=torch.uint8
        )
        base["es"] = torch.randint(
            120, 135, (rows, d // 32), generator=dgen, device=dev, dtype=torch.uint8
        )
    return base, s


def clone_inputs(inputs: dict) -> dict:
    out = {}
    for key, v in inputs.items():
        if isinstance(v, MoeSortOutput):
            out[key] = MoeSortOutput(*(t.clone() for t in v))
        else:
            out[key] = v.clone()
    return out
