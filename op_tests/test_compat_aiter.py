"""aiter_aux.compat.aiter: AITER's moe_mxfp4_aux signatures as adapters onto our ops.

Every adapter runs on random routing (with non-local ids) for three catalog shapes, into
buffers poisoned with random bytes, and every byte of every buffer it may touch is compared
with our own ops run on identically poisoned buffers (the allocating forms where they apply):
what the op writes must match, what it must not write must keep its poison.  Then the
mismatch errors, the signatures, and that importing the module builds nothing.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from instance_counts import keys_of  # noqa: E402 (op_tests/instance_counts.py)

from aiter_aux import ops as O  # noqa: E402
from aiter_aux import reference as R  # noqa: E402
from aiter_aux.compat import aiter as A  # noqa: E402
from aiter_aux.ops.moe_mxfp4_aux import MXFP4_MOE_SUPPORTED_SHAPES  # noqa: E402

SHAPES = [(256, 3072, 256, 8), (513, 2560, 768, 11), (128, 5120, 768, 3)]
TOKENS = [1, 13, 64]
BLOCK_MS = [16, 32, 64, 128]

CASES = [
    pytest.param(s, m, BLOCK_MS[(i * len(TOKENS) + j) % len(BLOCK_MS)], id=f"{s}-M{m}")
    for i, s in enumerate(SHAPES)
    for j, m in enumerate(TOKENS)
]


@pytest.fixture(scope="module", autouse=True)
def _module(cpu_module):
    return cpu_module


def test_shapes_are_in_the_catalog():
    assert set(SHAPES) <= MXFP4_MOE_SUPPORTED_SHAPES


# ---------------------------------------------------------------------------- helpers


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sorted_case(shape, m: int, mb: int, tag: str):
    """The case's generator (seeded by its parameters and ``tag``) and ``moe_sort`` of a
    random routing drawn from it."""
    e, _, _, k = shape
    g = _gen(hash((shape, m, mb, tag)) & 0xFFFF)
    ids, w = routing(m, e, k, g)
    return g, O.moe_sort(ids, w, e, mb)


def poison(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """``n`` elements of ``dtype`` holding random bytes."""
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    )


def routing(m: int, e: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids in [0, e) with ~10% -1 and ~5% out of range [e, e+3)."""
    ids = torch.randint(0, e, (m, k), dtype=torch.int32, generator=g)
    r = torch.rand(m, k, generator=g)
    ids[r < 0.10] = -1
    ids[(r >= 0.10) & (r < 0.15)] = e + 2
    w = torch.rand(m, k, generator=g, dtype=torch.float32)
    return ids, w


def activations(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    x = (torch.randn(m, d, generator=g) * 4).to(torch.bfloat16)
    if m * d >= 64:  # a NaN block and an Inf block
        x.view(-1)[5] = float("nan")
        x.view(-1)[40] = float("inf")
    return x


def aiter_capacity(m: int, k: int, e: int, mb: int) -> int:
    pairs = m * k
    return (pairs + min(e, pairs) * (mb - 1) + mb - 1) // mb * mb


SORT_FIELDS = ("sorted_token_ids", "sorted_weights", "m_indices", "sorted_expert_ids")
SORT_DTYPES = (torch.int32, torch.float32, torch.int32, torch.int32)


def sort_buffers(m, k, e, mb, tight, g):
    """AITER-style sort buffers (1-D, poisoned): ``tight`` -> AITER's capacity, else our
    capacity + 5 rows; plus the expected buffers (our capacity or more, same poison)."""
    cap = O.moe_sort_capacity(m, k, e, mb)
    n = aiter_capacity(m, k, e, mb) if tight else cap + 5 * mb
    sizes = (n, n, n, n // mb)
    caller = {f: poison(s, dt, g) for f, s, dt in zip(SORT_FIELDS, sizes, SORT_DTYPES, strict=True)}
    caller["cumsum_tensor"] = poison(2, torch.int32, g)
    caller["reverse_sorted"] = poison(m * k + 3, torch.int32, g)
    expect = {}
    for f, dt in zip(SORT_FIELDS, SORT_DTYPES, strict=True):
        need = cap if f != "sorted_expert_ids" else cap // mb
        extra = max(0, need - caller[f].numel())
        expect[f] = torch.cat([caller[f].clone(), poison(extra, dt, g)])
    expect["cumsum_tensor"] = caller["cumsum_tensor"].clone()
    expect["reverse_sorted"] = caller["reverse_sorted"].clone()
    return caller, expect


def our_sort_out(expect):
    return O.MoeSortOutput(
        expect["sorted_token_ids"],
        expect["sorted_weights"],
        expect["m_indices"],
        expect["sorted_expert_ids"],
        expect["cumsum_tensor"],
        expect["reverse_sorted"],
    )


def assert_sort_equal(caller, expect):
    for f, buf in caller.items():
        assert same_bytes(buf, expect[f][: buf.numel()]), f


# ------------------------------------------------------------------------ the adapters


@pytest.mark.parametrize("tight", [True, False], ids=["aiter-capacity", "our-capacity"])
@pytest.mark.parametrize("prologue", [0, 1])
@pytest.mark.parametrize("shape,m,mb", CASES)
def test_sort(shape, m, mb, prologue, tight):
    e, d, _, k = shape
    g = _gen(hash((shape, m, mb, prologue, tight)) & 0xFFFF)
    rows = m + 2  # M_logical < topk_ids.shape[0]: the first M_logical rows are sorted
    ids, w = routing(rows, e, k, g)
    caller, expect = sort_buffers(m, k, e, mb, tight, g)
    if tight and m * k < e:  # the staged path: shorter than our capacity
        assert caller["sorted_token_ids"].numel() < O.moe_sort_capacity(m, k, e, mb)
    zero = poison(m * d + 7, torch.bfloat16, g)
    ws = poison(37, torch.uint8, g)  # AITER zeroes floor(37 / 16) * 16 = 32 bytes
    s3 = poison(e * 17 if prologue else 0, torch.int32, g)  # as AITER's fused_moe sizes it
    zero0, ws0, s30 = zero.clone(), ws.clone(), s3.clone()
    A.mxfp4_moe_sort(ids, w, caller["sorted_token_ids"], caller["sorted_expert_ids"],
                     caller["cumsum_tensor"], caller["reverse_sorted"],
                     caller["sorted_weights"], caller["m_indices"], zero, ws, s3,
                     m, e, k, d, 1, mb, prologue)  # fmt: skip
    assert same_bytes(s3, s30)  # unused: our sort needs no scratch
    O.moe_sort_out(ids[:m], w[:m], e, mb, our_sort_out(expect))
    assert_sort_equal(caller, expect)
    if prologue == 0:
        assert not zero[: m * d].view(torch.int16).any()
        assert same_bytes(zero[m * d :], zero0[m * d :])
        assert not ws[:32].any() and same_bytes(ws[32:], ws0[32:])
    else:  # AITER's three-stage sort ignores bf16_zero_out and the workspace
        assert same_bytes(zero, zero0) and same_bytes(ws, ws0)
    # and the allocating form agrees on every row it writes
    ref = O.moe_sort(ids[:m], w[:m], e, mb)
    used = int(ref.num_valid_ids[0])
    assert int(caller["cumsum_tensor"][0]) == used and int(caller["cumsum_tensor"][1]) == m
    for f in ("sorted_token_ids", "sorted_weights", "m_indices"):
        assert same_bytes(caller[f][:used], getattr(ref, f)[:used]), f
    assert same_bytes(
        caller["sorted_expert_ids"][: used // mb], ref.sorted_expert_ids[: used // mb]
    )
    assert same_bytes(caller["reverse_sorted"][: m * k], ref.reverse_sorted)


def test_sort_empty_zero_out_leaves_workspace():
    e, d, _, k = SHAPES[0]
    g = _gen(7)
    ids, w = routing(4, e, k, g)
    caller, expect = sort_buffers(4, k, e, 32, True, g)
    caller["reverse_sorted"] = poison(4 * k, torch.int32, g).view(4, k)  # any shape
    expect["reverse_sorted"] = caller["reverse_sorted"].clone().view(-1)
    ws = poison(64, torch.uint8, g)
    ws0 = ws.clone()
    A.mxfp4_moe_sort(ids, w, caller["sorted_token_ids"], caller["sorted_expert_ids"],
                     caller["cumsum_tensor"], caller["reverse_sorted"], caller["sorted_weights"],
                     caller["m_indices"], torch.empty(0, 0, dtype=torch.bfloat16), ws,
                     torch.empty(0, dtype=torch.int32), 4, e, k, d, 1, 32, 0)  # fmt: skip
    O.moe_sort_out(ids, w, e, 32, our_sort_out(expect))
    assert_sort_equal(caller, expect)
    assert same_bytes(ws, ws0)


@pytest.mark.parametrize("tight", [True, False], ids=["aiter-capacity", "our-capacity"])
@pytest.mark.parametrize("shape,m,mb", CASES)
def test_sort_quant(shape, m, mb, tight):
    e, d, _, k = shape
    g = _gen(hash((shape, m, mb, tight, "sq")) & 0xFFFF)
    ids, w = routing(m + 1, e, k, g)  # the first M = a_input.shape[0] rows are sorted
    x = activations(m, d, g)
    caller, expect = sort_buffers(m, k, e, mb, tight, g)
    aq = poison(m * d // 2 + 5, torch.uint8, g)  # 1-D, as AITER's callers allocate
    asc = poison(m * d // 32 + 3, torch.float8_e8m0fnu, g)
    zero = poison(m * d + 3, torch.bfloat16, g)
    aq0, asc0, zero0 = aq.clone(), asc.clone(), zero.clone()
    A.mxfp4_moe_sort_quant(x, ids, w, caller["sorted_token_ids"], caller["sorted_expert_ids"],
                           caller["cumsum_tensor"], caller["reverse_sorted"],
                           caller["sorted_weights"], aq, asc, caller["m_indices"], zero,
                           e, k, d, mb)  # fmt: skip
    eq = aq0[: m * d // 2].clone().view(m, d // 2)
    es = asc0[: m * d // 32].clone().view(torch.uint8).view(m, d // 32)
    O.moe_sort_quant_out(ids[:m], w[:m], x, e, mb, our_sort_out(expect), eq, es)
    assert_sort_equal(caller, expect)
    assert same_bytes(aq[: m * d // 2], eq) and same_bytes(aq[m * d // 2 :], aq0[m * d // 2 :])
    assert same_bytes(asc[: m * d // 32], es)
    assert same_bytes(asc[m * d // 32 :], asc0[m * d // 32 :])
    assert not zero[: m * d].view(torch.int16).any()
    assert same_bytes(zero[m * d :], zero0[m * d :])
    ref_q, ref_s = O.mxfp4_quant(x)
    assert same_bytes(eq, ref_q) and same_bytes(es, ref_s)


@pytest.mark.parametrize("shape,m,mb", CASES)
def test_quant(shape, m, mb):
    e, d, _, k = shape
    g = _gen(hash((shape, m, mb, "q")) & 0xFFFF)
    x = activations(m, d, g)
    aq = poison(m * d // 2, torch.float4_e2m1fn_x2, g).view(m, d // 2)
    asc = poison(m * d // 32 + 9, torch.uint8, g)
    zero = poison(m * d + 1, torch.float16, g)  # AITER zeroes bytes: fp16 moe_buf works too
    asc0, zero0 = asc.clone(), zero.clone()
    A.mxfp4_moe_quant(x, aq, asc, zero, e, k, d, mb)
    ref_q, ref_s = O.mxfp4_quant(x)
    assert same_bytes(aq, ref_q)
    assert same_bytes(asc[: m * d // 32], ref_s)
    assert same_bytes(asc[m * d // 32 :], asc0[m * d // 32 :])
    assert not zero[: m * d].view(torch.int16).any()
    assert same_bytes(zero[m * d :], zero0[m * d :])


@pytest.mark.parametrize("shape,m,mb", CASES)
def test_sort_scales(shape, m, mb):
    e, d, _, k = shape
    g, srt = _sorted_case(shape, m, mb, "ss")
    a_scale = torch.randint(0, 256, (m, d // 32), dtype=torch.uint8, generator=g)
    cols, bm = d // 32, max(32, mb)
    cap = srt.sorted_token_ids.numel()
    # max_sorted = our capacity, AITER's (may not be a multiple of BM: a partial chunk is
    # not written), one below, and rounded up to BM
    up = -(-cap // bm) * bm  # past the length: the rows after it are padding
    for max_sorted in sorted({cap, aiter_capacity(m, k, e, mb), max(0, cap - 1), up}):
        rows = max_sorted // bm * bm
        out = poison(rows * cols + 2 * cols + 3, torch.float8_e8m0fnu, g)
        out0 = out.clone()
        A.mxfp4_moe_sort_scales(a_scale, srt.sorted_token_ids, srt.num_valid_ids, out,
                                e, k, d, mb, max_sorted)  # fmt: skip
        exp = out0[: rows * cols].clone().view(torch.uint8).view(rows, cols)
        sti = srt.sorted_token_ids[: min(rows, cap)]
        O.moe_sort_scales_out(a_scale, sti, srt.num_valid_ids, mb, exp)
        assert same_bytes(out[: rows * cols], exp), max_sorted
        assert same_bytes(out[rows * cols :], out0[rows * cols :]), max_sorted
        if rows == up:
            ref = O.moe_sort_scales(a_scale, srt.sorted_token_ids, srt.num_valid_ids, mb)
            assert same_bytes(out[: rows * cols], ref)


@pytest.mark.parametrize("shape,m,mb", CASES)
def test_scatter_reduce(shape, m, mb):
    e, d, _, k = shape
    g, srt = _sorted_case(shape, m, mb, "sr")
    rows = srt.sorted_weights.numel()
    flat = torch.randn(rows + 4, d, generator=g).to(torch.bfloat16)  # rows past sw ignored
    out = poison(m * d, torch.bfloat16, g).view(m, d)
    rev = torch.cat([srt.reverse_sorted, torch.full((5,), 1 << 30, dtype=torch.int32)])
    A.mxfp4_moe_scatter_reduce(flat, rev, srt.sorted_weights, out, e, k, d, mb)
    ref = O.moe_scatter_reduce(flat[:rows], srt.reverse_sorted, srt.sorted_weights, k)
    assert same_bytes(out, ref)


@pytest.mark.parametrize("shape,m,mb", CASES)
def test_scatter_reduce_q(shape, m, mb):
    e, d, _, k = shape
    g, srt = _sorted_case(shape, m, mb, "srq")
    rows = srt.sorted_weights.numel()
    q = torch.randint(0, 256, (rows, d // 2), dtype=torch.uint8, generator=g)
    s = torch.randint(118, 127, (rows + 3, d // 32), dtype=torch.uint8, generator=g)
    s[0, 0], s[1, 1] = 0, 255  # ours: 2^-127 and NaN (docs/compat.md)
    out = poison(m * d, torch.bfloat16, g).view(m, d)
    q4, s8 = q.view(torch.float4_e2m1fn_x2), s.view(torch.float8_e8m0fnu)
    A.mxfp4_moe_scatter_reduce_q(q4, s8, srt.reverse_sorted, srt.sorted_weights, out, e, k, d, mb)
    ref = O.moe_scatter_reduce_q(q, s[:rows], srt.reverse_sorted, srt.sorted_weights, k)
    assert same_bytes(out, ref)


# ------------------------------------------------- sort3stage_ws, bf16_out_init (vs the reference)


def _sort_kwargs(ids, w, caller, zero, m, e, k, d, mb, prologue, s3, **extra):
    """mxfp4_moe_sort's arguments by keyword, as AITER's fused_moe passes them."""
    return dict(topk_ids=ids, topk_weight=w, sorted_token_ids=caller["sorted_token_ids"],
                sorted_expert_ids=caller["sorted_expert_ids"],
                cumsum_tensor=caller["cumsum_tensor"], reverse_sorted=caller["reverse_sorted"],
                sorted_weights=caller["sorted_weights"], m_indices=caller["m_indices"],
                bf16_zero_out=zero, bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16),
                sort3stage_ws=s3, M_logical=m, NE=e, TOPK=k, D_HIDDEN=d, D_INTER=768, MB=mb,
                prologue=prologue, **extra)  # fmt: skip


@pytest.mark.parametrize("prologue", [0, 1])
def test_sort_by_keyword_with_sort3stage_ws(prologue):
    """AITER's fused_moe call: every argument by keyword, sort3stage_ws of NE*17 int32 for
    the three-stage sort, empty otherwise; the outputs are the reference's, the scratch is
    not touched."""
    e, d, _, k = SHAPES[1]
    m, mb = 13, 16 if prologue == 0 else 32
    g = _gen(40 + prologue)
    ids, w = routing(m, e, k, g)
    caller, expect = sort_buffers(m, k, e, mb, True, g)
    zero = poison(m * d, torch.bfloat16, g)
    zero_ref = zero.clone()
    s3 = poison(e * 17, torch.int32, g) if prologue else torch.empty(0, dtype=torch.int32)
    s30 = s3.clone()
    A.mxfp4_moe_sort(**_sort_kwargs(ids, w, caller, zero, m, e, k, d, mb, prologue, s3))
    R.moe_sort_out(ids, w, e, mb, our_sort_out(expect), zero_buf=None if prologue else zero_ref)
    assert_sort_equal(caller, expect)
    assert same_bytes(zero, zero_ref)  # zeroed for 0, untouched for 1
    assert same_bytes(s3, s30)


@pytest.mark.parametrize("prologue", [0, 1])
def test_sort_bf16_out_init(prologue):
    """bf16_zero_out's first M*D_HIDDEN elements get bf16_out_init's (random bits: NaN
    payloads, -0.0, subnormals), as the reference's zero_buf_init; the rest keeps its bytes.
    The three-stage sort (prologue 1) initialises nothing and ignores it, as AITER."""
    e, d, _, k = SHAPES[0]
    m, mb = 7, 16
    g = _gen(50 + prologue)
    ids, w = routing(m, e, k, g)
    caller, expect = sort_buffers(m, k, e, mb, False, g)
    zero = poison(m * d + 9, torch.bfloat16, g)
    init = poison(m * d + 5, torch.bfloat16, g)
    zero_ref, init0 = zero.clone(), init.clone()
    s3 = torch.zeros(e * 17, dtype=torch.int32)
    A.mxfp4_moe_sort(**_sort_kwargs(ids, w, caller, zero, m, e, k, d, mb, prologue, s3,
                                    bf16_out_init=init))  # fmt: skip
    if prologue == 0:
        R.moe_sort_out(ids, w, e, mb, our_sort_out(expect), zero_buf=zero_ref[: m * d],
                       zero_buf_init=init0[: m * d])  # fmt: skip
    else:
        R.moe_sort_out(ids, w, e, mb, our_sort_out(expect))
    assert_sort_equal(caller, expect)
    assert same_bytes(zero, zero_ref)
    assert same_bytes(init, init0)


@pytest.mark.parametrize("shape,m,mb", CASES[::2])
def test_sort_quant_bf16_out_init(shape, m, mb):
    e, d, _, k = shape
    g = _gen(hash((shape, m, mb, "sqi")) & 0xFFFF)
    ids, w = routing(m, e, k, g)
    x = activations(m, d, g)
    caller, expect = sort_buffers(m, k, e, mb, True, g)
    aq, asc = poison(m * d // 2, torch.uint8, g), poison(m * d // 32, torch.uint8, g)
    zero, init = poison(m * d + 3, torch.bfloat16, g), poison(m * d, torch.bfloat16, g)
    eq, es, zero_ref = aq.clone().view(m, d // 2), asc.clone().view(m, d // 32), zero.clone()
    A.mxfp4_moe_sort_quant(x, ids, w, caller["sorted_token_ids"], caller["sorted_expert_ids"],
                           caller["cumsum_tensor"], caller["reverse_sorted"],
                           caller["sorted_weights"], aq, asc, caller["m_indices"], zero,
                           e, k, d, mb, init)  # fmt: skip
    R.moe_sort_quant_out(ids, w, x, e, mb, our_sort_out(expect), eq, es,
                         zero_buf=zero_ref[: m * d], zero_buf_init=init)  # fmt: skip
    assert_sort_equal(caller, expect)
    assert same_bytes(aq, eq) and same_bytes(asc, es) and same_bytes(zero, zero_ref)


@pytest.mark.parametrize("zero_dtype", [torch.bfloat16, torch.float16])
def test_quant_bf16_out_init(zero_dtype):
    """AITER's quant kernel copies bf16_out_init's first M*D_HIDDEN elements (bits) into
    bf16_zero_out; a quant as the reference's.  fp16 buffers (a moe_buf) copy as bits too."""
    e, d, _, k = SHAPES[2]
    m = 13
    g = _gen(60)
    x = activations(m, d, g)
    aq, asc = poison(m * d // 2, torch.uint8, g), poison(m * d // 32, torch.uint8, g)
    zero, init = poison(m * d + 4, zero_dtype, g), poison(m * d + 2, zero_dtype, g)
    zero0, init0 = zero.clone(), init.clone()
    A.mxfp4_moe_quant(x, aq, asc, zero, e, k, d, 32, bf16_out_init=init)
    ref_q, ref_s = R.mxfp4_quant(x)
    assert same_bytes(aq, ref_q) and same_bytes(asc, ref_s)
    assert same_bytes(zero[: m * d], init0[: m * d])
    assert same_bytes(zero[m * d :], zero0[m * d :]) and same_bytes(init, init0)


def test_bf16_out_init_empty_or_unused():
    """AITER: an empty bf16_out_init means zeros; with an empty bf16_zero_out it is not
    read (not even checked beyond being a tensor)."""
    e, d, _, k = SHAPES[2]
    m = 5
    g = _gen(61)
    x = activations(m, d, g)
    aq = torch.empty(m * d // 2, dtype=torch.uint8)
    asc = torch.empty(m * d // 32, dtype=torch.uint8)
    zero = poison(m * d, torch.bfloat16, g)
    A.mxfp4_moe_quant(x, aq, asc, zero, e, k, d, 32, torch.empty(0, dtype=torch.bfloat16))
    assert not zero.view(torch.int16).any()
    odd = torch.ones(3, dtype=torch.float64)  # would be refused if it were used
    A.mxfp4_moe_quant(x, aq, asc, torch.empty(0, dtype=torch.bfloat16), e, k, d, 32, odd)
    assert same_bytes(aq.view(m, d // 2), R.mxfp4_quant(x)[0])


def test_bf16_out_init_errors_write_nothing():
    e, d, _, k = SHAPES[2]
    m = 4
    g = _gen(62)
    x = activations(m, d, g)
    aq, asc = poison(m * d // 2, torch.uint8, g), poison(m * d // 32, torch.uint8, g)
    zero = poison(m * d, torch.bfloat16, g)
    before = [t.clone() for t in (aq, asc, zero)]
    bad = [
        (torch.zeros(m * d, dtype=torch.float16), TypeError, "dtype of bf16_zero_out"),
        (torch.zeros(m * d, dtype=torch.float32), TypeError, "dtype of bf16_zero_out"),
        (torch.zeros(m * d - 1, dtype=torch.bfloat16), ValueError, "bf16_out_init is too small"),
        (torch.zeros(2, m * d, dtype=torch.bfloat16).t(), ValueError, "contiguous"),
        (zero, ValueError, "overlaps bf16_out_init"),
        ("zeros", TypeError, "bf16_out_init must be a torch.Tensor"),
    ]
    ids, w = routing(m, e, k, g)
    # sorted_token_ids, sorted_expert_ids, cumsum_tensor, reverse_sorted, sorted_weights
    sort = [torch.empty(n, dtype=dt) for n, dt in ((4096, torch.int32), (256, torch.int32),
                                                   (2, torch.int32), (m * k, torch.int32),
                                                   (4096, torch.float32))]  # fmt: skip
    m_indices = torch.empty(4096, dtype=torch.int32)
    for init, exc, match in bad:
        with pytest.raises(exc, match=match):
            A.mxfp4_moe_quant(x, aq, asc, zero, e, k, d, 32, init)
        with pytest.raises(exc, match=match):
            A.mxfp4_moe_sort_quant(x, ids, w, *sort, aq, asc, m_indices, zero, e, k, d, 32, init)
        assert all(same_bytes(t, b) for t, b in zip((aq, asc, zero), before, strict=True))


def test_predicates_have_aiters_meaning():
    from aiter_aux.ops import moe_mxfp4_aux as P

    assert A.is_mxfp4_moe_shape_supported is P.is_mxfp4_moe_shape_supported
    assert A.is_mxfp4_moe_scatter_supported is P.is_mxfp4_moe_scatter_supported
    assert A.MXFP4_MOE_SUPPORTED_SHAPES is P.MXFP4_MOE_SUPPORTED_SHAPES
    assert A.is_mxfp4_moe_shape_supported(513, 2560, 640, 11)  # inter rounded up to 768
    assert not A.is_mxfp4_moe_shape_supported(7, 2560, 640, 11)
    # AITER: (model_dim, topk) of some catalog shape, whatever expert and inter_dim
    dims = {1024, *(s[1] for s in MXFP4_MOE_SUPPORTED_SHAPES)}
    topks = {2, *(s[3] for s in MXFP4_MOE_SUPPORTED_SHAPES)}
    pairs = {(s[1], s[3]) for s in MXFP4_MOE_SUPPORTED_SHAPES}
    for d in dims:
        for k in topks:
            assert A.is_mxfp4_moe_scatter_supported(d, k) == ((d, k) in pairs), (d, k)
    assert A.is_mxfp4_moe_scatter_supported(3072, 8)
    assert not A.is_mxfp4_moe_scatter_supported(1024, 8)


# --------------------------------------------------------------------- prepare_mxfp4_moe_aux

# The instances of (256, 3072, *, 8), one per op, by their keys (codegen/instances.py).
KEYS_256_3072_8 = keys_of((256, 3072, 256, 8))


def test_prepare_catalog_shapes_load_every_instance():
    from aiter_aux.jit.spec import loaded_modules

    # a catalog shape, and a new inter_dim of a catalog (expert, model_dim, topk): AITER's
    # instances do not depend on inter_dim, nor do ours
    assert A.prepare_mxfp4_moe_aux([(256, 3072, 256, 8), (256, 3072, 2560, 8)]) is None
    assert A.prepare_mxfp4_moe_aux(iter([SHAPES[1]])) is None
    # the module of this process's backend: the GPU's when torch sees one, else the CPU's
    gpu = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    module = loaded_modules()[gpu if torch.cuda.is_available() else "cpu"]
    assert all(module.has(key) for key in KEYS_256_3072_8)


def test_prepare_builds_uncatalogued_shapes_and_names_unservable_ones():
    from aiter_aux.jit.spec import loaded_modules

    new = (255, 3072, 256, 8)  # no catalog shape has E = 255: built on demand
    assert A.prepare_mxfp4_moe_aux([(256, 3072, 256, 8), new]) is None
    gpu = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    module = loaded_modules()[gpu if torch.cuda.is_available() else "cpu"]
    assert all(module.has(key) for key in keys_of(new))
    shapes = [(256, 3072, 256, 8), (256, 2880, 2880, 4)]
    with pytest.raises(A.MissingInstancesError) as raised:
        A.prepare_mxfp4_moe_aux(shapes)
    err = raised.value
    assert isinstance(err, RuntimeError)  # as AITER's
    assert err.missing_shapes == ((256, 2880, 2880, 4),)
    assert "mxfp4_quant_d2880" in err.missing_keys
    assert "model_dim must be a positive multiple of 256" in str(err)


@pytest.mark.parametrize(
    "shapes,exc",
    [([(256, 3072, 256)], ValueError), ([7], ValueError), ([(256, 3072.0, 256, 8)], TypeError),
     ([(True, 3072, 256, 8)], TypeError)],
)  # fmt: skip
def test_prepare_bad_shapes(shapes, exc):
    with pytest.raises(exc):
        A.prepare_mxfp4_moe_aux(shapes)


def test_prepare_without_shapes_loads_nothing():
    code = (
        "import sys\n"
        "import aiter_aux.compat.aiter as m\n"
        "assert m.prepare_mxfp4_moe_aux([]) is None\n"
        "bad = [n for n in ('aiter_aux.jit.spec', 'aiter_aux.jit.build') "
        "if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------ errors


def _sort_call(**over):
    """An mxfp4_moe_sort call on SHAPES[0] with AITER-capacity buffers; ``over`` replaces
    arguments.  Returns (kwargs, the caller's buffers before the call)."""
    e, d, _, k = SHAPES[0]
    g = _gen(3)
    ids, w = routing(3, e, k, g)
    caller, _ = sort_buffers(3, k, e, 32, True, g)
    kw = dict(topk_ids=ids, topk_weight=w, sorted_token_ids=caller["sorted_token_ids"],
              sorted_expert_ids=caller["sorted_expert_ids"],
              cumsum_tensor=caller["cumsum_tensor"], reverse_sorted=caller["reverse_sorted"],
              sorted_weights=caller["sorted_weights"], m_indices=caller["m_indices"],
              bf16_zero_out=poison(3 * d, torch.bfloat16, g),
              bf16_zero_workspace=torch.empty(0, dtype=torch.uint8),
              sort3stage_ws=torch.empty(0, dtype=torch.int32),
              M_logical=3, NE=e, TOPK=k, D_HIDDEN=d, D_INTER=1, MB=32, prologue=0)  # fmt: skip
    kw.update(over)
    before = {n: v.clone() for n, v in kw.items() if isinstance(v, torch.Tensor)}
    return kw, before


@pytest.mark.parametrize(
    "over,exc,match",
    [
        (dict(NE=0), ValueError, "NE"),
        (dict(NE=2000), ValueError, "NE"),
        (dict(TOPK=9), ValueError, "TOPK"),
        (dict(MB=48), ValueError, "MB"),
        (dict(MB=True), TypeError, "MB"),
        (dict(prologue=2), ValueError, "prologue"),
        (dict(M_logical=4), ValueError, "M_logical"),
        (dict(M_logical=-1), ValueError, "M_logical"),
        (dict(D_INTER=1.5), TypeError, "D_INTER"),
        (dict(D_HIDDEN=100), ValueError, "D_HIDDEN"),
        (dict(D_HIDDEN=6144), ValueError, "bf16_zero_out is too small"),
        (dict(sorted_token_ids=torch.zeros(31, dtype=torch.int32)), ValueError,
         "sorted_token_ids is too small"),
        (dict(sorted_expert_ids=torch.zeros(0, dtype=torch.int32)), ValueError,
         "sorted_expert_ids is too small"),
        (dict(sorted_weights=torch.zeros(1024, dtype=torch.float64)), TypeError,
         "sorted_weights"),
        (dict(reverse_sorted=torch.zeros(23, dtype=torch.int32)), ValueError, "reverse_sorted"),
        (dict(cumsum_tensor=torch.zeros(4, dtype=torch.int32)[::2]), ValueError, "contiguous"),
        (dict(bf16_zero_out=torch.zeros(10000, dtype=torch.float32)), TypeError,
         "bf16_zero_out"),
        (dict(topk_ids=torch.zeros(3, 8, dtype=torch.int16)), TypeError, "topk_ids"),
        # AITER's check (prologue 1): int32, >= NE*16 + NE elements
        (dict(prologue=1, sort3stage_ws=torch.zeros(256 * 17 - 1, dtype=torch.int32)),
         ValueError, "sort3stage_ws is too small"),
        (dict(prologue=1, sort3stage_ws=torch.zeros(256 * 17, dtype=torch.float32)),
         TypeError, "sort3stage_ws"),
        (dict(sort3stage_ws=None), TypeError, "sort3stage_ws"),
        (dict(bf16_out_init=torch.zeros(3 * 3072, dtype=torch.float16)), TypeError,
         "bf16_out_init must have the dtype of bf16_zero_out"),
        (dict(bf16_out_init=torch.zeros(3 * 3072 - 1, dtype=torch.bfloat16)), ValueError,
         "bf16_out_init is too small"),
        (dict(bf16_out_init=torch.zeros(2, 3 * 3072, dtype=torch.bfloat16)[:, 0]), ValueError,
         "bf16_out_init"),
        (dict(bf16_out_init=torch.zeros(2, 3 * 3072, dtype=torch.bfloat16).t()), ValueError,
         "contiguous"),
        (dict(bf16_out_init=[0.0]), TypeError, "bf16_out_init"),
        (dict(prologue=1, sort3stage_ws=torch.zeros(256 * 17, dtype=torch.int32),
              bf16_out_init=[0.0]), TypeError, "bf16_out_init"),
    ],
)  # fmt: skip
def test_sort_errors(over, exc, match):
    kw, before = _sort_call(**over)
    with pytest.raises(exc, match=match):
        A.mxfp4_moe_sort(**kw)
    for name, t in before.items():  # nothing was written
        assert same_bytes(kw[name], t), name


def test_sort_overlap_is_refused():
    kw, before = _sort_call()
    kw["m_indices"] = kw["sorted_token_ids"]
    with pytest.raises(ValueError, match="overlaps"):
        A.mxfp4_moe_sort(**kw)
    assert same_bytes(kw["sorted_token_ids"], before["sorted_token_ids"])


def test_other_errors():
    e, d, _, k = SHAPES[0]
    g = _gen(5)
    m = 4
    x = activations(m, d, g)
    aq = torch.empty(m * d // 2, dtype=torch.uint8)
    asc = torch.empty(m * d // 32, dtype=torch.uint8)
    nz = torch.empty(0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="D_HIDDEN"):
        A.mxfp4_moe_quant(x, aq, asc, nz, e, k, 4096, 32)
    with pytest.raises(ValueError, match="a_quant is too small"):
        A.mxfp4_moe_quant(x, aq[:-1], asc, nz, e, k, d, 32)
    with pytest.raises(TypeError, match="a_scale"):
        A.mxfp4_moe_quant(x, aq, asc.view(torch.int8), nz, e, k, d, 32)
    with pytest.raises(ValueError, match="overlaps"):
        A.mxfp4_moe_quant(x, aq, aq[: m * d // 32], nz, e, k, d, 32)
    ids, w = routing(m, e, k, g)
    srt = O.moe_sort(ids, w, e, 32)
    s2d = asc.view(m, d // 32)
    out = torch.empty(srt.sorted_token_ids.numel() * d // 32, dtype=torch.uint8)
    n = srt.sorted_token_ids.numel()
    with pytest.raises(ValueError, match="2-D"):  # AITER takes M from a_scale.size(0)
        A.mxfp4_moe_sort_scales(asc, srt.sorted_token_ids, srt.num_valid_ids, out,
                                e, k, d, 32, n)  # fmt: skip
    with pytest.raises(ValueError, match="max_sorted"):
        A.mxfp4_moe_sort_scales(s2d, srt.sorted_token_ids, srt.num_valid_ids, out,
                                e, k, d, 32, n + 32)  # fmt: skip
    with pytest.raises(ValueError, match="a_scale_sorted_shuffled is too small"):
        A.mxfp4_moe_sort_scales(s2d, srt.sorted_token_ids, srt.num_valid_ids, out[:-1],
                                e, k, d, 32, n)  # fmt: skip
    with pytest.raises(ValueError, match="D_HIDDEN"):
        A.mxfp4_moe_sort_scales(s2d, srt.sorted_token_ids, srt.num_valid_ids, out,
                                e, k, 4096, 32, n)  # fmt: skip
    flat = torch.zeros(n, d, dtype=torch.bfloat16)
    o = torch.empty(m, d, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="reverse_sorted is too small"):
        A.mxfp4_moe_scatter_reduce(flat, srt.reverse_sorted, srt.sorted_weights, o, e, k + 1, d, 32)
    with pytest.raises(ValueError, match="out must be"):
        A.mxfp4_moe_scatter_reduce(flat, srt.reverse_sorted, srt.sorted_weights, o[:, :64],
                                   e, k, d, 32)  # fmt: skip
    with pytest.raises(ValueError, match="flat_out must be"):
        A.mxfp4_moe_scatter_reduce(flat[:, :64], srt.reverse_sorted, srt.sorted_weights, o,
                                   e, k, d, 32)  # fmt: skip
    q = torch.zeros(n, d // 2, dtype=torch.uint8)
    s = torch.zeros(n, d // 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="flat_out_scale must be"):
        A.mxfp4_moe_scatter_reduce_q(q, s[:, :8], srt.reverse_sorted, srt.sorted_weights, o,
                                     e, k, d, 32)  # fmt: skip
    # topk 5 with this model_dim is no catalog shape's: its instance is built on demand
    A.mxfp4_moe_scatter_reduce_q(q, s, srt.reverse_sorted[: m * 5], srt.sorted_weights,
                                 o, e, 5, d, 32)  # fmt: skip


# ------------------------------------------------------------------- signatures, import

# AITER's signatures (names in order; a value is a default), written from
# aiter/ops/moe_mxfp4_aux.py as docs/compat.md records ("Sources"):
# * ROCm/aiter, the newest stored version in the search index (file id 71309741114, which
#   the index gives without its commit): sort3stage_ws after bf16_zero_workspace,
#   is_mxfp4_moe_scatter_supported, prepare_mxfp4_moe_aux; the same sort signature at
#   kawhil-amd/aiter bd8566ca2d4295f666bb786db88a2e6955fd2b4e and
#   yhl-amd/aiter 22f2e2dc19e7806d49669dee799b80627b9d22cf;
# * bf16_out_init=None last on the three functions: amd-yashagar/aiter
#   30f98f769dd0ff48fc97f9a6d5561b7af4b3c77c (a fork, whose mxfp4_moe_sort predates
#   sort3stage_ws).
INIT = ("bf16_out_init", None)
AITER_SIGNATURES = {
    "mxfp4_moe_sort_quant": [*"a_input topk_ids topk_weight sorted_token_ids sorted_expert_ids "
                             "cumsum_tensor reverse_sorted sorted_weights a_quant a_scale "
                             "m_indices bf16_zero_out NE TOPK D_HIDDEN MB".split(), INIT],
    "mxfp4_moe_sort": [*"topk_ids topk_weight sorted_token_ids sorted_expert_ids cumsum_tensor "
                       "reverse_sorted sorted_weights m_indices bf16_zero_out "
                       "bf16_zero_workspace sort3stage_ws M_logical NE TOPK D_HIDDEN D_INTER "
                       "MB prologue".split(), INIT],
    "mxfp4_moe_quant": [*"a_input a_quant a_scale bf16_zero_out NE TOPK D_HIDDEN MB".split(),
                        INIT],
    "mxfp4_moe_sort_scales": "a_scale sorted_token_ids cumsum_tensor a_scale_sorted_shuffled "
                             "NE TOPK D_HIDDEN MB max_sorted".split(),
    "mxfp4_moe_scatter_reduce": "flat_out reverse_sorted sorted_weights out NE TOPK D_HIDDEN "
                                "MB".split(),
    "mxfp4_moe_scatter_reduce_q": "flat_out_q flat_out_scale reverse_sorted sorted_weights out "
                                  "NE TOPK D_HIDDEN MB".split(),
    "is_mxfp4_moe_shape_supported": ["expert", "model_dim", "inter_dim", "topk"],
    "is_mxfp4_moe_scatter_supported": ["model_dim", "topk"],
    "prepare_mxfp4_moe_aux": ["shapes"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(AITER_SIGNATURES))
def test_signature_is_aiters(name):
    sig = inspect.signature(getattr(A, name))
    want = [p if isinstance(p, tuple) else (p, inspect.Parameter.empty)
            for p in AITER_SIGNATURES[name]]  # fmt: skip
    assert [(p.name, p.default) for p in sig.parameters.values()] == want
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())
    assert sig.return_annotation is not inspect.Signature.empty
    assert name in A.__all__


def test_import_builds_and_loads_nothing():
    code = (
        "import sys\n"
        "import aiter_aux.compat.aiter as m\n"
        "assert m.is_mxfp4_moe_shape_supported(256, 3072, 256, 8)\n"
        "bad = [n for n in ('aiter_aux.jit.module', 'aiter_aux.jit.build', "
        "'aiter_aux.jit.spec') if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _aiter_call_kwargs(op: str, **change):
    """A valid keyword call of an AITER adapter (M = 4, shape (256, 3072, 256, 8), MB 32)."""
    m, d, ne, k, mb = 4, 3072, 256, 8, 32
    g = _gen(5)
    z = lambda n, dt=torch.int32: torch.zeros(n, dtype=dt)  # noqa: E731
    ids, w = routing(m, ne, k, g)
    cap = aiter_capacity(m, k, ne, mb)
    x = activations(m, d, g)
    common = dict(NE=ne, TOPK=k, D_HIDDEN=d, MB=mb)
    sort = dict(topk_ids=ids, topk_weight=w, sorted_token_ids=z(cap),
                sorted_expert_ids=z(cap // mb), cumsum_tensor=z(2), reverse_sorted=z(m * k),
                sorted_weights=z(cap, torch.float32), m_indices=z(cap),
                bf16_zero_out=z(0, torch.bfloat16))  # fmt: skip
    quant = dict(a_quant=z(m * d // 2, torch.uint8), a_scale=z(m * d // 32, torch.uint8))
    kw = {
        "mxfp4_moe_sort_quant": dict(a_input=x, **sort, **quant, **common),
        "mxfp4_moe_quant": dict(a_input=x, bf16_zero_out=z(0, torch.bfloat16), **quant, **common),
        "mxfp4_moe_sort": dict(**sort, bf16_zero_workspace=z(0), sort3stage_ws=z(0), M_logical=m,
                               D_INTER=256, prologue=0, **common),
        "mxfp4_moe_scatter_reduce": dict(
            flat_out=torch.zeros(cap, d, dtype=torch.bfloat16), reverse_sorted=z(m * k),
            sorted_weights=z(cap, torch.float32), out=torch.zeros(m, d, dtype=torch.bfloat16),
            **common),
    }[op]  # fmt: skip
    kw.update(change)
    return kw


def _noncontig(t):
    return t.t().contiguous().t() if t.dim() == 2 else t[::2]


@pytest.mark.parametrize(
    "op, name, change",
    [("mxfp4_moe_sort_quant", "a_input", lambda t: t.float()),
     ("mxfp4_moe_sort_quant", "a_input", _noncontig),
     ("mxfp4_moe_sort_quant", "a_input", lambda t: t.to("meta")),
     ("mxfp4_moe_sort_quant", "topk_weight", lambda t: t.half()),
     ("mxfp4_moe_sort_quant", "topk_weight", _noncontig),
     ("mxfp4_moe_sort_quant", "topk_weight", lambda t: t.to_sparse()),
     ("mxfp4_moe_sort_quant", "topk_ids", lambda t: t.short()),  # int64 ids are taken
     ("mxfp4_moe_sort_quant", "topk_ids", _noncontig),
     ("mxfp4_moe_quant", "a_input", lambda t: t.float()),
     ("mxfp4_moe_quant", "a_input", _noncontig),
     ("mxfp4_moe_sort", "topk_weight", lambda t: t.half()),
     ("mxfp4_moe_sort", "topk_weight", lambda t: t.to("meta")),
     ("mxfp4_moe_scatter_reduce", "flat_out", lambda t: t.half()),
     ("mxfp4_moe_scatter_reduce", "flat_out", _noncontig)],
)  # fmt: skip
def test_dtype_and_layout_errors_name_aiters_arguments(op, name, change):
    """docs/compat.md: the adapters' errors name AITER's arguments (``a_input``,
    ``topk_weight``, ``flat_out``), never ours (``x``, ``topk_weights``, ``expert_out``)."""
    import re

    kw = _aiter_call_kwargs(op)
    kw[name] = change(kw[name])
    with pytest.raises((TypeError, ValueError)) as e:
        getattr(A, op)(**kw)
    msg = str(e.value)
    assert re.search(rf"\b{name}\b", msg), msg
    assert not re.search(r"\b(x|topk_weights|expert_out|a_q|zero_buf)\b", msg), msg
