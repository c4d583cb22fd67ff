"""The ``torch.library`` custom ops (``torch.ops.aiter_aux.*``, aiter_aux.ops).

* ``torch.compile(fullgraph=True)`` of the whole aux pipeline (sort -> quant -> sort_scales ->
  scatter_reduce / scatter_reduce_q, and the fused sort_quant) on CPU: no graph break, one
  static and one dynamic-M recompile, outputs byte-equal to :mod:`aiter_aux.reference`.
* the same with the ``_out`` ops writing preallocated buffers.
* ``torch.library.opcheck`` of the allocating sort ops on routing that fills every row
  (every op's opcheck is in test_conformance.py).
* CUDA-graph capture of the ``_out`` ops at fixed buffer sizes, replayed with new routing
  (including all ids -1); skipped where torch sees no CUDA GPU.
* autograd sees every write: versions bumped, a leaf that requires grad refused (the C++
  kernel, and the Python one where that cannot load).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops as T  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.ops._library import grad_error  # noqa: E402
from aiter_aux.pipeline import draw_routing  # noqa: E402

E, D, K = 256, 3072, 8  # catalog shape (256, 3072, 256, 8)
BM = 32


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def assert_sort_equal(got, want, block_m=BM):
    got = ref.MoeSortOutput(*(t.cpu() for t in got))
    nv = int(want.num_valid_ids[0])
    assert got.num_valid_ids.tolist() == want.num_valid_ids.tolist()
    for name, n in (("sorted_token_ids", nv), ("sorted_weights", nv), ("m_indices", nv),
                    ("sorted_expert_ids", nv // block_m), ("reverse_sorted", None)):  # fmt: skip
        g, w = getattr(got, name), getattr(want, name)
        n = w.numel() if n is None else n
        assert same(g[:n], w[:n]), name


def inputs(m: int, seed: int, not_local: str = "some"):
    """Routing (with some or all ids -1), activations and expert outputs [max_rows, D]."""
    g = torch.Generator().manual_seed(seed)
    ids, w = draw_routing(m, E, K, g)
    if not_local == "all":
        ids.fill_(-1)
    elif not_local == "some" and m:
        ids.view(-1)[torch.randint(0, m * K, (max(1, m // 3),), generator=g)] = -1
    x = (torch.randn(m, D, generator=g) * 3).bfloat16()
    rows = ref.moe_sort_capacity(m, K, E, BM)
    expert_out = torch.randn(rows, D, generator=g).bfloat16()
    return ids, w, x, expert_out


def pipeline(ids, w, x, expert_out, zero_buf):
    s = T.moe_sort(ids, w, E, BM)
    a_q, a_s = T.mxfp4_quant(x)
    scales = T.moe_sort_scales(a_s, s.sorted_token_ids, s.num_valid_ids, BM)
    fused, fq, fs = T.moe_sort_quant(ids, w, x, E, BM, zero_buf=zero_buf)
    y = T.moe_scatter_reduce(expert_out, s.reverse_sorted, s.sorted_weights, K)
    eq, es = T.mxfp4_quant(expert_out)
    yq = T.moe_scatter_reduce_q(eq, es, s.reverse_sorted, s.sorted_weights, K)
    return s, a_q, a_s, scales, fused, fq, fs, y, yq


def check_pipeline(result, ids, w, x, expert_out, zero_buf):
    s, a_q, a_s, scales, fused, fq, fs, y, yq = result
    want = ref.moe_sort(ids, w, E, BM)
    assert_sort_equal(s, want)
    assert_sort_equal(fused, want)
    wq, ws = ref.mxfp4_quant(x)
    assert same(a_q, wq) and same(a_s, ws) and same(fq, wq) and same(fs, ws)
    assert same(scales, ref.moe_sort_scales(ws, want.sorted_token_ids, want.num_valid_ids, BM))
    assert same(y, ref.moe_scatter_reduce(expert_out, want.reverse_sorted, want.sorted_weights, K))
    eq, es = ref.mxfp4_quant(expert_out)
    want_q = ref.moe_scatter_reduce_q(eq, es, want.reverse_sorted, want.sorted_weights, K)
    assert same(yq, want_q)
    assert not bool(zero_buf.view(torch.int16).any()), "zero_buf was not zeroed"


def test_compile_fullgraph_pipeline():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(pipeline, fullgraph=True)
    # 16: the static first compile; 37 and 5: M is dynamic from the second size on
    for m, seed, not_local in ((16, 1, "some"), (37, 2, "some"), (5, 3, "all"), (37, 4, "all")):
        ids, w, x, expert_out = inputs(m, seed, not_local)
        zero_buf = torch.randn(m, D).bfloat16()
        result = compiled(ids, w, x, expert_out, zero_buf)
        check_pipeline(result, ids, w, x, expert_out, zero_buf)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def pipeline_out(ids, w, x, expert_out, bufs):
    sort, a_q, a_s, scales, eq, es, y, yq = bufs
    T.moe_sort_quant_out(ids, w, x, E, BM, sort, a_q, a_s)
    T.moe_sort_scales_out(a_s, sort.sorted_token_ids, sort.num_valid_ids, BM, scales)
    T.mxfp4_quant_out(expert_out, eq, es)
    T.moe_scatter_reduce_out(expert_out, sort.reverse_sorted, sort.sorted_weights, K, y)
    T.moe_scatter_reduce_q_out(eq, es, sort.reverse_sorted, sort.sorted_weights, K, yq)


def out_buffers(m: int, device="cpu"):
    rows = ref.moe_sort_capacity(m, K, E, BM)
    bm = max(32, BM)
    i32 = dict(dtype=torch.int32, device=device)
    u8 = dict(dtype=torch.uint8, device=device)
    sort = ref.MoeSortOutput(
        torch.full((rows,), 7, **i32), torch.zeros(rows, device=device),
        torch.full((rows,), 7, **i32), torch.full((rows // BM,), 7, **i32),
        torch.zeros(2, **i32), torch.zeros(m * K, **i32),
    )  # fmt: skip
    return (
        sort, torch.zeros(m, D // 2, **u8), torch.zeros(m, D // 32, **u8),
        torch.zeros(-(-rows // bm) * bm, D // 32, **u8), torch.zeros(rows, D // 2, **u8),
        torch.zeros(rows, D // 32, **u8),
        torch.zeros(m, D, dtype=torch.bfloat16, device=device),
        torch.zeros(m, D, dtype=torch.bfloat16, device=device),
    )  # fmt: skip


def check_out_buffers(bufs, ids, w, x, expert_out):
    sort, a_q, a_s, scales, eq, es, y, yq = (b if isinstance(b, tuple) else b.cpu() for b in bufs)
    want = ref.moe_sort(ids, w, E, BM)
    assert_sort_equal(sort, want)
    wq, ws = ref.mxfp4_quant(x)
    assert same(a_q, wq) and same(a_s, ws)
    assert same(scales, ref.moe_sort_scales(ws, want.sorted_token_ids, want.num_valid_ids, BM))
    req, res = ref.mxfp4_quant(expert_out)
    assert same(eq, req) and same(es, res)
    assert same(y, ref.moe_scatter_reduce(expert_out, want.reverse_sorted, want.sorted_weights, K))
    assert same(yq, ref.moe_scatter_reduce_q(req, res, want.reverse_sorted, want.sorted_weights, K))


def test_compile_fullgraph_out_ops():
    torch._dynamo.reset()
    compiled = torch.compile(pipeline_out, fullgraph=True)
    for m, seed, not_local in ((24, 5, "some"), (24, 6, "all")):
        ids, w, x, expert_out = inputs(m, seed, not_local)
        bufs = out_buffers(m)
        compiled(ids, w, x, expert_out, bufs)
        check_out_buffers(bufs, ids, w, x, expert_out)


def full_coverage_routing(m: int = 32):
    """Every expert gets exactly one pair, so every row of max_rows holds defined values
    (num_valid_ids[0] == max_rows): opcheck compares whole outputs."""
    assert m * K == E
    ids = torch.arange(m * K, dtype=torch.int32).view(m, K)
    w = torch.rand(m, K, generator=torch.Generator().manual_seed(0))
    return ids, w


def opcheck_cases():
    ids, w = full_coverage_routing()
    m = ids.shape[0]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, D, generator=g).bfloat16()
    sort = ref.moe_sort(ids, w, E, BM)
    assert int(sort.num_valid_ids[0]) == sort.sorted_token_ids.numel()
    a_q, a_s = ref.mxfp4_quant(x)
    eo = torch.randn(sort.sorted_token_ids.numel(), D, generator=g).bfloat16()
    eq, es = ref.mxfp4_quant(eo)
    zb = lambda: torch.ones(3, 5, dtype=torch.bfloat16)  # noqa: E731
    b = out_buffers(m)
    scat = (sort.reverse_sorted, sort.sorted_weights, K)
    ops = torch.ops.aiter_aux
    return {
        "moe_sort": (ops.moe_sort, (ids, w, E, BM), {"zero_buf": zb()}),
        "moe_sort_out": (ops.moe_sort_out, (ids, w, E, BM, *b[0]), {"zero_buf": zb()}),
        "mxfp4_quant": (ops.mxfp4_quant, (x,), {}),
        "mxfp4_quant_out": (ops.mxfp4_quant_out, (x, b[1], b[2]), {}),
        "moe_sort_quant": (ops.moe_sort_quant, (ids, w, x, E, BM), {"zero_buf": zb()}),
        "moe_sort_quant_out": (
            ops.moe_sort_quant_out,
            (ids, w, x, E, BM, *b[0], b[1], b[2]),
            {"zero_buf": None},
        ),
        "moe_sort_scales": (ops.moe_sort_scales, (a_s, *sort[:1], sort[4], BM), {}),
        "moe_sort_scales_out": (ops.moe_sort_scales_out, (a_s, sort[0], sort[4], BM, b[3]), {}),
        "moe_scatter_reduce": (ops.moe_scatter_reduce, (eo, *scat), {}),
        "moe_scatter_reduce_out": (ops.moe_scatter_reduce_out, (eo, *scat, b[6]), {}),
        "moe_scatter_reduce_q": (ops.moe_scatter_reduce_q, (eq, es, *scat), {}),
        "moe_scatter_reduce_q_out": (ops.moe_scatter_reduce_q_out, (eq, es, *scat, b[7]), {}),
    }


@pytest.mark.parametrize("name", ["moe_sort", "moe_sort_quant"])
def test_opcheck_whole_sort_outputs(name):
    """opcheck's AOT-dispatch comparison of the allocating sort ops, on routing that fills
    every row (test_conformance.py leaves it out for them: rows past num_valid_ids[0] are
    uninitialised)."""
    op, args, kwargs = opcheck_cases()[name]
    torch.library.opcheck(op, args, kwargs)


def test_fake_impl_rejects_bad_input_while_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with pytest.raises(TypeError, match="x must have dtype torch.bfloat16"):
            torch.ops.aiter_aux.mxfp4_quant(torch.empty(4, D))
        with pytest.raises(ValueError, match="block_m"):
            T.moe_sort(torch.empty(4, K, dtype=torch.int32), torch.empty(4, K), E, 48)
        s = T.moe_sort(torch.empty(5, K, dtype=torch.int32), torch.empty(5, K), E, BM)
        assert s.sorted_token_ids.shape[0] == ref.moe_sort_capacity(5, K, E, BM)


# ------------------------------------------------------------------------ CUDA graphs
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_out_ops():
    """Capture the out ops once at fixed buffer sizes; replay with new routing."""
    dev = torch.device("cuda")
    m = 64
    ids0, w0, x0, eo0 = inputs(m, 10)
    static = [t.to(dev) for t in (ids0, w0, x0, eo0)]
    bufs = out_buffers(m, dev)
    sort2 = out_buffers(m, dev)[0]
    zero_buf = torch.ones(m, D, dtype=torch.bfloat16, device=dev)

    def step():
        ids, w, x, eo = static
        pipeline_out(ids, w, x, eo, bufs)
        T.moe_sort_out(ids, w, E, BM, sort2, zero_buf=zero_buf)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: loads (or builds) the module outside capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed, not_local in ((11, "some"), (12, "all"), (13, "some"), (14, "none")):
        ids, w, x, eo = inputs(m, seed, not_local)
        for dst, src in zip(static, (ids, w, x, eo), strict=True):
            dst.copy_(src)
        zero_buf.fill_(1.0)
        graph.replay()
        torch.cuda.synchronize()
        check_out_buffers(bufs, ids, w, x, eo)
        assert_sort_equal(sort2, ref.moe_sort(ids, w, E, BM))
        assert not bool(zero_buf.view(torch.int16).any())


def _padded(m_real: int, m_cap: int, seed: int):
    """Inputs of m_cap tokens whose last m_cap - m_real are padding: ids all -1, x zero."""
    ids, w, x, eo = inputs(m_cap, seed, "some")
    ids[m_real:] = -1
    x[m_real:] = 0
    return ids, w, x, eo


def check_padding_transparent(bufs, ids, w, x, eo, m_real: int):
    """The outputs of the padded problem, restricted to the real tokens, are those of the
    m_real-token problem (padding tokens take no rows)."""
    sort, a_q, a_s, _scales, _eq, _es, y, yq = (
        b if isinstance(b, tuple) else b.cpu() for b in bufs
    )
    sort = ref.MoeSortOutput(*(t.cpu() for t in sort))
    real = ref.moe_sort(ids[:m_real], w[:m_real], E, BM)
    nv = int(real.num_valid_ids[0])
    assert int(sort.num_valid_ids[0]) == nv
    pair_rows = real.sorted_token_ids[:nv] != m_real  # rows holding a real pair
    assert same(sort.sorted_token_ids[:nv][pair_rows], real.sorted_token_ids[:nv][pair_rows])
    assert same(sort.sorted_weights[:nv], real.sorted_weights[:nv])
    assert same(sort.sorted_expert_ids[: nv // BM], real.sorted_expert_ids[: nv // BM])
    assert same(sort.reverse_sorted[: m_real * K], real.reverse_sorted)
    wq, ws = ref.mxfp4_quant(x[:m_real])
    assert same(a_q[:m_real], wq) and same(a_s[:m_real], ws)
    args = (real.reverse_sorted, real.sorted_weights, K)
    eo = eo[: real.sorted_weights.numel()]  # rows of the real problem's capacity
    assert same(y[:m_real], ref.moe_scatter_reduce(eo, *args))
    req, res = ref.mxfp4_quant(eo)
    assert same(yq[:m_real], ref.moe_scatter_reduce_q(req, res, *args))


@pytest.mark.parametrize("m_real", [0, 1, 17, 64])
def test_padding_tokens_are_transparent_cpu(m_real):
    ids, w, x, eo = _padded(m_real, 64, 20 + m_real)
    bufs = out_buffers(64)
    pipeline_out(ids, w, x, eo, bufs)
    check_padding_transparent(bufs, ids, w, x, eo, m_real)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replay_with_fewer_tokens_than_captured():
    """A graph captured at M=64, replayed for 1..64 real tokens padded with ids -1 (how a
    serving engine reuses one graph for every batch up to its size)."""
    dev = torch.device("cuda")
    m_cap = 64
    static = [t.to(dev) for t in _padded(m_cap, m_cap, 30)]
    bufs = out_buffers(m_cap, dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pipeline_out(*static, bufs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pipeline_out(*static, bufs)
    for m_real in (0, 1, 5, 33, 64):
        ids, w, x, eo = _padded(m_real, m_cap, 40 + m_real)
        for dst, src in zip(static, (ids, w, x, eo), strict=True):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        check_out_buffers(bufs, ids, w, x, eo)
        check_padding_transparent(bufs, ids, w, x, eo, m_real)


def _backward_over(write):
    """``write(out)`` under no_grad between the forward and the backward of ``out * out``."""
    a = torch.randn(4, 64, requires_grad=True)
    out = a * 1.0
    y = (out * out).sum()
    with torch.no_grad():
        write(out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_out_write_invalidates_saved_tensors():
    """An ``_out`` op that overwrites a tensor autograd saved makes backward raise (as
    torch's own ``out=`` ops), instead of silently using the new values."""
    inp = torch.randn(4, 8, 64)
    _backward_over(lambda out: T.moe_sum_out(inp, out))
    _backward_over(lambda out: torch.ops.aiter_aux.moe_sum_out(inp, out))
    _backward_over(lambda out: torch.ops.aiter_aux.moe_sum_out.default(inp, out))


def test_torch_op_refuses_a_leaf_that_requires_grad():
    leaf = torch.zeros(4, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match=re.escape(str(grad_error("moe_sum_out")))):
        torch.ops.aiter_aux.moe_sum_out(torch.randn(4, 8, 64), leaf)
    assert not leaf.detach().any()
    with pytest.raises(RuntimeError, match="requires grad"):  # torch's own out= rule
        torch.add(leaf, 1, out=leaf)


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference"])
def test_out_write_bumps_versions_in_every_mode(mode):
    """The wrapper and the torch op bump alike in every mode; in inference mode a normal
    tensor is bumped too (torch's in-place ops do the same)."""
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
           "inference": torch.inference_mode}[mode]  # fmt: skip
    inp, out = torch.randn(4, 8, 64), torch.empty(4, 64)
    for call in (T.moe_sum_out, torch.ops.aiter_aux.moe_sum_out):
        v = out._version
        with ctx():
            call(inp, out)
        assert out._version > v
        assert same(out, ref.moe_sum(inp))


def test_written_versions_in_python_where_the_cpp_kernel_cannot_load():
    """Where csrc/autograd cannot be built or loaded, the ops bump and refuse the same way
    through the Python kernel."""
    code = (
        "import torch\n"
        "from aiter_aux.jit import written_versions\n"
        "written_versions.load = lambda: 'no compiler'\n"
        "import aiter_aux\n"
        "from aiter_aux.ops import _library\n"
        "inp = torch.randn(4, 8, 64)\n"
        "for call in (aiter_aux.moe_sum_out, torch.ops.aiter_aux.moe_sum_out):\n"
        "    a = torch.randn(4, 64, requires_grad=True)\n"
        "    out = a * 1.0\n"
        "    y = (out * out).sum()\n"
        "    with torch.no_grad():\n"
        "        call(inp, out)\n"
        "    try:\n"
        "        y.backward()\n"
        "        raise SystemExit('backward ran over overwritten values')\n"
        "    except RuntimeError as e:\n"
        "        assert 'modified by an inplace operation' in str(e), e\n"
        "assert _library.register_written_versions() == 'no compiler'\n"
        "leaf = torch.zeros(4, 64, requires_grad=True)\n"
        "try:\n"
        "    torch.ops.aiter_aux.moe_sum_out(inp, leaf)\n"
        "    raise SystemExit('wrote a leaf that requires grad')\n"
        "except RuntimeError as e:\n"
        "    assert 'requires grad' in str(e), e\n"
        "assert not leaf.detach().any()\n"
        "# a written option passed as None by position before a given one (zero_buf before\n"
        "# sorted_scales: the wrappers pass non-default options by position)\n"
        "lg, x = torch.randn(3, 8), torch.randn(3, 256).bfloat16()\n"
        "kw = dict(scoring='sigmoid', sorted_scales=torch.empty(256, 8, dtype=torch.uint8))\n"
        "got = aiter_aux.moe_route_sort_quant(lg, x, 2, 8, 32, **kw)\n"
        "from aiter_aux import reference\n"
        "want = reference.moe_route_sort_quant(lg, x, 2, 8, 32, scoring='sigmoid')\n"
        "assert torch.equal(got[1], want[1]) and torch.equal(got[3], want[3])\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
