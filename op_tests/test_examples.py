"""The usage examples run and hold what they state: examples/moe_layer.py (a whole MXFP4 MoE
layer, a4w4 and a8w4, from the aux ops) stays within its stated tolerance of a dense fp32
MoE, and every Python block of docs/integration.md (and each README block marked
``<!-- run -->``) runs as written."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION_MD = ROOT / "docs" / "integration.md"


def _load_example():
    spec = importlib.util.spec_from_file_location("moe_layer", ROOT / "examples" / "moe_layer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


moe_layer = _load_example()
_EXPERTS: dict[str, object] = {}  # one weight set per device, shared by the cases


def _experts(request, device: str):
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
    else:
        request.getfixturevalue("cpu_module")  # build (or find) the CPU module once
    if device not in _EXPERTS:
        num_experts, model_dim, inter_dim, _ = moe_layer.DEFAULT_SHAPE
        _EXPERTS[device] = moe_layer.Mxfp4Experts(num_experts, model_dim, inter_dim, device)
    return _EXPERTS[device]


# M = 8 at topk 8 over 256 experts places several tokens in some expert's segment.
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("quant", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("num_tokens, routed_scaling_factor", [(1, 1.0), (8, 2.5)])
def test_moe_layer_within_tolerance(request, device, quant, num_tokens, routed_scaling_factor):
    experts = _experts(request, device)
    topk = moe_layer.DEFAULT_SHAPE[3]
    r = moe_layer.compare(experts, num_tokens, topk, quant, routed_scaling_factor, seed=1)
    assert r["rel_err"] < moe_layer.TOLERANCE[quant], r
    assert r["ok"]


def test_moe_layer_rows_shared_by_tokens(request):
    """The M = 8 case above exercises expert segments that hold several tokens' rows."""
    experts = _experts(request, "cpu")
    g = torch.Generator().manual_seed(1)
    torch.randn(8, experts.model_dim, generator=g)  # compare() draws x first
    logits = torch.randn(8, experts.num_experts, generator=g)
    topk_ids, _ = moe_layer.route(logits, moe_layer.DEFAULT_SHAPE[3])
    assert int(topk_ids.unique(return_counts=True)[1].max()) >= 2


def test_moe_layer_routes_with_the_model_router(request):
    """route() is moe_route with the router's options: the reference's ids and weights."""
    request.getfixturevalue("cpu_module")
    from aiter_aux.router_config import router_for

    router = router_for(moe_layer.DEFAULT_ROUTER)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, moe_layer.DEFAULT_SHAPE[0], generator=g)
    options = moe_layer.router_options(router, moe_layer.DEFAULT_SHAPE[0], "cpu", g)
    assert options["num_expert_group"] == 8 and options["correction_bias"].shape == (256,)
    topk_ids, topk_weights = moe_layer.route(logits, moe_layer.DEFAULT_SHAPE[3], options)
    want_w, want_ids = moe_layer.reference.moe_route(logits, moe_layer.DEFAULT_SHAPE[3], **options)
    assert torch.equal(topk_ids, want_ids) and torch.equal(topk_weights, want_w)
    experts = _experts(request, "cpu")
    r = moe_layer.compare(experts, 4, moe_layer.DEFAULT_SHAPE[3], "mxfp4", seed=2, router=router)
    assert r["ok"], r


def test_moe_layer_main(request, capsys):
    request.getfixturevalue("cpu_module")
    assert moe_layer.main(["--device", "cpu", "--tokens", "2", "--quant", "mxfp8"]) == 0
    out = capsys.readouterr().out
    assert "a8w4" in out and "M=2" in out and "ok" in out
    assert "router: DeepSeek-V3 (sigmoid, renormalize, groups 4 of 8" in out


def test_moe_layer_fused_shared_expert(request, capsys):
    """A catalog shape with a fused shared expert (odd E): the router scores E - 1 experts and
    picks topk - 1, and every token also takes the last expert with weight 1.0."""
    request.getfixturevalue("cpu_module")
    from aiter_aux.router_config import router_for

    e, topk = 257, 9
    assert moe_layer.routed_experts(e, topk) == 256 and moe_layer.routed_experts(256, 8) == 256
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 256, generator=g)
    options = moe_layer.router_options(router_for(moe_layer.DEFAULT_ROUTER), 256, "cpu", g)
    ids, w = moe_layer.route(logits, topk, options, e)
    want_w, want_ids = moe_layer.reference.moe_route(logits, topk - 1, **options)
    assert torch.equal(ids[:, :-1], want_ids) and torch.equal(w[:, :-1], want_w)
    assert (ids[:, -1] == e - 1).all() and (w[:, -1] == 1.0).all()
    assert moe_layer.main(["--device", "cpu", "--tokens", "2", "--shape", "257,7168,256,9"]) == 0
    assert "M=2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--shape", "2000,3072,256,8"],
        ["--shape", "256,2880,256,8"],
        ["--shape", "1,2,3"],
        ["--tokens", "x"],
        ["--tokens", "0,4"],
    ]
    + ([] if torch.cuda.is_available() else [["--device", "cuda"]]),
)
def test_moe_layer_main_rejects(argv, capsys):
    """What no op can serve (E 2000; model_dim 2880, which the sorted scales refuse) and bad
    arguments: one argparse error, exit 2."""
    with pytest.raises(SystemExit) as e:
        moe_layer.main(["--device", "cpu", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_moe_layer_runs_a_shape_outside_the_catalog(capsys):
    """A servable shape the catalog lacks runs: its instances are built on demand."""
    assert not moe_layer.aiter_aux.is_mxfp4_moe_shape_supported(8, 256, 256, 2)
    assert moe_layer.main(["--device", "cpu", "--tokens", "1", "--shape", "8,256,256,2",
                           "--router", "default"]) == 0  # fmt: skip
    assert "M=1" in capsys.readouterr().out


# Python blocks preceded by <!-- run --> run on CPU as written, each in a fresh namespace:
# every one of docs/integration.md, those of the README that are marked.
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def _python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(line, code, marked to run) of each ```python block of ``path``."""
    text = path.read_text()
    blocks = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        marked = text[: m.start()].rstrip("\n").endswith("<!-- run -->")
        blocks.append((line, m.group(1), marked))
    return blocks


def test_integration_md_blocks_all_marked_to_run():
    blocks = _python_blocks(INTEGRATION_MD)
    assert len(blocks) >= 7
    assert [line for line, _, marked in blocks if not marked] == []


_RUN_BLOCKS = [
    pytest.param(path, code, id=f"{path.name}:{line}")
    for path in (INTEGRATION_MD, ROOT / "README.md")
    for line, code, marked in _python_blocks(path)
    if marked
]


@pytest.mark.parametrize("path, code", _RUN_BLOCKS)
def test_doc_block_runs(cpu_module, path, code):
    exec(compile(code, str(path), "exec"), {"__name__": "doc_block"})
