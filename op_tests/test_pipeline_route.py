"""``aiter-aux run`` starts from router logits: :mod:`aiter_aux.routing` (random logits
routed by a model's router, the fused shared expert's column, the fallback to drawn routing
where moe_route cannot route the shape) and the route step of :mod:`aiter_aux.pipeline`,
checked byte for byte against the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.pipeline import run_one  # noqa: E402
from aiter_aux.router_config import DEFAULT_ROUTER, router_for  # noqa: E402
from aiter_aux.routing import draw_logits, resolve_router, route_logits  # noqa: E402

ROUTERS = ("DeepSeek-V3", "Kimi-K2-Instruct", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1",
           "gpt-oss-120b")  # fmt: skip


@pytest.mark.parametrize("model", ROUTERS)
@pytest.mark.parametrize("m", [0, 1, 33])
def test_routed_ids_equal_the_reference(model, m):
    router = router_for(model)
    expert, topk = 257, 9  # 256 routed experts + a fused shared one
    logits = draw_logits(m, expert, topk, router, torch.Generator().manual_seed(m))
    assert logits.router_logits.shape == (m, 256) and logits.topk == 8
    assert (logits.options["correction_bias"] is not None) == router.correction_bias
    want_ids, want_w = route_logits(logits, expert, ref)
    got_ids, got_w = route_logits(logits, expert, ops)
    assert torch.equal(got_ids, want_ids) and torch.equal(
        got_w.view(torch.int32), want_w.view(torch.int32)
    )
    # the fused shared expert: last column, every token, weight 1
    assert bool((want_ids[:, 8] == 256).all()) and bool((want_w[:, 8] == 1).all())
    if m:  # each token's routed experts are distinct and routed
        assert bool((want_ids[:, :8] < 256).all())
        assert all(len(set(row)) == 8 for row in want_ids[:, :8].tolist())
        w, ids = ref.moe_route(logits.router_logits, 8, **logits.options)
        assert torch.equal(want_ids[:, :8], ids)


def test_run_one_checks_the_route_step():
    router = router_for("DeepSeek-V3")
    rows = run_one((257, 7168, 256, 9), 3, 32, torch.Generator().manual_seed(1), "cpu",
                   repeat=1, router=router)  # fmt: skip
    assert rows[0].op == "moe_route" and rows[0].sizes == "E=256 topk=8"
    assert rows[0].nbytes == 3 * 256 * 2 + 8 * 3 * 8 + 4 * 256  # logits, outputs, bias
    assert all(r.ok for r in rows), rows
    drawn = run_one((257, 7168, 256, 9), 3, 32, torch.Generator().manual_seed(1), "cpu",
                    repeat=1, router=None)  # fmt: skip
    assert "moe_route" not in {r.op for r in drawn} and all(r.ok for r in drawn)


@pytest.mark.parametrize("quant", ["mxfp4", "mxfp8"])
def test_run_one_checks_the_preamble_in_one_call(quant):
    """Where the gate routes every expert of the shape, ``run`` also runs the preamble in one
    call (moe_route_sort_quant with sorted scales) and checks it byte for byte; a fused
    shared expert (not the gate's column) leaves it out."""
    from aiter_aux.pipeline import Options

    router = router_for("DeepSeek-V3")
    opts = Options(quant=quant)
    rows = run_one((256, 512, 256, 8), 5, 32, torch.Generator().manual_seed(2), "cpu",
                   repeat=1, options=opts, router=router)  # fmt: skip
    op = "moe_route_sort_quant" + ("_fp8" if quant == "mxfp8" else "")
    one = [r for r in rows if r.op == op]
    assert len(one) == 1 and one[0].sizes == "sorted scales" and all(r.ok for r in rows)
    route = next(r for r in rows if r.op == "moe_route").nbytes
    fused = next(r for r in rows if r.op.startswith("moe_sort_quant")).nbytes
    assert one[0].nbytes > route + fused  # the sorted scales written too
    shared = run_one((257, 512, 256, 9), 5, 32, torch.Generator().manual_seed(2), "cpu",
                     repeat=1, options=opts, router=router)  # fmt: skip
    assert op not in {r.op for r in shared} and all(r.ok for r in shared)


def test_resolve_router():
    router, line = resolve_router((257, 7168, 256, 9), "auto")
    assert router.model == "DeepSeek-V3" and line.startswith("router: DeepSeek-V3 (sigmoid")
    assert "over 256 experts, top-8, and the fused shared expert" in line.replace("\n  ", " ")
    assert max(len(ln) for ln in line.splitlines()) <= 100
    router, line = resolve_router((256, 3072, 256, 8), "auto")
    assert router is DEFAULT_ROUTER and "no shipped model config serves" in line
    assert "Note: gpt-oss" in resolve_router((128, 3072, 768, 4), "auto")[1].replace("\n  ", " ")
    # moe_route takes topk <= 16: auto falls back to drawn routing, a named router refuses
    router, line = resolve_router((256, 3072, 256, 17), "auto")
    assert router is None and "routing drawn" in line and "topk must be in [1, 16]" in line
    with pytest.raises(ValueError, match="--router default: moe_route cannot route"):
        resolve_router((256, 3072, 256, 17), "default")
    with pytest.raises(ValueError, match="num_expert_group = 8 must divide E = 60"):
        resolve_router((60, 2048, 1408, 4), "DeepSeek-V3")
