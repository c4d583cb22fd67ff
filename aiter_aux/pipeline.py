"""``aiter-aux run``: the aux pipeline of one model shape, every output checked and timed.

For each token count: router logits drawn at random (bf16 ``[M, E]``, each expert's column
offset by the log of a skewed, Zipf-like popularity), routed by ``moe_route`` with a model's
router options (:mod:`aiter_aux.router_config`: the model whose shipped config the catalog
shape serves, else moe_route's defaults; a correction bias is drawn when the model has
one); when ``expert`` is odd the last expert is a fused shared expert that every token
takes with weight 1.  A shape whose top-k moe_route cannot take (over 16) has its routing
drawn instead (each token ``topk`` distinct experts of that popularity), as do the
simulated EP ranks, whose global experts may exceed moe_route's.  bf16 activations; then
route -> sort -> quant -> fused sort+quant -> sort_scales -> (expert outputs drawn at random
in sorted order) -> scatter_reduce and scatter_reduce_q.  The fused op's checked call also
writes the sorted scales (``sorted_scales=``, the decode step in one call), compared with
the reference's sort_scales.  Where the router routes every expert of the shape (no fused
shared expert), the preamble in one call too: moe_route_sort_quant with the sorted scales,
from the logits to the GEMM's inputs.  Each compiled op is compared byte for byte with the
reference (:mod:`aiter_aux.reference`), the route too; that call is also the warm-up.
Then it is timed ``repeat`` times (default: as many as fit in about 0.2 s, 5 to 100): on
the CPU by the wall clock around each call, on a GPU by CUDA events around each call behind
a short GPU busy-wait (so the host's launch cost is hidden, as in
``benchmarks/auxbench/timing.py``).  The table and the CSV/JSON files come from
:mod:`aiter_aux.run_report`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch

from . import ops
from . import reference as ref
from . import run_report as rr
from .limits import MAX_NUM_TOKENS
from .ops.moe_mxfp4_aux import mxfp4_moe_shape_status
from .router_config import DEFAULT_ROUTER, Router
from .routing import (  # noqa: F401 (draw_routing: the tests' routing)
    draw_logits,
    draw_routing,
    resolve_router,
    route_logits,
    route_problem,
)
from .shapes import round_inter

BUDGET_S = 0.2  # default timing budget per op
PROGRESS_AFTER_S = 3.0  # a token count's block says what it is doing at most this often


class Row(NamedTuple):
    """One op at one token count (``row[3]`` is the check, as before)."""

    op: str
    sizes: str
    us: float  # median
    ok: bool
    stats: rr.Stats
    nbytes: int


def resolve_device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` with a visible GPU; anything else is a ValueError."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {text!r} is not a device; use cpu or cuda[:N]") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: torch sees no GPU here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {text}: only {torch.cuda.device_count()} GPU(s)")
    elif device.type != "cpu":
        raise ValueError(f"--device {text}: the pipeline runs on cpu or cuda (a ROCm GPU is "
                         f"cuda in torch), not on {device.type}")  # fmt: skip
    return device


def _sample_us(fn: Callable[[], object], device: torch.device) -> float:
    """One timed call in µs (CUDA events behind a busy-wait on a GPU, wall clock on CPU)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(200_000)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def time_op(fn: Callable[[], object], device: torch.device, repeat: int | None) -> rr.Stats:
    """Statistics of ``repeat`` timed calls (default: what fits in ``BUDGET_S``)."""
    first = _sample_us(fn, device)
    n = repeat or int(min(100, max(5, BUDGET_S * 1e6 / max(first, 1.0))))
    return rr.Stats.of([first] + [_sample_us(fn, device) for _ in range(n - 1)])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality (NaNs compare by their bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _check_sort(got: ref.MoeSortOutput, want: ref.MoeSortOutput, block_m: int) -> bool:
    nv = int(want.num_valid_ids[0])
    lengths = (nv, nv, nv, nv // block_m, 2, want.reverse_sorted.numel())
    return all(_same(g[:n], w[:n]) for g, w, n in zip(got, want, lengths, strict=True))


class Options(NamedTuple):
    """The serving options ``aiter-aux run`` exercises besides the plain pipeline."""

    ep_ranks: int = 1  # > 1: simulated expert parallelism, every rank's sort checked
    shared_init: bool = False  # the fused op copies zero_buf_init into zero_buf
    routed_scaling: float = 1.0  # the reduces scale the routed sum
    quant: str = "mxfp4"  # the activation format: "mxfp4" (a4w4) or "mxfp8" (a8w4)
    router: str = "auto"  # the shape's model, "default", a shipped model or a config.json


def run_one(shape, num_tokens: int, block_m: int, gen: torch.Generator, device,
            repeat: int | None = None, progress: Callable[[str], None] | None = None,
            options: Options | None = None,
            router: Router | None = DEFAULT_ROUTER) -> list[Row]:  # fmt: skip
    """Run, check and time the pipeline at one token count; the routing comes from random
    logits and ``router`` (None, or a router that cannot route the shape: drawn)."""
    options = options or Options()
    expert, model_dim, _inter, topk = shape
    device = torch.device(device)
    rows: list[Row] = []
    say = progress or (lambda op: None)

    def add(op: str, label: str, fn: Callable[[], object], ok: bool, nbytes: int) -> None:
        st = time_op(fn, device, repeat)
        rows.append(Row(op, label, st.median, bool(ok), st, nbytes))

    preamble = None  # (router_logits, topk, options): the route, when it routes every expert
    if router is not None and route_problem(router, expert, topk) is None:
        say("moe_route")
        logits = draw_logits(num_tokens, expert, topk, router, gen)
        ids, weights = route_logits(logits, expert)  # the reference's: what follows uses them
        dev_logits = logits.router_logits.to(device)
        opts = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                for k, v in logits.options.items()}  # fmt: skip
        got_w, got_ids = ops.moe_route(dev_logits, logits.topk, **opts)
        k = logits.topk
        ok = _same(got_ids.cpu(), ids[:, :k].contiguous())
        ok = ok and _same(got_w.cpu(), weights[:, :k].contiguous())
        e = dev_logits.shape[1]
        nbytes = rr.bytes_moved("moe_route", rr.Sizes(num_tokens, k, model_dim, block_m, 0, 0, 0,
                                e=e), bias=router.correction_bias)  # fmt: skip
        add("moe_route", f"E={e} topk={k}", lambda: ops.moe_route(dev_logits, k, **opts), ok,
            nbytes)  # fmt: skip
        if e == expert:  # (a fused shared expert's column is not the gate's)
            preamble = (dev_logits, k, opts)
    else:
        ids, weights = draw_routing(num_tokens, expert, topk, gen)
    x = (torch.randn(num_tokens, model_dim, generator=gen) * 3).bfloat16()
    ids, weights, x = ids.to(device), weights.to(device), x.to(device)

    say("moe_sort")
    want_sort = ref.moe_sort(ids, weights, expert, block_m)
    nv = int(want_sort.num_valid_ids[0])
    sizes = rr.Sizes(num_tokens, topk, model_dim, block_m, nv, want_sort.sorted_token_ids.numel(),
                     num_tokens)  # fmt: skip

    def add_op(op: str, label: str, fn: Callable[[], object], ok: bool) -> None:
        add(op, label, fn, ok, rr.bytes_moved(op, sizes))

    got_sort = ops.moe_sort(ids, weights, expert, block_m)
    add_op("moe_sort", f"E={expert} topk={topk}",
        lambda: ops.moe_sort(ids, weights, expert, block_m),
        _check_sort(got_sort, want_sort, block_m))  # fmt: skip

    fp8 = options.quant == "mxfp8"
    qop, fop = ("mxfp8_quant", "moe_sort_quant_fp8") if fp8 else ("mxfp4_quant", "moe_sort_quant")
    qdt = options.quant
    say(qop)
    want_q, want_s = getattr(ref, qop)(x)
    got_q, got_s = getattr(ops, qop)(x)
    add_op(qop, f"d={model_dim}", lambda: getattr(ops, qop)(x),
        _same(got_q, want_q) and _same(got_s, want_s))  # fmt: skip

    say(fop)
    sort_args = (want_s, want_sort.sorted_token_ids, want_sort.num_valid_ids, block_m)
    want_scales = ref.moe_sort_scales(*sort_args)
    zero_buf = torch.randn(num_tokens, model_dim, generator=gen).bfloat16().to(device)
    # the checked call is the decode step in one call: the sorted scales too
    one_call = torch.full_like(want_scales, 0xA5)
    fused, fq, fs = ops.moe_sort_quant(ids, weights, x, expert, block_m, zero_buf=zero_buf,
                                       quant_dtype=qdt, sorted_scales=one_call)  # fmt: skip
    ok = _check_sort(fused, want_sort, block_m) and _same(fq, want_q) and _same(fs, want_s)
    ok = ok and not bool(zero_buf.view(torch.int16).any()) and _same(one_call, want_scales)
    add_op(fop, "fused", lambda: ops.moe_sort_quant(ids, weights, x, expert, block_m,
                                                 quant_dtype=qdt), ok)  # fmt: skip

    if preamble is not None:  # the preamble in one call, from the logits to the GEMM's inputs
        rop = "moe_route_sort_quant" + ("_fp8" if fp8 else "")
        say(rop)
        logits_d, k, opts = preamble
        one_call = torch.full_like(want_scales, 0xA5)
        got = ops.moe_route_sort_quant(logits_d, x, k, expert, block_m, **opts, quant_dtype=qdt,
                                       sorted_scales=one_call)  # fmt: skip
        ok = _same(got[0], weights) and _same(got[1], ids) and _check_sort(got[2], want_sort,
                                                                          block_m)  # fmt: skip
        ok = ok and _same(got[3], want_q) and _same(got[4], want_s) and _same(one_call, want_scales)
        scales = torch.empty_like(want_scales)
        nbytes = rr.bytes_moved(rop, replace(sizes, e=expert), bias=router.correction_bias)
        add(rop, "sorted scales", lambda: ops.moe_route_sort_quant(
            logits_d, x, k, expert, block_m, **opts, quant_dtype=qdt, sorted_scales=scales),
            ok, nbytes)  # fmt: skip

    say("moe_sort_scales")
    got_scales = ops.moe_sort_scales(*sort_args)
    add_op("moe_sort_scales", f"BM={max(32, block_m)}", lambda: ops.moe_sort_scales(*sort_args),
        _same(got_scales, want_scales))  # fmt: skip

    expert_out = torch.randn(nv, model_dim, generator=gen).bfloat16().to(device)
    scatter_args = (expert_out, want_sort.reverse_sorted, want_sort.sorted_weights, topk)
    say("moe_scatter_reduce")
    want_out = ref.moe_scatter_reduce(*scatter_args)
    got_out = ops.moe_scatter_reduce(*scatter_args)
    add_op("moe_scatter_reduce", f"rows={nv}", lambda: ops.moe_scatter_reduce(*scatter_args),
        _same(got_out, want_out))  # fmt: skip

    say("moe_scatter_reduce_q")
    eq, es = ref.mxfp4_quant(expert_out)
    q_args = (eq, es, want_sort.reverse_sorted, want_sort.sorted_weights, topk)
    want_out = ref.moe_scatter_reduce_q(*q_args)
    got_out = ops.moe_scatter_reduce_q(*q_args)
    add_op("moe_scatter_reduce_q", f"rows={nv}", lambda: ops.moe_scatter_reduce_q(*q_args),
        _same(got_out, want_out))  # fmt: skip

    if options.routed_scaling != 1.0:
        f = options.routed_scaling
        say("routed scaling")
        for op, args in (("moe_scatter_reduce", scatter_args), ("moe_scatter_reduce_q", q_args)):
            want = getattr(ref, op)(*args, routed_scaling_factor=f)
            got = getattr(ops, op)(*args, routed_scaling_factor=f)
            add_op(op, f"scaled x{f:g}", lambda op=op, args=args: getattr(ops, op)(
                *args, routed_scaling_factor=f), _same(got, want))  # fmt: skip
    if options.shared_init:
        say("shared-expert init")
        init = torch.randn(num_tokens, model_dim, generator=gen).bfloat16().to(device)
        zb = torch.empty_like(init)
        fused, fq, fs = ops.moe_sort_quant(ids, weights, x, expert, block_m, zero_buf=zb,
                                           zero_buf_init=init, quant_dtype=qdt)  # fmt: skip
        ok = _check_sort(fused, want_sort, block_m) and _same(fq, want_q) and _same(zb, init)
        add_op(fop, "shared-init", lambda: ops.moe_sort_quant(
            ids, weights, x, expert, block_m, zero_buf=zb, zero_buf_init=init,
            quant_dtype=qdt), ok)  # fmt: skip
    if options.ep_ranks > 1:
        rows += _expert_parallel(shape, num_tokens, block_m, gen, device, options.ep_ranks, add_op)
    return rows


def _expert_parallel(shape, num_tokens, block_m, gen, device, ranks: int, add) -> list[Row]:
    """Simulated expert parallelism: routing over ``ranks * expert`` global experts, each rank
    holding ``expert`` of them (a random assignment); every rank's sort (and fused sort +
    quant) is checked against the reference, and together they place every pair once."""
    expert, _d, _i, topk = shape
    num_global = expert * ranks
    ids, weights = draw_routing(num_tokens, num_global, topk, gen)
    ids, weights = ids.to(device), weights.to(device)
    owner = torch.randperm(num_global, generator=gen)
    placed = torch.zeros(num_tokens * topk, dtype=torch.int32)
    for r in range(ranks):
        emap = torch.full((num_global,), -1, dtype=torch.int32)
        emap[owner[r * expert : (r + 1) * expert]] = torch.arange(expert, dtype=torch.int32)
        emap = emap.to(device)
        want = ref.moe_sort(ids, weights, expert, block_m, expert_map=emap)
        got = ops.moe_sort(ids, weights, expert, block_m, expert_map=emap)
        placed += (want.reverse_sorted.cpu() >= 0).to(torch.int32)
        ok = _check_sort(got, want, block_m)
        ok = ok and (r < ranks - 1 or bool((placed == 1).all()))  # each pair on one rank
        add("moe_sort", f"EP rank {r}/{ranks}", lambda emap=emap: ops.moe_sort(
            ids, weights, expert, block_m, expert_map=emap), ok)  # fmt: skip
    return []


def _timer_note(device: torch.device, repeat: int | None) -> list[str]:
    """The header lines that say what the numbers are."""
    n = f"{repeat}" if repeat else f"as many as fit in {BUDGET_S:g} s (5-100)"
    if device.type == "cuda":
        how = ["timing: CUDA events around each call (GPU time), after one checked warm-up",
               f"call; n calls per op: {n}."]  # fmt: skip
    else:
        threads = os.environ.get("OMP_NUM_THREADS") or str(torch.get_num_threads())
        how = [f"timing: wall clock around each call on the CPU (OpenMP threads: {threads}),",
               f"after one checked warm-up call; n calls per op: {n}.  CPU timings are",
               "load-sensitive: another process's time slice shows up as a multi-ms outlier",
               "in p90/max (OMP_NUM_THREADS=1 gives steadier numbers)."]  # fmt: skip
    return how + [
        "columns: median and p10-p90 of the n calls in us (min-max under 10 calls); bytes:",
        "the op's minimum traffic (aiter_aux/run_report.py); GB/s = bytes / median.",
    ]


def run_pipeline(shape, tokens, block_m: int = 32, seed: int | None = None, device="cpu", *,
                 repeat: int | None = None, csv_path: str | None = None,
                 json_path: str | None = None, options: Options | None = None) -> int:  # fmt: skip
    """Run ``aiter-aux run``; returns the exit code: 0, 1 on any mismatch.  Raises
    ``ValueError`` for arguments that cannot run (no token count, a count out of
    [0, MAX_NUM_TOKENS), a shape no instance compiles for, a device that is not there)."""
    expert, model_dim, inter, topk = shape
    tokens = list(tokens)
    if not tokens:
        raise ValueError("--tokens names no token count; nothing to run")
    bad = [m for m in tokens if not 0 <= m < MAX_NUM_TOKENS]
    if bad:
        raise ValueError(f"--tokens {bad[0]}: a token count must be in [0, {MAX_NUM_TOKENS})")
    if repeat is not None and repeat < 1:
        raise ValueError(f"--repeat {repeat}: must be at least 1")
    options = options or Options()
    if options.quant not in ("mxfp4", "mxfp8"):
        raise ValueError(f"--quant {options.quant}: must be mxfp4 or mxfp8")
    if not 1 <= options.ep_ranks <= 64:
        raise ValueError(f"--ep-ranks {options.ep_ranks}: must be in [1, 64]")
    for flag, path in (("--csv", csv_path), ("--json", json_path)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"{flag} {path}: its directory does not exist")
        if os.path.isdir(path):
            raise ValueError(f"{flag} {path}: is a directory (a file name is needed)")
        existed = os.path.exists(path)
        try:  # the run writes it at the end: find out now
            with open(path, "a"):
                pass
        except OSError as e:
            raise ValueError(f"{flag} {path}: not writable ({e.strerror})") from None
        if not existed:
            os.unlink(path)
    status = mxfp4_moe_shape_status(expert, model_dim, inter, topk)
    if not status.servable:
        raise ValueError(f"shape {tuple(shape)} cannot be served: {status.reason}")
    router, router_line = resolve_router(shape, options.router)
    device = resolve_device(str(device))
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    rounded = round_inter(inter)
    inter_text = f"{inter} -> {rounded}" if rounded != inter else f"{inter}"
    print(f"shape expert={expert} model_dim={model_dim} inter={inter_text} topk={topk}; "
          f"block_m={block_m} device={device} seed={seed}")  # fmt: skip
    if not status.prebuilt:
        print("  not in the catalog: its instances are built on first use (`aiter-aux add-shape` "
              "makes them prebuilt)")  # fmt: skip
    print(router_line)
    if options._replace(router="auto") != Options():
        print(f"  options: EP ranks {options.ep_ranks}, shared-expert init "
              f"{'on' if options.shared_init else 'off'}, routed scaling "
              f"{options.routed_scaling:g}, activations {options.quant}")  # fmt: skip
    print("\n".join("  " + line for line in _timer_note(device, repeat)))
    meta = dict(expert=expert, model_dim=model_dim, inter=inter, inter_rounded=rounded, topk=topk,
                block_m=block_m, device=str(device), seed=seed, quant=options.quant,
                router=router.describe() if router else "drawn",
                timer="cuda-events" if device.type == "cuda" else "wall-clock")  # fmt: skip
    records, failures = [], 0
    for m in tokens:
        t0 = time.perf_counter()
        said = [t0]  # the last progress line (or the block's start)

        def progress(op: str, m=m, t0=t0, said=said) -> None:
            now = time.perf_counter()
            if now - said[0] > PROGRESS_AFTER_S:
                said[0] = now
                print(f"  ... tokens={m}: {op} ({now - t0:.0f} s)", file=sys.stderr, flush=True)

        rows = run_one(shape, m, block_m, gen, device, repeat, progress, options, router)
        print(f"\ntokens = {m}")
        print("\n".join(rr.table(rows)))
        print(rr.summary(m, rows, time.perf_counter() - t0), flush=True)
        failures += sum(not r.ok for r in rows)
        records += [rr.record(m, r) for r in rows]
    if csv_path:
        rr.write_csv(csv_path, meta, records)
    if json_path:
        rr.write_json(json_path, meta, records)
    n = len(records)
    verdict = (
        f"all {n} outputs match the reference" if not failures else (f"{failures} of {n} MISMATCH")
    )
    print(f"\n{verdict}")
    for path in (p for p in (csv_path, json_path) if p):
        print(f"wrote {path}")
    return 1 if failures else 0
