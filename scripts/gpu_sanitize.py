"""A representative run of every GPU op, for compute-sanitizer (memcheck / racecheck).

    compute-sanitizer --tool memcheck python3 scripts/gpu_sanitize.py [route]

Small and medium sizes, every sort path, every op, with programmatic dependent launch off,
then on (AuxModule.set_pdl); each output is also compared with the reference so a
sanitizer-clean but wrong run still fails.  ``route``: the moe_route cases only.
"""

from __future__ import annotations

import sys

import torch

from aiter_aux import ops
from aiter_aux import reference as ref
from aiter_aux.compat import sglang, vllm
from aiter_aux.jit.spec import loaded_modules
from aiter_aux.pipeline import draw_routing
from aiter_aux.validation.ints import sort_capacity, sort_scales_rows


def same(a, b) -> bool:
    return torch.equal(
        a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8)
    )


def main() -> int:
    only_route = sys.argv[1:] == ["route"]
    dev = torch.device("cuda")
    ops.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16, device=dev))  # loads the module
    module = loaded_modules()["cuda"]
    bad = 0
    for pdl in (False, True):
        module.set_pdl(pdl)
        print(f"PDL {'on' if pdl else 'off'}", flush=True)
        bad += check_route(dev, torch.Generator().manual_seed(7)) if only_route else run_all(dev)
    return 1 if bad else 0


def run_all(dev) -> int:
    """Every shape's checks; the number of shapes with a mismatch."""
    g = torch.Generator().manual_seed(1234)
    bad = 0
    # every sort path (gpu/sort_policy.h choose_sort_path): pairs (M = 1, 3), tiny (40), mid
    # (300, 5000; the fused op at 6000 too), large (moe_sort at 6000: 54000 pairs)
    for shape, m in (
        ((257, 7168, 256, 9), 1),
        ((257, 7168, 256, 9), 3),
        ((896, 3584, 512, 16), 40),
        ((257, 7168, 256, 9), 300),
        ((32, 5120, 2304, 2), 5000),
        ((257, 7168, 256, 9), 6000),
    ):
        e, d, _i, k = shape
        ids, w = draw_routing(m, e, k, g)
        ids[::4, 0] = -1
        ids, w = ids.to(dev), w.to(dev)
        x = (
            torch.randint(-(2**15), 2**15, (m, d), generator=g, dtype=torch.int16)
            .view(torch.bfloat16)
            .to(dev)
        )
        zero_buf = torch.ones(m, d, dtype=torch.bfloat16, device=dev)
        srt, q, s = ops.moe_sort_quant(ids, w, x, e, 32, zero_buf=zero_buf)
        want = ref.moe_sort(ids.cpu(), w.cpu(), e, 32)
        nv = int(want.num_valid_ids[0])
        ok = all(
            same(a[:n], b[:n])
            for a, b, n in zip(srt, want, (nv, nv, nv, nv // 32, 2, m * k), strict=True)
        )
        srt2 = ops.moe_sort(ids, w, e, 32)
        ok &= all(
            same(a[:n], b[:n])
            for a, b, n in zip(srt2, want, (nv, nv, nv, nv // 32, 2, m * k), strict=True)
        )
        rq, rs = ref.mxfp4_quant(x.cpu())
        q2, s2 = ops.mxfp4_quant(x)
        ok &= same(q, rq) and same(s, rs) and same(q2, rq) and same(s2, rs)
        ok &= not bool(zero_buf.view(torch.int16).any())
        # MXFP8 (a8w4): the fused op and the separate quant
        srt8, q8, s8 = ops.moe_sort_quant(ids, w, x, e, 32, zero_buf=zero_buf, quant_dtype="mxfp8")
        rq8, rs8 = ref.mxfp8_quant(x.cpu())
        q8b, s8b = ops.mxfp8_quant(x)
        ok &= same(q8, rq8) and same(s8, rs8) and same(q8b, rq8) and same(s8b, rs8)
        ok &= same(srt8.reverse_sorted, want.reverse_sorted)
        sc = ops.moe_sort_scales(s, srt.sorted_token_ids, srt.num_valid_ids, 32)
        ok &= same(sc, ref.moe_sort_scales(rs, want.sorted_token_ids, want.num_valid_ids, 32))
        # the decode step in one call: the fused op writes sorted_scales too
        # (poisoned buffer with guard rows past out_rows, which must keep their bytes)
        for qd, ref_scale in (("mxfp4", rs), ("mxfp8", rs8)):
            want_sc = ref.moe_sort_scales(ref_scale, want.sorted_token_ids, want.num_valid_ids, 32)
            rows = want_sc.shape[0]
            buf = torch.full((rows + 32, d // 32), 0xA5, dtype=torch.uint8, device=dev)
            ops.moe_sort_quant(ids, w, x, e, 32, quant_dtype=qd, sorted_scales=buf)
            ok &= same(buf[:rows], want_sc) and bool((buf[rows:] == 0xA5).all())
        eo = torch.randn(max(nv, 1), d, generator=g).bfloat16()
        out = ops.moe_scatter_reduce(eo.to(dev), srt.reverse_sorted, srt.sorted_weights, k)
        ok &= same(out, ref.moe_scatter_reduce(eo, want.reverse_sorted, want.sorted_weights, k))
        eq, es = ref.mxfp4_quant(eo)
        outq = ops.moe_scatter_reduce_q(
            eq.to(dev), es.to(dev), srt.reverse_sorted, srt.sorted_weights, k
        )
        ok &= same(
            outq, ref.moe_scatter_reduce_q(eq, es, want.reverse_sorted, want.sorted_weights, k)
        )
        # the serving options: an expert map over 2E global experts (half local, with holes),
        # the accumulator initialised from another buffer, a routed scaling factor
        gids = torch.randint(-1, 2 * e, (m, k), generator=g, dtype=torch.int32)
        emap = torch.full((2 * e,), -1, dtype=torch.int32)
        emap[torch.randperm(2 * e, generator=g)[:e]] = torch.randperm(e, generator=g).int()
        emap[::7] = -1
        init = torch.randn(m, d, generator=g).bfloat16()
        zb = torch.empty(m, d, dtype=torch.bfloat16, device=dev)
        srt3, _q3, _s3 = ops.moe_sort_quant(
            gids.to(dev),
            w,
            x,
            e,
            32,
            zero_buf=zb,
            expert_map=emap.to(dev),
            zero_buf_init=init.to(dev),
        )
        want3 = ref.moe_sort(gids, w.cpu(), e, 32, expert_map=emap)
        nv3 = int(want3.num_valid_ids[0])
        ok &= all(
            same(a[:n], b[:n])
            for a, b, n in zip(srt3, want3, (nv3, nv3, nv3, nv3 // 32, 2, m * k), strict=True)
        )
        ok &= same(zb, init)
        outs = ops.moe_scatter_reduce(
            eo.to(dev), srt.reverse_sorted, srt.sorted_weights, k, routed_scaling_factor=2.5
        )
        ok &= same(
            outs,
            ref.moe_scatter_reduce(
                eo, want.reverse_sorted, want.sorted_weights, k, routed_scaling_factor=2.5
            ),
        )
        ok &= check_compat(dev, g, ids, gids, emap, e, k, d, m)
        torch.cuda.synchronize()
        print(f"shape {shape} M={m}: {'ok' if ok else 'MISMATCH'}", flush=True)
        bad += not ok
    return bad + check_route(dev, g)


def check_route(dev, g) -> int:
    """moe_route: every column class, softmax and DeepSeek-V3's grouped gate, M across the
    block's rows; the number of cases with a mismatch."""
    bad = 0
    for e, k, m in ((256, 8, 1), (256, 8, 37), (128, 8, 5), (384, 8, 2), (384, 8, 260),
                    (896, 16, 3), (1024, 16, 9)):  # fmt: skip
        logits = torch.randn(m, e, generator=g).bfloat16()
        bias = torch.randn(e, generator=g) * 0.1
        grouped = dict(scoring="sigmoid", num_expert_group=8, topk_group=4,
                       correction_bias=bias, routed_scaling_factor=2.5)  # fmt: skip
        for kw in ({}, grouped):
            tei = torch.full((m, k), -7, dtype=torch.int32, device=dev)  # token_expert_indices
            want_tei = torch.full((m, k), -7, dtype=torch.int32)
            got = ops.moe_route(
                logits.to(dev),
                k,
                token_expert_indices=tei,
                **{n: v.to(dev) if isinstance(v, torch.Tensor) else v for n, v in kw.items()},
            )
            want = ref.moe_route(logits, k, token_expert_indices=want_tei, **kw)
            ok = same(got[0], want[0]) and same(got[1], want[1]) and same(tei, want_tei)
            torch.cuda.synchronize()
            print(f"moe_route E={e} topk={k} M={m} {'grouped' if kw else 'softmax'}: "
                  f"{'ok' if ok else 'MISMATCH'}", flush=True)  # fmt: skip
            bad += not ok
    return bad + check_preamble(dev, g)


def check_preamble(dev, g) -> int:
    """moe_route_sort_quant with sorted_scales, an expert_map and zero_buf, at a decode and a
    prefill size (the sort's mid path; moe_sort_scales' own launch); the number of
    mismatches."""
    bad = 0
    e, k, d, local = 256, 8, 7168, 64  # DeepSeek-V3 at EP4: (64, 7168, 2048, 8)
    for m in (37, 1100):
        logits = torch.randn(m, e, generator=g).bfloat16()
        x = (torch.randn(m, d, generator=g) * 3).bfloat16()
        gmap = torch.full((e,), -1, dtype=torch.int32)
        gmap[torch.randperm(e, generator=g)[:local]] = torch.arange(local, dtype=torch.int32)
        rows = sort_scales_rows(sort_capacity(m, k, local, 32), 32)
        kw = dict(scoring="sigmoid", num_expert_group=8, topk_group=4, expert_map=gmap,
                  correction_bias=torch.randn(e, generator=g) * 0.1)  # fmt: skip
        for quant in ("mxfp4", "mxfp8"):
            bufs = [(torch.full((rows, d // 32), 0x5A, dtype=torch.uint8, device=v),
                     torch.full((m, d), 7.0, dtype=torch.bfloat16, device=v))
                    for v in (dev, "cpu")]  # fmt: skip
            on = {n: v.to(dev) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
            got = ops.moe_route_sort_quant(logits.to(dev), x.to(dev), k, local, 32, **on,
                                           quant_dtype=quant, sorted_scales=bufs[0][0],
                                           zero_buf=bufs[0][1])  # fmt: skip
            want = ref.moe_route_sort_quant(
                logits,
                x,
                k,
                local,
                32,
                **kw,
                quant_dtype=quant,
                sorted_scales=bufs[1][0],
                zero_buf=bufs[1][1],
            )
            n = int(want[2].num_valid_ids[0])
            ok = all(
                same(a, b) for a, b in zip(got[:2] + got[3:], want[:2] + want[3:], strict=True)
            )
            ok &= all(same(a[:n], b[:n]) for a, b in zip(got[2][:3], want[2][:3], strict=True))
            ok &= same(got[2].reverse_sorted, want[2].reverse_sorted)
            ok &= same(bufs[0][0], bufs[1][0]) and same(bufs[0][1], bufs[1][1])
            print(f"moe_route_sort_quant {quant} M={m}: {'ok' if ok else 'MISMATCH'}", flush=True)
            bad += not ok
    return bad


def check_compat(dev, g, ids, gids, emap, e, k, d, m) -> bool:
    """The peers' formats (every sort path again) and the sums, against the references."""
    R = ref.compat
    ok = all(
        map(
            same,
            vllm.moe_align_block_size(ids, 32, e),
            R.vllm_moe_align_block_size(ids.cpu(), 32, e),
        )
    )
    # vLLM's expert_map: global ids in [-1, e), half of them local (ids [0, e // 2))
    vids = gids.clamp(max=e - 1)
    vmap = torch.full((e,), -1, dtype=torch.int32)
    vmap[torch.randperm(e, generator=g)[: e // 2]] = torch.arange(e // 2, dtype=torch.int32)
    for ignore in (False, True):  # with and without ignore_invalid_experts
        args = (vids.to(dev), 32, e, vmap.to(dev), True, ignore, ignore)
        want = R.vllm_moe_align_block_size(vids, 32, e, vmap, True, ignore, ignore)
        ok &= all(map(same, vllm.moe_align_block_size(*args), want))
    want = R.sglang_moe_align_block_size(ids.cpu(), 32, e)
    got = [torch.full_like(t, 0x5A5A5A5A, device=dev) for t in want]
    sglang.moe_align_block_size(
        ids, e + 1, 32, *got, torch.empty(e + 2, dtype=torch.int32, device=dev), True
    )
    ok &= all(map(same, got, want))
    # the sums on at most 64 tokens (their rows are [M, topk, model_dim])
    t = min(m, 64)
    inp = torch.randn(t, k, d, generator=g).bfloat16()
    out, want = torch.empty(t, d, dtype=torch.bfloat16, device=dev), torch.empty(t, d).bfloat16()
    vllm.moe_sum(inp.to(dev), out, ids[:t], emap[:e].to(dev))
    R.vllm_moe_sum(inp, want, ids[:t].cpu(), emap[:e])
    ok &= same(out, want)
    sglang.moe_sum_reduce(inp.to(dev), out, 2.5)
    R.sglang_moe_sum_reduce(inp, want, 2.5)
    return ok & same(out, want)


if __name__ == "__main__":
    sys.exit(main())
