"""Tests of the vLLM / SGLang format references (aiter_aux.reference.compat) against
docs/compat.md.

Expected values are literal hand-worked tensors, or come from the naive loops and the
property checks written here from the rules of docs/compat.md (never from the code under
test).  The AITER-format sort (aiter_aux.reference.moe_sort) is cross-checked as a second,
independently written description of the same assignment.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from aiter_aux import reference as R  # noqa: E402
from aiter_aux.reference import compat as C  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]  # fmt: skip
BLOCK_SIZES = [1, 2, 3, 4, 16, 32, 64, 128, 256]  # the peers take any block_size >= 1
I32 = torch.int32


def ints(values, device="cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=I32, device=device)


def rand_ids(m, topk, lo, hi, seed, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (m, topk), generator=g, dtype=I32).to(device)


def assert_outputs(got, expected) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == I32 and g.device == got[0].device
        assert g.cpu().tolist() == e


# --------------------------------------------------------------------------------------------
# naive loops from the rules (small inputs)
# --------------------------------------------------------------------------------------------


def vllm_capacity(n, e, bs, pad):
    cap = n + e * (bs - 1)
    if pad:
        cap = (cap + bs - 1) // bs * bs
    return min(n * bs, cap) if n < e else cap


def naive_align(buckets, n_buckets, bs, cap, bucket_expert):
    """buckets[i]: the bucket of pair i or None; -> (sorted, expert_ids, [total])."""
    numel = len(buckets)
    sorted_ids, expert_ids = [], []
    for b in range(n_buckets):
        pairs = [i for i, x in enumerate(buckets) if x == b]
        blocks = (len(pairs) + bs - 1) // bs
        sorted_ids += pairs + [numel] * (blocks * bs - len(pairs))
        expert_ids += [bucket_expert[b]] * blocks
    total = len(sorted_ids)
    assert total <= cap
    n_blocks = (cap + bs - 1) // bs
    return (
        sorted_ids + [numel] * (cap - total),
        expert_ids + [-1] * (n_blocks - len(expert_ids)),
        [total],
    )


def naive_vllm(ids, bs, e, emap=None, pad=False, ignore=False):
    flat = [x for row in ids for x in row]
    kernel_map = emap if (emap is not None and ignore) else None
    local = [None if not 0 <= x < e else (kernel_map[x] if kernel_map else x) for x in flat]
    local = [None if x == -1 else x for x in local]
    cap = vllm_capacity(len(flat), e, bs, pad)
    s, eid, total = naive_align(local, e, bs, cap, list(range(e)))
    if emap is not None and not ignore:
        eid = [emap[x] for x in eid]  # Python indexing: -1 -> the last entry, as vLLM's
    scatter = [[i if x is not None else -1] for i, x in enumerate(local)]
    return s, eid, total, scatter


def naive_sglang(ids, bs, e):
    flat = [x for row in ids for x in row]
    n = len(flat)
    cap = n * bs if n < e + 1 else n + (e + 1) * (bs - 1)
    return naive_align([x + 1 for x in flat], e + 1, bs, cap, list(range(-1, e)))


# --------------------------------------------------------------------------------------------
# hand-worked examples
# --------------------------------------------------------------------------------------------

DOC_IDS = [[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]  # vLLM's docstring example, E = 5
DOC_SORTED = [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_hand_examples(device):
    t = ints(DOC_IDS, device)
    out = C.vllm_moe_align_block_size(t, 4, 5)
    assert_outputs(out, [DOC_SORTED + [12] * 11, [1, 2, 3, 4, -1, -1, -1], [16]])
    out = C.vllm_moe_align_block_size(t, 4, 5, pad_sorted_ids=True)  # 27 -> 28 rows
    assert_outputs(out, [DOC_SORTED + [12] * 12, [1, 2, 3, 4, -1, -1, -1], [16]])
    # EP, global ids: experts 1, 3, 4 are local 0, 1, 2; blocks past the used ones get
    # expert_map[-1] = 2 (vLLM indexes the map with the kernel's -1).
    emap = ints([-1, 0, -1, 1, 2], device)
    out = C.vllm_moe_align_block_size(t, 4, 5, expert_map=emap)
    assert_outputs(out, [DOC_SORTED + [12] * 11, [0, -1, 1, 2, 2, 2, 2], [16]])
    out = C.vllm_moe_align_block_size(
        t, 4, 5, expert_map=emap, ignore_invalid_experts=True, return_scatter_idx=True
    )
    scatter = [[-1], [1], [2], [3], [-1], [5], [6], [7], [8], [9], [-1], [11]]
    sorted_local = [3, 6, 9, 12, 1, 7, 11, 12, 2, 5, 8, 12] + [12] * 15
    assert_outputs(out, [sorted_local, [0, 1, 2, -1, -1, -1, -1], [12], scatter])
    # numel < num_experts: capacity numel * block_size; ids -1 and 9 (>= E) are dropped.
    out = C.vllm_moe_align_block_size(ints([[0, 7], [-1, 9]], device), 16, 8)
    assert_outputs(out, [[0] + [4] * 15 + [1] + [4] * 15 + [4] * 32, [0, 7, -1, -1], [32]])
    # M = 0
    out = C.vllm_moe_align_block_size(torch.zeros(0, 8, dtype=I32, device=device), 16, 8)
    assert_outputs(out, [[], [], [0]])


@pytest.mark.parametrize("device", DEVICES)
def test_sglang_hand_examples(device):
    # -1 pairs (1, 4, 5) first, in a block of expert -1; expert 1 has no pairs.
    out = C.sglang_moe_align_block_size(ints([[2, -1], [0, 2], [-1, -1]], device), 4, 3)
    sorted_ids = [1, 4, 5, 6, 2, 6, 6, 6, 0, 3, 6, 6] + [6] * 6
    assert_outputs(out, [sorted_ids, [-1, 0, 2, -1, -1], [12]])
    out = C.sglang_moe_align_block_size(ints([[5]], device), 16, 8)  # numel < E + 1
    assert_outputs(out, [[0] + [1] * 15, [5], [16]])
    out = C.sglang_moe_align_block_size(ints([3, 3, -1], device), 2, 4)  # 1-D ids
    assert_outputs(out, [[2, 3, 0, 1, 3, 3], [-1, 3, -1], [4]])
    out = C.sglang_moe_align_block_size(torch.zeros(0, 4, dtype=I32, device=device), 8, 3)
    assert_outputs(out, [[], [], [0]])


# --------------------------------------------------------------------------------------------
# random inputs against the naive loops, every block size
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("m", [0, 1, 7, 33])
def test_vllm_matches_naive(m, bs):
    e, topk = 12, 4
    ids = rand_ids(m, topk, -2, e + 3, seed=m * 1000 + bs)  # -1, -2 and >= E are dropped
    emap = [-1] * e
    for g, loc in ((1, 0), (4, 1), (5, 2), (11, 3)):  # EP with gaps
        emap[g] = loc
    for kw in ({}, {"pad_sorted_ids": True}, {"expert_map": emap},
               {"expert_map": emap, "ignore_invalid_experts": True}):  # fmt: skip
        got = C.vllm_moe_align_block_size(
            ids, bs, e, **{k: (ints(v) if k == "expert_map" else v) for k, v in kw.items()},
            return_scatter_idx=not ("expert_map" in kw and "ignore_invalid_experts" not in kw),
        )  # fmt: skip
        s, eid, total, scatter = naive_vllm(
            ids.tolist(), bs, e, kw.get("expert_map"), kw.get("pad_sorted_ids", False),
            kw.get("ignore_invalid_experts", False),
        )  # fmt: skip
        assert_outputs(got, [s, eid, total, scatter][: len(got)])


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("m", [0, 1, 7, 33])
def test_sglang_matches_naive(m, bs):
    e = 10
    ids = rand_ids(m, 3, -1, e, seed=m * 100 + bs)
    assert_outputs(C.sglang_moe_align_block_size(ids, bs, e), naive_sglang(ids.tolist(), bs, e))


# --------------------------------------------------------------------------------------------
# properties on large inputs (vectorised checks)
# --------------------------------------------------------------------------------------------


def check_props(bucket, n_buckets, bs, out, bucket_expert, cap):
    """bucket: int64 [numel] (-1 = dropped).  Checks every rule of the format."""
    sorted_ids, expert_ids, total = (x.cpu().to(torch.int64) for x in out[:3])
    bucket = bucket.cpu()
    numel = bucket.numel()
    counts = torch.bincount(bucket[bucket >= 0], minlength=n_buckets)
    blocks = (counts + bs - 1) // bs
    tot = int(total[0])
    assert sorted_ids.shape == (cap,) and expert_ids.shape == ((cap + bs - 1) // bs,)
    assert tot == int(blocks.sum()) * bs and tot <= cap
    assert bool((sorted_ids[tot:] == numel).all()) and bool((expert_ids[tot // bs :] == -1).all())
    used = sorted_ids[:tot]
    real = used < numel
    # every kept pair exactly once, no dropped pair
    assert used[real].sort().values.tolist() == torch.nonzero(bucket >= 0).flatten().tolist()
    # blocks: buckets ascending, each its ceil(count / bs) blocks, its own expert id
    block_bucket = torch.repeat_interleave(torch.arange(n_buckets), blocks)
    assert expert_ids[: tot // bs].tolist() == bucket_expert[block_bucket].tolist()
    row_bucket = block_bucket.repeat_interleave(bs)
    assert bool((bucket[used[real]] == row_bucket[real]).all())
    # inside a bucket: pairs first, ascending; padding after them
    seg_start = torch.cumsum(blocks * bs, 0) - blocks * bs
    rank = torch.arange(tot) - seg_start[row_bucket]
    assert bool((real == (rank < counts[row_bucket])).all())
    same = (row_bucket[1:] == row_bucket[:-1]) & real[1:] & real[:-1]
    assert bool((used[1:][same] > used[:-1][same]).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [0, 1, 7, 4096, 65536])
def test_vllm_properties(m, device):
    e, topk, bs = 257, 9, 32
    ids = rand_ids(m, topk, -1, e + 1, seed=m, device=device)
    emap = torch.full((e,), -1, dtype=I32)
    emap[3::7] = torch.arange(len(range(3, e, 7)), dtype=I32)  # EP with gaps
    for em, ignore in ((None, False), (emap, True), (torch.full((e,), -1, dtype=I32), True)):
        out = C.vllm_moe_align_block_size(
            ids, bs, e, expert_map=None if em is None else em.to(device),
            ignore_invalid_experts=ignore, return_scatter_idx=True,
        )  # fmt: skip
        flat = ids.flatten().cpu().to(torch.int64)
        local = torch.where((flat >= 0) & (flat < e), flat, -1)
        if em is not None:
            local = torch.where(local >= 0, em.to(torch.int64)[local.clamp_min(0)], -1)
        check_props(local, e, bs, out, torch.arange(e), vllm_capacity(m * topk, e, bs, False))
        want = torch.where(local >= 0, torch.arange(m * topk), -1)
        assert out[3].shape == (m * topk, 1) and out[3].flatten().cpu().tolist() == want.tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [0, 1, 7, 4096, 65536])
def test_sglang_properties(m, device):
    e, topk, bs = 256, 8, 64
    ids = rand_ids(m, topk, -1, e, seed=m + 1, device=device)
    out = C.sglang_moe_align_block_size(ids, bs, e)
    n = m * topk
    cap = n * bs if n < e + 1 else n + (e + 1) * (bs - 1)
    check_props(ids.flatten().cpu().to(torch.int64) + 1, e + 1, bs, out, torch.arange(-1, e), cap)


# --------------------------------------------------------------------------------------------
# cross-checks between formats
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
@pytest.mark.parametrize("m", [1, 7, 300])
def test_aiter_sort_describes_the_same_assignment(m, block_m):
    """AITER id t | k << 24 -> t * topk + k, padding M -> M * topk: the used rows and
    blocks of moe_sort equal vLLM's (no map, and EP with ignore_invalid_experts)."""
    e, topk = 40, 6
    ids = rand_ids(m, topk, -1, e + 2, seed=m + block_m)
    w = torch.rand(m, topk)
    emap = torch.full((e,), -1, dtype=I32)
    emap[1::3] = torch.arange(len(range(1, e, 3)), dtype=I32)
    for ours_e, kw in ((e, {}), (int(emap.max()) + 1, {"expert_map": emap})):
        ours = R.moe_sort(ids, w, ours_e, block_m, **kw)
        sorted_ids, expert_ids, total = C.vllm_moe_align_block_size(
            ids, block_m, e, ignore_invalid_experts=True, **kw
        )
        rows = int(ours.num_valid_ids[0])
        assert int(total[0]) == rows
        sti = ours.sorted_token_ids[:rows].to(torch.int64)
        t, k = sti & 0xFFFFFF, sti >> 24
        flat = torch.where(t == m, m * topk, t * topk + k)
        assert sorted_ids[:rows].tolist() == flat.tolist()
        assert (
            expert_ids[: rows // block_m].tolist()
            == ours.sorted_expert_ids[: rows // block_m].tolist()
        )
        rev = ours.reverse_sorted.to(torch.int64)  # pair -> row, -1 where not local
        kept = rev >= 0
        assert sorted_ids[rev[kept]].tolist() == torch.nonzero(kept).flatten().tolist()


def test_sglang_equals_vllm_without_filtered_ids():
    e, bs = 60, 16
    ids = rand_ids(500, 8, 0, e, seed=3)
    s_sorted, s_eids, s_total = C.sglang_moe_align_block_size(ids, bs, e)
    v_sorted, v_eids, v_total = C.vllm_moe_align_block_size(ids, bs, e)
    tot = int(v_total[0])
    assert int(s_total[0]) == tot
    assert s_sorted[:tot].tolist() == v_sorted[:tot].tolist()
    assert s_eids[: tot // bs].tolist() == v_eids[: tot // bs].tolist()


# --------------------------------------------------------------------------------------------
# errors before any work
# --------------------------------------------------------------------------------------------


def test_sort_input_errors():
    ids = ints([[0, 1], [2, 3]])
    v, s = C.vllm_moe_align_block_size, C.sglang_moe_align_block_size
    with pytest.raises(TypeError, match="topk_ids must have dtype"):
        v(ids.float(), 16, 4)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        s([[0, 1]], 16, 4)
    # vLLM reads topk_ids as a flat array of any shape
    assert all(
        torch.equal(a, b) for a, b in zip(v(ids.flatten(), 16, 4), v(ids, 16, 4), strict=True)
    )
    with pytest.raises(ValueError, match="1-D or 2-D"):
        s(ids.reshape(1, 2, 2), 16, 4)
    with pytest.raises(ValueError, match="contiguous"):
        v(ids.t(), 16, 4)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        s(ids, 0, 4)
    with pytest.raises(TypeError, match="block_size must be an int"):
        v(ids, True, 4)
    with pytest.raises(ValueError, match=r"num_experts must be in \[1, 992\]"):
        v(ids, 16, 993)
    with pytest.raises(ValueError, match=r"num_experts must be in \[1, 8191\]"):
        s(ids, 16, 8192)
    with pytest.raises(TypeError, match="pad_sorted_ids must be a bool"):
        v(ids, 16, 4, pad_sorted_ids=1)
    emap = ints([0, -1, 1, -1])
    with pytest.raises(ValueError, match="requires ignore_invalid_experts"):
        v(ids, 16, 4, expert_map=emap, return_scatter_idx=True)
    with pytest.raises(ValueError, match="expert_map must have >= num_experts"):
        v(ids, 16, 5, expert_map=emap)
    with pytest.raises(ValueError, match="expert_map values"):
        v(ids, 16, 4, expert_map=ints([0, -2, 1, -1]), ignore_invalid_experts=True)
    with pytest.raises(TypeError, match="expert_map must have dtype"):
        v(ids, 16, 4, expert_map=emap.long())
    for bad in (-2, 4):  # SGLang reads out of bounds for these; vLLM drops them
        with pytest.raises(ValueError, match=r"topk_ids values must be in \[-1, 4\)"):
            s(ints([[0, bad]]), 16, 4)
        assert int(v(ints([[0, bad]]), 16, 4)[2][0]) == 16
    with pytest.raises(ValueError, match="fit in int32"):
        v(torch.zeros(1024, 1, dtype=I32), 1 << 22, 900)


# --------------------------------------------------------------------------------------------
# the sums
# --------------------------------------------------------------------------------------------

NAN_BITS = {torch.bfloat16: 0x7FFF, torch.float16: 0x7FFF, torch.float32: 0x7FFFFFFF}


def bits(t: torch.Tensor) -> list[int]:
    width = {2: torch.int16, 4: torch.int32}[t.element_size()]
    mask = (1 << (8 * t.element_size())) - 1
    return [b & mask for b in t.contiguous().view(width).flatten().tolist()]


def naive_sum(x, keep, scale, dtype):
    """numpy: fp32 adds in k order from +0.0, skipped slots left out, one fp32 multiply,
    then round to nearest even into ``dtype`` with the canonical NaN; returns bit patterns."""
    x = x.float().cpu().numpy()
    acc = np.zeros((x.shape[0], x.shape[2]), dtype=np.float32)
    for k in range(x.shape[1]):
        add = np.where(keep[:, k : k + 1], x[:, k], np.float32(0)) if keep is not None else x[:, k]
        acc = (acc + add).astype(np.float32)
    if scale is not None:
        acc = (acc * np.float32(scale)).astype(np.float32)
    if dtype == torch.float32:
        out = acc.view(np.uint32).astype(np.int64)
    elif dtype == torch.float16:
        out = acc.astype(np.float16).view(np.uint16).astype(np.int64)
    else:
        u = acc.view(np.uint32).astype(np.int64)
        out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    out[np.isnan(acc)] = NAN_BITS[dtype]
    return out.flatten().tolist()


def bf16(values, shape):
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).reshape(shape)


@pytest.mark.parametrize("device", DEVICES)
def test_sum_hand_examples(device):
    x = bf16([1.0, 2.0**-8], (1, 2, 1)).to(device)
    out = torch.empty(1, 1, dtype=torch.bfloat16, device=device)
    C.vllm_moe_sum(x, out)  # fp32 1 + 2^-8, one rounding: the tie goes to 1.0
    assert out.item() == 1.0
    x3 = bf16([1.0, 2.0**-8, 2.0**-8], (1, 3, 1)).to(device)
    C.vllm_moe_sum(x3, out)  # 1 + 2^-7 exact in fp32 and bf16 (bf16 per step: 1.0)
    assert out.item() == 1.0078125
    C.sglang_moe_sum_reduce(x, out, 2.5)  # (1 + 2^-8) * 2.5 = 2.509765625 -> 2.515625
    assert out.item() == 2.515625  # (rounding the sum first would give 2.5)
    f = torch.tensor([[[2.0**24], [1.0], [1.0]]], device=device)
    out32 = torch.empty(1, 1, device=device)
    C.vllm_moe_sum(f, out32)  # k order: (2^24 + 1) + 1 = 2^24 (the other order: 2^24 + 2)
    assert out32.item() == 2.0**24
    g = torch.tensor([[[1.0], [2.0**24], [1.0]]], device=device)
    for ids, emap, want in (
        ([[0, 1, 3]], None, 2.0**24),  # (1 + 2^24 -> 2^24) + 1 -> 2^24
        ([[0, -1, 3]], None, 2.0),  # slot 1 skipped (id < 0)
        ([[0, 9, 3]], None, 2.0**24),  # no map: only ids < 0 are skipped
        ([[0, 1, 3]], [0, -1, -1, 1], 2.0),  # expert_map[1] < 0
        ([[0, 9, 3]], [0, -1, -1, 1], 2.0),  # id past the map
        ([[-1, 2, 2]], [0, -1, -1, 1], 0.0),  # every slot skipped: +0.0
    ):
        em = None if emap is None else ints(emap, device)
        C.vllm_moe_sum(g, out32, topk_ids=ints(ids, device), expert_map=em)
        assert out32.item() == want and bits(out32) != [0x80000000]
    C.vllm_moe_sum(g, out32, expert_map=ints([-1, -1, -1, -1], device))  # ignored
    assert out32.item() == 2.0**24
    C.sglang_moe_sum_reduce(bf16([1.0, 1.0], (1, 2, 1)).to(device), out, -0.5)
    assert out.item() == -1.0
    specials = bf16([-0.0, -0.0, float("inf"), float("-inf"), 1.0, float("nan")], (3, 2, 1))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = specials.to(dtype).to(device)
        o = torch.empty(3, 1, dtype=dtype, device=device)
        C.vllm_moe_sum(x, o)  # -0 + -0 from +0.0 is +0.0; inf - inf and a NaN: canonical
        assert bits(o) == [0, NAN_BITS[dtype], NAN_BITS[dtype]]
        C.sglang_moe_sum_reduce(x, o, 1.0)
        assert bits(o) == [0, NAN_BITS[dtype], NAN_BITS[dtype]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m", [0, 1, 7, 4096])
def test_sums_match_naive(m, dtype, device):
    g = torch.Generator().manual_seed(m)
    for topk in (1, 2, 3, 4, 5, 6, 8, 9, 10, 16):
        d = 8 if m > 7 else 40
        x = (torch.randn(m, topk, d, generator=g) * 4).to(dtype)
        if m:
            x.view(-1)[::97] = float("nan")
            x.view(-1)[1::101] = float("inf")
            x.view(-1)[2::103] = -0.0
        ids = torch.randint(-1, 12, (m, topk), generator=g, dtype=I32)
        emap = torch.tensor([0, -1, 1, 2, -1, 3, -1, -1, 4, 5], dtype=I32)  # 10 < 12 ids
        keep = ((ids >= 0) & (ids < 10)).numpy()
        keep &= emap[ids.clamp(0, 9).long()].numpy() >= 0
        x, ids, emap = x.to(device), ids.to(device), emap.to(device)
        out = torch.empty(m, d, dtype=dtype, device=device)
        C.vllm_moe_sum(x, out)
        assert bits(out) == naive_sum(x, None, None, dtype)
        C.vllm_moe_sum(x, out, topk_ids=ids, expert_map=emap)
        assert bits(out) == naive_sum(x, keep, None, dtype)
        C.vllm_moe_sum(x, out, topk_ids=ids)
        assert bits(out) == naive_sum(x, (ids >= 0).cpu().numpy(), None, dtype)
        C.sglang_moe_sum_reduce(x, out, 2.5)
        assert bits(out) == naive_sum(x, None, 2.5, dtype)


def test_sum_input_errors():
    x = torch.zeros(2, 3, 8, dtype=torch.bfloat16)
    out = torch.empty(2, 8, dtype=torch.bfloat16)
    v, s = C.vllm_moe_sum, C.sglang_moe_sum_reduce
    with pytest.raises(TypeError, match="output must have input's dtype"):
        v(x, out.float())
    with pytest.raises(TypeError, match="input must have dtype"):
        s(x.to(torch.int32), out, 1.0)
    with pytest.raises(ValueError, match="input must be 3-D"):
        v(x[0], out)
    with pytest.raises(ValueError, match=r"output must have shape \[2, 8\]"):
        s(x, out[:1], 1.0)
    with pytest.raises(ValueError, match="input must be contiguous"):
        v(x.transpose(0, 1).contiguous().transpose(0, 1), out)
    with pytest.raises(ValueError, match="overlaps"):
        s(x, x.view(-1)[:16].view(2, 8), 1.0)
    with pytest.raises(ValueError, match=r"topk_ids must have shape \[2, 3\]"):
        v(x, out, topk_ids=ints([[0, 1]]))
    with pytest.raises(TypeError, match="routed_scaling_factor must be a float"):
        s(x, out, "2.5")
