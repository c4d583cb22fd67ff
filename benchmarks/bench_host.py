"""Host cost per call of every aux op, next to ``torch.add`` on the same tensors.

A serving engine pays the CPU time of each call (argument parsing, dispatch, validation,
launch) on top of the kernel.  This benchmark times a host-bound loop of back-to-back calls
(no synchronisation inside the loop) at M = 1 (``--tokens``), for every op in both forms
(allocating and ``_out``) and both entry points (``torch.ops.aiter_aux.<op>`` and
``aiter_aux.ops.<op>``), ``moe_route_out`` and ``moe_route_sort_quant[_out]`` with
DeepSeek-V3's router options as an engine calls them (the options by position through
``torch.ops``), and the drop-ins of
:mod:`aiter_aux.compat` (api ``compat``), on the CPU (where the time includes the kernel:
M = 0 leaves only the call) and, when present, on the GPU.
Each row is the median of ``--repeats`` loops of ``--calls`` calls (spread: min to max of
the loops), in µs per call, and its ratio to ``torch.add(a, b)`` of the same run.

    python benchmarks/bench_host.py [--device cpu,cuda] [--shape 257,7168,256,9]
                                    [--calls 2000] [--repeats 7] [--ops moe_sum,compat]
                                    [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiter_aux import ops as aux_ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.compat import aiter, sglang, vllm  # noqa: E402
from aiter_aux.compat.sglang import srt as sglang_srt  # noqa: E402
from aiter_aux.compat.vllm import custom_ops as vllm_ops  # noqa: E402
from aiter_aux.reference import compat as RC  # noqa: E402


def _inputs(shape, device, m: int):
    """Valid arguments of every op for M tokens, with preallocated outputs."""
    e, d, _inter, k = shape
    bm = 32
    g = torch.Generator().manual_seed(0)
    ids = torch.empty(m, k, dtype=torch.int32)
    for t in range(m):  # k distinct experts per token
        ids[t] = torch.randperm(e, generator=g)[:k]
    w = torch.rand(m, k, generator=g)
    x = torch.randn(m, d, generator=g).to(torch.bfloat16)
    s = ref.moe_sort(ids, w, e, bm)
    q, sc = ref.mxfp4_quant(x)
    rows = max(1, s.sorted_token_ids.numel())
    eo = torch.randn(rows, d, generator=g).to(torch.bfloat16)
    eo_q = torch.randint(0, 256, (rows, d // 2), generator=g, dtype=torch.uint8)
    eo_s = torch.randint(100, 140, (rows, d // 32), generator=g, dtype=torch.uint8)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    ids, w, x, q, sc, eo, eo_q, eo_s = to(ids, w, x, q, sc, eo, eo_q, eo_s)
    sort = ref.MoeSortOutput(*to(*s))
    sort_buf = ref.MoeSortOutput(*[torch.empty_like(t) for t in sort])
    q_buf, sc_buf = torch.empty_like(q), torch.empty_like(sc)
    scales = aux_ops.moe_sort_scales(sc, sort.sorted_token_ids, sort.num_valid_ids, bm)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=device)
    sum_in = torch.randn(m, k, d, device=device).to(torch.bfloat16)  # moe_sum's [M, topk, D]
    logits = torch.randn(m, e, device=device).to(torch.bfloat16)  # moe_route's router logits
    kr = min(k, 16)
    route_w = torch.empty(m, kr, device=device)
    route_ids = torch.empty(m, kr, dtype=torch.int32, device=device)
    rev, sw = sort.reverse_sorted, sort.sorted_weights
    sti, nv = sort.sorted_token_ids, sort.num_valid_ids
    align = {f: tuple(torch.empty_like(t) for t in aux_ops.__dict__[f"moe_align_block_size_{f}"](
        ids, e, bm)) for f in ("vllm", "sglang")}  # fmt: skip
    cases = {
        # op: (positional args of the allocating form, extra args of the _out form)
        "moe_sort": ((ids, w, e, bm), tuple(sort_buf)),
        "mxfp4_quant": ((x,), (q_buf, sc_buf)),
        "moe_sort_quant": ((ids, w, x, e, bm), (*sort_buf, q_buf, sc_buf)),
        "moe_sort_scales": ((sc, sti, nv, bm), (torch.empty_like(scales),)),
        "moe_scatter_reduce": ((eo, rev, sw, k), (out,)),
        "moe_scatter_reduce_q": ((eo_q, eo_s, rev, sw, k), (out,)),
        "moe_sum": ((sum_in,), (out,)),
        "moe_align_block_size_vllm": ((ids, e, bm), align["vllm"]),
        "moe_align_block_size_sglang": ((ids, e, bm), align["sglang"]),
        "moe_route": ((logits, kr), (route_w, route_ids)),
    }
    assert tuple(cases) == OPS_TIMED, tuple(cases)  # the --ops names
    return cases, (w, w)


def _drop_ins(shape, device, m: int) -> dict:
    """The drop-ins, each called as its peer's callers do, with valid arguments for M tokens:
    row name -> a call."""
    e, d, _inter, k = shape
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]) if m else (
        torch.empty(0, k, dtype=torch.int64))  # fmt: skip
    ids = ids.to(torch.int32).to(device)
    bs = 64
    kw = dict(dtype=torch.int32, device=device)
    cap = RC.vllm_align_capacity(ids.numel(), e, bs)  # the buffers the peers' callers size
    v_sorted, v_experts, v_total = (torch.empty(cap, **kw), torch.empty(-(-cap // bs), **kw),
                                    torch.empty(1, **kw))  # fmt: skip
    s_cap = RC.sglang_align_capacity(ids.numel(), e, bs)
    s_sorted, s_experts, s_total = (torch.empty(s_cap, **kw), torch.empty(-(-s_cap // bs), **kw),
                                    torch.empty(1, **kw))  # fmt: skip
    sum_in = torch.randn(m, k, d, device=device).to(torch.bfloat16)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=device)
    e_gate = 256  # the gates' experts: DeepSeek-V3's 256 routed (8 groups) for AITER's
    logits = torch.randn(m, e_gate, device=device)  # router logits, float32 as vLLM's
    bias = torch.zeros(e_gate, device=device)
    gw = torch.empty(m, k, device=device)
    gi, tei = (torch.empty(m, k, dtype=torch.int32, device=device) for _ in range(2))
    return {
        "vllm.moe_sum": lambda: vllm_ops.moe_sum(sum_in, out),
        "sglang.moe_sum_reduce": lambda: sglang.moe_sum_reduce(sum_in, out, 2.5),
        "sglang.moe_sum": lambda: sglang.moe_sum(sum_in, out),
        "vllm.custom moe_align": lambda: vllm_ops.moe_align_block_size(
            ids, e, bs, v_sorted, v_experts, v_total, None),
        "vllm.moe_align_block_size": lambda: vllm.moe_align_block_size(ids, bs, e),
        "sglang.moe_align_block_size": lambda: sglang.moe_align_block_size(
            ids, e + 1, bs, s_sorted, s_experts, s_total, None),
        "sglang.srt moe_align": lambda: sglang_srt.moe_align_block_size(ids, bs, e),
        "vllm.topk_softmax": lambda: vllm_ops.topk_softmax(gw, gi, tei, logits, True),
        "sglang.topk_softmax": lambda: sglang.topk_softmax(gw, gi, logits, True),
        "aiter.biased_grouped_topk": lambda: aiter.biased_grouped_topk(
            logits, bias, gw, gi, 8, 4, True, 2.5),
        "vllm.grouped_topk": lambda: vllm_ops.grouped_topk(logits, 8, 4, k, True, 2.5, bias, 1),
        "sglang.moe_fused_gate": lambda: sglang.moe_fused_gate(logits, bias, 8, 4, k),
    }  # fmt: skip


def _with_options(shape, device, m: int) -> dict:
    """moe_route_out and moe_route_sort_quant[_out] with a model's router options (DeepSeek-V3:
    sigmoid, 4 of 8 groups, a correction bias, scaling 2.5), as a serving engine calls them:
    row name -> (api, call)."""
    e = 256  # DeepSeek-V3's routed experts
    logits = torch.randn(m, e, device=device).to(torch.bfloat16)
    w = torch.empty(m, 8, device=device)
    ids = torch.empty(m, 8, dtype=torch.int32, device=device)
    bias = torch.zeros(e, device=device)
    py = dict(scoring="sigmoid", num_expert_group=8, topk_group=4, correction_bias=bias,
              routed_scaling_factor=2.5)  # fmt: skip
    op = torch.ops.aiter_aux.moe_route_out.default
    # the preamble in one call: the gate, then moe_sort_quant (block_m 32, model_dim 7168)
    x = torch.randn(m, 7168, device=device).to(torch.bfloat16)
    rsq = aux_ops.moe_route_sort_quant(logits, x, 8, e, 32, **py)
    bufs = (*rsq[:2], *rsq[2], *rsq[3:])
    rw, ri, sort, q, s = rsq  # the buffers, built once as a caller that reuses them does
    rsq_op = torch.ops.aiter_aux.moe_route_sort_quant_out.default
    # the options by keyword, as a caller writes them (not a ** dict built per call)
    return {
        "moe_route_out DeepSeek-V3": (
            ("torch.ops", lambda: op(logits, 8, w, ids, 1, 1, 8, 4, bias, 2.5)),
            ("aiter_aux.ops", lambda: aux_ops.moe_route_out(
                logits, 8, w, ids, scoring="sigmoid", num_expert_group=8, topk_group=4,
                correction_bias=bias, routed_scaling_factor=2.5)),
        ),
        "moe_route_sort_quant_out DeepSeek-V3": (
            ("torch.ops", lambda: rsq_op(logits, x, 8, e, 32, *bufs, 1, 1, 8, 4, bias, 2.5)),
            ("aiter_aux.ops", lambda: aux_ops.moe_route_sort_quant_out(
                logits, x, 8, e, 32, rw, ri, sort, q, s, scoring="sigmoid", num_expert_group=8,
                topk_group=4, correction_bias=bias, routed_scaling_factor=2.5)),
        ),
        "moe_route_sort_quant DeepSeek-V3": (
            ("aiter_aux.ops", lambda: aux_ops.moe_route_sort_quant(
                logits, x, 8, e, 32, scoring="sigmoid", num_expert_group=8, topk_group=4,
                correction_bias=bias, routed_scaling_factor=2.5)),
        ),
    }  # fmt: skip


def _python_call(op: str, alloc_args, out_args, out_form: bool):
    """The aiter_aux.ops call of ``op`` (its _out form takes a MoeSortOutput for sorts)."""
    fn = getattr(aux_ops, op + ("_out" if out_form else ""))
    if not out_form:
        return lambda: fn(*alloc_args)
    # the buffers' MoeSortOutput is built once, as a caller that reuses its buffers does
    if op == "moe_sort":
        sort = ref.MoeSortOutput(*out_args)
        return lambda: fn(*alloc_args, sort)
    if op == "moe_sort_quant":
        sort, rest = ref.MoeSortOutput(*out_args[:6]), out_args[6:]
        return lambda: fn(*alloc_args, sort, *rest)
    return lambda: fn(*alloc_args, *out_args)


def _per_call_us(fn, calls: int, repeats: int, sync) -> list[float]:
    for _ in range(max(10, calls // 20)):  # warm-up (the first call may load the module)
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        times.append((t1 - t0) / calls * 1e6)
    return times


def run(device: torch.device, shape, calls: int, repeats: int, m: int = 1,
        ops: tuple[str, ...] = ()) -> list[dict]:  # fmt: skip
    """The rows of one device and M; ``ops``: only the ops (or ``compat``) named."""
    cases, (a, b) = _inputs(shape, device, m)
    cases = {op: c for op, c in cases.items() if not ops or op in ops}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = []
    base = _per_call_us(lambda: torch.add(a, b), calls, repeats, sync)
    base_med = statistics.median(base)
    rows.append(dict(op="torch.add", form="alloc", api="torch", times=base))
    for op, (args, outs) in cases.items():
        for out_form in (False, True):
            name = op + ("_out" if out_form else "")
            torch_op = getattr(torch.ops.aiter_aux, name).default
            torch_args = (*args, *outs) if out_form else args
            for api, fn in (
                ("torch.ops", lambda f=torch_op, t=torch_args: f(*t)),
                ("aiter_aux.ops", _python_call(op, args, outs, out_form)),
            ):
                times = _per_call_us(fn, calls, repeats, sync)
                rows.append(dict(op=name, form="out" if out_form else "alloc", api=api,
                                 times=times))  # fmt: skip
    if not ops or {"moe_route", "moe_route_sort_quant"} & set(ops):
        for name, variants in _with_options(shape, device, m).items():
            for api, fn in variants:
                times = _per_call_us(fn, calls, repeats, sync)
                rows.append(dict(op=name, form="out", api=api, times=times))
    if not ops or "compat" in ops:
        for name, fn in _drop_ins(shape, device, m).items():
            times = _per_call_us(fn, calls, repeats, sync)
            rows.append(dict(op=name, form="drop-in", api="compat", times=times))
    for r in rows:
        r.update(device=str(device), shape=",".join(map(str, shape)), M=m)
        r["median_us"] = statistics.median(r["times"])
        r["min_us"], r["max_us"] = min(r["times"]), max(r["times"])
        r["x_add"] = r["median_us"] / base_med
    return rows


#: What ``--ops`` selects: each op of :func:`_inputs` (its two forms), ``moe_route`` also and
#: ``moe_route_sort_quant`` alone the rows with DeepSeek-V3's options, ``compat`` the drop-ins.
OPS_TIMED = ("moe_sort", "mxfp4_quant", "moe_sort_quant", "moe_sort_scales", "moe_scatter_reduce",
             "moe_scatter_reduce_q", "moe_sum", "moe_align_block_size_vllm",
             "moe_align_block_size_sglang", "moe_route")  # fmt: skip
SELECTORS = OPS_TIMED + ("moe_route_sort_quant", "compat")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="comma list (default: cpu, and cuda if any)")
    p.add_argument("--shape", default="257,7168,256,9", help="E,MODEL_DIM,INTER,TOPK")
    p.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    p.add_argument("--tokens", default="1", help="comma list of M (M = 0 on the CPU: the cost "
                   "of the call without the kernel's work)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=7, help="timed loops per row")
    p.add_argument("--ops", default="", help="comma list of the ops to time (their two forms; "
                   "`moe_route_sort_quant`: the rows with DeepSeek-V3's options; `compat`: the "
                   "drop-ins); default: all")  # fmt: skip
    p.add_argument("--csv", type=Path, help="write the rows to this CSV file")
    args = p.parse_args(argv)
    unknown = [o for o in args.ops.split(",") if o and o not in SELECTORS]
    if unknown:
        p.error(f"--ops: unknown {', '.join(unknown)} (known: {', '.join(SELECTORS)})")
    shape = tuple(int(v) for v in args.shape.split(","))
    devices = args.device.split(",") if args.device else ["cpu"] + (
        ["cuda"] if torch.cuda.is_available() else [])  # fmt: skip
    rows = []
    for dev in devices:
        for m in (int(t) for t in args.tokens.split(",")):
            rows += run(torch.device(dev), shape, args.calls, args.repeats, m,
                        tuple(o for o in args.ops.split(",") if o))  # fmt: skip
    print(f"host cost per call, shape {args.shape}, torch {torch.__version__}; "
          f"median of {args.repeats} loops x {args.calls} calls (min-max)")  # fmt: skip
    print(f"{'device':<7} {'M':>2} {'op':<31} {'api':<14} {'us/call':>8} {'min-max':>13} "
          f"{'x add':>6}")  # fmt: skip
    for r in rows:
        spread = f"{r['min_us']:.1f}-{r['max_us']:.1f}"
        print(f"{r['device']:<7} {r['M']:>2} {r['op']:<31} {r['api']:<14} {r['median_us']:>8.2f} "
              f"{spread:>13} {r['x_add']:>6.2f}")  # fmt: skip
    if args.csv:
        fields = ["device", "shape", "M", "op", "form", "api", "median_us", "min_us", "max_us",
                  "x_add"]  # fmt: skip
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
