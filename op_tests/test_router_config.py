""":mod:`aiter_aux.router_config`: each shipped config's router as moe_route options (the
expected options are literals read off the published configs and the architectures' code,
never computed by the module); moe_route with those options against each router written
out in plain torch as the model's code states it (fp32 logits, no ties); the router
``aiter-aux run`` picks for a shape; and the errors."""

from __future__ import annotations

import pytest

from aiter_aux.model_config import CONFIG_DIR, ModelConfigError, load_config
from aiter_aux.router_config import (
    DEFAULT_ROUTER,
    router_for,
    router_from_config,
    router_of_shape,
)


def cfg(name: str) -> dict:
    return load_config(CONFIG_DIR / f"{name}.json")


# file -> (scoring, renormalize, num_expert_group, topk_group, correction bias, scaling)
EXPECTED = {
    "deepseek_v3": ("sigmoid", True, 8, 4, True, 2.5),  # noaux_tc, n_group 8 / topk_group 4
    "kimi_k2": ("sigmoid", True, None, None, True, 2.827),  # n_group 1: no groups
    "glm_4_5": ("sigmoid", True, None, None, True, 2.5),  # sigmoid + bias in code
    "glm_4_5_air": ("sigmoid", True, None, None, True, 1.0),
    "qwen3_235b_a22b": ("softmax", True, None, None, False, 1.0),  # norm_topk_prob true
    "qwen3_30b_a3b": ("softmax", True, None, None, False, 1.0),
    "qwen1_5_moe_a2_7b": ("softmax", False, None, None, False, 1.0),  # norm_topk_prob false
    "mixtral_8x7b": ("softmax", True, None, None, False, 1.0),  # renormalises in code
    "gpt_oss_120b": ("softmax", True, None, None, False, 1.0),  # softmax over the top-k
    "gpt_oss_20b": ("softmax", True, None, None, False, 1.0),
    "llama_4_scout": ("sigmoid", False, None, None, False, 1.0),  # sigmoid of the top-1
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_routers(name):
    r = router_from_config(cfg(name))
    got = (r.scoring, r.renormalize, r.num_expert_group, r.topk_group, r.correction_bias,
           r.routed_scaling_factor)  # fmt: skip
    assert got == EXPECTED[name]
    assert r.steps and all(isinstance(s, str) for s in r.steps)


def test_every_shipped_config_is_covered():
    names = {p.stem for p in CONFIG_DIR.glob("*.json")}
    assert names == set(EXPECTED) | {"deepseek_v4_flash"}


def test_deepseek_v4_is_refused_with_the_reason():
    with pytest.raises(ModelConfigError, match="sqrt\\(softplus"):
        router_from_config(cfg("deepseek_v4_flash"))


def test_notes_for_routers_computed_another_way():
    assert "softmax over its top-k" in router_from_config(cfg("gpt_oss_20b")).notes[0]
    assert "sigmoid to its top-k" in router_from_config(cfg("llama_4_scout")).notes[0]
    assert router_from_config(cfg("deepseek_v3")).notes == ()


@pytest.mark.parametrize(
    "config, want",
    [({}, ("softmax", True, None, None, False, 1.0)),  # moe_route's defaults
     ({"n_group": 4, "topk_group": 2, "topk_method": "greedy"},  # greedy ignores groups
      ("softmax", True, None, None, False, 1.0)),
     ({"n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy",
       "scoring_func": "softmax"}, ("softmax", True, 4, 2, False, 1.0)),
     ({"text_config": {"model_type": "x", "num_experts": 8, "norm_topk_prob": False,
                       "routed_scaling_factor": 3}}, ("softmax", False, None, None, False, 3.0))],
)  # fmt: skip
def test_absent_fields_take_the_defaults(config, want):
    r = router_from_config(config)
    assert (r.scoring, r.renormalize, r.num_expert_group, r.topk_group, r.correction_bias,
            r.routed_scaling_factor) == want  # fmt: skip


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"scoring_func": "sqrtsoftplus"}, "scoring_func 'sqrtsoftplus' is not one moe_route"),
        ({"n_group": 8}, "n_group = 8 without topk_group"),
        ({"n_group": 0, "topk_group": 1}, "n_group must be a positive integer, got 0"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
        ({"routed_scaling_factor": -1}, "routed_scaling_factor must be a positive number"),
    ],
)
def test_bad_fields_are_one_line_errors(config, fragment):
    with pytest.raises(ModelConfigError, match=fragment.replace("(", "\\(")):
        router_from_config(config)


def test_options_need_the_bias_the_model_has():
    r = router_from_config(cfg("deepseek_v3"))
    with pytest.raises(ValueError, match="needs a correction_bias"):
        r.options()
    assert r.options("bias")["correction_bias"] == "bias"
    assert DEFAULT_ROUTER.options() == dict(
        scoring="softmax",
        renormalize=True,
        num_expert_group=None,
        topk_group=None,
        correction_bias=None,
        routed_scaling_factor=1.0,
    )


def test_router_for_names():
    assert router_for("default") is DEFAULT_ROUTER
    assert router_for("deepseek-v3").model == "DeepSeek-V3"  # case-insensitive
    assert router_for(str(CONFIG_DIR / "mixtral_8x7b.json")).model == "Mixtral-8x7B-v0.1"
    with pytest.raises(ModelConfigError, match="not a shipped model"):
        router_for("no-such-model")


@pytest.mark.parametrize(
    "shape, model",
    [((257, 7168, 256, 9), "DeepSeek-V3"),  # DeepSeek-V3 TP8, shared expert fused
     ((384, 7168, 256, 8), "Kimi-K2-Instruct"),  # Kimi-K2 TP8, not fused
     ((128, 3072, 768, 4), "gpt-oss-120b"),  # gpt-oss-120b TP4
     ((128, 4096, 1536, 8), "Qwen3-235B-A22B"),  # GLM-4.5-Air's layout too: the catalog's
     ((7, 256, 256, 1), "default")],  # no shipped model
)  # fmt: skip
def test_router_of_shape(shape, model):
    router, why = router_of_shape(shape)
    assert router.model == model
    assert why.startswith("no shipped model") == (model == "default")
    assert ("so does GLM-4.5-Air" in why) == (model == "Qwen3-235B-A22B"), why


def test_router_of_a_deepseek_v4_shape_is_the_default():
    router, why = router_of_shape((257, 4096, 256, 7))  # DeepSeek-V4-Flash TP8 fused
    assert router is DEFAULT_ROUTER and "sqrt(softplus" in why


# ------------------------------------------------ moe_route against the models' own routers
torch = pytest.importorskip("torch")


def _deepseek(logits, bias, k, groups, kept, scale):
    """noaux_tc as DeepSeek-V3's code states it."""
    m, e = logits.shape
    scores = logits.float().sigmoid()
    choice = scores + bias
    gscore = choice.view(m, groups, -1).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros(m, groups).scatter_(1, gscore.topk(kept, dim=-1).indices, 1.0)
    mask = keep[:, :, None].expand(m, groups, e // groups).reshape(m, e).bool()
    ids = choice.masked_fill(~mask, float("-inf")).topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def _sigmoid_bias(logits, bias, k, scale):  # Kimi-K2 (n_group 1), GLM-4.5
    scores = logits.float().sigmoid()
    ids = (scores + bias).topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def _softmax_topk(logits, k, renormalize):  # Qwen3 / Qwen1.5 (norm_topk_prob), Mixtral
    w, ids = logits.float().softmax(-1).topk(k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True) if renormalize else w


def _topk_softmax(logits, k):  # gpt-oss: the softmax over the top-k logits
    v, ids = logits.float().topk(k, dim=-1)
    return ids, v.softmax(-1)


def _topk_sigmoid(logits, k):  # Llama-4
    v, ids = logits.float().topk(k, dim=-1)
    return ids, v.sigmoid()


@pytest.mark.parametrize(
    "name, e, k, plain",
    [("deepseek_v3", 256, 8, lambda x, b: _deepseek(x, b, 8, 8, 4, 2.5)),
     ("kimi_k2", 384, 8, lambda x, b: _sigmoid_bias(x, b, 8, 2.827)),
     ("glm_4_5", 160, 8, lambda x, b: _sigmoid_bias(x, b, 8, 2.5)),
     ("qwen3_30b_a3b", 128, 8, lambda x, b: _softmax_topk(x, 8, True)),
     ("qwen1_5_moe_a2_7b", 60, 4, lambda x, b: _softmax_topk(x, 4, False)),
     ("mixtral_8x7b", 8, 2, lambda x, b: _softmax_topk(x, 2, True)),
     ("gpt_oss_120b", 128, 4, lambda x, b: _topk_softmax(x, 4)),
     ("llama_4_scout", 16, 1, lambda x, b: _topk_sigmoid(x, 1))],
)  # fmt: skip
def test_moe_route_with_the_config_options_is_the_models_router(name, e, k, plain):
    from aiter_aux import reference as ref

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(64, e, generator=g) * 2
    router = router_from_config(cfg(name))
    bias = torch.randn(e, generator=g) * 0.05 if router.correction_bias else None
    w, ids = ref.moe_route(logits, k, **router.options(bias))
    want_ids, want_w = plain(logits, bias)
    assert torch.equal(ids.long(), want_ids)  # same experts, same (descending) order
    torch.testing.assert_close(w, want_w.float(), rtol=4e-6, atol=0)
