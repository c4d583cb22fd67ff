"""MXFP8 (E4M3 + e8m0 per 1x32, a8w4): the reference against independent oracles, and every
backend of the compiled module against the reference, byte for byte.

* The scale formula ``clamp(((bits(fp32(amax)) + 0x1FFFFF) >> 23) - 8, 1, 254)`` against its
  definition (the smallest s with ``amax <= 448 * 2^(s - 127)``) for all 65,536 bf16 amax.
* The bf16 -> E4M3 table against torch's own float -> float8_e4m3fn conversion (RNE).
* Edge classes: amax one ulp either side of ``448 * 2^k`` for every k (subnormal bf16
  included); every E4M3 rounding midpoint at several scales and its bf16 neighbours; +-0,
  NaN/Inf and mixed-sign blocks; every bf16 bit pattern as an element; the fused op against
  the separate ops with poisoned outputs and guard regions; moe_sort_scales on MXFP8 scales.

The compiled tests run on the CPU backend and, where torch sees a GPU, on cuda/rocm too.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.reference.mxfp8 import (  # noqa: E402
    _decode_mxfp8_rows,
    _e4m3_lut,
    _quant_rows_fp8,
    e4m3_values,
    mxfp8_scale_from_amax,
)

D = 7168  # a catalog model_dim
NB = D // 32
E, K = 257, 9  # catalog shape (257, 7168, 256, 9)
POISON = 0x5A
GUARD = 64
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request, cpu_module):
    return torch.device(request.param)


def ops():
    from aiter_aux import ops

    return ops


def bf16_from_bits(bits) -> torch.Tensor:
    b = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(b >= 0x8000, b - 0x10000, b).to(torch.int16).view(torch.bfloat16)


def all_bf16() -> torch.Tensor:
    return bf16_from_bits(torch.arange(1 << 16))


def blocks_to_rows(blocks: torch.Tensor) -> torch.Tensor:
    """bf16 [n, 32] -> bf16 [ceil(n / NB), D], padded with zero blocks."""
    n = blocks.shape[0]
    rows = -(-n // NB)
    out = torch.zeros(rows * NB, 32, dtype=torch.bfloat16)
    out[:n] = blocks
    return out.reshape(rows, D)


def smallest_scale(amax: torch.Tensor) -> torch.Tensor:
    """The definition: the smallest s in [1, 254] with amax <= 448 * 2^(s - 127) (0 for 0)."""
    s = torch.arange(1, 255, dtype=torch.float64)
    bound = 448.0 * torch.pow(2.0, s - 127)  # exact in float64
    ok = amax.to(torch.float64).unsqueeze(1) <= bound
    first = ok.to(torch.int64).argmax(dim=1) + 1
    return torch.where(amax == 0, 0, first)


def quant_on(device, x):
    """mxfp8_quant_out of the compiled module on poisoned, guarded buffers (CPU results)."""
    m, d = x.shape
    rq = torch.full((m * d + 2 * GUARD,), POISON, dtype=torch.uint8, device=device)
    rs = torch.full((m * d // 32 + 2 * GUARD,), POISON, dtype=torch.uint8, device=device)
    q, s = rq[GUARD:-GUARD].view(m, d), rs[GUARD:-GUARD].view(m, d // 32)
    ops().mxfp8_quant_out(x.to(device), q, s)
    for raw in (rq, rs):
        assert bool((raw[:GUARD] == POISON).all() and (raw[-GUARD:] == POISON).all())
    return q.cpu(), s.cpu()


def check_backend(device, x):
    """Reference vs compiled (both forms), byte for byte; returns the reference's result."""
    want = ref.mxfp8_quant(x)
    got = quant_on(device, x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    alloc = ops().mxfp8_quant(x.to(device))
    assert torch.equal(alloc[0].cpu(), want[0]) and torch.equal(alloc[1].cpu(), want[1])
    return want


# ------------------------------------------------------------------ the spec's oracles
def test_scale_formula_exhaustive_over_bf16_amax():
    x = all_bf16()
    finite = torch.isfinite(x)
    amax = x[finite].abs().to(torch.float32)
    assert amax.numel() == 65536 - 256  # +-Inf and the 254 NaN patterns excluded
    assert torch.equal(mxfp8_scale_from_amax(amax), smallest_scale(amax))


def test_scale_of_every_bf16_amax_through_the_reference():
    """Each finite bf16 value v as the amax of a block [v, 0, ..., 0]: the scale byte."""
    x = all_bf16()
    v = x[torch.isfinite(x)]
    blocks = torch.zeros(v.numel(), 32, dtype=torch.bfloat16)
    blocks[:, 0] = v
    _, s = _quant_rows_fp8(blocks.reshape(-1, 32))
    assert torch.equal(s.reshape(-1).to(torch.int64), smallest_scale(v.abs().float()))


def test_e4m3_table_against_torch_conversion():
    x = all_bf16()
    f = x.float()
    lut = _e4m3_lut(torch.device("cpu"))
    ok = torch.isfinite(f) & (f.abs() <= 448)
    want = f[ok].to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(lut[ok], want)
    big = torch.isfinite(f) & (f.abs() > 448)
    assert bool((lut[big] & 0x7F == 0x7E).all())  # saturates (never reached under the scale)
    assert e4m3_values()[-1].item() == 448.0 and e4m3_values()[1].item() == 2.0**-9


def test_every_bf16_element_matches_independent_oracle():
    """Every bf16 pattern as an element of blocks of 32 consecutive patterns; each element
    against torch's float -> e4m3fn conversion of x * 2^(127 - s) (exact in float64)."""
    x = all_bf16().reshape(-1, 32)
    q, s = _quant_rows_fp8(x)
    s64 = s.reshape(-1).to(torch.int64)
    nonfinite = ~torch.isfinite(x).all(dim=1)
    assert torch.equal(nonfinite, s64 == 255)
    assert bool((q[nonfinite] == 0).all())
    fin = ~nonfinite
    scaled = x[fin].double() * torch.pow(2.0, 127 - s64[fin].double()).unsqueeze(1)
    assert bool((scaled.abs() <= 448).all())
    want = scaled.float().to(torch.float8_e4m3fn).view(torch.uint8)  # fp32 step exact or < 2^-126
    assert torch.equal(q[fin], want)


def test_amax_one_ulp_either_side_of_448_times_2k():
    rows, expect = [], []
    for s in range(1, 255):
        b = torch.tensor(448.0 * 2.0 ** (s - 127), dtype=torch.float64)
        bb = b.to(torch.bfloat16)
        if not torch.isfinite(bb) or bb.double() != b:
            continue  # not a bf16 value (below the bf16 subnormals)
        u = int(bb.view(torch.int16).item()) & 0xFFFF
        for bits, want in ((u - 1, s), (u, s), (u + 1, min(s + 1, 254))):
            v = bf16_from_bits(bits)
            if not torch.isfinite(v):
                continue
            rows.append(v)
            expect.append(max(1, want) if float(v) > 0 else 0)
    assert len(rows) > 3 * 120
    v = torch.stack(rows)
    blocks = torch.zeros(v.numel(), 32, dtype=torch.bfloat16)
    blocks[:, 3] = v
    blocks[:, 7] = -v  # mixed signs: the amax is |v| either way
    _, s = _quant_rows_fp8(blocks)
    assert s.reshape(-1).tolist() == [min(e, 254) for e in expect]
    assert torch.equal(s.reshape(-1).to(torch.int64), smallest_scale(v.abs().float()))


def midpoint_blocks(scale_exp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [anchor 448 * 2^k, v, -v, ...] with v every E4M3 midpoint times 2^k and its bf16
    neighbours; returns (blocks [n, 32], expected E4M3 byte of v [n])."""
    vals = e4m3_values()
    mids = (vals[:-1] + vals[1:]) / 2
    cases, want = [], []
    for i, mid in enumerate(mids.tolist()):
        m = torch.tensor(mid * 2.0**scale_exp).to(torch.bfloat16)
        u = int(m.view(torch.int16).item())
        assert m.double().item() == mid * 2.0**scale_exp
        cases += [bf16_from_bits(u - 1), m, bf16_from_bits(u + 1)]
        want += [i, i if i % 2 == 0 else i + 1, i + 1]
    v = torch.stack(cases)
    blocks = torch.zeros(v.numel(), 32, dtype=torch.bfloat16)
    blocks[:, 0] = 448.0 * 2.0**scale_exp
    blocks[:, 5] = v
    blocks[:, 6] = -v
    return blocks, torch.tensor(want, dtype=torch.uint8)


@pytest.mark.parametrize("k", [0, -7, 5, -100, -120, 100])
def test_every_e4m3_midpoint_and_neighbours(k):
    blocks, want = midpoint_blocks(k)
    q, s = _quant_rows_fp8(blocks)
    assert bool((s == 127 + k).all())
    assert torch.equal(q[:, 5], want) and torch.equal(q[:, 6], want | 0x80)
    assert bool((q[:, 0] == 0x7E).all())


def test_zero_nan_inf_and_mixed_blocks():
    b = torch.zeros(6, 32, dtype=torch.bfloat16)
    b[1] = -0.0
    b[1, ::2] = 0.0
    b[2, 3] = float("nan")
    b[2, 4] = 3.0
    b[3, 31] = float("-inf")
    b[4] = torch.linspace(-448, 448, 32).bfloat16()
    b[5, 0] = float("inf")
    b[5, 1] = float("nan")
    q, s = _quant_rows_fp8(b)
    assert s.reshape(-1).tolist() == [0, 0, 255, 255, 127, 255]
    assert bool((q[0] == 0).all())
    assert q[1].tolist() == [0x00, 0x80] * 16
    assert bool((q[2:4] == 0).all()) and bool((q[5] == 0).all())
    assert q[4, 0].item() == 0xFE and q[4, 31].item() == 0x7E
    dec = _decode_mxfp8_rows(q[4:5].reshape(1, 32), s[4:5].reshape(1, 1))
    assert bool(((dec - b[4].double()).abs() <= b[4].double().abs() / 16).all())


def test_quant_dtype_is_checked():
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    ids = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="quant_dtype must be 'mxfp4' or 'mxfp8', got 'fp8'"):
        ref.moe_sort_quant(ids, torch.ones(2, 1), x, 2, 32, quant_dtype="fp8")


# ------------------------------------------------------------------ compiled backends
def test_backend_every_bf16_pattern(device):
    x = blocks_to_rows(all_bf16().reshape(-1, 32))
    check_backend(device, x)
    # each pattern under a fixed scale: anchor 448 * 2^k in element 0 of its block
    v = all_bf16()
    v = v[torch.isfinite(v) & (v.float().abs() <= 448.0 * 2.0**3)]
    for k in (3, -30):
        blocks = torch.zeros(v.numel(), 32, dtype=torch.bfloat16)
        blocks[:, 0] = 448.0 * 2.0**k
        blocks[:, 9] = v if k == 3 else (v.double() * 2.0**-33).bfloat16()
        check_backend(device, blocks_to_rows(blocks))


def test_backend_edge_blocks(device):
    parts = [midpoint_blocks(k)[0] for k in (0, -7, 5, -120, 100)]
    b = torch.zeros(6, 32, dtype=torch.bfloat16)
    b[1] = -0.0
    b[2, 3] = float("nan")
    b[3, 31] = float("-inf")
    b[4] = torch.linspace(-448, 448, 32).bfloat16()
    b[5, 0] = float("inf")
    x = blocks_to_rows(torch.cat(parts + [b]))
    check_backend(device, x)
    g = torch.Generator().manual_seed(16)
    bits = torch.randint(-(2**15), 2**15, (37, D), generator=g, dtype=torch.int16)
    check_backend(device, bits.view(torch.bfloat16))
    scale = 10.0 ** torch.randint(-30, 30, (37, 1), generator=g).float()
    check_backend(device, (torch.randn(37, D, generator=g) * scale).bfloat16())
    check_backend(device, torch.empty(0, D, dtype=torch.bfloat16))


@pytest.mark.parametrize("m", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("init", [False, True])
def test_fused_equals_separate_ops(device, m, init):
    from aiter_aux.pipeline import draw_routing

    g = torch.Generator().manual_seed(100 + m)
    ids, w = draw_routing(m, E, K, g)
    x = torch.randint(-(2**15), 2**15, (m, D), generator=g, dtype=torch.int16).view(torch.bfloat16)
    x[::3] = (torch.randn(x[::3].shape, generator=g) * 3).bfloat16()
    block_m = 32
    max_rows = ref.moe_sort_capacity(m, K, E, block_m)
    sizes = [(max_rows, torch.int32), (max_rows, torch.float32), (max_rows, torch.int32),
             (max_rows // block_m, torch.int32), (2, torch.int32), (m * K, torch.int32),
             (m * D, torch.uint8), (m * NB, torch.uint8)]  # fmt: skip
    raws, bufs = [], []
    for n, dt in sizes:
        es = torch.empty((), dtype=dt).element_size()
        raw = torch.full(((n + 2 * GUARD) * es,), POISON, dtype=torch.uint8, device=device)
        raws.append((raw, es))
        bufs.append(raw.view(dt)[GUARD : GUARD + n])
    a_q, a_s = bufs[6].view(m, D), bufs[7].view(m, NB)
    zb = torch.full((m, 64), 7.0, dtype=torch.bfloat16, device=device)
    zi = torch.full((m, 64), 2.0, dtype=torch.bfloat16, device=device) if init else None
    out = ref.MoeSortOutput(*bufs[:6])
    ops().moe_sort_quant_out(ids.to(device), w.to(device), x.to(device), E, block_m, out, a_q,
                             a_s, zero_buf=zb, zero_buf_init=zi, quant_dtype="mxfp8")  # fmt: skip
    for raw, es in raws:
        assert bool((raw[: GUARD * es] == POISON).all() and (raw[-GUARD * es :] == POISON).all())
    sort = ref.moe_sort(ids, w, E, block_m)
    q, s = ref.mxfp8_quant(x)
    assert torch.equal(a_q.cpu(), q) and torch.equal(a_s.cpu(), s)
    nv = int(sort.num_valid_ids[0])
    for i, (got, want) in enumerate(zip(out, sort, strict=True)):
        n = want.numel() if i in (4, 5) else (nv // block_m if i == 3 else nv)
        assert torch.equal(got[:n].cpu(), want[:n]), i
        assert bool((got[n:].cpu().view(torch.uint8) == POISON).all())
    assert bool((zb.cpu() == (2.0 if init else 0.0)).all())
    alloc = ops().moe_sort_quant(ids.to(device), w.to(device), x.to(device), E, block_m,
                                 quant_dtype="mxfp8")  # fmt: skip
    assert torch.equal(alloc[1].cpu(), q) and torch.equal(alloc[2].cpu(), s)
    assert torch.equal(alloc[0].reverse_sorted.cpu(), sort.reverse_sorted)


def test_sort_scales_takes_mxfp8_scales(device):
    from aiter_aux.pipeline import draw_routing

    g = torch.Generator().manual_seed(5)
    m = 200
    ids, w = draw_routing(m, E, K, g)
    x = (torch.randn(m, D, generator=g) * 100).bfloat16()
    sort = ref.moe_sort(ids, w, E, 64)
    _, s8 = ref.mxfp8_quant(x)
    _, s4 = ref.mxfp4_quant(x)
    assert not torch.equal(s8, s4)  # the scales differ: the layout is what is shared
    want = ref.moe_sort_scales(s8, sort.sorted_token_ids, sort.num_valid_ids, 64)
    got = ops().moe_sort_scales(s8.to(device), sort.sorted_token_ids.to(device),
                                sort.num_valid_ids.to(device), 64)  # fmt: skip
    assert torch.equal(got.cpu(), want)


def test_errors_match_reference(device):
    x = torch.zeros(4, D, dtype=torch.bfloat16, device=device)
    small = torch.empty(4, D // 2, dtype=torch.uint8, device=device)
    sc = torch.empty(4, NB, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError) as want:
        ref.mxfp8_quant_out(x.cpu(), small.cpu(), sc.cpu())
    with pytest.raises(ValueError) as got:
        ops().mxfp8_quant_out(x, small, sc)
    assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="quant_dtype"):
        ids = torch.zeros(4, K, dtype=torch.int32, device=device)
        ops().moe_sort_quant(ids, torch.ones(4, K, device=device), x, E, 32, quant_dtype="e4m3")


@pytest.mark.parametrize("name", ["mxfp8_quant", "mxfp8_quant_out", "moe_sort_quant_fp8",
                                  "moe_sort_quant_fp8_out"])  # fmt: skip
def test_opcheck(name, cpu_module):
    import aiter_aux.ops  # noqa: F401  (defines the ops)

    e, d, k = 256, 3072, 8  # catalog shape (256, 3072, 256, 8): every expert one pair, so
    m = e // k  # num_valid_ids[0] == max_rows and opcheck compares whole outputs
    ids = torch.arange(m * k, dtype=torch.int32).view(m, k)
    g = torch.Generator().manual_seed(3)
    w = torch.rand(m, k, generator=g)
    x = (torch.randn(m, d, generator=g) * 5).bfloat16()
    op = getattr(torch.ops.aiter_aux, name).default
    q_s = (torch.empty(m, d, dtype=torch.uint8), torch.empty(m, d // 32, dtype=torch.uint8))
    if name.startswith("mxfp8"):
        torch.library.opcheck(op, (x,) if name == "mxfp8_quant" else (x, *q_s))
        return
    zb = torch.ones(3, 5, dtype=torch.bfloat16)
    if name == "moe_sort_quant_fp8":
        torch.library.opcheck(op, (ids, w, x, e, 16), {"zero_buf": zb})
        return
    mr = ref.moe_sort_capacity(m, k, e, 16)
    i32 = lambda n: torch.empty(n, dtype=torch.int32)  # noqa: E731
    outs = (i32(mr), torch.empty(mr), i32(mr), i32(mr // 16), i32(2), i32(m * k), *q_s)
    torch.library.opcheck(op, (ids, w, x, e, 16, *outs), {"zero_buf": zb})
