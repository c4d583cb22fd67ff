"""Where a forked routing preamble's time goes (GPU only; a probe, not part of the bench).

    python3 benchmarks/probe_preamble_fork.py [--no-pdl]

For (E, model_dim, M) of DeepSeek-V3 (256, 7168) and Qwen3 (128, 4096) at M = 1024-16384,
bf16 logits, topk 8, block_m 32, with sorted scales: CUDA-graph replay of 20 back-to-back
calls over one buffer set (median of 15 replays, µs per call) of each part alone (the gate
``moe_route_out``, ``moe_sort_out``, ``mxfp4_quant_out``, ``moe_sort_scales_out``, the fused
``moe_sort_quant_out``), of the op's two launches (the gate, then the fused sort+quant with
sorted scales), of the four parts on one stream, and of the four parts forked: the gate and
the sort on a side stream (normal, then high priority) beside the quant, joined before the
scales.  docs/perf.md (Gaps, the preamble) reads it."""

from __future__ import annotations

import argparse

import torch

from aiter_aux import ops
from aiter_aux.jit.spec import loaded_modules
from aiter_aux.types import MoeSortOutput
from aiter_aux.validation.ints import sort_capacity, sort_scales_rows

CASES = ((256, 7168, 1024), (256, 7168, 4096), (256, 7168, 16384), (128, 4096, 1024),
         (128, 4096, 16384))  # fmt: skip
TOPK, BLOCK_M = 8, 32


def graph_us(fn, calls: int = 20, replays: int = 15) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # the launch hidden behind a busy GPU
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def probe(e: int, d: int, m: int) -> dict[str, float]:
    dev = "cuda"
    logits = torch.randn(m, e, device=dev).bfloat16()
    x = torch.randn(m, d, device=dev).bfloat16()
    w = torch.empty(m, TOPK, device=dev)
    ids = torch.empty(m, TOPK, dtype=torch.int32, device=dev)
    rows = sort_capacity(m, TOPK, e, BLOCK_M)
    i32 = dict(dtype=torch.int32, device=dev)
    out = MoeSortOutput(torch.empty(rows, **i32), torch.empty(rows, device=dev),
                        torch.empty(rows, **i32), torch.empty(rows // BLOCK_M, **i32),
                        torch.empty(2, **i32), torch.empty(m * TOPK, **i32))  # fmt: skip
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=dev)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=dev)
    ss = torch.empty(sort_scales_rows(rows, BLOCK_M), d // 32, dtype=torch.uint8, device=dev)

    def route():
        ops.moe_route_out(logits, TOPK, w, ids)

    def sort():
        ops.moe_sort_out(ids, w, e, BLOCK_M, out)

    def quant():
        ops.mxfp4_quant_out(x, a_q, a_scale)

    def scales():
        ops.moe_sort_scales_out(a_scale, out.sorted_token_ids, out.num_valid_ids, BLOCK_M, ss)

    def sort_quant():
        ops.moe_sort_quant_out(ids, w, x, e, BLOCK_M, out, a_q, a_scale, sorted_scales=ss)

    def two_launches():
        route()
        sort_quant()

    def serial():
        route()
        sort()
        quant()
        scales()

    def forked(side):
        def run():
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                route()
                sort()
            quant()
            main.wait_stream(side)
            scales()

        return run

    cases = {"route": route, "sort": sort, "quant": quant, "scales": scales,
             "sort_quant+scales": sort_quant, "two launches": two_launches, "serial": serial,
             "forked": forked(torch.cuda.Stream()),
             "forked high priority": forked(torch.cuda.Stream(priority=-1))}  # fmt: skip
    return {name: graph_us(fn) for name, fn in cases.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-pdl", action="store_true", help="programmatic dependent launch off")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    ops.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16, device="cuda"))  # loads
    loaded_modules()["cuda"].set_pdl(not args.no_pdl)
    print(f"{torch.cuda.get_device_name()}, PDL {'off' if args.no_pdl else 'on'}; µs per call")
    for e, d, m in CASES:
        r = probe(e, d, m)
        print(f"E={e} model_dim={d} M={m}: " + ", ".join(f"{n} {v:.2f}" for n, v in r.items()))


if __name__ == "__main__":
    main()
