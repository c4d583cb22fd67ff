"""aiter_aux.compat.vllm / .sglang ``moe_align_block_size`` and the ops
``moe_align_block_size_vllm`` / ``moe_align_block_size_sglang`` against the references
(aiter_aux.reference.compat is the spec of the formats; aiter_aux.reference.align of the
ops), on the CPU module and on CUDA when there is one: random routing, expert parallelism
with gaps, nothing local, M = 0, 1, 7, 4096, 65536 (the large ones on a small catalog
shape), every block size, ids out of range, one expert taking every pair, the vLLM options,
poisoned and longer buffers, and the errors (raised before any kernel runs).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops as O  # noqa: E402
from aiter_aux import reference as R  # noqa: E402
from aiter_aux.compat import sglang as S  # noqa: E402
from aiter_aux.compat import vllm as V  # noqa: E402
from aiter_aux.compat.sglang import srt as SRT  # noqa: E402
from aiter_aux.compat.vllm import custom_ops as CO  # noqa: E402
from aiter_aux.reference import compat as RC  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BLOCK_SIZES = [16, 32, 64, 128]
SMALL = (33, 8)  # a small catalog (num_experts, topk): the large M
SHAPES = [(256, 8), (513, 11), (33, 8), (896, 16)]
POISON = 0x5A5A5A5A


@pytest.fixture(scope="module", autouse=True)
def _module(cpu_module):
    return cpu_module


def _routing(g, m, k, e, mode):
    ids = torch.randint(0, e, (m, k), generator=g, dtype=torch.int32)
    if mode == "one":
        return torch.full((m, k), e // 2, dtype=torch.int32)
    if mode == "none":
        return torch.where(torch.rand(m, k, generator=g) < 0.5, -1, e + 7).to(torch.int32)
    if mode == "ep":  # -1 for other ranks' experts, some experts never picked
        ids = torch.where(ids % 3 == 1, -1, ids)
    if mode == "oob":  # ids out of range (the vLLM format drops them)
        bad = torch.tensor([-1, -2, e, e + 1, 2**31 - 1, -(2**31)], dtype=torch.int32)
        pick = bad[torch.randint(0, len(bad), (m, k), generator=g)]
        ids = torch.where(torch.rand(m, k, generator=g) < 0.3, pick, ids)
    return ids


def _eq(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.shape, b.shape)
        assert torch.equal(a.cpu(), b.cpu()), f"output {i} differs"


CASES = [(e, k, m, bs, mode) for (e, k) in SHAPES for m, bs, mode in
         [(0, 16, "rand"), (1, 32, "rand"), (7, 64, "ep"), (7, 128, "one"), (100, 16, "oob"),
          (300, 64, "none"), (1000, 128, "ep")]]  # fmt: skip
CASES += [(*SMALL, 4096, bs, "rand") for bs in BLOCK_SIZES]
CASES += [(*SMALL, 65536, 64, "ep"), (*SMALL, 65536, 16, "one")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("e,k,m,bs,mode", CASES)
def test_vllm(device, e, k, m, bs, mode):
    g = torch.Generator().manual_seed(e * 7 + m + bs)
    ids = _routing(g, m, k, e, mode).to(device)
    for pad in (False, True):
        want = RC.vllm_moe_align_block_size(ids, bs, e, pad_sorted_ids=pad, return_scatter_idx=True)
        _eq(V.moe_align_block_size(ids, bs, e, pad_sorted_ids=pad, return_scatter_idx=True), want)
        _eq(V.moe_align_block_size(ids.long(), bs, e, pad_sorted_ids=pad), want[:3])
    # expert parallelism: a map with gaps (every third expert local), both meanings
    emap = torch.full((e + 3,), -1, dtype=torch.int32)
    local = torch.arange(0, e, 3)
    emap[local] = torch.arange(local.numel(), dtype=torch.int32)
    emap = emap.to(device)
    for ignore in (True, False):
        want = RC.vllm_moe_align_block_size(ids, bs, e, emap, ignore_invalid_experts=ignore,
                                            return_scatter_idx=ignore)  # fmt: skip
        got = V.moe_align_block_size(ids, bs, e, emap, ignore_invalid_experts=ignore,
                                     return_scatter_idx=ignore)  # fmt: skip
        _eq(got, want)
    none_local = torch.full((e,), -1, dtype=torch.int32, device=device)
    _eq(
        V.moe_align_block_size(ids, bs, e, none_local, ignore_invalid_experts=True),
        RC.vllm_moe_align_block_size(ids, bs, e, none_local, ignore_invalid_experts=True),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("e,k,m,bs,mode", [c for c in CASES if c[4] != "oob"])
def test_sglang(device, e, k, m, bs, mode):
    g = torch.Generator().manual_seed(e * 5 + m + bs)
    ids = _routing(g, m, k, e, mode).clamp(-1, e - 1).to(device)
    want = RC.sglang_moe_align_block_size(ids, bs, e)
    cap = want[0].numel()
    for flat in (False, True):
        x = ids.reshape(-1) if flat else ids
        buf = [torch.full((n,), POISON, dtype=torch.int32, device=device)
               for n in (cap, want[1].numel(), 1)]  # fmt: skip
        cumsum = torch.full((e + 2,), POISON, dtype=torch.int32, device=device)
        assert S.moe_align_block_size(x, e + 1, bs, *buf, cumsum, True) is None
        _eq(buf, want)
        assert bool((cumsum == POISON).all()), "cumsum_buffer was written"


@pytest.mark.parametrize("device", DEVICES)
def test_ops_longer_buffers_and_guards(device):
    """The _out forms write rows [0, min(len(sti), len(eid) * bs)) and those blocks, nothing
    else: guard elements keep their poison, and equal the op's reference."""
    g = torch.Generator().manual_seed(3)
    e, k, bs = 256, 8, 32
    ids = _routing(g, 50, k, e, "oob").to(device)
    emap = torch.randint(-1, e, (e + 1,), generator=g, dtype=torch.int32).to(device)
    for op, kw in (("vllm", {}), ("vllm", {"expert_map": emap}),
                   ("vllm", {"block_expert_map": emap}), ("sglang", {})):  # fmt: skip
        name = f"moe_align_block_size_{op}"
        cap_fn = RC.vllm_align_capacity if op == "vllm" else RC.sglang_align_capacity
        cap = cap_fn(ids.numel(), e, bs) + 45  # a longer sorted_token_ids
        outs = []
        for lib in (O, R):
            bufs = [torch.full((n + 8,), POISON, dtype=torch.int32, device=device)
                    for n in (cap, -(-cap // bs) + 1, 1, ids.numel())]  # fmt: skip
            getattr(lib, name + "_out")(ids, e, bs, *(b[4:-4] for b in bufs), **kw)
            outs.append(bufs)
            for b in bufs:
                assert bool((b[:4] == POISON).all() and (b[-4:] == POISON).all()), name
        _eq(outs[0], outs[1])
        _eq(getattr(O, name)(ids, e, bs, **kw), getattr(R, name)(ids, e, bs, **kw))


def test_vllm_int64_ids_past_int32_are_dropped():
    ids = torch.tensor([[2**32 + 3, 5], [-(2**32) + 1, 2**31]], dtype=torch.int64)
    want = RC.vllm_moe_align_block_size(ids, 16, 256, return_scatter_idx=True)
    _eq(V.moe_align_block_size(ids, 16, 256, return_scatter_idx=True), want)
    assert want[3].reshape(-1).tolist() == [-1, 1, -1, -1]


def _no_kernel(cpu_module, fn, exc, match):
    calls = cpu_module.kernel_calls()
    with pytest.raises(exc, match=match):
        fn()
    assert cpu_module.kernel_calls() == calls, "a kernel ran"


def test_errors_before_any_kernel(cpu_module):
    ids = torch.randint(0, 256, (4, 8), dtype=torch.int32)
    emap = torch.arange(256, dtype=torch.int32)
    cases = [
        (lambda: V.moe_align_block_size(ids, 65537, 256), ValueError, "block_size must be in"),
        (lambda: V.moe_align_block_size(ids, 0, 256), ValueError, "block_size"),
        (lambda: V.moe_align_block_size(ids, 64, 993), ValueError, "num_experts"),
        (lambda: V.moe_align_block_size(ids.float(), 64, 256), TypeError, "topk_ids"),
        (lambda: V.moe_align_block_size(ids.t(), 64, 256), ValueError, "contiguous"),
        (lambda: V.moe_align_block_size(ids, 64, 256, pad_sorted_ids=1), TypeError, "pad"),
        (lambda: V.moe_align_block_size(ids, 64, 256, emap, return_scatter_idx=True),
         ValueError, "ignore_invalid_experts"),
        (lambda: V.moe_align_block_size(ids, 64, 256, emap[:10]), ValueError, "expert_map"),
        (lambda: V.moe_align_block_size(ids, 64, 256, emap + 5, ignore_invalid_experts=True),
         ValueError, "expert_map values"),
        (lambda: O.moe_align_block_size_vllm(ids, 256, 64, expert_map=emap,
                                             block_expert_map=emap), ValueError, "not both"),
        (lambda: O.moe_align_block_size_sglang(ids, 1024, 64), ValueError, "1023"),
    ]  # fmt: skip
    sti, eid, nt = (torch.zeros(n, dtype=torch.int32) for n in (2048, 64, 1))
    cases += [
        (lambda: S.moe_align_block_size(ids, 257, 64, sti[:100], eid, nt, None), ValueError,
         "elements"),
        (lambda: S.moe_align_block_size(ids + 300, 257, 64, torch.zeros(17000, dtype=torch.int32),
                                        torch.zeros(300, dtype=torch.int32), nt, None),
         ValueError, "topk_ids values"),
        (lambda: S.moe_align_block_size(ids, 1, 64, sti, eid, nt, None), ValueError,
         r"in \[2, 1024\].*, got 1$"),
        (lambda: S.moe_align_block_size(ids, 257, 64, sti.long(), eid, nt, None), TypeError,
         "sorted_token_ids"),
        (lambda: S.moe_align_block_size(ids, 257, 64, sti, eid, nt, None, True, 1), TypeError,
         "ignore_invalid_expert"),
        (lambda: S.moe_align_block_size(ids + 256, 257, 64, sti, eid, nt, None, True, True),
         ValueError, "topk_ids values must be < 256"),
        (lambda: SRT.moe_align_block_size(ids, 64, 256, ignore_invalid_expert=None), TypeError,
         "ignore_invalid_expert"),
        (lambda: CO.moe_align_block_size(ids, 256, 64, sti[:100], eid, nt, None), ValueError,
         "sorted_token_ids must have >="),
        (lambda: CO.moe_align_block_size(ids, 256, 64, sti, eid[:2], nt, None), ValueError,
         "experts_ids must have >="),
        (lambda: CO.moe_align_block_size(ids, 256, 64, sti, eid, nt, None, sti[:5]), ValueError,
         "scatter_idx must have"),
        (lambda: CO.moe_align_block_size(ids, 256, 64, sti, eid, nt, emap + 5), ValueError,
         "expert_map values"),
        (lambda: CO.moe_align_block_size(ids, 256, 0, sti, eid, nt, None), ValueError,
         "block_size"),
        # what the binding accepts and the peers' rules do not: a bool for an int, 0-D ids,
        # the SGLang buffers with ignore_invalid_expert (the op's capacity is vLLM's)
        (lambda: V.moe_align_block_size(ids, True, 256), TypeError, "block_size"),
        (lambda: CO.moe_align_block_size(ids, 256, True, sti, eid, nt, None), TypeError,
         "block_size"),
        (lambda: S.moe_align_block_size(ids[0, 0], 257, 64, sti, eid, nt, None), ValueError,
         "1-D or 2-D"),
        (lambda: S.moe_align_block_size(ids, 257, 64, sti, eid[:3], nt, None, False, True),
         ValueError, "experts_ids must have >="),
    ]  # fmt: skip
    for fn, exc, match in cases:
        _no_kernel(cpu_module, fn, exc, match)


def test_import_loads_nothing():
    code = ("import sys; import aiter_aux.compat.vllm, aiter_aux.compat.sglang; "
            "import aiter_aux.compat.vllm.custom_ops, aiter_aux.compat.sglang.srt; "
            "bad = [m for m in ('torch', 'aiter_aux.ops', 'aiter_aux.jit.build') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_signatures():
    import inspect

    p = list(inspect.signature(V.moe_align_block_size).parameters.values())
    assert [(x.name, x.default) for x in p] == [
        ("topk_ids", inspect._empty), ("block_size", inspect._empty),
        ("num_experts", inspect._empty), ("expert_map", None), ("pad_sorted_ids", False),
        ("ignore_invalid_experts", False), ("return_scatter_idx", False),
    ]  # fmt: skip
    p = list(inspect.signature(S.moe_align_block_size).parameters.values())
    assert [x.name for x in p] == [
        "topk_ids", "num_experts", "block_size", "sorted_token_ids", "experts_ids",
        "num_tokens_post_pad", "cumsum_buffer", "pad_sorted_token_ids", "ignore_invalid_expert",
    ]  # fmt: skip
    assert p[-1].default is False and p[-2].default is False
    # SGLang 0.5.x srt layer: moe_align_block_size(topk_ids, block_size, num_experts,
    # ignore_invalid_expert=False); vllm._custom_ops.moe_align_block_size's out form
    p = list(inspect.signature(SRT.moe_align_block_size).parameters.values())
    assert [(x.name, x.default) for x in p] == [
        ("topk_ids", inspect._empty), ("block_size", inspect._empty),
        ("num_experts", inspect._empty), ("ignore_invalid_expert", False),
    ]  # fmt: skip
    p = list(inspect.signature(CO.moe_align_block_size).parameters.values())
    assert [(x.name, x.default) for x in p] == [
        ("topk_ids", inspect._empty), ("num_experts", inspect._empty),
        ("block_size", inspect._empty), ("sorted_token_ids", inspect._empty),
        ("experts_ids", inspect._empty), ("num_tokens_post_pad", inspect._empty),
        ("maybe_expert_map", inspect._empty), ("scatter_idx", None),
    ]  # fmt: skip
    assert CO.moe_sum is V.moe_sum


# ---------------------------------------------------------------- any block size, any shape
# vLLM's Marlin MoE aligns with 8, 16, 32, 48 and 64; the peers take any block size.
ANY_BS = [1, 7, 8, 48, 200, 256]
ANY_CASES = [(e, k, m, bs, mode) for (e, k) in [(256, 8), SMALL] for bs in ANY_BS
             for m, mode in [(1, "rand"), (3, "ep"), (300, "oob"), (4096, "ep")]]  # fmt: skip


@pytest.mark.parametrize("e,k,m,bs,mode", ANY_CASES)
def test_vllm_any_block_size_and_shape(e, k, m, bs, mode):
    g = torch.Generator().manual_seed(e + m * 3 + bs)
    ids = _routing(g, m, k, e, mode)
    emap = torch.full((e + 2,), -1, dtype=torch.int32)
    emap[::2] = torch.arange(0, e + 2, 2, dtype=torch.int32).clamp_max(e - 1) // 2
    for pad in (False, True):
        want = RC.vllm_moe_align_block_size(ids, bs, e, pad_sorted_ids=pad, return_scatter_idx=True)
        # any shape is read as a flat array, int32 or int64
        for x in (ids, ids.long(), ids.reshape(-1), ids.reshape(1, -1, 1).long()):
            _eq(V.moe_align_block_size(x, bs, e, pad_sorted_ids=pad, return_scatter_idx=True),
                want)  # fmt: skip
    for ignore in (True, False):
        want = RC.vllm_moe_align_block_size(ids, bs, e, emap, ignore_invalid_experts=ignore)
        _eq(V.moe_align_block_size(ids.long(), bs, e, emap, ignore_invalid_experts=ignore), want)


# On a GPU: the paths a block size outside moe_sort's takes (micro up to a warp of pairs, the
# pair path's kernel of divisions up to 64 pairs whose rows it covers, then mid).
GPU_ANY = [(256, 8, m, bs) for bs in (1, 7, 8, 48, 1024, 1025) for m in (1, 5, 8, 100)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("e,k,m,bs", GPU_ANY)
def test_any_block_size_on_the_gpu(e, k, m, bs):
    g = torch.Generator().manual_seed(e + m * 5 + bs)
    ids = _routing(g, m, k, e, "ep").cuda()
    emap = torch.full((e + 1,), -1, dtype=torch.int32)
    emap[::3] = torch.arange(0, e + 1, 3, dtype=torch.int32) // 3
    emap = emap.cuda()
    for kw in ({}, {"expert_map": emap, "ignore_invalid_experts": True}):
        want = RC.vllm_moe_align_block_size(ids, bs, e, return_scatter_idx=True, **kw)
        _eq(V.moe_align_block_size(ids, bs, e, return_scatter_idx=True, **kw), want)
    want = RC.sglang_moe_align_block_size(ids, bs, e)
    bufs = [torch.full((n,), POISON, dtype=torch.int32, device="cuda")
            for n in (want[0].numel(), want[1].numel(), 1)]  # fmt: skip
    cumsum = torch.full((e + 2,), POISON, dtype=torch.int32, device="cuda")
    assert S.moe_align_block_size(ids, e + 1, bs, *bufs, cumsum, True) is None
    _eq(bufs, want)


@pytest.mark.parametrize("e,k,m,bs,mode", [c for c in ANY_CASES if c[4] != "oob"])
def test_sglang_any_block_size_and_ignore_invalid(e, k, m, bs, mode):
    g = torch.Generator().manual_seed(e * 3 + m + bs)
    ids = _routing(g, m, k, e, mode).clamp(-1, e - 1)
    for ignore in (False, True):
        x = ids
        if ignore:  # any negative id is skipped, not only -1
            x = torch.where(ids < 0, torch.randint(-9, 0, ids.shape, generator=g), ids)
            x = x.to(torch.int32)
        want = RC.sglang_moe_align_block_size(x, bs, e, ignore_invalid_expert=ignore)
        if not ignore:
            assert want[2].item() >= 0
        _eq(SRT.moe_align_block_size(x.long(), bs, e, ignore_invalid_expert=ignore), want)
        for flat in (False, True):
            y = x.reshape(-1) if flat else x
            bufs = [torch.full((n,), POISON, dtype=torch.int32)
                    for n in (want[0].numel(), want[1].numel(), 1)]  # fmt: skip
            cumsum = torch.full((e + 2,), POISON, dtype=torch.int32)
            assert S.moe_align_block_size(y, e + 1, bs, *bufs, cumsum, True, ignore) is None
            _eq(bufs, want)
            assert bool((cumsum == POISON).all())
        if ignore:  # bucket 0 takes no rows: the rows of the non-negative ids only
            kept = RC.sglang_moe_align_block_size(x.clamp_min(-1), bs, e)
            assert want[2].item() <= kept[2].item()


def test_sglang_ignore_invalid_expert_semantics():
    """sgl-kernel: `if (ignore_invalid_expert && topk_ids[i] < 0) continue;` (count and place
    loops): the negative ids take no rows and no blocks; the rest as without them."""
    ids = torch.tensor([[-1, 2], [0, -5], [2, 2]], dtype=torch.int32)
    sti, eid, total = RC.sglang_moe_align_block_size(ids, 4, 3, ignore_invalid_expert=True)
    assert total.item() == 8
    assert sti[:8].tolist() == [2, 6, 6, 6, 1, 4, 5, 6]
    assert eid[:2].tolist() == [0, 2] and bool((eid[2:] == -1).all())
    sti, eid, total = RC.sglang_moe_align_block_size(ids.clamp_min(-1), 4, 3)
    assert total.item() == 12 and eid[:3].tolist() == [-1, 0, 2]


@pytest.mark.parametrize("bs", [8, 16, 48])
@pytest.mark.parametrize("m,mode", [(1, "rand"), (9, "oob"), (700, "ep")])
def test_vllm_custom_ops_out_form(bs, m, mode):
    """vllm._custom_ops.moe_align_block_size: every element of sorted_token_ids (the caller's
    length), the blocks of that length, num_tokens_post_pad, scatter_idx when given;
    nothing past them (guards keep their poison)."""
    e, k = 256, 8
    g = torch.Generator().manual_seed(m + bs)
    ids = _routing(g, m, k, e, mode)
    emap = torch.randint(-1, e, (e,), generator=g, dtype=torch.int32)
    n = ids.numel()
    for maybe_map in (None, emap):
        for extra in (0, 13):
            for want_sc in (False, True):
                cap = RC.vllm_align_capacity(n, e, bs, extra > 0) + extra
                outs = []
                for fn in (CO.moe_align_block_size, RC.vllm_custom_moe_align_block_size):
                    bufs = [torch.full((c + 4,), POISON, dtype=torch.int32)
                            for c in (cap, -(-cap // bs) + 3, 1, n)]  # fmt: skip
                    sc = bufs[3][2:-2] if want_sc else None
                    x = ids.long() if fn is CO.moe_align_block_size else ids
                    r = fn(x, e, bs, bufs[0][2:-2], bufs[1][2:-2], bufs[2][2:-2], maybe_map, sc)
                    assert r is None
                    outs.append(bufs)
                _eq(outs[0], outs[1])
                sti, eid, nt, sc = outs[0]
                assert bool((sti[:2] == POISON).all() and (sti[-2:] == POISON).all())
                assert bool((sti[2:-2] != POISON).all()), "every row is written"
                nblk = -(-cap // bs)
                assert bool((eid[2 + nblk :] == POISON).all()), "no block past the rows"
                assert bool((eid[2 : 2 + nblk] != POISON).all())
                assert bool((sc[2:-2] != POISON).all()) == want_sc
                want = RC.vllm_moe_align_block_size(
                    ids, bs, e, maybe_map, ignore_invalid_experts=maybe_map is not None,
                    return_scatter_idx=True)  # fmt: skip
                assert nt[2].item() == want[2].item()
                assert torch.equal(sti[2 : 2 + want[2].item()], want[0][: want[2].item()])


@pytest.mark.parametrize("op", ["vllm", "sglang"])
@pytest.mark.parametrize("bs", [1, 8, 48, 100, 65536])
def test_align_ops_any_block_size(op, bs):
    """The native ops take any block_size in [1, 65536], bytes as their reference's."""
    g = torch.Generator().manual_seed(bs)
    e, k = SMALL
    for m in (0, 1, 5, 600):
        ids = _routing(g, m, k, e, "ep")
        name = f"moe_align_block_size_{op}"
        _eq(getattr(O, name)(ids, e, bs), getattr(R, name)(ids, e, bs))
        _eq(getattr(O, name)(ids.long(), e, bs), getattr(R, name)(ids, e, bs))
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 65536\]"):
        getattr(O, name)(ids, e, 65537)


def test_pairs_past_the_kernels_limit_are_a_value_error_in_the_callers_terms(cpu_module):
    """topk_ids.numel() == 2**24 (M = 2**21, topk = 8): a ValueError before any kernel that
    names the caller's M and topk, from both drop-ins and the op (was the kernel's
    RuntimeError for vLLM, and M = 16777216 for SGLang)."""
    e, k = SMALL
    m = (1 << 24) // k
    ids = torch.zeros(m, k, dtype=torch.int32)
    cap = RC.sglang_align_capacity(ids.numel(), e, 32)
    sti, eid, nt = (torch.empty(n, dtype=torch.int32) for n in (cap, -(-cap // 32), 1))
    for fn in (lambda: V.moe_align_block_size(ids, 32, e),
               lambda: O.moe_align_block_size_vllm(ids, e, 32),
               lambda: S.moe_align_block_size(ids, e + 1, 32, sti, eid, nt)):  # fmt: skip
        _no_kernel(cpu_module, fn, ValueError, f"M={m}, topk={k}")
    # 1-D ids (vLLM reads them flat): M is their elements, named as topk_ids'
    flat = ids.view(-1)
    want = r"^M \(the rows of topk_ids, its elements when 1-D\) must be in \[0, 2\*\*24\)"
    _no_kernel(cpu_module, lambda: V.moe_align_block_size(flat, 32, e), ValueError, want)


@pytest.mark.parametrize("passed", [1025, 1100, 8192, 8193, 10_000])
def test_sglang_num_experts_errors_name_the_value_passed(cpu_module, passed):
    """SGLang's num_experts counts the routed experts plus one: its limit errors name the
    value as the caller passed it (they named one less, under three different limits)."""
    ids = torch.zeros(4, 8, dtype=torch.int32)
    sti, eid, nt = (torch.zeros(n, dtype=torch.int32) for n in (1 << 20, 1 << 15, 1))
    _no_kernel(cpu_module, lambda: S.moe_align_block_size(ids, passed, 64, sti, eid, nt),
               ValueError, rf"num_experts must be in \[2, 1024\].*got {passed}\b")  # fmt: skip


@pytest.mark.parametrize("passed", [0, 1024, 1100, 8191, 8192, 10_000])
def test_srt_num_experts_errors_name_the_value_passed(cpu_module, passed):
    """The srt form's num_experts counts the routed experts: its errors name it as the
    caller passed it, never the buckets (num_experts + 1) of the sgl-kernel form it calls."""
    ids = torch.zeros(4, 8, dtype=torch.int32)
    _no_kernel(cpu_module, lambda: SRT.moe_align_block_size(ids, 64, passed), ValueError,
               rf"^num_experts must be in \[1, 1023\] \(.*\), got {passed}$")  # fmt: skip


@pytest.mark.parametrize("ignore", [False, True])
def test_srt_id_errors_name_num_experts_as_passed(cpu_module, ignore):
    """An id out of range names the srt caller's num_experts, not SGLang's kernel's
    num_experts - 1 (that form's argument counts the buckets)."""
    ids = torch.tensor([[0, 9], [3, 1]], dtype=torch.int32)
    rule = "< 8" if ignore else r"in \[-1, 8\)"
    _no_kernel(cpu_module, lambda: SRT.moe_align_block_size(ids, 16, 8, ignore), ValueError,
               rf"^topk_ids values must be {rule}, got 9 \(8 = num_experts\)$")  # fmt: skip
    sti, eid, nt = (torch.zeros(n, dtype=torch.int32) for n in (1024, 64, 1))
    _no_kernel(cpu_module, lambda: S.moe_align_block_size(ids, 9, 16, sti, eid, nt, None,
                                                          False, ignore), ValueError,
               rf"^topk_ids values must be {rule}, got 9 \(8 = num_experts - 1, the routed "
               r"experts\)$")  # fmt: skip


def test_overlap_errors_name_the_out_forms_experts_ids():
    # the out forms' parameter is experts_ids (vLLM's custom op, sgl-kernel's): the error
    # names it so, not the native op's expert_ids (ids < 12: SGLang's 13 is routed + 1)
    ids = torch.randint(0, 12, (5, 3), dtype=torch.int32)
    s = torch.full((200,), -7, dtype=torch.int32)
    ntp = torch.full((1,), -7, dtype=torch.int32)
    cum = torch.full((15,), -7, dtype=torch.int32)
    for call in (
        lambda: CO.moe_align_block_size(ids, 13, 8, s[:106], s[100:114], ntp, None),
        lambda: S.moe_align_block_size(ids, 13, 8, s[:106], s[100:114], ntp, cum),
    ):
        with pytest.raises(ValueError, match=r"^experts_ids overlaps sorted_token_ids"):
            call()
    assert (s == -7).all() and (ntp == -7).all()
