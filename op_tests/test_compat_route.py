"""The gates' drop-ins (vLLM's ``topk_softmax`` / ``grouped_topk``, SGLang's ``topk_softmax`` /
``moe_fused_gate``, AITER's ``biased_grouped_topk``) against ``aiter_aux.reference.moe_route``
with the options docs/compat.md maps them to, and against the peers' rules written here in
plain torch where they differ from a plain call (token_expert_indices, SGLang's zero bias and
output scaling); their signatures; errors before anything is written."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import reference as R  # noqa: E402
from aiter_aux.compat import aiter, sglang, vllm  # noqa: E402
from aiter_aux.compat.vllm import custom_ops  # noqa: E402

F32, I32 = torch.float32, torch.int32
POISON = 0x5A5A5A5A


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def bits(t):
    return t.contiguous().view(I32)


def logits(m, e, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, e, generator=g) * 2
    if m > 3:
        x[1] = 0.5  # all equal
        x[2, 1] = float("nan")
    return x.to(dtype)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]  # fmt: skip


def bufs(m, k, ids_dtype=I32):
    return (torch.full((m, k), POISON, dtype=I32).view(F32),
            torch.full((m, k), POISON, dtype=ids_dtype))  # fmt: skip


@pytest.mark.parametrize("dtype", (F32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("renorm", (True, False))
def test_vllm_topk_softmax(dtype, renorm):
    m, e, k = 13, 64, 6
    x = logits(m, e, dtype)
    for ids_dtype in (I32, torch.int64):
        w, ids = bufs(m, k, ids_dtype)
        tei = torch.full((m, k), POISON, dtype=I32)
        assert custom_ops.topk_softmax(w, ids, tei, x, renorm) is None
        rw, rids = R.moe_route(x, k, renormalize=renorm)
        assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids.to(ids_dtype))
        want = torch.tensor([[kk * m + t for kk in range(k)] for t in range(m)], dtype=I32)
        assert torch.equal(tei, want)  # vLLM's source-row layout: k * M + t
    assert vllm.topk_softmax is custom_ops.topk_softmax


@pytest.mark.parametrize("renorm", (True, False))
def test_vllm_topk_softmax_bias_and_padding(renorm):
    # vLLM 0.33's topk_softmax: choice = softmax + e_score_correction_bias (weights the
    # uncorrected scores), ids of padding rows -1; the rest as without them
    m, e, k = 9, 64, 4
    x = logits(m, e, seed=3)
    bias = torch.randn(e, generator=torch.Generator().manual_seed(4))
    pad = torch.tensor([False, True, False, False, True, False, False, False, True])
    w, ids = bufs(m, k)
    tei = torch.full((m, k), POISON, dtype=I32)
    assert custom_ops.topk_softmax(w, ids, tei, x, renorm, bias, pad) is None
    rw, rids = R.moe_route(x, k, renormalize=renorm, correction_bias=bias)
    rids[pad] = -1
    assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)
    assert torch.equal(tei, torch.arange(m * k, dtype=I32).view(k, m).t())
    w2, ids2 = bufs(m, k)
    custom_ops.topk_softmax(w2, ids2, tei, x, renorm, bias.bfloat16(), None)  # widened exactly
    rw2, rids2 = R.moe_route(x, k, renormalize=renorm, correction_bias=bias.bfloat16().float())
    assert torch.equal(bits(w2), bits(rw2)) and torch.equal(ids2, rids2)
    for bad, exc, match in (
        (pad.int(), TypeError, "is_padding must be a torch.bool tensor"),
        (pad[:4], ValueError, r"is_padding must be \[M\] = \[9\]"),
        ("x", TypeError, "is_padding must be a torch.bool tensor"),
    ):
        w3, ids3 = bufs(m, k)
        with pytest.raises(exc, match=match):
            custom_ops.topk_softmax(w3, ids3, tei, x, renorm, None, bad)
        assert (bits(w3) == POISON).all() and (ids3 == POISON).all()


@pytest.mark.parametrize("scoring_func", (0, 1))
def test_vllm_grouped_topk(scoring_func):
    m, e = 11, 256
    x = logits(m, e, seed=1)
    if scoring_func == 0:
        x = torch.softmax(x, -1)  # vLLM's caller passes scores
    bias = torch.randn(e, generator=torch.Generator().manual_seed(2)).bfloat16()
    w, ids = vllm.grouped_topk(x, 8, 4, 8, True, 2.5, bias, scoring_func)
    rw, rids = R.moe_route(
        x,
        8,
        scoring=("none", "sigmoid")[scoring_func],
        num_expert_group=8,
        topk_group=4,
        correction_bias=bias.float(),
        routed_scaling_factor=2.5,
    )
    assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)
    with pytest.raises(ValueError, match="scoring_func must be 0"):
        vllm.grouped_topk(x, 8, 4, 8, True, 2.5, bias, 2)


def test_sglang_topk_softmax():
    x = logits(9, 128, torch.bfloat16, seed=3)
    w, ids = bufs(9, 8)
    assert sglang.topk_softmax(w, ids, x, renormalize=True) is None
    rw, rids = R.moe_route(x, 8)
    assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)


def test_sglang_moe_fused_gate():
    m, e = 10, 256
    x = logits(m, e, seed=4)
    bias = torch.randn(e, generator=torch.Generator().manual_seed(5))
    w, ids = sglang.moe_fused_gate(x, bias, 8, 4, 8, routed_scaling_factor=2.5,
                                   apply_routed_scaling_factor_on_output=True)  # fmt: skip
    rw, rids = R.moe_route(x, 8, scoring="sigmoid", num_expert_group=8, topk_group=4,
                           correction_bias=bias, routed_scaling_factor=2.5)  # fmt: skip
    assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)
    # the factor only scales the output with apply_routed_scaling_factor_on_output
    w1, _ = sglang.moe_fused_gate(x, bias, 8, 4, 8, routed_scaling_factor=2.5)
    assert torch.equal(
        bits(w1),
        bits(
            R.moe_route(
                x, 8, scoring="sigmoid", num_expert_group=8, topk_group=4, correction_bias=bias
            )[0]
        ),
    )
    # no bias: the groups are still scored by their two largest scores (SGLang's kernel)
    z = torch.tensor([[3.0, -9.0, 1.0, 1.0]])
    _, ids = sglang.moe_fused_gate(z, None, 2, 1, 2)
    assert ids.tolist() == [[2, 3]]  # 1 + 1 beats 3 + (-9) after the sigmoid
    with pytest.raises(NotImplementedError):
        sglang.moe_fused_gate(x, bias, 8, 4, 8, num_fused_shared_experts=1)
    with pytest.raises(ValueError, match="scoring_func"):
        sglang.moe_fused_gate(x, bias, 8, 4, 8, scoring_func="relu")


def test_aiter_biased_grouped_topk():
    m, e = 7, 256
    x = logits(m, e, torch.bfloat16, seed=6)
    bias = torch.randn(e, generator=torch.Generator().manual_seed(7))
    for renorm in (True, False):
        w, ids = bufs(m, 8)
        assert aiter.biased_grouped_topk(x, bias, w, ids, 8, 4, renorm, 2.5) is None
        rw, rids = R.moe_route(
            x,
            8,
            scoring="sigmoid",
            renormalize=renorm,
            num_expert_group=8,
            topk_group=4,
            correction_bias=bias,
            routed_scaling_factor=2.5,
        )
        assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)


def test_errors_before_any_write(cpu_module):
    x = logits(4, 16)
    w, ids = bufs(4, 2)
    tei = torch.full((4, 2), POISON, dtype=I32)
    bad = [
        (TypeError, lambda: custom_ops.topk_softmax(w, ids, tei.long(), x)),
        (ValueError, lambda: custom_ops.topk_softmax(w, ids, tei[:3], x)),
        (ValueError, lambda: custom_ops.topk_softmax(w, ids[:, :1], tei, x)),
        (TypeError, lambda: sglang.topk_softmax(w.double(), ids, x)),
        (ValueError, lambda: sglang.topk_softmax(w, ids, x[:, :1])),  # topk 2 > E 1
        (ValueError, lambda: aiter.biased_grouped_topk(x, torch.zeros(16), w, ids, 3, 1, True)),
        (ValueError, lambda: aiter.biased_grouped_topk(x, torch.zeros(15), w, ids, 4, 1, True)),
        (TypeError, lambda: sglang.topk_softmax(w, ids.tolist(), x)),
    ]
    calls = cpu_module.kernel_calls()
    for exc, call in bad:
        with pytest.raises(exc):
            call()
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    assert (bits(w) == POISON).all() and (ids == POISON).all() and (tei == POISON).all()


def test_aliased_buffers_refused_before_any_write(cpu_module):
    """int64 ids (written through an int32 buffer) and vLLM's ``is_padding`` (read after the
    gate wrote) are checked against the other tensors like the op's own arguments."""
    m, e, k = 4, 16, 2
    x = logits(m, e)
    i64 = torch.full((m * k,), POISON, dtype=torch.int64)
    w_in_ids = i64.view(F32)[: m * k].view(m, k)  # the weights inside the int64 ids
    f32 = torch.full((m * e * 2,), POISON, dtype=I32).view(F32)
    ids_in_logits = f32.view(torch.int64)[: m * k].view(m, k)
    logits_with_ids = f32[: m * e].view(m, e)
    ids_in_bias = torch.zeros(2 * e).view(torch.int64)[: m * k].view(m, k)
    wp, ids32 = bufs(m, k)
    tei = torch.full((m, k), POISON, dtype=I32)
    ids64 = torch.full((m, k), POISON, dtype=torch.int64)
    cases = [
        (lambda: custom_ops.topk_softmax(w_in_ids, i64.view(m, k), tei, x),
         "topk_ids overlaps topk_weights"),
        (lambda: sglang.topk_softmax(w_in_ids, i64.view(m, k), x),
         "topk_ids overlaps topk_weights"),
        (lambda: custom_ops.topk_softmax(bufs(m, k)[0], ids_in_logits, tei, logits_with_ids),
         "topk_ids overlaps gating_output"),
        (lambda: custom_ops.topk_softmax(bufs(m, k)[0], ids64, ids64.view(I32)[:, :k], x),
         "token_expert_indices overlaps topk_ids"),
        (lambda: aiter.biased_grouped_topk(x, ids_in_bias.view(-1).view(F32)[:e], bufs(m, k)[0],
                                           ids_in_bias, 4, 2, True),
         "topk_ids overlaps correction_bias"),
        (lambda: custom_ops.topk_softmax(wp, ids32, tei, x, False, None,
                                         wp.view(-1).view(torch.bool)[:m]),
         "topk_weights overlaps is_padding"),
        (lambda: custom_ops.topk_softmax(wp, ids32, tei, x, False, None,
                                         ids32.view(-1).view(torch.bool)[:m]),
         "topk_ids overlaps is_padding"),
    ]  # fmt: skip
    calls = cpu_module.kernel_calls()
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    assert (i64 == POISON).all() and (f32.view(I32) == POISON).all()
    assert (bits(wp) == POISON).all() and (ids32 == POISON).all() and (tei == POISON).all()
    assert (ids64 == POISON).all()


def test_peers_required_arguments_and_option_types():
    """What the peers' schemas require or refuse is refused, not read as moe_route's None or
    a truthy value."""
    m, e, k = 4, 16, 4
    x = logits(m, e)
    w, ids = bufs(m, k)
    bias = torch.zeros(e)
    cases = [
        (TypeError, lambda: vllm.grouped_topk(x, 4, 2, k, True, 1.0, None), "bias is required"),
        (TypeError, lambda: vllm.grouped_topk(x, None, None, k, True, 1.0, bias),
         "num_expert_group is required"),
        (TypeError, lambda: aiter.biased_grouped_topk(x, None, w, ids, 4, 2, True),
         "correction_bias is required"),
        (TypeError, lambda: aiter.biased_grouped_topk(x, bias, w, ids, 4, None, True),
         "topk_group is required"),
        (TypeError, lambda: sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", 0, 2.0, "no"),
         "apply_routed_scaling_factor_on_output must be a bool, got 'no'"),
        (TypeError, lambda: sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", 0, "x"),
         "routed_scaling_factor must be a float, got 'x'"),
        (TypeError, lambda: sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", "0"),
         "num_fused_shared_experts must be an int"),
        (ValueError, lambda: sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", -1),
         "num_fused_shared_experts must be >= 0"),
        (NotImplementedError, lambda: sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", 1),
         "fused shared experts are not supported"),
        (TypeError, lambda: custom_ops.topk_softmax(w, ids, ids.clone(), x, False,
                                                    torch.zeros(e, dtype=torch.float64)),
         "e_score_correction_bias must have dtype torch.float32, torch.float16 or "
         "torch.bfloat16"),
        (TypeError, lambda: custom_ops.topk_softmax(w, ids, ids.clone(), x, False, None, [0] * m),
         "is_padding must be a torch.bool tensor, got list$"),
        (TypeError, lambda: sglang.topk_softmax(w, ids, x, 2), "renormalize must be a bool, got 2"),
    ]  # fmt: skip
    for exc, call, match in cases:
        with pytest.raises(exc, match=match):
            call()
    assert (bits(w) == POISON).all() and (ids == POISON).all()
    # SGLang's factor is not read when not applied (its kernel takes any double)
    rw, rids = R.moe_route(x, k, scoring="sigmoid", num_expert_group=4, topk_group=2,
                           correction_bias=bias)  # fmt: skip
    gw, gids = sglang.moe_fused_gate(x, bias, 4, 2, k, True, "sigmoid", 0, float("nan"), False)
    assert torch.equal(bits(gw), bits(rw)) and torch.equal(gids, rids)


def test_numpy_scalars_taken_as_the_peers_schemas_take_them():
    """numpy bools, ints and floats are taken where the peer's schema (bool, int, float)
    takes them: the same bytes as the Python values."""
    np = pytest.importorskip("numpy")
    m, e, k = 5, 64, 4
    x = logits(m, e)
    bias = torch.zeros(e)
    w, ids = bufs(m, k)
    tei = torch.full((m, k), POISON, dtype=I32)
    custom_ops.topk_softmax(w, ids, tei, x, np.bool_(True))
    rw, rids = R.moe_route(x, k, renormalize=True)
    assert torch.equal(bits(w), bits(rw)) and torch.equal(ids, rids)
    got = sglang.moe_fused_gate(x, bias, np.int64(4), np.int64(2), k, np.bool_(True), "sigmoid",
                                np.int64(0), np.float32(2.5), np.bool_(True))  # fmt: skip
    want = R.moe_route(x, k, scoring="sigmoid", num_expert_group=4, topk_group=2,
                       correction_bias=bias, routed_scaling_factor=2.5)  # fmt: skip
    assert torch.equal(bits(got[0]), bits(want[0])) and torch.equal(got[1], want[1])
    got = vllm.grouped_topk(x, 4, 2, k, np.bool_(False), 1.0, bias, np.int64(1))
    want = R.moe_route(x, k, scoring="sigmoid", renormalize=False, num_expert_group=4,
                       topk_group=2, correction_bias=bias)  # fmt: skip
    assert torch.equal(bits(got[0]), bits(want[0])) and torch.equal(got[1], want[1])


def test_required_buffers_and_groups(cpu_module):
    """vLLM's token_expert_indices and SGLang's group counts are required by the peers'
    schemas: None is refused before any write, whatever the other arguments."""
    m, e, k = 4, 16, 2
    x = logits(m, e)
    w, ids = bufs(m, k)
    ids64 = torch.full((m, k), POISON, dtype=torch.int64)
    pad = torch.zeros(m, dtype=torch.bool)
    calls = cpu_module.kernel_calls()
    for call in (lambda: custom_ops.topk_softmax(w, ids, None, x),
                 lambda: custom_ops.topk_softmax(w, ids64, None, x),
                 lambda: custom_ops.topk_softmax(w, ids, None, x, False, None, pad)):  # fmt: skip
        with pytest.raises(TypeError, match="token_expert_indices must be a torch.Tensor"):
            call()
    for groups in ((None, None), (None, 2), (4, None)):
        with pytest.raises(TypeError, match="is required, got None"):
            sglang.moe_fused_gate(x, torch.zeros(e), *groups, k)
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    assert (bits(w) == POISON).all() and (ids == POISON).all() and (ids64 == POISON).all()


def test_signatures_match_the_peers():
    def names(f):
        return list(inspect.signature(f).parameters)

    assert names(vllm.topk_softmax) == ["topk_weights", "topk_ids", "token_expert_indices",
                                        "gating_output", "renormalize",
                                        "e_score_correction_bias", "is_padding"]  # fmt: skip
    assert names(vllm.grouped_topk) == ["scores", "num_expert_group", "topk_group", "topk",
                                        "renormalize", "routed_scaling_factor", "bias",
                                        "scoring_func"]  # fmt: skip
    assert names(sglang.topk_softmax) == ["topk_weights", "topk_ids", "gating_output",
                                          "renormalize"]  # fmt: skip
    assert names(sglang.moe_fused_gate) == [
        "input_tensor", "bias", "num_expert_group", "topk_group", "topk", "renormalize",
        "scoring_func", "num_fused_shared_experts", "routed_scaling_factor",
        "apply_routed_scaling_factor_on_output"]  # fmt: skip
    assert names(aiter.biased_grouped_topk) == [
        "gating_output", "correction_bias", "topk_weights", "topk_ids", "num_expert_group",
        "topk_group", "need_renorm", "routed_scaling_factor"]  # fmt: skip


def test_import_loads_nothing():
    """vLLM's and SGLang's drop-ins load neither torch nor the ops; AITER's loads no JIT."""
    code = (
        "import sys\n"
        "import aiter_aux.compat.vllm, aiter_aux.compat.sglang\n"
        "bad = [n for n in ('torch', 'aiter_aux.ops', 'aiter_aux.jit.build') if n in sys.modules]\n"
        "import aiter_aux.compat.aiter\n"
        "bad += [n for n in ('aiter_aux.jit.build',) if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_errors_name_the_callers_arguments():
    # the drop-ins' errors name the peer's parameters, not moe_route's
    g = logits(6, 64)
    w, ids = bufs(6, 2)
    tei = torch.full((6, 2), POISON, dtype=I32)
    cases = [
        (lambda: custom_ops.topk_softmax(w, ids, tei, g[0]), "gating_output must be a 2-D"),
        (lambda: custom_ops.topk_softmax(w, ids, tei, g, False, torch.zeros(63)),
         "e_score_correction_bias must have shape"),
        (lambda: vllm.grouped_topk(g, 8, 2, 4, True, 1.0, torch.zeros(63), 1),
         "bias must have shape"),
        (lambda: vllm.grouped_topk(g, 8, 2, 4, True, 1.0, torch.zeros(64), 1.0),
         "scoring_func must be 0"),
        (lambda: sglang.topk_softmax(w, ids, g[0]), "gating_output must be a 2-D"),
        (lambda: sglang.moe_fused_gate(g[0], None, 8, 2, 4), "input_tensor must be a 2-D"),
        (lambda: aiter.biased_grouped_topk(g, torch.zeros(64), w, ids, 8, 2, None),
         "need_renorm must be a bool"),
        (lambda: custom_ops.topk_softmax(w, ids.short(), tei, g),
         "topk_ids must have dtype torch.int32 or torch.int64"),
        (lambda: vllm.grouped_topk(torch.empty(1 << 24, 8), 1, 1, 1, True, 1.0, torch.zeros(8), 1),
         r"^M \(the rows of scores\) must be in \[0, 2\*\*24\)"),
    ]  # fmt: skip
    for call, match in cases:
        with pytest.raises((TypeError, ValueError), match=match) as info:
            call()
        assert "router_logits" not in str(info.value) and "\n" not in str(info.value)
    assert (bits(w) == POISON).all() and (ids == POISON).all() and (tei == POISON).all()


def test_vllm_topk_softmax_rows_are_gating_outputs():
    # vLLM's num_rows is gating_output's: longer buffers keep their extra rows, and
    # token_expert_indices counts k * num_rows + t
    g = logits(4, 8)
    w, ids = bufs(6, 2)
    tei = torch.full((6, 2), POISON, dtype=I32)
    custom_ops.topk_softmax(w, ids, tei, g, True)
    rw, rids = R.moe_route(g, 2, renormalize=True)
    assert torch.equal(bits(w[:4]), bits(rw)) and torch.equal(ids[:4], rids)
    assert torch.equal(tei[:4], torch.arange(8, dtype=I32).view(2, 4).t())
    assert (bits(w[4:]) == POISON).all() and (ids[4:] == POISON).all() and (tei[4:] == POISON).all()


@pytest.mark.parametrize("ids_dtype", (I32, torch.int64))
def test_out_buffer_gates_keep_rows_past_m(ids_dtype):
    # buffers longer than the logits: only the first M rows are written, int64 ids too
    g = logits(4, 64, seed=8)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(9))
    calls = (
        lambda w, ids: custom_ops.topk_softmax(w, ids, torch.empty(7, 8, dtype=I32), g, True),
        lambda w, ids: sglang.topk_softmax(w, ids, g, renormalize=True),
        lambda w, ids: aiter.biased_grouped_topk(g, bias, w, ids, 8, 4, True, 2.5),
    )
    wants = (R.moe_route(g, 8), R.moe_route(g, 8), R.moe_route(
        g, 8, scoring="sigmoid", num_expert_group=8, topk_group=4, correction_bias=bias,
        routed_scaling_factor=2.5))  # fmt: skip
    for call, (rw, rids) in zip(calls, wants, strict=True):
        w, ids = bufs(7, 8, ids_dtype)
        call(w, ids)
        assert torch.equal(bits(w[:4]), bits(rw)) and torch.equal(ids[:4], rids.to(ids_dtype))
        assert (bits(w[4:]) == POISON).all() and (ids[4:] == POISON).all()


def test_vllm_topk_softmax_source_rows_for_each_m():
    # token_expert_indices = k * M + t for each call's M, written by the gate's launch
    tei = torch.full((5, 3), POISON, dtype=I32)
    for m in (5, 2, 0, 5, 2):
        w, ids = bufs(5, 3)
        tei.fill_(POISON)
        custom_ops.topk_softmax(w, ids, tei, logits(m, 16, seed=m), True)
        want = torch.arange(m * 3, dtype=I32).view(3, m).t()
        assert torch.equal(tei[:m], want) and (tei[m:] == POISON).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", (1, 37))
def test_gates_on_each_backend(device, m):
    """Every gate drop-in on the device against the reference on the CPU: the out-buffer
    gates' one-call form (int32 ids, token_expert_indices) and their full path (int64 ids, a
    bfloat16 bias), the allocating gates; rows past M keep their poison."""
    e, k = 256, 8
    x = logits(m, e, seed=m)
    bias = torch.randn(e, generator=torch.Generator().manual_seed(9)) * 0.1
    grouped = dict(scoring="sigmoid", num_expert_group=8, topk_group=4, correction_bias=bias,
                   routed_scaling_factor=2.5)  # fmt: skip
    want_soft = R.moe_route(x, k)
    want_grouped = R.moe_route(x, k, **grouped)
    rows = torch.tensor([[j * m + t for j in range(k)] for t in range(m)], dtype=I32)
    xd, bd = x.to(device), bias.to(device)

    def out(ids_dtype=I32):
        w, ids = bufs(m + 2, k, ids_dtype)
        return w.to(device), ids.to(device)

    def same(w, ids, want):
        assert torch.equal(bits(w[:m].cpu()), bits(want[0]))
        assert torch.equal(ids[:m].cpu().to(I32), want[1])
        assert (bits(w[m:].cpu()) == POISON).all() and (ids[m:].cpu() == POISON).all()

    for ids_dtype in (I32, torch.int64):
        w, ids = out(ids_dtype)
        tei = torch.full((m + 2, k), POISON, dtype=I32, device=device)
        custom_ops.topk_softmax(w, ids, tei, xd, True)
        same(w, ids, want_soft)
        assert torch.equal(tei[:m].cpu(), rows) and (tei[m:].cpu() == POISON).all()
        w, ids = out(ids_dtype)
        sglang.topk_softmax(w, ids, xd, True)
        same(w, ids, want_soft)
        for b in (bd, bd.bfloat16()):  # float32: the one-call form; bfloat16: widened first
            w, ids = out(ids_dtype)
            aiter.biased_grouped_topk(xd, b, w, ids, 8, 4, True, 2.5)
            want = want_grouped if b.dtype == F32 else R.moe_route(
                x, k, **{**grouped, "correction_bias": bias.bfloat16().float()})  # fmt: skip
            same(w, ids, want)
    w, ids = vllm.grouped_topk(xd, 8, 4, k, True, 2.5, bd, 1)
    assert torch.equal(bits(w.cpu()), bits(want_grouped[0])) and torch.equal(
        ids.cpu(), want_grouped[1]
    )
    w, ids = sglang.moe_fused_gate(xd, bd, 8, 4, k, routed_scaling_factor=2.5,
                                   apply_routed_scaling_factor_on_output=True)  # fmt: skip
    assert torch.equal(bits(w.cpu()), bits(want_grouped[0])) and torch.equal(
        ids.cpu(), want_grouped[1]
    )
