"""Every backend of module_moe_mxfp4_aux against the torch reference, byte for byte.

Runs on the CPU backend everywhere and, where torch sees a GPU, on the cuda/rocm backend
too (the same tests, tensors moved to the GPU; the reference runs on CPU copies).

Outputs are poisoned before each run (and surrounded by guard regions) so unwritten or
out-of-bounds elements are caught.  Inputs are fresh random draws: router-like routing,
random bf16 bit patterns (covering NaN, ±Inf, subnormals), plus the edge cases.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.pipeline import draw_routing  # noqa: E402

POISON = 0x5A
GUARD = 64
BLOCK_MS = (16, 32, 64, 128)
# catalog shapes (expert, model_dim, inter, topk) covering every op kind and odd/even E
SHAPES = [(257, 7168, 256, 9), (513, 2560, 768, 11), (32, 5120, 2304, 2), (896, 3584, 512, 16),
          (24, 7168, 3072, 6), (128, 5120, 768, 3)]  # fmt: skip


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request, cpu_module):
    """The device under test; the module of its backend is loaded on first use."""
    return torch.device(request.param)


def cpu(t):
    return t.cpu() if isinstance(t, torch.Tensor) else t


def gen(seed=None):
    g = torch.Generator()
    g.manual_seed(int(torch.randint(0, 2**62, ()).item()) if seed is None else seed)
    return g


def guarded(n: int, dtype, shape=None, device="cpu"):
    """A contiguous poisoned buffer of n elements with poisoned guard regions around it."""
    esize = torch.empty((), dtype=dtype).element_size()
    raw = torch.full(((n + 2 * GUARD) * esize,), POISON, dtype=torch.uint8, device=device)
    whole = raw.view(dtype)
    buf = whole[GUARD : GUARD + n]
    return (buf.view(shape) if shape is not None else buf), whole


def guards_intact(whole: torch.Tensor) -> bool:
    raw = whole.view(torch.uint8)
    esize = whole.element_size()
    return bool((raw[: GUARD * esize] == POISON).all() and (raw[-GUARD * esize :] == POISON).all())


def same(a, b) -> bool:
    a, b = cpu(a), cpu(b)
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def random_bf16(m, d, g, kind="normal"):
    if kind == "bits":  # every bf16 bit pattern: NaN, ±Inf, subnormals, ±0
        return torch.randint(-(2**15), 2**15, (m, d), generator=g, dtype=torch.int16).view(
            torch.bfloat16
        )
    scale = 10.0 ** torch.randint(-30, 30, (m, 1), generator=g).float()
    return (torch.randn(m, d, generator=g) * scale).bfloat16()


# ---------------------------------------------------------------------------- moe_sort
def run_sort_out(ids, w, e, block_m, device, zero_buf=None):
    m, k = ids.shape
    max_rows = ref.moe_sort_capacity(m, k, e, block_m)
    bufs = [guarded(max_rows, torch.int32, device=device),
            guarded(max_rows, torch.float32, device=device),
            guarded(max_rows, torch.int32, device=device),
            guarded(max_rows // block_m, torch.int32, device=device),
            guarded(2, torch.int32, device=device),
            guarded(m * k, torch.int32, device=device)]  # fmt: skip
    out = ref.MoeSortOutput(*(b for b, _ in bufs))
    ops.moe_sort_out(ids.to(device), w.to(device), e, block_m, out, zero_buf=zero_buf)
    assert all(guards_intact(whole) for _, whole in bufs), "write outside an out= buffer"
    return ref.MoeSortOutput(*(cpu(b) for b in out))


def check_sort(ids, w, e, block_m, device):
    got = run_sort_out(ids, w, e, block_m, device)
    want = ref.moe_sort(ids, w, e, block_m)
    nv = int(want.num_valid_ids[0])
    assert got.num_valid_ids.tolist() == want.num_valid_ids.tolist()
    for name, n in (("sorted_token_ids", nv), ("sorted_weights", nv), ("m_indices", nv),
                    ("sorted_expert_ids", nv // block_m), ("reverse_sorted", None)):  # fmt: skip
        g, r = getattr(got, name), getattr(want, name)
        n = r.numel() if n is None else n
        assert same(g[:n], r[:n]), name
        rest = g[n:].view(torch.uint8)
        assert bool((rest == POISON).all()), f"{name}: rows past num_valid_ids[0] were written"
    return got


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [0, 1, 5, 64, 700])
def test_moe_sort_router_like(shape, m, device):
    e, _d, _i, k = shape
    ids, w = draw_routing(m, e, k, gen())
    for block_m in BLOCK_MS:
        check_sort(ids, w, e, block_m, device)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_moe_sort_not_local_ids(shape, device):
    e, _d, _i, k = shape
    g = gen()
    m = 97
    ids = torch.randint(-3, e + 3, (m, k), generator=g, dtype=torch.int32)
    ids[::7, 0] = 2**31 - 1
    ids[1::7, -1] = -(2**31)
    ids[5] = -1  # a token with no local pair
    w = torch.rand(m, k, generator=g)
    got = check_sort(ids, w, e, 32, device)
    assert bool((got.reverse_sorted.view(m, k)[5] == -1).all())


def test_moe_sort_all_ids_not_local(device):
    e, _d, _i, k = SHAPES[0]
    ids = torch.full((40, k), -1, dtype=torch.int32)
    got = check_sort(ids, torch.rand(40, k, generator=gen()), e, 64, device)
    assert got.num_valid_ids.tolist() == [0, 40]


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_moe_sort_one_expert_takes_every_token(shape, device):
    e, _d, _i, k = shape
    m = 333
    ids = torch.full((m, k), -1, dtype=torch.int32)
    ids[:, 0] = e - 1
    w = torch.rand(m, k, generator=gen())
    for block_m in BLOCK_MS:
        got = check_sort(ids, w, e, block_m, device)
        assert int(got.num_valid_ids[0]) == -(-m // block_m) * block_m


def test_moe_sort_zero_buf_is_zeroed(device):
    e, d, _i, k = SHAPES[0]
    g = gen()
    ids, w = draw_routing(17, e, k, g)
    zero_buf = torch.randn(17, d, generator=g).bfloat16().to(device)
    run_sort_out(ids, w, e, 32, device, zero_buf=zero_buf)
    assert not bool(zero_buf.view(torch.int16).any())


def test_moe_sort_uncatalogued_key_is_built_on_demand(device):
    """E = 100, topk 9 is no catalog shape's: its instance is built on demand, then equal to
    the reference like any other."""
    ids, w = draw_routing(23, 100, 9, gen())
    check_sort(ids, w, 100, 32, device)


def test_moe_sort_uncatalogued_key_without_jit_names_key_and_fix(device, monkeypatch, tmp_path):
    """AITER_AUX_DISABLE_JIT=1 and a cache without the key: UnsupportedShapeError naming
    the key and the fix, before any kernel runs."""
    monkeypatch.setenv("AITER_AUX_DISABLE_JIT", "1")
    monkeypatch.setenv("AITER_AUX_CACHE_DIR", str(tmp_path))
    ids = torch.zeros(1, 9, dtype=torch.int32, device=device)
    with pytest.raises(ops.UnsupportedShapeError, match=r"moe_sort_e99_k9.*DISABLE_JIT"):
        ops.moe_sort(ids, torch.ones(1, 9, device=device), 99, 32)


# ---------------------------------------------------------------------------- quant
def run_quant_out(x, device):
    m, d = x.shape
    a_q, wq = guarded(m * d // 2, torch.uint8, (m, d // 2), device)
    a_s, ws = guarded(m * d // 32, torch.uint8, (m, d // 32), device)
    ops.mxfp4_quant_out(x.to(device), a_q, a_s)
    assert guards_intact(wq) and guards_intact(ws)
    return a_q, a_s


@pytest.mark.parametrize("d", sorted({s[1] for s in SHAPES}))
@pytest.mark.parametrize("kind", ["normal", "bits"])
@pytest.mark.parametrize("m", [0, 1, 33])
def test_mxfp4_quant_random(d, kind, m, device):
    x = random_bf16(m, d, gen(), kind)
    got_q, got_s = run_quant_out(x, device)
    want_q, want_s = ref.mxfp4_quant(x)
    assert same(got_q, want_q) and same(got_s, want_s)


def test_mxfp4_quant_edge_blocks(device):
    d = 2560
    g = gen()
    x = torch.randn(8, d, generator=g).bfloat16()
    x[0, :32] = 0.0  # all-zero block
    x[0, 32:64] = -0.0
    x[1, 5] = float("nan")
    x[1, 40] = float("inf")
    x[1, 70] = float("-inf")
    x[2, :32] = torch.tensor(1e-39).bfloat16()  # subnormal bf16
    x[2, 32:64] = (torch.randn(32, generator=g) * 1e-39).bfloat16()
    for j, kexp in enumerate(range(-3, 5)):  # amax exactly 6 * 2^k, with ties around it
        blk = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4) * 2.0**kexp
        x[3, 32 * j : 32 * (j + 1)] = blk * torch.where(torch.rand(32, generator=g) < 0.5, -1, 1)
    x[4] = torch.tensor(3.3895e38).bfloat16()  # near bf16 max
    x[5, ::2] = -x[5, ::2].abs()  # nibble order with signs
    got_q, got_s = run_quant_out(x, device)
    want_q, want_s = ref.mxfp4_quant(x)
    assert same(got_q, want_q) and same(got_s, want_s)
    assert cpu(got_s)[1, :3].tolist() == [255, 255, 255]


# ---------------------------------------------------------------------------- fused
@pytest.mark.parametrize("shape", SHAPES[:4])
@pytest.mark.parametrize("m", [0, 1, 40, 1500])
def test_moe_sort_quant_equals_separate_ops(shape, m, device):
    e, d, _i, k = shape
    g = gen()
    ids, w = draw_routing(m, e, k, g)
    x = random_bf16(m, d, g, "bits" if m % 2 else "normal")
    zero_buf = torch.randn(m, d, generator=g).bfloat16().to(device)
    out, a_q, a_s = ops.moe_sort_quant(
        ids.to(device), w.to(device), x.to(device), e, 64, zero_buf=zero_buf
    )
    want = ref.moe_sort(ids, w, e, 64)
    nv = int(want.num_valid_ids[0])
    for gt, wt, n in zip(out, want, (nv, nv, nv, nv // 64, 2, m * k), strict=True):
        assert same(gt[:n], wt[:n])
    want_q, want_s = ref.mxfp4_quant(x)
    assert same(a_q, want_q) and same(a_s, want_s)
    assert not bool(zero_buf.view(torch.int16).any())


# ---------------------------------------------------------------------------- sort_scales
@pytest.mark.parametrize("shape", SHAPES[:4])
@pytest.mark.parametrize("m", [0, 1, 50])
def test_moe_sort_scales(shape, m, device):
    e, d, _i, k = shape
    g = gen()
    ids, w = draw_routing(m, e, k, g)
    for block_m in BLOCK_MS:
        sort = ref.moe_sort(ids, w, e, block_m)
        a_scale = torch.randint(0, 256, (m, d // 32), generator=g, dtype=torch.uint8)
        bm = max(32, block_m)
        n_rows = -(-sort.sorted_token_ids.numel() // bm) * bm
        out, whole = guarded(n_rows * d // 32, torch.uint8, (n_rows, d // 32), device)
        ops.moe_sort_scales_out(
            a_scale.to(device), sort.sorted_token_ids.to(device), sort.num_valid_ids.to(device),
            block_m, out,
        )  # fmt: skip
        assert guards_intact(whole)
        want = ref.moe_sort_scales(a_scale, sort.sorted_token_ids, sort.num_valid_ids, block_m)
        assert same(out, want)


# ---------------------------------------------------------------------------- scatter
def _scatter_inputs(shape, m, g):
    e, d, _i, k = shape
    ids, w = draw_routing(m, e, k, g)
    ids[::5, 0] = -1  # not-local pairs
    sort = ref.moe_sort(ids, w, e, 32)
    rows = max(int(sort.num_valid_ids[0]), 1)
    return sort, rows, d, k


def _same_scatter(op, rows, reverse_sorted, sorted_weights, k, out_shape, device):
    """``op``'s ``_out`` form on ``device`` (expert rows ``rows``) writes exactly the reference's
    bytes into a guarded ``out`` and nothing around it; returns the reference's output."""
    m, d = out_shape
    out, whole = guarded(m * d, torch.bfloat16, out_shape, device)
    args = (*rows, reverse_sorted, sorted_weights)
    getattr(ops, op + "_out")(*(t.to(device) for t in args), k, out)
    assert guards_intact(whole)
    want = getattr(ref, op)(*args, k)
    assert same(out, want)
    return want


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [0, 1, 30])
def test_moe_scatter_reduce(shape, m, device):
    g = gen()
    sort, rows, d, k = _scatter_inputs(shape, m, g)
    expert_out = random_bf16(rows, d, g, "normal")
    expert_out[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    _same_scatter("moe_scatter_reduce", (expert_out,), sort.reverse_sorted, sort.sorted_weights,
                  k, (m, d), device)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [0, 1, 30])
def test_moe_scatter_reduce_q(shape, m, device):
    g = gen()
    sort, rows, d, k = _scatter_inputs(shape, m, g)
    q = torch.randint(0, 256, (rows, d // 2), generator=g, dtype=torch.uint8)
    s = torch.randint(100, 150, (rows, d // 32), generator=g, dtype=torch.uint8)
    s[0, 0], s[-1, -1] = 255, 0  # NaN scale; 2^-127 (fp32 subnormal)
    _same_scatter("moe_scatter_reduce_q", (q, s), sort.reverse_sorted, sort.sorted_weights, k,
                  (m, d), device)  # fmt: skip


@pytest.mark.parametrize("m", [1, 30])
def test_moe_scatter_reduce_q_any_weight_and_scale(m, device):
    """Any e8m0 scale (0..255) in every fourth block, weights over a wide exponent range, some
    with any exponent (subnormal, Inf, NaN), some zero: the GPU kernel's fast product
    w * 2^(s-113) and its exact fallback (s > 252, or the scaled weight out of range) both
    meet the spec."""
    g = gen()
    sort, rows, d, k = _scatter_inputs(SHAPES[0], m, g)
    q = torch.randint(0, 256, (rows, d // 2), generator=g, dtype=torch.uint8)
    s = torch.randint(100, 150, (rows, d // 32), generator=g, dtype=torch.uint8)
    s[:, ::4] = torch.randint(0, 256, s[:, ::4].shape, generator=g, dtype=torch.uint8)  # any s
    n = sort.sorted_weights.numel()
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64) << 31
    mant = torch.randint(0, 2**23, (n,), generator=g, dtype=torch.int64)
    expo = torch.randint(100, 142, (n,), generator=g, dtype=torch.int64)  # |w| in [2^-27, 2^15)
    expo[::7] = torch.randint(0, 256, (len(expo[::7]),), generator=g)  # any exponent: 0 = subnormal
    bits = sign | (expo << 23) | mant
    weights = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    weights[1::11] = 0.0
    want = _same_scatter("moe_scatter_reduce_q", (q, s), sort.reverse_sorted, weights, k,
                         (m, d), device)  # fmt: skip
    if m > 1:  # not a test of NaN alone (at M=1 one NaN/Inf weight can make the whole row so)
        assert torch.isfinite(want.float()).float().mean() > 0.5


def test_moe_scatter_reduce_rejects_rows_out_of_range():
    e, d, _i, k = SHAPES[0]
    rev = torch.full((2 * k,), -1, dtype=torch.int32)
    rev[3] = 10
    with pytest.raises(ValueError, match="reverse_sorted"):
        ops.moe_scatter_reduce(torch.zeros(10, d).bfloat16(), rev, torch.ones(10), k)


def test_bad_input_raises_before_kernel(device):
    e, d, _i, k = SHAPES[0]
    ids = torch.zeros(4, k, dtype=torch.int16, device=device)  # int32 and int64 are ids
    with pytest.raises(TypeError, match="topk_ids"):
        ops.moe_sort(ids, torch.ones(4, k, device=device), e, 32)
    with pytest.raises(ValueError, match="block_m"):
        ops.moe_sort(ids.int(), torch.ones(4, k, device=device), e, 48)
    with pytest.raises(ValueError, match="contiguous"):
        ops.mxfp4_quant(torch.zeros(d, 4, device=device).bfloat16().t())
    with pytest.raises(ValueError, match="too small"):
        ops.mxfp4_quant_out(
            torch.zeros(4, d, device=device).bfloat16(),
            torch.empty(3, d // 2, dtype=torch.uint8, device=device),
            torch.empty(4, d // 32, dtype=torch.uint8, device=device),
        )


# ---------------------------------------------------------------------------- large M (GPU)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [65536, 70000])
def test_large_m_pipeline_gpu(m):
    """Large-M sort (multi-block path), quant, sort_scales and scatter against the reference
    computed on the GPU with the same torch ops (bit-exact: no fused arithmetic)."""
    e, d, _i, k = (32, 5120, 2304, 2)
    dev = torch.device("cuda")
    g = gen()
    ids, w = draw_routing(m, e, k, g)
    ids, w = ids.to(dev), w.to(dev)
    got = ops.moe_sort(ids, w, e, 128)
    want = ref.moe_sort(ids, w, e, 128)
    nv = int(want.num_valid_ids[0])
    for gt, wt, n in zip(got, want, (nv, nv, nv, nv // 128, 2, m * k), strict=True):
        assert same(gt[:n], wt[:n])
    x = random_bf16(m, d, g, "bits").to(dev)
    q, s = ops.mxfp4_quant(x)
    rq, rs = ref.mxfp4_quant(x)
    assert same(q, rq) and same(s, rs)
    args = (s, want.sorted_token_ids, want.num_valid_ids, 128)
    assert same(ops.moe_sort_scales(*args), ref.moe_sort_scales(*args))
    expert_out = random_bf16(nv, d, g).to(dev)
    sargs = (expert_out, want.reverse_sorted, want.sorted_weights, k)
    assert same(ops.moe_scatter_reduce(*sargs), ref.moe_scatter_reduce(*sargs))
    eq, es = ref.mxfp4_quant(expert_out)
    qargs = (eq, es, want.reverse_sorted, want.sorted_weights, k)
    assert same(ops.moe_scatter_reduce_q(*qargs), ref.moe_scatter_reduce_q(*qargs))
