"""Programmatic dependent launch (PDL): ``AITER_AUX_PDL`` and ``AuxModule.set_pdl``.

* the switch of a loaded module (CPU module: the C functions exist and keep the value; the
  loader applies the environment variable);
* CUDA GPU, PDL on: chains of the aux ops with torch neighbours -- torch kernels writing an
  op's inputs right before it, reading its outputs right after it, reading a buffer the
  next op overwrites, and aux ops reading each other's outputs -- eagerly, in a CUDA graph
  (captured with PDL on, replayed with new inputs) and under ``torch.compile``; every
  output equals the reference byte for byte and the bytes of the same chain with PDL off.
  Every sort path (micro, tiny, mid, large), both scatter kernels (small and large M) and
  the decode pipeline's one launch run.  Skipped without a CUDA GPU.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import env  # noqa: E402
from aiter_aux import ops as T  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.pipeline import draw_routing  # noqa: E402

E, D, K = 256, 3072, 8  # catalog shape (256, 3072, 256, 8)
BM = 32
# sort paths at topk 8 (gpu/sort.h): micro (M = 1: 8 pairs), tiny (3, 40), mid (300, 2000),
# large (8000: 64000 pairs); scatter: small-M kernels up to 256 (MXFP4) / 1024 (bf16) tokens
SIZES = [1, 3, 40, 300, 2000, 8000]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(
        a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8)
    )


# ------------------------------------------------------------------------- the switch
def test_switch_of_a_loaded_module(cpu_module, monkeypatch):
    module = cpu_module
    before = module.pdl()
    try:
        module.set_pdl(True)
        assert module.pdl() is True
        module.set_pdl(False)
        assert module.pdl() is False
    finally:
        module.set_pdl(before)
    monkeypatch.setenv("AITER_AUX_PDL", "on")
    assert env.get("AITER_AUX_PDL") is True
    monkeypatch.setenv("AITER_AUX_PDL", "maybe")
    with pytest.raises(env.EnvError, match="AITER_AUX_PDL"):
        env.get("AITER_AUX_PDL")
    monkeypatch.delenv("AITER_AUX_PDL")
    assert env.get("AITER_AUX_PDL") is env.PDL_DEFAULT


def test_loader_applies_the_variable(cpu_module, monkeypatch):
    """AuxModule sets the switch from AITER_AUX_PDL when it loads (checked on a second load
    object of the already-loaded CPU module file: the same library, so the same switch)."""
    from aiter_aux.jit.module import AuxModule

    module = cpu_module
    before = module.pdl()
    try:
        for value, want in (("1", True), ("0", False)):
            monkeypatch.setenv("AITER_AUX_PDL", value)
            AuxModule(cpu_module.path)
            assert module.pdl() is want
    finally:
        module.set_pdl(before)


# ------------------------------------------------------------------------- CUDA chains
@contextlib.contextmanager
def pdl(on: bool):
    from aiter_aux.jit.spec import loaded_modules

    module = loaded_modules()["cuda"]
    before = module.pdl()
    module.set_pdl(on)
    try:
        yield
    finally:
        module.set_pdl(before)


def inputs(m: int, seed: int):
    """Routing (some ids -1), activations, expert outputs [max_rows, D], a bf16 buffer."""
    g = torch.Generator().manual_seed(seed)
    ids, w = draw_routing(m, E, K, g)
    ids.view(-1)[torch.randint(0, m * K, (max(1, m // 3),), generator=g)] = -1
    x = (torch.randn(m, D, generator=g) * 3).bfloat16()
    rows = ref.moe_sort_capacity(m, K, E, BM)
    expert_out = torch.randn(rows, D, generator=g).bfloat16()
    old = torch.randn(m, D, generator=g).bfloat16()
    return ids, w, x, expert_out, old


def chain(ids, w, x, expert_out, old, y_buf):
    """The aux ops between torch kernels.  ``y_buf`` holds ``old`` on entry; a torch kernel
    reads it right before moe_scatter_reduce_out overwrites it."""
    ids2 = ids + 0  # torch writes the sort's input right before it
    s = T.moe_sort(ids2, w, E, BM)
    sti = s.sorted_token_ids * 1  # torch reads the sort's output right after it
    a_q, a_s = T.mxfp4_quant(x * 1)
    aq2 = a_q ^ 0  # ... the quant's
    scales = T.moe_sort_scales(a_s, s.sorted_token_ids, s.num_valid_ids, BM)  # aux -> aux
    fused, fq, fs = T.moe_sort_quant(ids2, w, x, E, BM)
    dec_scales = torch.full_like(scales, 0xA5)
    T.moe_sort_quant(ids, w, x, E, BM, sorted_scales=dec_scales)  # decode: one launch
    q8, s8 = T.mxfp8_quant(x)
    y = T.moe_scatter_reduce(expert_out, s.reverse_sorted, s.sorted_weights, K)
    y2 = y + y  # scatter -> add
    eq, es = T.mxfp4_quant(expert_out)
    yq = T.moe_scatter_reduce_q(eq, es, s.reverse_sorted, s.sorted_weights, K)
    seen = y_buf.view(torch.int16) + 0  # reads y_buf; the next kernel overwrites it
    T.moe_scatter_reduce_out(expert_out, fused.reverse_sorted, fused.sorted_weights, K, y_buf)
    return (*s, sti, a_q, a_s, aq2, scales, *fused, fq, fs, dec_scales, q8, s8, y, y2, yq,
            seen, y_buf)  # fmt: skip


def expected(ids, w, x, expert_out, old):
    s = ref.moe_sort(ids, w, E, BM)
    a_q, a_s = ref.mxfp4_quant(x)
    scales = ref.moe_sort_scales(a_s, s.sorted_token_ids, s.num_valid_ids, BM)
    q8, s8 = ref.mxfp8_quant(x)
    y = ref.moe_scatter_reduce(expert_out, s.reverse_sorted, s.sorted_weights, K)
    eq, es = ref.mxfp4_quant(expert_out)
    yq = ref.moe_scatter_reduce_q(eq, es, s.reverse_sorted, s.sorted_weights, K)
    return (*s, s.sorted_token_ids, a_q, a_s, a_q, scales, *s, a_q, a_s, scales, q8, s8, y,
            y + y, yq, old.view(torch.int16), y)  # fmt: skip


NAMES = [f"sort.{f}" for f in ref.MoeSortOutput._fields] + [
    "torch(sorted_token_ids)", "a_q", "a_scale", "torch(a_q)", "sorted_scales"] + [
    f"fused.{f}" for f in ref.MoeSortOutput._fields] + [
    "fused.a_q", "fused.a_scale", "decode sorted_scales", "mxfp8 a_q", "mxfp8 a_scale", "y",
    "torch(y + y)", "y_q", "torch(the old y_buf)", "y_buf"]  # fmt: skip


def valid_prefix(name: str, t, nv: int, m: int):
    """The part of a sort output the spec defines (rows past num_valid_ids are unspecified)."""
    field = name.split(".")[-1]
    if field in ("sorted_token_ids", "sorted_weights", "m_indices") or name.startswith("torch(s"):
        return t[:nv]
    if field == "sorted_expert_ids":
        return t[: nv // BM]
    return t


def assert_chain(got, want, nv: int, m: int, what: str):
    assert len(got) == len(want) == len(NAMES)
    bad = [
        n
        for n, g, w in zip(NAMES, got, want, strict=True)
        if not same(valid_prefix(n, g, nv, m), valid_prefix(n, w, nv, m))
    ]
    assert not bad, f"{what}: {bad}"


def to(dev, *ts):
    return [t.to(dev) for t in ts]


@pytest.mark.parametrize("m", [1, 40])
def test_chain_on_cpu(cpu_module, m):
    """The chain and its expected bytes on the CPU module (where the switch changes nothing):
    the harness of the GPU tests below."""
    args = inputs(m, 50 + m)
    y_buf = args[4].clone()
    want = expected(*args)
    assert_chain(chain(*args, y_buf), want, int(want[4][0]), m, f"cpu M={m}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", SIZES)
def test_eager_chain_pdl_on_and_off(m):
    dev = torch.device("cuda")
    args = inputs(m, 100 + m)
    want = expected(*args)
    nv = int(want[4][0])
    outs = {}
    for on in (True, False, True):
        gpu = to(dev, *args)
        y_buf = gpu[4].clone()
        T.mxfp4_quant(gpu[2][:1])  # loads the module (the switch needs it)
        with pdl(on):
            got = chain(*gpu, y_buf)
            torch.cuda.synchronize()
        assert_chain(got, want, nv, m, f"M={m} pdl={on}")
        outs[on] = [t.cpu() for t in got]
    assert not [n for n, a, b in zip(NAMES, outs[True], outs[False], strict=True)
                if not same(valid_prefix(n, a, nv, m), valid_prefix(n, b, nv, m))]  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [1, 40, 2000])
def test_cuda_graph_chain_pdl_on(m):
    """Captured with PDL on (the programmatic edges are part of the graph), replayed with new
    inputs of the same sizes."""
    dev = torch.device("cuda")
    static = to(dev, *inputs(m, 200 + m))
    y_buf = static[4].clone()
    T.mxfp4_quant(static[2][:1])
    with pdl(True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(*static, y_buf)  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(*static, y_buf)
    for seed in (201, 202, 203):  # replayed with PDL off too: the edges are in the graph
        args = inputs(m, seed + m)
        for dst, src in zip(static, args, strict=True):
            dst.copy_(src)
        y_buf.copy_(args[4])
        with pdl(seed != 202):
            graph.replay()
        torch.cuda.synchronize()
        want = expected(*args)
        assert_chain(got, want, int(want[4][0]), m, f"M={m} replay seed {seed}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_chain_pdl_on(mode):
    """torch.compile of the chain (Inductor's kernels as the neighbours; reduce-overhead
    also captures CUDA graphs)."""
    dev = torch.device("cuda")
    torch._dynamo.reset()
    compiled = torch.compile(chain, fullgraph=True, mode=mode)
    m = 40
    T.mxfp4_quant(torch.zeros(1, D, dtype=torch.bfloat16, device=dev))
    with pdl(True):
        for seed in (301, 302, 303):  # reduce-overhead: warm-up, record, replay
            args = inputs(m, seed)
            gpu = to(dev, *args)
            y_buf = gpu[4].clone()
            got = [t.clone() for t in compiled(*gpu, y_buf)]
            torch.cuda.synchronize()
            want = expected(*args)
            assert_chain(got, want, int(want[4][0]), m, f"{mode} seed {seed}")
