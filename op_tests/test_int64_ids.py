"""The native ops take int64 ``topk_ids`` (what ``torch.topk`` returns) with the same output
bytes as int32: moe_sort, moe_sort_quant (MXFP4 and MXFP8, with and
without expert_map), moe_sum's ``topk_ids`` and both align ops, on the CPU module, against
the same op on int32 ids and the reference.  int64 values past int32 keep their meaning
(dropped / skipped) instead of wrapping.  The int32 path is unchanged: the wrappers retry
with narrowed ids only after the binding refused the int64 tensor, before any write.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops as O  # noqa: E402
from aiter_aux import reference as R  # noqa: E402
from aiter_aux.types import empty_moe_sort_output  # noqa: E402

E, D, K = 256, 3072, 8  # a catalog shape (README)
POISON = 0x5A
HUGE = [2**31, 2**40, -(2**31) - 1, -(2**40), 2**63 - 1, -(2**63)]


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def _ids(m, seed, huge=True):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(E + 6, generator=g)[:K] - 3 for _ in range(m)]
    ids = (torch.stack(rows) if rows else torch.empty(0, K)).to(torch.int64).reshape(m, K)
    if huge and m:
        pick = torch.tensor(HUGE)[torch.randint(0, len(HUGE), (m, K), generator=g)]
        ids = torch.where(torch.rand(m, K, generator=g) < 0.1, pick, ids)
    return ids


def _narrow(ids):
    """The int32 ids of the same meaning (the spec's): out-of-int32 values clamped."""
    return ids.clamp(-2, 2**31 - 1).to(torch.int32)


def _same(a, b):
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"output {i} differs"


@pytest.mark.parametrize("m", [0, 1, 7, 300])
@pytest.mark.parametrize("bm", [16, 64])
@pytest.mark.parametrize("with_map", [False, True])
def test_moe_sort_int64(m, bm, with_map):
    ids = _ids(m, m + bm)
    w = torch.rand(m, K)
    kw = {}
    if with_map:
        emap = torch.full((E + 10,), -1, dtype=torch.int32)
        emap[::3] = torch.arange(0, (E + 12) // 3, dtype=torch.int32)[: emap[::3].numel()] % 64
        kw = {"expert_map": emap}
        ne = 64
    else:
        ne = E
    want = O.moe_sort(_narrow(ids), w, ne, bm, **kw)
    got = O.moe_sort(ids, w, ne, bm, **kw)
    ref = R.moe_sort(_narrow(ids), w, ne, bm, **kw)
    n = int(want.num_valid_ids[0])
    for a, b, c in zip(got, want, ref, strict=True):
        # rows past num_valid_ids[0] are unspecified in the allocating form: compare the rest
        if a.numel() == want.sorted_token_ids.numel():
            a, b, c = a[:n], b[:n], c[:n]
        elif a.numel() == want.sorted_expert_ids.numel():
            a, b, c = a[: n // bm], b[: n // bm], c[: n // bm]
        assert torch.equal(a, b) and torch.equal(b, c)
    # _out form into poisoned buffers: every byte equal
    outs = []
    for x in (ids, _narrow(ids)):
        cap = O.moe_sort_capacity(m, K, ne, bm)
        bufs = [torch.full((c,), 0x5A5A5A5A, dtype=dt) for c, dt in (
            (cap, torch.int32), (cap, torch.float32), (cap, torch.int32), (cap // bm, torch.int32),
            (2, torch.int32), (m * K, torch.int32))]  # fmt: skip
        O.moe_sort_out(x, w, ne, bm, bufs, **kw)
        outs.append(bufs)
    _same(outs[0], outs[1])


@pytest.mark.parametrize("quant_dtype", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 33])
def test_moe_sort_quant_int64(quant_dtype, m):
    ids = _ids(m, m)
    w = torch.rand(m, K)
    x = torch.randn(m, D).to(torch.bfloat16)
    a = O.moe_sort_quant(ids, w, x, E, 32, quant_dtype=quant_dtype)
    b = O.moe_sort_quant(_narrow(ids), w, x, E, 32, quant_dtype=quant_dtype)
    n = int(b[0].num_valid_ids[0])
    assert torch.equal(a[0].sorted_token_ids[:n], b[0].sorted_token_ids[:n])
    assert torch.equal(a[0].reverse_sorted, b[0].reverse_sorted)
    assert torch.equal(a[0].num_valid_ids, b[0].num_valid_ids)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


@pytest.mark.parametrize("m", [0, 1, 17])
def test_moe_sum_int64(m):
    g = torch.Generator().manual_seed(m)
    inp = torch.randn(m, K, 96, generator=g).to(torch.bfloat16)
    ids = _ids(m, m + 5)
    emap = torch.randint(-1, 4, (E,), generator=g, dtype=torch.int32)
    for kw in ({}, {"expert_map": emap}):
        outs = []
        for x in (ids, _narrow(ids)):
            out = torch.full((m, 96), 0x5A5A, dtype=torch.int16).view(torch.bfloat16)
            O.moe_sum_out(inp, out, topk_ids=x, **kw)
            outs.append(out)
        ref = torch.empty(m, 96, dtype=torch.bfloat16)
        R.moe_sum_out(inp, ref, topk_ids=_narrow(ids), **kw)
        _same(outs, [outs[1], ref])
        assert torch.equal(O.moe_sum(inp, topk_ids=ids, **kw).view(torch.int16),
                           ref.view(torch.int16))  # fmt: skip


@pytest.mark.parametrize("op", ["vllm", "sglang"])
@pytest.mark.parametrize("m", [0, 3, 500])
def test_align_ops_int64(op, m):
    ids = _ids(m, m + 11, huge=op == "vllm")
    if op == "sglang":
        ids = ids.clamp(-1, E - 1)
        ids[::5] = -(2**40)  # dropped, as -2 is
    name = f"moe_align_block_size_{op}"
    _same(getattr(O, name)(ids, E, 48), getattr(O, name)(_narrow(ids), E, 48))
    _same(getattr(O, name)(ids, E, 48), getattr(R, name)(_narrow(ids), E, 48))


def test_int64_errors_name_the_argument():
    """A bad int64 call raises the reference's error for the call (after narrowing), as
    int32 would: nothing is retried twice, nothing written."""
    ids = _ids(4, 1)
    with pytest.raises(ValueError, match="block_m"):
        O.moe_sort(ids, torch.rand(4, K), E, 48)
    with pytest.raises(TypeError, match="topk_ids"):
        O.moe_sort(ids.to(torch.int16), torch.rand(4, K), E, 16)


@pytest.mark.parametrize(
    "call",
    [lambda ids: O.moe_sort(ids, torch.rand(4, K), E, 16),
     lambda ids: O.moe_sort_out(ids, torch.rand(4, K), E, 16,
                                empty_moe_sort_output(4, K, 4096, 16, "cpu")),
     lambda ids: O.moe_sort_quant(ids, torch.rand(4, K), torch.zeros(4, D, dtype=torch.bfloat16),
                                  E, 16),
     lambda ids: O.moe_sum(torch.zeros(4, K, 64), topk_ids=ids),
     lambda ids: O.moe_align_block_size_vllm(ids, E, 16),
     lambda ids: O.moe_align_block_size_sglang(ids, E, 16)],
    ids=["moe_sort", "moe_sort_out", "moe_sort_quant", "moe_sum", "align_vllm", "align_sglang"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8])
def test_a_wrong_id_dtype_names_every_accepted_one(call, dtype):
    """Every op that takes topk_ids says int32 or int64 (both are taken), not int32 alone."""
    with pytest.raises(TypeError) as e:
        call(_ids(4, 2).clamp(0, E - 1).to(dtype))
    assert str(e.value) == f"topk_ids must have dtype torch.int32 or torch.int64, got {dtype}"
