"""The decode pipeline in one call: ``moe_sort_quant[_fp8]`` with the
optional ``sorted_scales`` buffer also writes what ``moe_sort_scales_out`` would write from the
call's own outputs.  Every backend (CPU everywhere, CUDA where a GPU is present) against the
reference, byte for byte, with poisoned outputs and a guard region; the reference against the
two separate ops; the checks (before any kernel runs, the reference's messages); the fake
implementations (opcheck, FakeTensorMode, torch.compile)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# catalog shapes (expert, model_dim, topk): topk 9 and 8
SHAPES = {9: (257, 7168, 9), 8: (256, 3072, 8)}
POISON = 0xA5
GUARD = 37  # rows past out_rows that must keep their poison
QUANTS = ("mxfp4", "mxfp8")


@pytest.fixture(params=DEVICES)
def device(request, cpu_module):
    return torch.device(request.param)


def gen(seed=None):
    g = torch.Generator()
    g.manual_seed(int(torch.randint(0, 2**62, ()).item()) if seed is None else seed)
    return g


def out_rows(max_rows, bm):
    b = max(32, bm)
    return (max_rows + b - 1) // b * b


def bits(t):
    return t.detach().cpu().contiguous().view(torch.uint8)


def routing(m, e, k, g, device, bad_ids=False):
    """Random routing: distinct experts per token (a router's top-k); with ``bad_ids`` some
    ids outside [0, e) (not local)."""
    ids = torch.rand(m, e, generator=g).argsort(dim=1)[:, :k].to(torch.int32)
    if bad_ids and m:
        mask = torch.rand(m, k, generator=g) < 0.2
        ids[mask] = torch.randint(-3, 2 * e, (int(mask.sum()),), generator=g, dtype=torch.int32)
    w = torch.rand(m, k, generator=g)
    return ids.to(device), w.to(device)


def poisoned(shape, device, dtype=torch.uint8):
    n = 1
    for s in shape:
        n *= s
    size = torch.tensor([], dtype=dtype).element_size()
    buf = torch.full((n * size,), POISON, dtype=torch.uint8, device=device)
    return buf.view(dtype).view(*shape)


def sort_buffers(m, k, e, bm, device):
    rows = ref.moe_sort_capacity(m, k, e, bm)
    return ref.MoeSortOutput(
        poisoned((rows,), device, torch.int32), poisoned((rows,), device, torch.float32),
        poisoned((rows,), device, torch.int32), poisoned((rows // bm,), device, torch.int32),
        poisoned((2,), device, torch.int32), poisoned((m * k,), device, torch.int32),
    )  # fmt: skip


def same_sort(got, want, bm):
    n = int(want.num_valid_ids[0])
    for f in ("sorted_token_ids", "sorted_weights", "m_indices"):
        assert torch.equal(bits(getattr(got, f)[:n]), bits(getattr(want, f)[:n])), f
    assert torch.equal(
        bits(got.sorted_expert_ids[: n // bm]), bits(want.sorted_expert_ids[: n // bm])
    )
    assert torch.equal(bits(got.num_valid_ids), bits(want.num_valid_ids))
    assert torch.equal(bits(got.reverse_sorted), bits(want.reverse_sorted))


def run_both(form, quant, ids, w, x, e, bm, ss_ours, ss_ref, device, **kw):
    """The fused call on the module and on the reference (CPU copies), each into its own
    poisoned buffers; returns ``(ours, theirs)`` as ``(sort, a_q, a_scale)``."""
    m, k = ids.shape
    d = x.shape[1]
    cpu = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
    if form == "alloc":
        ours = ops.moe_sort_quant(ids, w, x, e, bm, quant_dtype=quant, sorted_scales=ss_ours, **kw)
        theirs = ref.moe_sort_quant(ids.cpu(), w.cpu(), x.cpu(), e, bm, quant_dtype=quant,
                                    sorted_scales=ss_ref, **cpu)  # fmt: skip
        return ours, theirs
    cq = d if quant == "mxfp8" else d // 2
    bufs = []
    for dev in (device, torch.device("cpu")):
        bufs.append((sort_buffers(m, k, e, bm, dev), poisoned((m, cq), dev),
                     poisoned((m, d // 32), dev)))  # fmt: skip
    ours = ops.moe_sort_quant_out(ids, w, x, e, bm, *bufs[0], quant_dtype=quant,
                                  sorted_scales=ss_ours, **kw)  # fmt: skip
    theirs = ref.moe_sort_quant_out(ids.cpu(), w.cpu(), x.cpu(), e, bm, *bufs[1],
                                    quant_dtype=quant, sorted_scales=ss_ref, **cpu)  # fmt: skip
    return ours, theirs


def check_call(form, quant, m, k, bm, device, g, bad_ids=False, **kw):
    e, d, _ = SHAPES[k]
    ids, w = routing(m, e, k, g, device, bad_ids)
    x = (torch.randn(m, d, generator=g) * 3).bfloat16().to(device)
    rows = out_rows(ref.moe_sort_capacity(m, k, e, bm), bm)
    ss = poisoned((rows + GUARD, d // 32), device)
    ss_ref = poisoned((rows + GUARD, d // 32), torch.device("cpu"))
    kw = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
    (s1, q1, sc1), (s2, q2, sc2) = run_both(form, quant, ids, w, x, e, bm, ss, ss_ref, device,
                                            **kw)  # fmt: skip
    same_sort(s1, s2, bm)
    assert torch.equal(bits(q1), bits(q2)) and torch.equal(bits(sc1), bits(sc2))
    # every byte of the first out_rows rows, and the guard rows keep their poison
    assert torch.equal(bits(ss), bits(ss_ref)), "sorted_scales differs from the reference"
    assert bool((bits(ss[rows:]) == POISON).all()), "a guard row was written"
    # the reference is the separate op on the call's outputs
    sep = ref.moe_sort_scales(sc2, s2.sorted_token_ids, s2.num_valid_ids, bm)
    assert torch.equal(ss_ref[:rows], sep)
    return ss


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("form", ["alloc", "out"])
@pytest.mark.parametrize("bm", [16, 32, 64, 128])
@pytest.mark.parametrize("m,k", [(0, 9), (1, 9), (2, 8), (7, 9), (64, 8), (100, 9), (600, 8)])
def test_sorted_scales_against_reference(m, k, bm, form, quant, device):
    """Random routing, M*topk from 0 to 4800 pairs (the GPU's <=16, <=1024 and larger
    paths), every block_m, both formats and both forms; at block_m 64 some ids are not
    local (negative or >= num_experts)."""
    check_call(form, quant, m, k, bm, device, gen(), bad_ids=bm == 64)


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("form", ["alloc", "out"])
@pytest.mark.parametrize("m", [1, 13, 300])
def test_sorted_scales_with_expert_map_and_zero_buf(m, form, quant, device):
    """expert_map with non-local ids (global ids past the map, negative map entries) and
    zero_buf / zero_buf_init given with sorted_scales."""
    g = gen()
    e, d, k = SHAPES[9]
    num_global = 2 * e
    emap = torch.full((num_global,), -1, dtype=torch.int32)
    mine = torch.randperm(num_global, generator=g)[:e]
    emap[mine] = torch.randperm(e, generator=g).to(torch.int32)
    emap[mine[::7]] = -1
    ids = torch.randint(-2, num_global + 3, (m, k), generator=g, dtype=torch.int32)
    w = torch.rand(m, k, generator=g)
    x = torch.randn(m, d, generator=g).bfloat16()
    init = torch.randn(m, d, generator=g).bfloat16()
    zb = poisoned((m, d), device, torch.bfloat16)
    bm = 32
    rows = out_rows(ref.moe_sort_capacity(m, k, e, bm), bm)
    ss, ss_ref = poisoned((rows + GUARD, d // 32), device), poisoned((rows + GUARD, d // 32), "cpu")
    to = lambda t: t.to(device)  # noqa: E731
    ours = run_both(form, quant, to(ids), to(w), to(x), e, bm, ss, ss_ref, device,
                    expert_map=to(emap), zero_buf=zb, zero_buf_init=to(init))  # fmt: skip
    same_sort(ours[0][0], ours[1][0], bm)
    assert torch.equal(bits(ss), bits(ss_ref))
    assert bool((bits(ss[rows:]) == POISON).all())
    assert torch.equal(bits(zb), bits(init)), "zero_buf was not set to zero_buf_init"


def test_reference_is_the_two_ops():
    """The reference's one call equals moe_sort_quant_out then moe_sort_scales_out."""
    g = gen(5)
    e, d, k = SHAPES[9]
    ids, w = routing(40, e, k, g, "cpu")
    x = torch.randn(40, d, generator=g).bfloat16()
    for bm in (16, 128):
        rows = out_rows(ref.moe_sort_capacity(40, k, e, bm), bm)
        ss = torch.full((rows, d // 32), POISON, dtype=torch.uint8)
        s, q, sc = ref.moe_sort_quant(ids, w, x, e, bm, sorted_scales=ss)
        assert torch.equal(ss, ref.moe_sort_scales(sc, s.sorted_token_ids, s.num_valid_ids, bm))


# ---------------------------------------------------------------------------------- errors
E9, D9, K9 = SHAPES[9]
M_ERR, BM_ERR = 5, 32


def _err_case(device="cpu"):
    g = gen(11)
    ids, w = routing(M_ERR, E9, K9, g, device)
    x = torch.randn(M_ERR, D9, generator=g).bfloat16().to(device)
    rows = out_rows(ref.moe_sort_capacity(M_ERR, K9, E9, BM_ERR), BM_ERR)
    return ids, w, x, rows


def _assert_refused(call_ours, call_ref, exc, match, watched, cpu_module):
    before = [bits(t).clone() for t in watched]
    calls = cpu_module.kernel_calls()
    with pytest.raises(exc, match=match) as mine:
        call_ours()
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    for t, b in zip(watched, before, strict=True):
        assert torch.equal(bits(t), b), "a buffer was written"
    with pytest.raises(exc) as theirs:
        call_ref()
    assert str(theirs.value) == str(mine.value)


def _bad_buffers(rows):
    cols = D9 // 32
    big = torch.full((rows + 8, cols), POISON, dtype=torch.uint8)
    return {
        "wrong dtype": (torch.zeros(rows, cols, dtype=torch.int8), TypeError, "dtype"),
        "int32": (torch.zeros(rows, cols, dtype=torch.int32), TypeError, "dtype"),
        "too few rows": (torch.zeros(rows - 1, cols, dtype=torch.uint8), ValueError,
                         rf"buffer too small: sorted_scales needs >= {rows * cols} elements, "
                         rf"got {(rows - 1) * cols} \(>= {rows} rows of {cols}\)"),
        "wrong columns": (torch.zeros(rows, cols + 1, dtype=torch.uint8), ValueError,
                          "sorted_scales must have 224 columns"),
        "1-D": (torch.zeros(rows * cols, dtype=torch.uint8), ValueError, "2-D"),
        "not contiguous": (big[:, :].t().contiguous().t()[:rows], ValueError, "contiguous"),
        "not a tensor": ([0] * 3, TypeError, "sorted_scales must be a torch.Tensor"),
    }  # fmt: skip


BAD = list(_bad_buffers(1000))


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("form", ["alloc", "out"])
@pytest.mark.parametrize("case", BAD)
def test_bad_sorted_scales_is_refused_before_any_kernel(case, form, quant, cpu_module):
    ids, w, x, rows = _err_case()
    buf, exc, match = _bad_buffers(rows)[case]
    watched = [buf] if isinstance(buf, torch.Tensor) else []
    if form == "alloc":
        fn = lambda mod: mod.moe_sort_quant(ids, w, x, E9, BM_ERR, quant_dtype=quant,  # noqa: E731
                                            sorted_scales=buf)  # fmt: skip
    else:
        cq = D9 if quant == "mxfp8" else D9 // 2
        outs = (sort_buffers(M_ERR, K9, E9, BM_ERR, "cpu"), poisoned((M_ERR, cq), "cpu"),
                poisoned((M_ERR, D9 // 32), "cpu"))  # fmt: skip
        watched += [outs[1], outs[2], *outs[0]]
        fn = lambda mod: mod.moe_sort_quant_out(ids, w, x, E9, BM_ERR, *outs,  # noqa: E731
                                                quant_dtype=quant, sorted_scales=buf)  # fmt: skip
    _assert_refused(lambda: fn(ops), lambda: fn(ref), exc, match, watched, cpu_module)


@pytest.mark.parametrize("quant", QUANTS)
def test_sorted_scales_overlapping_a_scale_is_refused(quant, cpu_module):
    ids, w, x, rows = _err_case()
    cols = D9 // 32
    cq = D9 if quant == "mxfp8" else D9 // 2
    pool = torch.full((rows + M_ERR, cols), POISON, dtype=torch.uint8)
    a_scale = pool[rows - 2 : rows - 2 + M_ERR]  # its first 2 rows are sorted_scales' last
    ss = pool[:rows]
    sort = sort_buffers(M_ERR, K9, E9, BM_ERR, "cpu")
    a_q = poisoned((M_ERR, cq), "cpu")

    def fn(mod):
        return mod.moe_sort_quant_out(ids, w, x, E9, BM_ERR, sort, a_q, a_scale,
                                      quant_dtype=quant, sorted_scales=ss)  # fmt: skip

    _assert_refused(lambda: fn(ops), lambda: fn(ref), ValueError,
                    "sorted_scales overlaps a_scale in memory", [pool, a_q, *sort],
                    cpu_module)  # fmt: skip


@pytest.mark.parametrize("other", ["sorted_token_ids", "a_q", "zero_buf"])
def test_sorted_scales_overlapping_other_buffers_is_refused(other, cpu_module):
    ids, w, x, rows = _err_case()
    cols = D9 // 32
    pool = torch.full((2 * rows * cols + 4 * D9 * M_ERR,), POISON, dtype=torch.uint8)
    ss = pool[: rows * cols].view(rows, cols)
    sort = sort_buffers(M_ERR, K9, E9, BM_ERR, "cpu")
    a_q = poisoned((M_ERR, D9 // 2), "cpu")
    a_scale = poisoned((M_ERR, cols), "cpu")
    zb = None
    if other == "sorted_token_ids":
        n = sort.sorted_token_ids.numel()
        sort = sort._replace(sorted_token_ids=pool[4 : 4 + 4 * n].view(torch.int32))
    elif other == "a_q":
        a_q = pool[rows * cols - 8 : rows * cols - 8 + M_ERR * D9 // 2].view(M_ERR, D9 // 2)
    else:
        zb = pool[rows * cols - 2 :][: 2 * M_ERR * D9].view(torch.bfloat16)

    def fn(mod):
        return mod.moe_sort_quant_out(ids, w, x, E9, BM_ERR, sort, a_q, a_scale, zero_buf=zb,
                                      sorted_scales=ss)  # fmt: skip

    _assert_refused(lambda: fn(ops), lambda: fn(ref), ValueError,
                    f"(sorted_scales overlaps {other}|{other} overlaps sorted_scales) in memory",
                    [pool], cpu_module)  # fmt: skip


def test_sorted_scales_overlapping_zero_buf_in_the_allocating_form(cpu_module):
    ids, w, x, rows = _err_case()
    cols = D9 // 32
    pool = torch.full((rows * cols + 64,), POISON, dtype=torch.uint8)
    ss = pool[: rows * cols].view(rows, cols)
    zb = pool[rows * cols - 32 :].view(torch.bfloat16)

    def fn(mod):
        return mod.moe_sort_quant(ids, w, x, E9, BM_ERR, zero_buf=zb, sorted_scales=ss)

    _assert_refused(lambda: fn(ops), lambda: fn(ref), ValueError,
                    "sorted_scales overlaps zero_buf in memory", [pool], cpu_module)  # fmt: skip


def test_sorted_scales_needs_model_dim_multiple_of_256(cpu_module):
    """model_dim = 160 (no such instance): refused for sorted_scales before the lookup."""
    g = gen(2)
    ids, w = routing(3, E9, K9, g, "cpu")
    x = torch.randn(3, 160, generator=g).bfloat16()
    rows = out_rows(ref.moe_sort_capacity(3, K9, E9, 16), 16)
    ss = torch.full((rows, 5), POISON, dtype=torch.uint8)

    def fn(mod):
        return mod.moe_sort_quant(ids, w, x, E9, 16, sorted_scales=ss)

    msg = "sorted_scales needs model_dim a multiple of 256"
    _assert_refused(lambda: fn(ops), lambda: fn(ref), ValueError, msg, [ss], cpu_module)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", ["alloc", "out"])
def test_sorted_scales_on_another_device_is_refused(form, cpu_module):
    ids, w, x, rows = _err_case("cuda")
    ss = torch.full((rows, D9 // 32), POISON, dtype=torch.uint8)  # CPU
    if form == "alloc":
        fn = lambda mod: mod.moe_sort_quant(ids, w, x, E9, BM_ERR, sorted_scales=ss)  # noqa: E731
    else:
        outs = (sort_buffers(M_ERR, K9, E9, BM_ERR, "cuda"), poisoned((M_ERR, D9 // 2), "cuda"),
                poisoned((M_ERR, D9 // 32), "cuda"))  # fmt: skip
        fn = lambda mod: mod.moe_sort_quant_out(ids, w, x, E9, BM_ERR, *outs,  # noqa: E731
                                                sorted_scales=ss)  # fmt: skip
    before = ss.clone()
    with pytest.raises(ValueError, match="one device: sorted_scales is on cpu") as mine:
        fn(ops)
    assert torch.equal(ss, before)
    with pytest.raises(ValueError) as theirs:
        fn(ref)
    assert str(theirs.value) == str(mine.value)


# ------------------------------------------------------------------------ fakes / compile
def _opcheck_case(quant):
    e, d, k = SHAPES[8]
    m = e // k  # every expert one pair: every sorted row defined, opcheck compares all
    ids = torch.arange(m * k, dtype=torch.int32).view(m, k)
    g = gen(3)
    w = torch.rand(m, k, generator=g)
    x = (torch.randn(m, d, generator=g) * 5).bfloat16()
    bm = 16
    mr = ref.moe_sort_capacity(m, k, e, bm)
    ss = torch.zeros(out_rows(mr, bm), d // 32, dtype=torch.uint8)
    cq = d if quant == "mxfp8" else d // 2
    i32 = lambda n: torch.empty(n, dtype=torch.int32)  # noqa: E731
    outs = (
        i32(mr),
        torch.empty(mr),
        i32(mr),
        i32(mr // bm),
        i32(2),
        i32(m * k),
        torch.empty(m, cq, dtype=torch.uint8),
        torch.empty(m, d // 32, dtype=torch.uint8),
    )
    return (ids, w, x, e, bm), outs, ss  # fmt: skip


@pytest.mark.parametrize("name", ["moe_sort_quant", "moe_sort_quant_out", "moe_sort_quant_fp8",
                                  "moe_sort_quant_fp8_out"])  # fmt: skip
def test_opcheck_with_sorted_scales(name, cpu_module):
    args, outs, ss = _opcheck_case("mxfp8" if "fp8" in name else "mxfp4")
    op = getattr(torch.ops.aiter_aux, name).default
    if not name.endswith("_out"):
        outs = ()
    torch.library.opcheck(op, (*args, *outs), {"sorted_scales": ss})


def test_fake_impl_checks_sorted_scales_while_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    e, d, k = SHAPES[9]
    with FakeTensorMode():
        ids, w = torch.empty(4, k, dtype=torch.int32), torch.empty(4, k)
        x = torch.empty(4, d, dtype=torch.bfloat16)
        rows = out_rows(ref.moe_sort_capacity(4, k, e, 32), 32)
        with pytest.raises(TypeError, match="sorted_scales must have dtype torch.uint8"):
            torch.ops.aiter_aux.moe_sort_quant(
                ids, w, x, e, 32, sorted_scales=torch.empty(rows, d // 32, dtype=torch.int32)
            )
        with pytest.raises(ValueError, match="buffer too small: sorted_scales"):
            torch.ops.aiter_aux.moe_sort_quant_fp8(
                ids, w, x, e, 32, sorted_scales=torch.empty(rows - 1, d // 32, dtype=torch.uint8)
            )
        r = torch.ops.aiter_aux.moe_sort_quant(
            ids, w, x, e, 32, sorted_scales=torch.empty(rows, d // 32, dtype=torch.uint8)
        )
        assert len(r) == 8  # sorted_scales is written, not returned


@pytest.mark.parametrize("quant", QUANTS)
def test_torch_compile_one_call_pipeline(quant, cpu_module):
    """torch.compile(fullgraph=True) of the one-call decode step: no graph break, same bytes."""
    e, d, k = SHAPES[9]
    g = gen(7)
    m, bm = 9, 32
    ids, w = routing(m, e, k, g, "cpu")
    x = torch.randn(m, d, generator=g).bfloat16()
    rows = out_rows(ref.moe_sort_capacity(m, k, e, bm), bm)

    def step(ids, w, x, ss):
        s, q, sc = ops.moe_sort_quant(ids, w, x, e, bm, quant_dtype=quant, sorted_scales=ss)
        return s.num_valid_ids, q, sc

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    ss = torch.full((rows, d // 32), POISON, dtype=torch.uint8)
    nv, q, sc = compiled(ids, w, x, ss)
    want = torch.full((rows, d // 32), POISON, dtype=torch.uint8)
    s2, q2, sc2 = ref.moe_sort_quant(ids, w, x, e, bm, quant_dtype=quant, sorted_scales=want)
    assert torch.equal(ss, want) and torch.equal(q, q2) and torch.equal(sc, sc2)
    assert torch.equal(nv, s2.num_valid_ids)
