"""Our vLLM drop-ins and native ops against vLLM's own kernels, built from a vLLM source
release in a scratch folder (auxbench/vllm_peer.py; nothing of vLLM enters the repository):

    tar xzf vllm-0.33.0.tar.gz -C /scratch   # the source release's file on the package index
    python3 benchmarks/bench_vllm_peer.py --vllm-src /scratch/vllm-0.33.0 --check --bench

``--check`` compares outputs on random cases: ``moe_align_block_size`` (block sizes 8-128,
expert counts 8-992, int32/int64 ids, ``expert_map``, ``scatter_idx``) equal except the order
inside an expert's rows (docs/compat.md); ``moe_sum`` bit for bit (bf16/fp16/fp32, NaN/Inf
included); the gates (``topk_softmax``, ``grouped_topk``) by how often the ids agree and the
largest weight difference (the reference defines our bytes, not vLLM's).  ``--bench`` times
both sides with the same CUDA-graph replay (auxbench/timing.py) and prints ours / peer;
its ``host`` group (``--ops host``) times the host instead: eager calls back to back at M = 1
(median of 7 loops of 2000, µs per call), each drop-in against a Python function calling
the peer's op as vLLM's ``_custom_ops`` wrapper does.  CUDA only.  Exit 1 when a check
fails.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from auxbench import vllm_peer
from auxbench.common import log, ops
from auxbench.timing import Timer, n_buffer_sets

ours_vllm = importlib.import_module("aiter_aux.compat.vllm.custom_ops")  # after auxbench.common

BLOCKS = (8, 16, 32, 48, 64, 128)
EXPERTS = ((8, 2), (13, 3), (64, 6), (128, 8), (257, 9), (512, 10), (992, 8))
CHECK_M = (1, 4, 7, 33, 256, 1024, 4096)
OP_GROUPS = ("align", "sums", "gates", "host")


def align_buffers(numel: int, e: int, block: int, dev: torch.device):
    """vLLM's allocation (fused_moe/moe_align_block_size.py), poisoned."""
    cap = numel + e * (block - 1)
    if numel < e:
        cap = min(numel * block, cap)
    sorted_ids = torch.full((cap,), -7, dtype=torch.int32, device=dev)
    expert_ids = torch.full(((cap + block - 1) // block,), -7, dtype=torch.int32, device=dev)
    post = torch.full((1,), -7, dtype=torch.int32, device=dev)
    return sorted_ids, expert_ids, post


def canonical_rows(sorted_ids: torch.Tensor, post: int, block: int, expert_ids: torch.Tensor):
    """``sorted_ids`` with each expert's rows (the run of blocks of one expert) sorted."""
    out = sorted_ids.clone()
    ex = expert_ids[: post // block].tolist()
    start = 0
    for b in range(1, len(ex) + 1):
        if b == len(ex) or ex[b] != ex[start]:
            seg = out[start * block : b * block]
            out[start * block : b * block] = torch.sort(seg).values
            start = b
    return out


def check_align(dev: torch.device, peer, gen: torch.Generator) -> tuple[int, list[str]]:
    n, bad = 0, []
    for e, topk in EXPERTS:
        for block in BLOCKS:
            for m in CHECK_M:
                for variant in ("plain", "int64", "map", "scatter"):
                    ids = torch.randint(0, e, (m, topk), generator=gen, device=dev)
                    ids = ids.to(torch.int64 if variant == "int64" else torch.int32)
                    if m >= 7:
                        ids[m // 2] = ids[0, 0]  # one expert takes a whole row (repeats)
                    emap = None
                    if variant == "map":
                        local = torch.randperm(e, generator=gen, device=dev)[: max(1, e // 2)]
                        emap = torch.full((e,), -1, dtype=torch.int32, device=dev)
                        emap[local] = torch.arange(local.numel(), dtype=torch.int32, device=dev)
                    res = []
                    for fn in (peer.moe_align_block_size, ours_vllm.moe_align_block_size):
                        bufs = align_buffers(ids.numel(), e, block, dev)
                        sc = None
                        if variant == "scatter":
                            sc = torch.full((ids.numel(), 1), -7, dtype=torch.int32, device=dev)
                        fn(ids, e, block, *bufs, emap, sc)
                        res.append((*bufs, sc))
                    (ps, pe, pp, psc), (os_, oe, op_, osc) = res
                    post = int(pp[0])
                    ok = post == int(op_[0]) and torch.equal(pe, oe)
                    ok = ok and torch.equal(
                        canonical_rows(ps, post, block, pe), canonical_rows(os_, post, block, oe)
                    )
                    if psc is not None:
                        ok = ok and torch.equal(psc, osc)
                    n += 1
                    if not ok:
                        bad.append(f"align e={e} topk={topk} block={block} M={m} {variant}")
    return n, bad


def check_sums(dev: torch.device, peer, gen: torch.Generator) -> tuple[int, list[str]]:
    n, bad = 0, []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for topk in (1, 2, 3, 4, 6, 8, 9, 16):
            for d in (2048, 2880, 7168, 100):
                for m in (1, 5, 64, 700):
                    x = torch.randn(m, topk, d, generator=gen, device=dev).to(dtype)
                    flat = x.view(-1)
                    for v, pos in ((float("nan"), 3), (float("inf"), 11), (-float("inf"), 29)):
                        flat[pos % flat.numel()] = v
                    variants = [None]
                    if m == 64:
                        ids = torch.randint(-1, 12, (m, topk), generator=gen, device=dev)
                        emap = torch.tensor([0, -1] * 6, dtype=torch.int32, device=dev)
                        variants += [(ids.int(), None), (ids.int(), emap)]
                    for var in variants:
                        kw = {} if var is None else {"topk_ids": var[0], "expert_map": var[1]}
                        outs = []
                        for fn in (peer.moe_sum, ours_vllm.moe_sum):
                            o = torch.full((m, d), 7.0, dtype=dtype, device=dev)
                            if kw:
                                fn(x, o, kw["topk_ids"], kw["expert_map"])
                            else:
                                fn(x, o, None, None)
                            outs.append(o)
                        iv = torch.int32 if dtype == torch.float32 else torch.int16
                        n += 1
                        if not torch.equal(outs[0].view(iv), outs[1].view(iv)):
                            bad.append(f"moe_sum {dtype} topk={topk} d={d} M={m} {bool(kw)}")
    return n, bad


def gate_pairs(dev: torch.device, gen: torch.Generator, m: int, e: int, dtype):
    logits = torch.randn(m, e, generator=gen, device=dev).to(dtype)
    bias = (0.1 * torch.randn(e, generator=gen, device=dev)).float()
    return logits, bias


def peer_softmax(peer, logits, topk):
    m = logits.shape[0]
    w = torch.empty(m, topk, dtype=torch.float32, device=logits.device)
    i = torch.empty(m, topk, dtype=torch.int32, device=logits.device)
    t = torch.empty(m, topk, dtype=torch.int32, device=logits.device)
    peer.topk_softmax(w, i, t, logits, True, None, None)
    return w, i


def compare_gates(dev: torch.device, peer, gen: torch.Generator) -> list[str]:
    lines = []
    for m in (1, 64, 1024, 16384):
        for e, dtype in ((128, torch.float32), (256, torch.bfloat16)):
            logits, bias = gate_pairs(dev, gen, m, e, dtype)
            pw, pi = peer_softmax(peer, logits, 8)
            ow, oi = ops.moe_route(logits, 8, renormalize=True)
            same = (pi == oi).all(dim=1).float().mean().item()
            dw = ((pw - ow).abs() / pw.abs().clamp_min(1e-30))[pi == oi].max().item()
            lines.append(f"topk_softmax E={e} {dtype} M={m}: rows with equal ids {same:.4f}, "
                         f"max rel weight diff {dw:.2e}")  # fmt: skip
        logits, bias = gate_pairs(dev, gen, m, 256, torch.float32)
        pw, pi = peer.grouped_topk(logits, 8, 4, 8, True, 2.5, bias, 1)
        ow, oi = ops.moe_route(logits, 8, scoring="sigmoid", renormalize=True,
                               num_expert_group=8, topk_group=4, correction_bias=bias,
                               routed_scaling_factor=2.5)  # fmt: skip
        # vLLM's grouped_topk orders its ids by its own rule: compare as sets per row
        ps, po = torch.sort(pi.int(), dim=1), torch.sort(oi, dim=1)
        same = (ps.values == po.values).all(dim=1).float().mean().item()
        lines.append(f"grouped_topk E=256 fp32 M={m}: rows with the same id set {same:.4f}")
    return lines


def bench(dev, peer, gen: torch.Generator, timer: Timer, l2: int, which: set[str]) -> list[dict]:
    rows = []

    def row(op, shape, m, ours_fns, peer_fns, nbytes=0):
        for fn in (ours_fns[0], peer_fns[0]):
            fn()
        us = []
        for fns in (ours_fns, peer_fns):
            est = timer.once_us(fns[0])
            reps = sorted(timer.ours_us(fns, est)[0] for _ in range(3))
            us.append(reps[1])
        r = {"op": op, "shape": shape, "M": m, "ours_us": round(us[0], 3),
             "peer_us": round(us[1], 3), "peer_over_ours": round(us[1] / us[0], 3)}  # fmt: skip
        rows.append(r)
        log(f"{op:28s} {shape:16s} {m:6d} {us[0]:9.3f} {us[1]:9.3f} {us[1] / us[0]:7.3f}")

    log(f"{'op':28s} {'shape':16s} {'M':>6s} {'ours us':>9s} {'vllm us':>9s} {'x':>7s}")
    for e, topk in ((256, 8), (128, 8), (8, 2), (512, 10)) if "align" in which else ():
        for block in (8, 16, 48, 64):
            for m in (1, 4, 64, 1024, 16384):
                ids = torch.randint(0, e, (m, topk), generator=gen, device=dev, dtype=torch.int32)
                bo = align_buffers(ids.numel(), e, block, dev)
                bp = align_buffers(ids.numel(), e, block, dev)
                ours = partial(ours_vllm.moe_align_block_size, ids, e, block, *bo, None)
                theirs = partial(peer.moe_align_block_size, ids, e, block, *bp, None, None)
                row("moe_align_block_size", f"e{e} k{topk} b{block}", m, [ours], [theirs])
    for topk, d in ((8, 7168), (8, 4096), (4, 2880), (8, 2048)) if "sums" in which else ():
        for m in (1, 4, 64, 256, 1024, 4096, 16384):
            sets = n_buffer_sets(timer, 2 * m * topk * d + 2 * m * d, l2)
            xs = [
                torch.randn(m, topk, d, generator=gen, device=dev).bfloat16() for _ in range(sets)
            ]
            o1 = torch.empty(m, d, device=dev, dtype=torch.bfloat16)
            o2 = torch.empty_like(o1)
            row("moe_sum", f"k{topk} d{d}", m,
                [partial(ours_vllm.moe_sum, x, o1) for x in xs],
                [partial(peer.moe_sum, x, o2, None, None) for x in xs])  # fmt: skip
            del xs
    for m in (1, 4, 64, 1024, 16384) if "gates" in which else ():
        w = torch.empty(m, 8, device=dev)
        i = torch.empty(m, 8, device=dev, dtype=torch.int32)
        t = torch.empty_like(i)
        for e in (128, 256):
            logits, _ = gate_pairs(dev, gen, m, e, torch.float32)
            peer_call = partial(peer.topk_softmax, w, i, t, logits, True, None, None)
            row("moe_route softmax", f"e{e} k8", m,
                [partial(ops.moe_route_out, logits, 8, w, i)], [peer_call])  # fmt: skip
            row("compat topk_softmax", f"e{e} k8", m,
                [partial(ours_vllm.topk_softmax, w, i, t, logits, True)], [peer_call])  # fmt: skip
        logits, bias = gate_pairs(dev, gen, m, 256, torch.float32)
        grouped = {"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4,
                   "correction_bias": bias, "routed_scaling_factor": 2.5}  # fmt: skip
        row("moe_route grouped", "e256 k8 g8/4", m,
            [partial(ops.moe_route_out, logits, 8, w, i, **grouped)],
            [partial(peer.grouped_topk, logits, 8, 4, 8, True, 2.5, bias, 1)])  # fmt: skip
        row("compat grouped_topk", "e256 k8 g8/4", m,
            [partial(ours_vllm.grouped_topk, logits, 8, 4, 8, True, 2.5, bias, 1)],
            [partial(peer.grouped_topk, logits, 8, 4, 8, True, 2.5, bias, 1)])  # fmt: skip
    if "host" in which:
        rows += host_rows(dev, peer, gen)
    return rows


def _host_us(fn, dev, calls: int = 2000, loops: int = 7) -> float:
    """Median µs per call of ``calls`` eager calls back to back (the launch queue drained
    after each loop, outside the timing)."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize(dev)
    return statistics.median(times)


def host_rows(dev, peer, gen: torch.Generator) -> list[dict]:
    """Host cost per call at M = 1: each drop-in against a Python function that calls the
    peer's op, as vLLM's ``_custom_ops`` wrappers do (``torch.add`` for scale)."""

    def vllm_moe_sum(input, output):  # vLLM's _custom_ops.moe_sum
        peer.moe_sum(input, output, None, None)

    def vllm_align(ids, e, block, sti, eid, post, scatter=None, expert_map=None):
        # _custom_ops.moe_align_block_size
        peer.moe_align_block_size(ids, e, block, sti, eid, post, scatter, expert_map)

    def vllm_topk_softmax(w, i, t, logits, renorm):  # _custom_ops.topk_softmax
        peer.topk_softmax(w, i, t, logits, renorm, None, None)

    m, e, topk, d = 1, 256, 8, 7168
    x = torch.randn(m, topk, d, generator=gen, device=dev).bfloat16()
    out = torch.empty(m, d, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, e, (m, topk), generator=gen, device=dev, dtype=torch.int32)
    bo, bp = align_buffers(ids.numel(), e, 16, dev), align_buffers(ids.numel(), e, 16, dev)
    logits, _ = gate_pairs(dev, gen, m, e, torch.float32)
    w = torch.empty(m, topk, device=dev)
    i = torch.empty(m, topk, device=dev, dtype=torch.int32)
    t = torch.empty_like(i)
    a = torch.randn(m, d, device=dev)
    add_us = _host_us(partial(torch.add, a, a), dev)
    log(f"host cost per call, M = 1 (torch.add {add_us:.2f} us)")
    log(f"{'op':28s} {'ours us':>9s} {'vllm us':>9s} {'ours - vllm':>12s}")
    rows = []
    for op, ours, theirs in (
        ("host moe_sum", partial(ours_vllm.moe_sum, x, out), partial(vllm_moe_sum, x, out)),
        ("host moe_align_block_size",
         partial(ours_vllm.moe_align_block_size, ids, e, 16, *bo, None),
         partial(vllm_align, ids, e, 16, *bp)),
        ("host topk_softmax", partial(ours_vllm.topk_softmax, w, i, t, logits, True),
         partial(vllm_topk_softmax, w, i, t, logits, True)),
    ):  # fmt: skip
        o, p = _host_us(ours, dev), _host_us(theirs, dev)
        rows.append({"op": op, "shape": f"e{e} k{topk} d{d}", "M": m, "ours_us": round(o, 3),
                     "peer_us": round(p, 3), "peer_over_ours": round(p / o, 3)})  # fmt: skip
        log(f"{op:28s} {o:9.2f} {p:9.2f} {o - p:+12.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vllm-src", required=True, type=Path,
                   help="an unpacked vLLM source release (vllm-X.Y.Z/, with csrc/)")  # fmt: skip
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/peer_vllm_build"),
                   help="the peer's scratch build folder (default: %(default)s)")  # fmt: skip
    p.add_argument("--check", action="store_true", help="compare outputs")
    p.add_argument("--bench", action="store_true", help="time both sides")
    p.add_argument("--csv", default=None, help="write the bench rows to this CSV file")
    p.add_argument("--ops", nargs="+", choices=OP_GROUPS, default=list(OP_GROUPS),
                   help="which ops --bench times")  # fmt: skip
    args = p.parse_args(argv)
    if not (args.check or args.bench):
        p.error("nothing to do: give --check, --bench or both")
    missing = vllm_peer.missing_sources(args.vllm_src)
    if missing:
        p.error(
            f"--vllm-src {args.vllm_src}: not an unpacked vLLM source release (no {missing[0]})"
        )
    if not torch.cuda.is_available():
        log("bench_vllm_peer: needs a CUDA GPU")
        return 2
    dev = torch.device("cuda")
    peer = vllm_peer.load(args.vllm_src, args.build_dir)
    log(f"peer: {vllm_peer.version(args.vllm_src)} built in {args.build_dir}")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    if args.check:
        for name, fn in (("moe_align_block_size", check_align), ("moe_sum", check_sums)):
            n, bad = fn(dev, peer, gen)
            log(f"check {name}: {n - len(bad)} of {n} cases equal")
            for b in bad[:20]:
                log(f"  differs: {b}")
            failed |= bool(bad)
        for line in compare_gates(dev, peer, gen):
            log(line)
    if args.bench:
        timer = Timer(dev, quick=False)
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20))
        rows = bench(dev, peer, gen, timer, l2, set(args.ops))
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
