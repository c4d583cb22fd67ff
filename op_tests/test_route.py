"""moe_route: the reference against the gate's definition (plain torch softmax / sigmoid /
topk written here, float64 exp), and the compiled op (CPU; CUDA where present) against the
reference byte for byte on random logits, ties, NaN, +-Inf, all-equal rows, M = 0 and 1,
E up to 1024, topk up to 16, every option; its errors before any kernel runs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as R  # noqa: E402
from aiter_aux.reference import route as RR  # noqa: E402
from aiter_aux.types import MoeSortOutput  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]  # fmt: skip
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
F32, I32 = torch.float32, torch.int32
POISON = 0x5A5A5A5A
# (M, E, topk, num_expert_group, topk_group, bias, scoring)
CONFIGS = [
    (0, 8, 2, None, None, False, "softmax"),
    (1, 8, 2, None, None, False, "softmax"),
    (1, 256, 8, 8, 4, True, "sigmoid"),  # DeepSeek-V3 / Kimi-K2 at decode
    (37, 256, 8, 8, 4, True, "sigmoid"),
    (33, 128, 8, None, None, False, "softmax"),  # Qwen3-MoE
    (20, 8, 2, None, None, False, "softmax"),  # Mixtral
    (20, 32, 4, None, None, False, "softmax"),  # gpt-oss
    (9, 1024, 16, None, None, True, "softmax"),
    (9, 1024, 16, 16, 2, True, "sigmoid"),
    (11, 160, 6, 8, 3, False, "softmax"),
    (12, 64, 16, 64, 16, True, "sigmoid"),  # one expert per group
    (12, 1000, 16, 1000, 16, False, "softmax"),
    (7, 257, 9, None, None, True, "softmax"),
    (3, 384, 8, 1, 1, True, "sigmoid"),  # Kimi-K2 at decode: the 512 class
    (260, 384, 8, None, None, False, "softmax"),  # the 512 class, a warp per row
    (5, 896, 16, 8, 4, True, "sigmoid"),
    (14, 1, 1, None, None, False, "sigmoid"),
    (300, 96, 5, 32, 4, False, "sigmoid"),
    (9, 256, 8, 8, 4, True, "none"),
    (21, 64, 6, None, None, False, "none"),
]


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().cpu().view(torch.int32)


def make_logits(m: int, e: int, dtype, seed: int, device="cpu") -> torch.Tensor:
    """Random rows; every 6th row of a kind: ties, all equal, a NaN, -Infs, a +Inf, all -Inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, e, generator=g) * 3
    for t in range(m):
        kind = t % 12
        if kind == 1:
            x[t] = torch.randint(0, 4, (e,), generator=g).float()
        elif kind == 3:
            x[t] = 0.25
        elif kind == 5:
            x[t, min(3, e - 1)] = float("nan")
        elif kind == 7:
            x[t, ::3] = float("-inf")
        elif kind == 9:
            x[t, e // 2] = float("inf")
        elif kind == 11:
            x[t] = float("-inf")
    return x.to(dtype).to(device)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of the last place (finite fp32 of one sign)."""
    return (a.view(I32).long() - b.view(I32).long()).abs()


# ------------------------------------------------------------------ the reference
def test_exp_within_one_ulp_of_exp():
    x = -torch.linspace(0, 87.3, 1 << 20)
    got = RR.exp_f32(x).double()
    want = torch.exp(x.double())
    one_ulp = (torch.nextafter(got.float(), torch.tensor(math.inf)) - got.float()).double()
    assert ((got - want).abs() / one_ulp).max() < 1.0
    assert RR.exp_f32(torch.tensor([0.0, -0.0])).tolist() == [1.0, 1.0]
    special = RR.exp_f32(torch.tensor([-math.inf, -200.0, math.nan]))
    assert special[0] == 0 and special[1] == 0 and math.isnan(special[2])


def test_scores_close_to_torch():
    """docs/ops.md's bounds: softmax <= 16 ulps (9 measured), sigmoid <= 4 from torch's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 256, generator=g) * 4
    assert ulps(RR._scores(x, 0), torch.softmax(x, -1)).max() <= 16
    y = torch.randn(1 << 20, generator=g) * 8
    assert ulps(RR.sigmoid_f32(y), torch.sigmoid(y)).max() <= 4


def test_row_sum_order():
    e = torch.rand(3, 200)
    p = [torch.zeros(3) for _ in range(64)]
    for i in range(200):
        p[i % 64] = p[i % 64] + e[:, i]
    h = 32
    while h:
        p = [p[j] + p[j + h] for j in range(h)]
        h //= 2
    assert torch.equal(RR.row_sum(e), p[0])


def _gate(x, topk, scoring, renorm, groups, topk_group, bias, scale):
    """The gate as the issue states it, in plain torch (torch's softmax / sigmoid)."""
    fns = {"softmax": lambda v: torch.softmax(v, -1), "sigmoid": torch.sigmoid, "none": lambda v: v}
    scores = fns[scoring](x.float())
    choice = scores if bias is None else scores + bias
    if groups:
        g = choice.view(x.shape[0], groups, -1)
        top = g.topk(min(2, g.shape[2]), -1).values
        gs = top.sum(-1) if bias is not None else g.max(-1).values
        keep = torch.zeros_like(gs, dtype=torch.bool)
        keep.scatter_(1, gs.topk(topk_group, -1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(x.shape[1] // groups, 1), -math.inf)
    ids = choice.topk(topk, -1).indices
    w = scores.gather(1, ids)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    return w * scale, ids


@pytest.mark.parametrize("cfg", CONFIGS[3:13] + CONFIGS[-2:])
def test_reference_is_the_gate(cfg):
    """Random logits (no ties): same ids as the gate in plain torch, weights within 1e-5."""
    m, e, k, groups, tg, has_bias, scoring = cfg
    g = torch.Generator().manual_seed(e + k)
    x = torch.randn(m, e, generator=g) * 2
    bias = torch.randn(e, generator=g) * 0.1 if has_bias else None
    for renorm in (True, False):
        kw = dict(scoring=scoring, renormalize=renorm, num_expert_group=groups, topk_group=tg)
        w, ids = R.moe_route(x, k, **kw, correction_bias=bias, routed_scaling_factor=2.5)
        tw, tids = _gate(x, k, scoring, renorm, groups, tg, bias, 2.5)
        assert torch.equal(ids.long(), tids)
        torch.testing.assert_close(w, tw, rtol=1e-5, atol=1e-7)


def test_hand_examples():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0], [math.nan, 1.0, 2.0, 3.0]])
    w, ids = R.moe_route(x, 2, renormalize=False)
    assert ids.tolist() == [[1, 2], [0, 1], [0, 1]]  # ties: the lower id; a NaN row: all NaN
    assert w[1].tolist() == [0.25, 0.25] and bits(w[2]).tolist() == [0x7FFFFFFF] * 2
    w, ids = R.moe_route(x, 2, scoring="sigmoid", renormalize=False)
    assert ids[2].tolist() == [3, 2]  # a NaN score is below every number
    y = torch.tensor([[-math.inf, math.inf, 0.0, -1.0]])
    w, ids = R.moe_route(y, 2, scoring="sigmoid")
    assert ids.tolist() == [[1, 2]] and torch.equal(w, torch.tensor([[2 / 3, 1 / 3]]))
    # groups: [0, 1] (sum of the two largest with a bias) beats [2, 3]; excluded never chosen
    z = torch.tensor([[2.0, 2.0, 3.0, -9.0]])
    bias = torch.zeros(4)
    _, ids = R.moe_route(z, 2, scoring="sigmoid", num_expert_group=2, topk_group=1,
                         correction_bias=bias)  # fmt: skip
    assert ids.tolist() == [[0, 1]]
    _, ids = R.moe_route(z, 2, scoring="sigmoid", num_expert_group=2, topk_group=1)
    assert ids.tolist() == [[2, 3]]  # without a bias: the group's largest score


# ------------------------------------------------------------------ the compiled op
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_op_matches_reference(cfg, dtype, device):
    m, e, k, groups, tg, has_bias, scoring = cfg
    x = make_logits(m, e, dtype, seed=m * 31 + e, device=device)
    bias = None
    if has_bias:
        bias = (torch.randn(e, generator=torch.Generator().manual_seed(e)) * 0.5).to(device)
        bias[e // 3] = 0.0 if e < 3 else float("nan")  # a NaN choice
    for renorm in (True, False):
        for scale in (1.0, 2.5):
            kw = dict(scoring=scoring, renormalize=renorm, num_expert_group=groups,
                      topk_group=tg, correction_bias=bias, routed_scaling_factor=scale)  # fmt: skip
            want_w, want_ids = R.moe_route(x.cpu(), k, **{**kw, "correction_bias": (
                None if bias is None else bias.cpu())})  # fmt: skip
            w, ids = ops.moe_route(x, k, **kw)
            assert torch.equal(bits(w), bits(want_w)), (renorm, scale)
            assert torch.equal(ids.cpu(), want_ids), (renorm, scale)
            # _out form: extra rows keep their bytes; token_expert_indices on every other case
            w2 = torch.full((m + 2, k), POISON, dtype=I32, device=device).view(F32)
            ids2 = torch.full((m + 2, k), POISON, dtype=I32, device=device)
            tei = torch.full((m + 2, k), POISON, dtype=I32, device=device)
            with_tei = renorm != (scale == 1.0)
            ops.moe_route_out(x, k, w2, ids2, **kw, token_expert_indices=tei if with_tei else None)
            assert torch.equal(bits(w2[:m]), bits(want_w)) and torch.equal(ids2[:m].cpu(), want_ids)
            assert (bits(w2[m:]) == POISON).all() and (ids2[m:].cpu() == POISON).all()
            rows = [[j * m + t for j in range(k)] for t in range(m)]  # k * M + t
            assert tei[:m].tolist() == (rows if with_tei else [[POISON] * k] * m)
            assert (tei[m:].cpu() == POISON).all()


@pytest.mark.parametrize("device", DEVICES)
def test_op_every_bit_pattern(device):
    """bf16 logits of every bit pattern (NaN payloads, subnormals, +-0, +-Inf), 256 per row."""
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x.view(256, 256).to(device)
    for scoring in ("softmax", "sigmoid"):
        want = R.moe_route(x.cpu(), 8, scoring=scoring)
        got = ops.moe_route(x, 8, scoring=scoring)
        assert torch.equal(bits(got[0]), bits(want[0])) and torch.equal(got[1].cpu(), want[1])


def test_errors_before_any_kernel(cpu_module):
    x = torch.zeros(2, 8)
    w = torch.full((2, 2), POISON, dtype=I32).view(F32)
    ids = torch.full((2, 2), POISON, dtype=I32)
    tei = torch.full((2, 2), POISON, dtype=I32)
    bad = [
        (ValueError, "topk must be <= E = 8", lambda: ops.moe_route(x, 9)),
        (ValueError, r"topk must be in \[1, 16\]", lambda: ops.moe_route(torch.zeros(2, 32), 17)),
        (
            ValueError,
            "scoring must be 'softmax' or 'sigmoid' or 'none'",
            lambda: ops.moe_route(x, 2, scoring="relu"),
        ),
        (TypeError, "renormalize must be a bool", lambda: ops.moe_route(x, 2, renormalize="yes")),
        (
            ValueError,
            "must divide E = 8",
            lambda: ops.moe_route(x, 2, num_expert_group=3, topk_group=1),
        ),
        (ValueError, "both be given", lambda: ops.moe_route(x, 2, num_expert_group=2)),
        (
            ValueError,
            "topk_group must be <= num_expert_group = 2",
            lambda: ops.moe_route(x, 2, num_expert_group=2, topk_group=3),
        ),
        (
            ValueError,
            "experts of the kept groups",
            lambda: ops.moe_route(x, 5, num_expert_group=2, topk_group=1),
        ),
        (
            ValueError,
            "num_expert_group must be None or an int >= 1",
            lambda: ops.moe_route(x, 2, num_expert_group=0, topk_group=0),
        ),
        (
            ValueError,
            r"correction_bias must have shape \[E\] = \[8\]",
            lambda: ops.moe_route(x, 2, correction_bias=torch.zeros(7)),
        ),
        (
            TypeError,
            "correction_bias must have dtype torch.float32",
            lambda: ops.moe_route(x, 2, correction_bias=torch.zeros(8, dtype=torch.float16)),
        ),
        (TypeError, "router_logits must have dtype", lambda: ops.moe_route(x.double(), 2)),
        (
            ValueError,
            r"E \(router_logits.shape\[1\]\) must be in \[1, 1024\]",
            lambda: ops.moe_route(torch.zeros(1, 1025), 2),
        ),
        (ValueError, "topk_weights", lambda: ops.moe_route_out(x, 2, w[:1], ids)),
        (
            TypeError,
            "topk_ids must have dtype torch.int32",
            lambda: ops.moe_route_out(x, 2, w, ids.long()),
        ),
        (
            TypeError,
            "token_expert_indices must have dtype torch.int32",
            lambda: ops.moe_route_out(x, 2, w, ids, token_expert_indices=ids.long()),
        ),
        (
            ValueError,
            "token_expert_indices needs >= 4 elements",
            lambda: ops.moe_route_out(x, 2, w, ids, token_expert_indices=tei[:1]),
        ),
        (
            ValueError,
            "overlap",
            lambda: ops.moe_route_out(x, 2, w, ids, token_expert_indices=ids),
        ),
        (
            ValueError,
            "overlap",
            lambda: ops.moe_route(x, 2, token_expert_indices=x.view(-1)[:4].view(2, 2).view(I32)),
        ),
    ]
    calls = cpu_module.kernel_calls()
    for exc, msg, call in bad:
        with pytest.raises(exc, match=msg) as info:
            call()
        assert "\n" not in str(info.value)
    assert cpu_module.kernel_calls() == calls, "a kernel ran"
    assert (w.view(I32) == POISON).all() and (ids == POISON).all() and (tei == POISON).all()


def test_same_errors_as_the_reference():
    x = torch.zeros(2, 8)
    for kw in ({"scoring": "relu"}, {"num_expert_group": 3, "topk_group": 1},
               {"correction_bias": torch.zeros(7)}, {"renormalize": None},
               {"num_expert_group": 2}, {"routed_scaling_factor": "2"}):  # fmt: skip
        with pytest.raises((TypeError, ValueError)) as mine:
            ops.moe_route(x, 2, **kw)
        with pytest.raises(type(mine.value)) as theirs:
            R.moe_route(x, 2, **kw)
        assert str(mine.value) == str(theirs.value)


def test_option_values_as_the_reference():
    """The wrappers convert plain option values inline and anything else through the
    validators' ``<op>_codes``: every value, valid or not, gives the reference's outputs or
    its error (numpy scalars, ints for bools, floats and bools for counts)."""
    np = pytest.importorskip("numpy")
    x = make_logits(5, 8, torch.float32, seed=4)
    values = dict(
        scoring=("softmax", "sigmoid", "none", "relu", np.str_("sigmoid"), 1, None),
        renormalize=(True, False, 1, 0, 2, 1.0, None, np.bool_(True)),
        groups=((None, None), (2, 1), (np.int64(2), 1), (2, np.int32(2)), (0, 0), (0, 1), (2, 0),
                (2.0, 1), (True, 1), (2, True), (-1, 1), ("2", 1), (None, 1)),
    )  # fmt: skip
    for scoring in values["scoring"]:
        for renormalize in values["renormalize"]:
            for groups, topk_group in values["groups"]:
                kw = dict(scoring=scoring, renormalize=renormalize, num_expert_group=groups,
                          topk_group=topk_group)  # fmt: skip
                try:
                    want = R.moe_route(x, 2, **kw)
                except (TypeError, ValueError) as e:
                    with pytest.raises(type(e)) as mine:
                        ops.moe_route(x, 2, **kw)
                    assert str(mine.value) == str(e), kw
                    continue
                got = ops.moe_route(x, 2, **kw)
                assert all(
                    torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True)
                ), kw


def test_quant_dtype_values_as_the_reference():
    """The wrappers pick the op by ``quant_dtype`` with a dict lookup: every value, valid or
    not (unhashable included), gives the reference's outputs or its error."""
    np = pytest.importorskip("numpy")
    x = make_logits(3, 8, torch.float32, seed=5)
    a = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).bfloat16()
    for quant_dtype in ("mxfp4", "mxfp8", np.str_("mxfp8"), "fp4", "MXFP4", None, 4, ["mxfp4"]):
        try:
            want = R.moe_route_sort_quant(x, a, 2, 8, 32, quant_dtype=quant_dtype)
        except (TypeError, ValueError) as e:
            with pytest.raises(type(e)) as mine:
                ops.moe_route_sort_quant(x, a, 2, 8, 32, quant_dtype=quant_dtype)
            assert str(mine.value) == str(e), quant_dtype
            continue
        got = ops.moe_route_sort_quant(x, a, 2, 8, 32, quant_dtype=quant_dtype)
        # the gate, the quant (which tells the formats apart) and the sort's count
        pick = lambda r: (*r[:2], *r[3:], r[2].num_valid_ids)  # noqa: E731
        for g, w in zip(pick(got), pick(want), strict=True):
            assert g.dtype == w.dtype and torch.equal(g.view(torch.uint8), w.view(torch.uint8))


# ------------------------------------------------------------------ moe_route_sort_quant
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_dtype", ("mxfp4", "mxfp8"))
def test_route_sort_quant_is_route_then_sort_quant(quant_dtype, device):
    m, e, k, d = 19, 256, 8, 512
    x = (torch.randn(m, d, generator=torch.Generator().manual_seed(3)) * 3).bfloat16()
    logits = make_logits(m, e, torch.bfloat16, seed=4)
    bias = torch.randn(e, generator=torch.Generator().manual_seed(5)) * 0.1
    x, logits, bias = x.to(device), logits.to(device), bias.to(device)
    kw = dict(scoring="sigmoid", num_expert_group=8, topk_group=4, correction_bias=bias,
              routed_scaling_factor=2.5, quant_dtype=quant_dtype)  # fmt: skip
    got = ops.moe_route_sort_quant(logits, x, k, e, 32, **kw)
    want = R.moe_route_sort_quant(logits, x, k, e, 32, **kw)
    rkw = {n: v for n, v in kw.items() if n != "quant_dtype"}
    w, ids = R.moe_route(logits, k, **rkw)
    sort, a_q, a_scale = R.moe_sort_quant(ids, w, x, e, 32, quant_dtype=quant_dtype)
    n = int(sort.num_valid_ids[0])
    for one in (got, want):
        assert torch.equal(bits(one[0]), bits(w)) and torch.equal(one[1].cpu(), ids.cpu())
        assert torch.equal(one[2].sorted_token_ids[:n].cpu(), sort.sorted_token_ids[:n].cpu())
        assert torch.equal(one[2].reverse_sorted.cpu(), sort.reverse_sorted.cpu())
        assert torch.equal(one[3].cpu(), a_q.cpu()) and torch.equal(one[4].cpu(), a_scale.cpu())


def test_route_sort_quant_checks_both_before_any_kernel(cpu_module):
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    calls = cpu_module.kernel_calls()
    with pytest.raises(ValueError, match="block_m"):
        ops.moe_route_sort_quant(torch.zeros(2, 8), x, 2, 8, 48)
    with pytest.raises(ValueError, match="topk must be <= E"):
        ops.moe_route_sort_quant(torch.zeros(2, 8), x, 9, 8, 32)
    assert cpu_module.kernel_calls() == calls


def test_route_output_sizes_live_in_one_place(monkeypatch):
    """The reference's moe_route takes its checks and output sizes from
    reference.route.route_outputs, the one place of that rule in the reference (the ops
    take theirs from the op table)."""

    class Sentinel(Exception):
        pass

    def route_outputs(*args, **kwargs):
        raise Sentinel

    monkeypatch.setattr(RR, "route_outputs", route_outputs)
    with pytest.raises(Sentinel):
        R.moe_route(torch.randn(4, 8), 2)


def test_out_forms_return_a_moe_sort_output_for_any_sequence(cpu_module):
    """The _out wrappers return the caller's sort buffers as a MoeSortOutput, as the reference
    does, whether ``out`` was passed as one, a list or a tuple."""
    m, e, k, d, bm = 3, 16, 4, 256, 32
    logits, x = make_logits(m, e, torch.float32, seed=6), torch.zeros(m, d, dtype=torch.bfloat16)
    w, ids, sort, a_q, a_scale = ops.moe_route_sort_quant(logits, x, k, e, bm)
    for out in (sort, list(sort), tuple(sort)):
        got = ops.moe_route_sort_quant_out(logits, x, k, e, bm, w, ids, out, a_q, a_scale)
        assert type(got[2]) is MoeSortOutput
        assert all(a is b for a, b in zip(got[2], sort, strict=True))  # the caller's buffers
        assert type(ops.moe_sort_out(ids, w, e, bm, out)) is MoeSortOutput
        assert type(ops.moe_sort_quant_out(ids, w, x, e, bm, out, a_q, a_scale)[0]) is MoeSortOutput
