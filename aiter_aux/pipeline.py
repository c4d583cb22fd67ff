"""``aiter-aux run``: the aux pipeline of one model shape, every output checked.

For each token count: routing drawn like a real router (each token takes ``topk`` distinct
experts with skewed, Zipf-like popularity; when ``expert`` is odd the last expert is a fused
shared expert that every token takes), bf16 activations; then sort -> quant -> fused
sort+quant -> sort_scales -> (expert outputs drawn at random in sorted order) ->
scatter_reduce and scatter_reduce_q.  Each compiled op is compared byte for byte with the
reference (:mod:`aiter_aux.reference`) and timed (median of repeated runs).
"""

from __future__ import annotations

import statistics
import time

import torch

from . import reference as ref
from .ops import aux_ops as ops
from .ops.moe_mxfp4_aux import is_mxfp4_moe_shape_supported


def draw_routing(
    num_tokens: int, expert: int, topk: int, gen: torch.Generator, zipf_s: float = 1.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router-like ``(topk_ids int32 [M, topk], topk_weights float32 [M, topk])``."""
    shared = expert % 2 == 1 and topk > 1
    routed_e, routed_k = (expert - 1, topk - 1) if shared else (expert, topk)
    ranks = torch.randperm(routed_e, generator=gen).double() + 1.0
    popularity = ranks.pow(-zipf_s)
    ids = torch.multinomial(
        popularity.expand(max(num_tokens, 1), routed_e), routed_k, replacement=False, generator=gen
    )[:num_tokens]
    logits = torch.randn(num_tokens, routed_k, generator=gen)
    weights = torch.softmax(logits, dim=-1)
    if shared:
        ids = torch.cat([ids, torch.full((num_tokens, 1), expert - 1, dtype=ids.dtype)], dim=1)
        weights = torch.cat([weights, torch.ones(num_tokens, 1)], dim=1)
    return ids.to(torch.int32).contiguous(), weights.float().contiguous()


def _timed(fn, device: torch.device, repeat: int) -> float:
    """Median wall time of ``fn`` in microseconds."""
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality (NaNs compare by their bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _check_sort(got: ref.MoeSortOutput, want: ref.MoeSortOutput, block_m: int) -> bool:
    nv = int(want.num_valid_ids[0])
    lengths = (nv, nv, nv, nv // block_m, 2, want.reverse_sorted.numel())
    return all(_same(g[:n], w[:n]) for g, w, n in zip(got, want, lengths, strict=True))


def run_one(shape, num_tokens: int, block_m: int, gen: torch.Generator, device) -> list[tuple]:
    """Run and check the pipeline at one token count; rows of (op, sizes, µs, ok)."""
    expert, model_dim, _inter, topk = shape
    ids, weights = draw_routing(num_tokens, expert, topk, gen)
    x = (torch.randn(num_tokens, model_dim, generator=gen) * 3).bfloat16()
    ids, weights, x = ids.to(device), weights.to(device), x.to(device)
    repeat = 20 if num_tokens <= 64 else 5
    rows = []

    want_sort = ref.moe_sort(ids, weights, expert, block_m)
    got_sort = ops.moe_sort(ids, weights, expert, block_m)
    t = _timed(lambda: ops.moe_sort(ids, weights, expert, block_m), device, repeat)
    rows.append(("moe_sort", f"E={expert} topk={topk}", t, _check_sort(got_sort, want_sort,
                                                                     block_m)))  # fmt: skip

    want_q, want_s = ref.mxfp4_quant(x)
    got_q, got_s = ops.mxfp4_quant(x)
    t = _timed(lambda: ops.mxfp4_quant(x), device, repeat)
    rows.append(("mxfp4_quant", f"d={model_dim}", t, _same(got_q, want_q) and _same(got_s, want_s)))

    zero_buf = torch.randn(num_tokens, model_dim, generator=gen).bfloat16().to(device)
    fused, fq, fs = ops.moe_sort_quant(ids, weights, x, expert, block_m, zero_buf=zero_buf)
    ok = _check_sort(fused, want_sort, block_m) and _same(fq, want_q) and _same(fs, want_s)
    ok = ok and not bool(zero_buf.view(torch.int16).any())
    t = _timed(lambda: ops.moe_sort_quant(ids, weights, x, expert, block_m), device, repeat)
    rows.append(("moe_sort_quant", "fused, zero_buf", t, ok))

    sort_args = (want_s, want_sort.sorted_token_ids, want_sort.num_valid_ids, block_m)
    want_scales = ref.moe_sort_scales(*sort_args)
    got_scales = ops.moe_sort_scales(*sort_args)
    t = _timed(lambda: ops.moe_sort_scales(*sort_args), device, repeat)
    rows.append(("moe_sort_scales", f"BM={max(32, block_m)}", t, _same(got_scales, want_scales)))

    num_rows = int(want_sort.num_valid_ids[0])
    expert_out = torch.randn(num_rows, model_dim, generator=gen).bfloat16().to(device)
    scatter_args = (expert_out, want_sort.reverse_sorted, want_sort.sorted_weights, topk)
    want_out = ref.moe_scatter_reduce(*scatter_args)
    got_out = ops.moe_scatter_reduce(*scatter_args)
    t = _timed(lambda: ops.moe_scatter_reduce(*scatter_args), device, repeat)
    rows.append(("moe_scatter_reduce", f"rows={num_rows}", t, _same(got_out, want_out)))

    eq, es = ref.mxfp4_quant(expert_out)
    q_args = (eq, es, want_sort.reverse_sorted, want_sort.sorted_weights, topk)
    want_out = ref.moe_scatter_reduce_q(*q_args)
    got_out = ops.moe_scatter_reduce_q(*q_args)
    t = _timed(lambda: ops.moe_scatter_reduce_q(*q_args), device, repeat)
    rows.append(("moe_scatter_reduce_q", f"rows={num_rows}", t, _same(got_out, want_out)))
    return rows


def run_pipeline(shape, tokens, block_m: int = 32, seed: int | None = None, device="cpu") -> int:
    """Run ``aiter-aux run``; returns the process exit code (1 on any mismatch)."""
    expert, model_dim, inter, topk = shape
    if not is_mxfp4_moe_shape_supported(expert, model_dim, inter, topk):
        print(
            f"shape {tuple(shape)} is not in the catalog (inter is rounded up to 256); "
            "see `aiter-aux list`, add it with `aiter-aux add-shape`"
        )
        return 2
    device = torch.device(device)
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    print(f"shape (expert={expert}, model_dim={model_dim}, inter={inter}, topk={topk}), "
          f"block_m={block_m}, device={device}, seed={seed}")  # fmt: skip
    failures = 0
    for m in tokens:
        t0 = time.perf_counter()
        rows = run_one(shape, m, block_m, gen, device)
        print(f"\ntokens = {m}")
        print(f"  {'op':<22} {'sizes':<20} {'time (us)':>11}  check")
        for op, sizes, us, ok in rows:
            failures += not ok
            print(f"  {op:<22} {sizes:<20} {us:>11.1f}  {'ok' if ok else 'MISMATCH'}")
        print(f"  ({time.perf_counter() - t0:.1f} s including the reference)")
    print(f"\n{'all outputs match the reference' if not failures else f'{failures} MISMATCHES'}")
    return 1 if failures else 0
