"""vLLM's ``moe_sum`` and SGLang's ``moe_sum_reduce`` drop-ins (aiter_aux.compat.vllm /
.sglang) and the native ``moe_sum`` op, on the compiled module, against the references
(aiter_aux.reference.compat and aiter_aux.reference.moe_sum): the same bytes in poisoned,
guarded outputs, and the same errors before any kernel runs.  CPU always; CUDA where a
device is present."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as R  # noqa: E402
from aiter_aux.compat import sglang, vllm  # noqa: E402
from aiter_aux.compat.vllm import custom_ops  # noqa: E402
from aiter_aux.reference import compat as RC  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]  # fmt: skip
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
POISON, GUARD = 0x5A, 64  # guard bytes on each side of an output
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
I32 = torch.int32
MAP = [0, -1, 3, 2, -7, 1, 0, 4, -1, 5, 6]  # 11 global ids, gaps


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def guarded(shape, dtype, device):
    """A poisoned ``shape`` buffer inside poisoned guards: (buffer, whole allocation)."""
    n = 1
    for s in shape:
        n *= s
    esize = torch.empty((), dtype=dtype).element_size()
    whole = torch.full((n * esize + 2 * GUARD,), POISON, dtype=torch.uint8, device=device)
    return whole[GUARD : GUARD + n * esize].view(dtype).view(shape), whole


def raw(t) -> bytes:
    return t.contiguous().cpu().view(torch.uint8).numpy().tobytes()


def guards_ok(whole) -> bool:
    b = raw(whole)
    return b[:GUARD].count(POISON) == GUARD and b[-GUARD:].count(POISON) == GUARD


def make_input(m, k, d, dtype, seed, kind="normal", device="cpu"):
    """Random rows; ``kind="bits"``: every bit pattern (NaN, ±Inf, subnormals, ±0)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "bits":
        info = torch.iinfo(BITS[dtype])
        x = torch.randint(info.min, info.max + 1, (m, k, d), generator=g, dtype=BITS[dtype])
        return x.view(dtype).to(device)
    x = (torch.randn(m, k, d, generator=g) * 3).to(dtype)
    if x.numel():  # specials among ordinary values
        flat = x.view(-1)
        flat[::97] = float("nan")
        flat[1::89] = float("inf")
        flat[2::83] = float("-inf")
        flat[3::79] = -0.0
        tiny = torch.finfo(dtype).tiny
        flat[4::7] = flat[4::7] * tiny  # subnormals (and some underflow to ±0)
    return x.to(device)


def make_ids(m, k, seed, device="cpu", dtype=I32):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(-2, 14, (m, k), generator=g, dtype=I32).to(dtype).to(device)


def run_both(fn_mine, fn_ref, x, *args, **kwargs):
    """Both into guarded poisoned outputs; asserts the same bytes and intact guards."""
    m, _k, d = x.shape
    mine, wm = guarded((m, d), x.dtype, x.device)
    theirs, wt = guarded((m, d), x.dtype, x.device)
    fn_mine(x, mine, *args, **kwargs)
    fn_ref(x, theirs, *args, **kwargs)
    assert guards_ok(wm), "a write outside output"
    assert raw(mine) == raw(theirs)
    return mine


CASES = [  # (M, topk, hidden)
    (0, 8, 64), (1, 1, 7), (1, 9, 7168), (2, 1, 4096), (3, 8, 100), (5, 16, 2880),
    (17, 9, 33), (64, 6, 256), (1100, 2, 24), (2, 3, 0), (4, 17, 20000), (300, 8, 512),
    (2000, 4, 136),
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, d", CASES)
def test_compat_matches_reference(m, k, d, dtype, device):
    for kind in ("normal", "bits"):
        x = make_input(m, k, d, dtype, m * 31 + k + d, kind, device)
        ids = make_ids(m, k, m + k, device)
        emap = torch.tensor(MAP, dtype=I32, device=device)
        run_both(vllm.moe_sum, RC.vllm_moe_sum, x)
        run_both(vllm.moe_sum, RC.vllm_moe_sum, x, ids)
        run_both(vllm.moe_sum, RC.vllm_moe_sum, x, ids, emap)
        run_both(vllm.moe_sum, RC.vllm_moe_sum, x, ids.long(), emap)  # int64 ids
        for scale in (1.0, 2.5, -0.75, 1e-30, 3):
            run_both(sglang.moe_sum_reduce, RC.sglang_moe_sum_reduce, x, scale)
        # SGLang's default scale (1.0), sgl's moe_sum(input, output), vllm._custom_ops' form
        run_both(sglang.moe_sum_reduce, RC.sglang_moe_sum_reduce, x)
        run_both(sglang.moe_sum_reduce, RC.sglang_moe_sum, x)
        run_both(sglang.moe_sum, RC.sglang_moe_sum, x)
        run_both(sglang.moe_sum, RC.vllm_moe_sum, x)
        run_both(custom_ops.moe_sum, RC.vllm_moe_sum, x, ids.long(), emap)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_expert_map_edges(dtype, device):
    x = make_input(6, 4, 40, dtype, 5, device=device)
    ids = make_ids(6, 4, 5, device)
    none_local = torch.full((11,), -1, dtype=I32, device=device)
    empty = torch.empty(0, dtype=I32, device=device)
    for emap in (none_local, empty):  # every slot non-local: +0.0 everywhere
        out = run_both(vllm.moe_sum, RC.vllm_moe_sum, x, ids, emap)
        assert raw(out) == bytes(out.numel() * out.element_size())
    huge = torch.tensor([[2**31 - 1, -(2**31), 0, 10]] * 6, dtype=I32, device=device)
    run_both(vllm.moe_sum, RC.vllm_moe_sum, x, huge, torch.tensor(MAP, dtype=I32, device=device))
    big64 = huge.long() + torch.tensor([1 << 32, -(1 << 40), 0, 0], device=device)
    run_both(vllm.moe_sum, RC.vllm_moe_sum, x, big64, torch.tensor(MAP, dtype=I32, device=device))
    run_both(vllm.moe_sum, RC.vllm_moe_sum, x, None, none_local)  # map without ids: ignored
    run_both(vllm.moe_sum, RC.vllm_moe_sum, x, torch.full_like(ids, -1))  # every id < 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, d", CASES[:8])
def test_native_op_matches_reference(m, k, d, dtype, device):
    x = make_input(m, k, d, dtype, 7 * m + d, "bits", device)
    ids = make_ids(m, k, 3, device)
    emap = torch.tensor(MAP, dtype=I32, device=device)
    for kw in (
        {},
        {"topk_ids": ids},
        {"topk_ids": ids, "expert_map": emap},
        {"routed_scaling_factor": 2.5},
        {"topk_ids": ids, "routed_scaling_factor": -3.0},
    ):
        mine = ops.moe_sum(x, **kw)
        assert mine.dtype == dtype and tuple(mine.shape) == (m, d)
        assert raw(mine) == raw(R.moe_sum(x, **kw))
        out, whole = guarded((m + 2, d), dtype, device)  # extra rows: not written
        keep = raw(out[m:])
        assert ops.moe_sum_out(x, out, **kw) is out
        assert guards_ok(whole) and raw(out[m:]) == keep
        assert raw(out[:m]) == raw(R.moe_sum(x, **kw))


def test_hand_examples():
    """Values worked by hand from docs/ops.md (fp32 sum in k order, one rounding)."""
    x = torch.tensor([[[1.0], [2.0**-8]]]).to(torch.bfloat16)
    assert ops.moe_sum(x).item() == 1.0  # 1 + 2^-8 in fp32, a tie rounded to even
    assert ops.moe_sum(x, routed_scaling_factor=2.5).item() == 2.515625
    f = torch.tensor([[[2.0**24], [1.0], [1.0]]])
    assert ops.moe_sum(f).item() == 2.0**24  # (2^24 + 1) + 1 in k order
    h = torch.tensor([[[65504.0], [8.0]]], dtype=torch.float16)
    assert ops.moe_sum(h).item() == 65504.0  # 65512: below the tie 65520, down
    h2 = torch.tensor([[[65504.0], [16.0]]], dtype=torch.float16)
    assert ops.moe_sum(h2).item() == float("inf")  # the tie 65520: to even, Inf
    nan = torch.tensor([[[float("inf")], [float("-inf")]]], dtype=torch.float16)
    assert ops.moe_sum(nan).view(torch.int16).item() == 0x7FFF
    sub = torch.tensor([[[2.0**-24], [0.0]]], dtype=torch.float16)  # the smallest subnormal
    assert ops.moe_sum(sub, routed_scaling_factor=1.5).item() == 2.0**-23  # 1.5 units: to 2
    assert ops.moe_sum(sub, routed_scaling_factor=2.5).item() == 2.0**-23  # 2.5 units: to 2
    assert ops.moe_sum(sub, routed_scaling_factor=0.5).item() == 0.0  # 0.5 units: to 0


def test_errors_before_any_kernel(cpu_module):
    x = torch.zeros(2, 3, 8, dtype=torch.bfloat16)
    out, whole = guarded((2, 8), torch.bfloat16, "cpu")
    ids = torch.zeros(2, 3, dtype=I32)
    v, s = vllm.moe_sum, sglang.moe_sum_reduce
    bad = [
        (TypeError, lambda: v(x, out.float())),
        (TypeError, lambda: s(x.to(torch.float64), out, 1.0)),
        (TypeError, lambda: v(x.tolist(), out)),
        (ValueError, lambda: v(x[0], out)),
        (ValueError, lambda: s(x, out[:1], 1.0)),
        (ValueError, lambda: v(x.transpose(0, 1).contiguous().transpose(0, 1), out)),
        (ValueError, lambda: s(x[:, :0], out, 1.0)),  # topk = 0
        (ValueError, lambda: v(x, out, ids[:, :2])),
        (TypeError, lambda: v(x, out, ids.to(torch.int16))),
        (TypeError, lambda: v(x, out, ids, torch.zeros(4, dtype=torch.int64))),
        (ValueError, lambda: v(x, out, ids, torch.zeros(2, 2, dtype=I32))),
        (TypeError, lambda: s(x, out, "2.5")),
        (TypeError, lambda: s(x, out, True)),
        (TypeError, lambda: s(x, out, torch.tensor(2.5))),
        (ValueError, lambda: ops.moe_sum(x, expert_map=torch.zeros(4, dtype=I32))),
        (ValueError, lambda: ops.moe_sum(x, topk_ids=ids.t().contiguous())),
        (TypeError, lambda: ops.moe_sum(x.to(torch.int32))),
        (TypeError, lambda: ops.moe_sum_out(x, out.to(torch.float16))),
        (ValueError, lambda: ops.moe_sum_out(x, out[:, :4])),
    ]
    calls = cpu_module.kernel_calls()
    for exc, call in bad:
        with pytest.raises(exc):
            call()
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    assert raw(whole).count(POISON) == whole.numel()


def test_same_errors_as_the_reference():
    x = torch.zeros(2, 3, 8, dtype=torch.float16)
    out = torch.empty(2, 8, dtype=torch.float16)
    ids = torch.zeros(2, 3, dtype=I32)
    more_rows = torch.empty(3, 8, dtype=torch.float16)  # the binding takes it, the peers not
    for args in ((x, out.bfloat16()), (x[0], out), (x, out[:1]), (x, out, ids[:1]),
                 (x, out, ids.float()), (x, out, ids, torch.zeros(3)), (x, more_rows),
                 (x, more_rows, ids)):  # fmt: skip
        with pytest.raises((TypeError, ValueError)) as mine:
            vllm.moe_sum(*args)
        with pytest.raises(type(mine.value)) as theirs:
            RC.vllm_moe_sum(*args)
        assert str(mine.value) == str(theirs.value)
    for scale in ("1", None, [1.0]):
        with pytest.raises(TypeError) as mine:
            sglang.moe_sum_reduce(x, out, scale)
        with pytest.raises(TypeError) as theirs:
            RC.sglang_moe_sum_reduce(x, out, scale)
        assert str(mine.value) == str(theirs.value)
    for call, ref_call in ((sglang.moe_sum_reduce, RC.sglang_moe_sum_reduce),
                           (sglang.moe_sum, RC.sglang_moe_sum)):  # fmt: skip
        with pytest.raises(ValueError) as mine:
            call(x, more_rows)
        with pytest.raises(ValueError) as theirs:
            ref_call(x, more_rows)
        assert str(mine.value) == str(theirs.value)


def test_aliasing_rejected():
    x = torch.zeros(2, 3, 8)
    alias = x.view(-1)[:16].view(2, 8)
    for call in (lambda: vllm.moe_sum(x, alias), lambda: sglang.moe_sum_reduce(x, alias, 1.0),
                 lambda: ops.moe_sum_out(x, alias)):  # fmt: skip
        with pytest.raises(ValueError, match="overlaps"):
            call()
    ids = torch.zeros(2, 8, dtype=I32)  # output over the ids: the native op refuses too
    with pytest.raises(ValueError, match="overlaps"):
        ops.moe_sum_out(x, ids.view(torch.float32), topk_ids=ids.view(-1)[:6].view(2, 3))


def test_signatures_match_the_peers():
    assert list(inspect.signature(vllm.moe_sum).parameters) == [
        "input", "output", "topk_ids", "expert_map"]  # fmt: skip
    assert inspect.signature(vllm.moe_sum).parameters["topk_ids"].default is None
    assert list(inspect.signature(sglang.moe_sum_reduce).parameters) == [
        "input", "output", "routed_scaling_factor"]  # fmt: skip
    assert (
        inspect.signature(sglang.moe_sum_reduce).parameters["routed_scaling_factor"].default == 1.0
    )
    assert list(inspect.signature(sglang.moe_sum).parameters) == ["input", "output"]
    assert custom_ops.moe_sum is vllm.moe_sum
    assert "moe_sum" in vllm.__all__ and "moe_sum_reduce" in sglang.__all__
    assert "moe_sum" in sglang.__all__ and "moe_sum" in custom_ops.__all__


def test_import_loads_nothing():
    code = (
        "import sys\n"
        "import aiter_aux.compat.vllm, aiter_aux.compat.sglang\n"
        "bad = [n for n in ('torch', 'aiter_aux.ops', 'aiter_aux.jit.module', "
        "'aiter_aux.jit.build', 'aiter_aux.jit.spec') if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("call", ["vllm", "sglang"])
def test_drop_in_write_invalidates_saved_tensors(call):
    """The drop-ins' writes are seen by autograd: backward over overwritten values raises."""
    a = torch.randn(4, 64, requires_grad=True)
    out = a * 1.0
    y = (out * out).sum()
    inp = torch.randn(4, 8, 64)
    with torch.no_grad():
        if call == "vllm":
            vllm.moe_sum(inp, out)
        else:
            sglang.moe_sum_reduce(inp, out, 1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize(
    "scale", [float("nan"), float("inf"), float("-inf"), 1e39, -4e38, 3.4028235e38]
)  # (above float32's largest in a double)
def test_non_finite_routed_scaling_factor_is_refused_before_any_kernel(cpu_module, scale):
    """The rule of ``aiter-aux run --routed-scaling``: a NaN or infinite scale, or one
    beyond float32's range (the kernels' type), is a ValueError naming
    routed_scaling_factor, before any kernel, on every entry point."""
    x = torch.ones(2, 3, 8, dtype=torch.bfloat16)
    out, whole = guarded((2, 8), torch.bfloat16, "cpu")
    calls = {
        "sglang.moe_sum_reduce": lambda: sglang.moe_sum_reduce(x, out, scale),
        "ops.moe_sum": lambda: ops.moe_sum(x, routed_scaling_factor=scale),
        "ops.moe_sum_out": lambda: ops.moe_sum_out(x, out, routed_scaling_factor=scale),
        "torch.ops moe_sum_out": lambda: torch.ops.aiter_aux.moe_sum_out(
            x, out, routed_scaling_factor=scale),
        "reference.moe_sum": lambda: R.moe_sum(x, routed_scaling_factor=scale),
        "ops.moe_route": lambda: ops.moe_route(torch.randn(4, 8), 2, routed_scaling_factor=scale),
        "torch.ops moe_route": lambda: torch.ops.aiter_aux.moe_route(
            torch.randn(4, 8), 2, routed_scaling_factor=scale),
    }  # fmt: skip
    before = cpu_module.kernel_calls()
    for name, call in calls.items():
        # torch.ops.aiter_aux.* is the binding itself: its RuntimeError says "ValueError: ..."
        exc = RuntimeError if name.startswith("torch.ops") else ValueError
        want = (r"routed_scaling_factor must be a finite float32 number "
                r"\(\|x\| <= 3\.4028234663852886e\+38\), "
                rf"got {re.escape(repr(scale))}$")  # fmt: skip
        with pytest.raises(exc, match=want) as e:
            call()
        assert "\n" not in str(e.value), (name, str(e.value))
    assert cpu_module.kernel_calls() == before, "a kernel ran"
    assert raw(whole).count(POISON) == whole.numel()
