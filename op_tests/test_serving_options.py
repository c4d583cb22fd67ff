"""What serving engines need: ``expert_map`` (expert parallelism), ``zero_buf_init``
(the GEMM2 accumulator initialised from the shared expert's output) and
``routed_scaling_factor`` on the reduce.  Every backend (CPU everywhere, CUDA where a GPU is
present) against the reference, byte for byte, on fresh random inputs with poisoned outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [(257, 7168, 256, 9), (32, 5120, 2304, 2), (896, 3584, 512, 16)]  # catalog shapes
POISON = 0x5A


@pytest.fixture(params=DEVICES)
def device(request, cpu_module):
    return torch.device(request.param)


def gen():
    g = torch.Generator()
    g.manual_seed(int(torch.randint(0, 2**62, ()).item()))
    return g


def bits(t):
    return t.detach().cpu().contiguous().view(torch.uint8)


def poisoned_sort(m, k, e, bm, device):
    rows = ref.moe_sort_capacity(m, k, e, bm)
    return ref.MoeSortOutput(*(
        torch.full((n,), POISON, dtype=torch.uint8, device=device).view(dt)
        for n, dt in ((4 * rows, torch.int32), (4 * rows, torch.float32), (4 * rows, torch.int32),
                      (4 * (rows // bm), torch.int32), (8, torch.int32), (4 * m * k, torch.int32))
    ))  # fmt: skip


def same_sort(got, want, bm) -> bool:
    n = int(want.num_valid_ids[0])
    parts = ("sorted_token_ids", "sorted_weights", "m_indices")
    ok = all(torch.equal(bits(getattr(got, f)[:n]), bits(getattr(want, f)[:n])) for f in parts)
    ok &= torch.equal(
        bits(got.sorted_expert_ids[: n // bm]), bits(want.sorted_expert_ids[: n // bm])
    )
    ok &= torch.equal(bits(got.num_valid_ids), bits(want.num_valid_ids))
    return ok and torch.equal(bits(got.reverse_sorted), bits(want.reverse_sorted))


def rank_maps(num_global, e, ranks, g, gaps=False):
    """Each rank's expert_map: a random assignment of the global experts to ranks, e local
    experts each (some holes when ``gaps``: experts no rank holds)."""
    perm = torch.randperm(num_global, generator=g)
    maps = []
    for r in range(ranks):
        m = torch.full((num_global,), -1, dtype=torch.int32)
        mine = perm[r * e : (r + 1) * e]
        local = torch.randperm(e, generator=g)[: len(mine)].to(torch.int32)
        m[mine] = local
        if gaps:
            m[mine[::5]] = -1
        maps.append(m)
    return maps


@pytest.mark.parametrize("ranks", [1, 2, 8])
@pytest.mark.parametrize("gaps", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_expert_parallel_sort_every_rank_against_reference(shape, ranks, gaps, device):
    e, d, _i, k = shape
    g = gen()
    num_global = e * ranks
    m, bm = 61, 32
    ids = torch.randint(-2, num_global + 3, (m, k), generator=g, dtype=torch.int32)
    ids[3] = -1  # a token with no local pair anywhere
    w = torch.rand(m, k, generator=g)
    x = torch.randn(m, d, generator=g).bfloat16()
    placed = []
    for emap in rank_maps(num_global, e, ranks, g, gaps):
        want = ref.moe_sort(ids, w, e, bm, expert_map=emap)
        bufs = poisoned_sort(m, k, e, bm, device)
        got = ops.moe_sort_out(
            ids.to(device), w.to(device), e, bm, bufs, expert_map=emap.to(device)
        )
        assert same_sort(got, want, bm)
        srt, q, s = ops.moe_sort_quant(ids.to(device), w.to(device), x.to(device), e, bm,
                                       expert_map=emap.to(device))  # fmt: skip
        assert same_sort(srt, want, bm)
        q2, s2 = ref.mxfp4_quant(x)
        assert torch.equal(bits(q), bits(q2)) and torch.equal(bits(s), bits(s2))
        rev = want.reverse_sorted.view(m, k)
        placed += [(t, kk) for t, kk in (rev >= 0).nonzero().tolist()]
    assert len(placed) == len(set(placed)), "a pair placed by two ranks"


def test_expert_parallel_union_is_the_single_rank_sort(device):
    """Ranks that together hold every global expert place each valid pair exactly once, and
    the union equals the pairs a map-free sort of the same (global == local) ids places."""
    e, _d, _i, k = SHAPES[1]  # 32 experts per rank
    ranks, g = 8, gen()
    num_global = e * ranks
    m, bm = 40, 16
    ids = torch.randint(0, num_global, (m, k), generator=g, dtype=torch.int32)
    ids[::7, 0] = -1
    w = torch.rand(m, k, generator=g)
    owner = torch.full((m, k), -1)
    for r, emap in enumerate(rank_maps(num_global, e, ranks, g)):
        got = ops.moe_sort(ids.to(device), w.to(device), e, bm, expert_map=emap.to(device))
        rev = got.reverse_sorted.cpu().view(m, k)
        assert not bool(((rev >= 0) & (owner >= 0)).any()), "a pair placed by two ranks"
        owner[rev >= 0] = r
    assert torch.equal(owner >= 0, ids >= 0)


def test_all_ids_not_local_on_a_rank(device):
    e, _d, _i, k = SHAPES[0]
    g = gen()
    ids = torch.randint(0, 4 * e, (17, k), generator=g, dtype=torch.int32)
    emap = torch.full((4 * e,), -1, dtype=torch.int32, device=device)
    got = ops.moe_sort(ids.to(device), torch.rand(17, k, generator=g).to(device), e, 32,
                       expert_map=emap)  # fmt: skip
    assert got.num_valid_ids.tolist() == [0, 17]
    assert bool((got.reverse_sorted == -1).all())
    empty = torch.empty(0, dtype=torch.int32, device=device)  # no global expert at all
    got = ops.moe_sort(ids.to(device), torch.rand(17, k).to(device), e, 32, expert_map=empty)
    assert got.num_valid_ids.tolist() == [0, 17]


def test_map_values_past_num_experts_are_not_local(device):
    """A map value >= num_experts is a caller error: every backend treats it as not local."""
    e, _d, _i, k = SHAPES[1]
    assert k == 2
    ids = torch.arange(2 * k, dtype=torch.int32).view(2, k)
    emap = torch.tensor([0, e, e + 7, -5] + [1] * 60, dtype=torch.int32)
    want = ref.moe_sort(ids, torch.ones(2, k), e, 16, expert_map=emap)
    got = ops.moe_sort(ids.to(device), torch.ones(2, k, device=device), e, 16,
                       expert_map=emap.to(device))  # fmt: skip
    assert same_sort(got, want, 16)
    assert want.reverse_sorted.tolist()[1:4] == [-1, -1, -1]  # ids 1, 2, 3: map e, e + 7, -5


@pytest.mark.parametrize("fused", [False, True])
def test_zero_buf_init_is_copied_bit_for_bit(fused, device):
    e, d, _i, k = SHAPES[0]
    g = gen()
    m = 23
    ids = torch.randint(0, e, (m, k), generator=g, dtype=torch.int32).to(device)
    w = torch.rand(m, k, generator=g).to(device)
    init = torch.randint(-(2**15), 2**15, (m, d), generator=g, dtype=torch.int16)
    init = init.view(torch.bfloat16).to(device)  # every bit pattern, NaNs included
    zero_buf = torch.full((m, d), 3.0, dtype=torch.bfloat16, device=device)
    if fused:
        x = torch.randn(m, d, generator=g).bfloat16().to(device)
        ops.moe_sort_quant(ids, w, x, e, 32, zero_buf=zero_buf, zero_buf_init=init)
    else:
        ops.moe_sort(ids, w, e, 32, zero_buf=zero_buf, zero_buf_init=init)
    assert torch.equal(bits(zero_buf), bits(init))
    # an unaligned zero_buf and a differently aligned init (element copies)
    whole = torch.zeros(m * d + 3, dtype=torch.bfloat16, device=device)
    zb, src = whole[1 : 1 + m * d - 5], init.view(-1)[2 : 2 + m * d - 5]
    ops.moe_sort(ids, w, e, 32, zero_buf=zb, zero_buf_init=src)
    assert torch.equal(bits(zb), bits(src)) and float(whole[0]) == 0.0


@pytest.mark.parametrize("factor", [1.0, 2.5, -0.75, 1e-30, 3e38])
@pytest.mark.parametrize("quantized", [False, True])
def test_routed_scaling_factor(factor, quantized, device):
    e, d, _i, k = SHAPES[0]
    g = gen()
    m = 19
    s = ref.moe_sort(torch.randint(0, e, (m, k), generator=g, dtype=torch.int32),
                     torch.rand(m, k, generator=g), e, 32)  # fmt: skip
    rows = s.sorted_token_ids.numel()
    dev = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    rev, sw = dev(s.reverse_sorted, s.sorted_weights)
    if quantized:
        q = torch.randint(0, 256, (rows, d // 2), generator=g, dtype=torch.uint8)
        sc = torch.randint(100, 150, (rows, d // 32), generator=g, dtype=torch.uint8)
        want = ref.moe_scatter_reduce_q(q, sc, s.reverse_sorted, s.sorted_weights, k,
                                        routed_scaling_factor=factor)  # fmt: skip
        plain = ref.moe_scatter_reduce_q(q, sc, s.reverse_sorted, s.sorted_weights, k)
        q, sc = dev(q, sc)
        got = ops.moe_scatter_reduce_q(q, sc, rev, sw, k, routed_scaling_factor=factor)
        out = torch.full((m, d), 7.0, dtype=torch.bfloat16, device=device)
        ops.moe_scatter_reduce_q_out(q, sc, rev, sw, k, out, routed_scaling_factor=factor)
    else:
        eo = torch.randn(rows, d, generator=g).bfloat16()
        want = ref.moe_scatter_reduce(eo, s.reverse_sorted, s.sorted_weights, k,
                                      routed_scaling_factor=factor)  # fmt: skip
        plain = ref.moe_scatter_reduce(eo, s.reverse_sorted, s.sorted_weights, k)
        (eo,) = dev(eo)
        got = ops.moe_scatter_reduce(eo, rev, sw, k, routed_scaling_factor=factor)
        out = torch.full((m, d), 7.0, dtype=torch.bfloat16, device=device)
        ops.moe_scatter_reduce_out(eo, rev, sw, k, out, routed_scaling_factor=factor)
    assert torch.equal(bits(got), bits(want)) and torch.equal(bits(out), bits(want))
    assert torch.equal(bits(want), bits(plain)) == (factor == 1.0)


def test_routed_scaling_is_one_fp32_multiply_of_the_fp32_sum():
    """The spec in numbers: out = bf16_rne(fp32(acc) * fp32(factor))."""
    e, d, _i, k = SHAPES[0]
    s = ref.moe_sort(torch.tensor([[0] + [-1] * (k - 1)], dtype=torch.int32),
                     torch.ones(1, k), e, 32)  # fmt: skip
    eo = torch.zeros(s.sorted_token_ids.numel(), d, dtype=torch.bfloat16)
    eo[0, 0] = 3.0
    out = ops.moe_scatter_reduce(
        eo, s.reverse_sorted, s.sorted_weights, k, routed_scaling_factor=2.5
    )
    assert float(out[0, 0]) == 7.5 and float(out[0, 1]) == 0.0


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        (dict(expert_map="map"), TypeError, "expert_map must be a torch.Tensor"),
        (dict(expert_map=torch.zeros(4, dtype=torch.int64)), TypeError, "expert_map must have"),
        (dict(expert_map=torch.zeros(2, 2, dtype=torch.int32)), ValueError, "expert_map must be"),
        (dict(zero_buf_init=torch.zeros(4, dtype=torch.bfloat16)), ValueError, "needs zero_buf"),
        (dict(zero_buf=torch.zeros(4, dtype=torch.bfloat16),
              zero_buf_init=torch.zeros(5, dtype=torch.bfloat16)), ValueError, "the 4 elements"),
        (dict(zero_buf=torch.zeros(4, dtype=torch.bfloat16),
              zero_buf_init=torch.zeros(4, dtype=torch.float32)), TypeError, "zero_buf_init must"),
    ],
)  # fmt: skip
def test_option_errors_match_the_reference(kwargs, exc, text, cpu_module):
    e, _d, _i, k = SHAPES[0]
    ids, w = torch.zeros(2, k, dtype=torch.int32), torch.ones(2, k)
    calls = cpu_module.kernel_calls()
    with pytest.raises(exc, match=text) as mine:
        ops.moe_sort(ids, w, e, 32, **kwargs)
    with pytest.raises(exc) as theirs:
        ref.moe_sort(ids, w, e, 32, **kwargs)
    assert str(mine.value) == str(theirs.value) and cpu_module.kernel_calls() == calls


def test_scaling_factor_type_errors():
    e, d, _i, k = SHAPES[0]
    s = ref.moe_sort(torch.zeros(1, k, dtype=torch.int32), torch.ones(1, k), e, 32)
    eo = torch.zeros(s.sorted_token_ids.numel(), d, dtype=torch.bfloat16)
    for bad in ("2", None):  # (a bool is a float to torch's parser, as an int is)
        with pytest.raises(TypeError, match="routed_scaling_factor must be a float"):
            ops.moe_scatter_reduce(eo, s.reverse_sorted, s.sorted_weights, k,
                                   routed_scaling_factor=bad)  # fmt: skip
