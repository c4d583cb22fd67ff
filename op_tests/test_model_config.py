""":mod:`aiter_aux.model_config`: the catalog shape of each shipped config
(``aiter_aux/data/model_configs``) at TP 1, 2, 4, 8 and EP, worked out by hand from the
config values and the rules (the expected tuples are literals, never computed by the
module); the derivation text; and the errors.  Stdlib only, no torch."""

from __future__ import annotations

import json

import pytest

from aiter_aux.model_config import (
    CONFIG_DIR,
    ModelConfigError,
    Served,
    format_derivation,
    load_config,
    model_name,
    models_served,
    shapes_from_config,
)

DATA = CONFIG_DIR


def cfg(name: str) -> dict:
    return load_config(DATA / f"{name}.json")


# (fixture, tp, ep, fuse_shared) -> shape.  Rules applied by hand: E = routed / EP (+ 1 when
# the one shared expert of the routed size is fused), topk (+ 1 likewise), inter = expert
# inter / TP (EP >= TP: not split) rounded up to 256, hidden padded up to 256.
CASES = {
    # DeepSeek-V3: 256 routed + 1 shared of 2048, topk 8, hidden 7168; fused by default.
    ("deepseek_v3", 1, 1, None): (257, 7168, 2048, 9),
    ("deepseek_v3", 2, 1, None): (257, 7168, 1024, 9),
    ("deepseek_v3", 4, 1, None): (257, 7168, 512, 9),
    ("deepseek_v3", 8, 1, None): (257, 7168, 256, 9),
    ("deepseek_v3", 1, 1, False): (256, 7168, 2048, 8),
    ("deepseek_v3", 2, 1, False): (256, 7168, 1024, 8),
    ("deepseek_v3", 4, 1, False): (256, 7168, 512, 8),
    ("deepseek_v3", 8, 1, False): (256, 7168, 256, 8),
    ("deepseek_v3", 8, 8, None): (32, 7168, 2048, 8),  # EP: not fused by default
    ("deepseek_v3", 1, 8, None): (32, 7168, 2048, 8),
    ("deepseek_v3", 4, 4, None): (64, 7168, 2048, 8),
    ("deepseek_v3", 8, 8, True): (33, 7168, 2048, 9),  # 32 local + the shared one
    ("deepseek_v3", 8, 2, None): (128, 7168, 512, 8),  # EP 2 inside TP 8: 2048 / 4
    # Kimi-K2: 384 routed + 1 shared of 2048, topk 8, hidden 7168.
    ("kimi_k2", 1, 1, None): (385, 7168, 2048, 9),
    ("kimi_k2", 2, 1, None): (385, 7168, 1024, 9),
    ("kimi_k2", 4, 1, None): (385, 7168, 512, 9),
    ("kimi_k2", 8, 1, None): (385, 7168, 256, 9),
    ("kimi_k2", 1, 1, False): (384, 7168, 2048, 8),
    ("kimi_k2", 8, 1, False): (384, 7168, 256, 8),
    ("kimi_k2", 8, 8, None): (48, 7168, 2048, 8),
    # DeepSeek-V4-Flash: 256 routed + 1 shared of 2048, topk 6, hidden 4096.
    ("deepseek_v4_flash", 1, 1, None): (257, 4096, 2048, 7),
    ("deepseek_v4_flash", 2, 1, None): (257, 4096, 1024, 7),
    ("deepseek_v4_flash", 4, 1, None): (257, 4096, 512, 7),
    ("deepseek_v4_flash", 8, 1, None): (257, 4096, 256, 7),
    ("deepseek_v4_flash", 1, 1, False): (256, 4096, 2048, 6),
    ("deepseek_v4_flash", 8, 8, None): (32, 4096, 2048, 6),
    # GLM-4.5: 160 routed + 1 shared of 1536, topk 8, hidden 5120.
    ("glm_4_5", 1, 1, None): (161, 5120, 1536, 9),
    ("glm_4_5", 2, 1, None): (161, 5120, 768, 9),
    ("glm_4_5", 4, 1, None): (161, 5120, 512, 9),  # 384 -> 512
    ("glm_4_5", 8, 1, None): (161, 5120, 256, 9),  # 192 -> 256
    ("glm_4_5", 1, 1, False): (160, 5120, 1536, 8),
    ("glm_4_5", 8, 8, None): (20, 5120, 1536, 8),
    # GLM-4.5-Air: 128 routed + 1 shared of 1408, topk 8, hidden 4096.
    ("glm_4_5_air", 1, 1, None): (129, 4096, 1536, 9),  # 1408 -> 1536
    ("glm_4_5_air", 2, 1, None): (129, 4096, 768, 9),  # 704 -> 768
    ("glm_4_5_air", 4, 1, None): (129, 4096, 512, 9),  # 352 -> 512
    ("glm_4_5_air", 8, 1, None): (129, 4096, 256, 9),  # 176 -> 256
    # Qwen3-235B-A22B: 128 experts, no shared, topk 8, moe_inter 1536, hidden 4096.
    ("qwen3_235b_a22b", 1, 1, None): (128, 4096, 1536, 8),
    ("qwen3_235b_a22b", 2, 1, None): (128, 4096, 768, 8),
    ("qwen3_235b_a22b", 4, 1, None): (128, 4096, 512, 8),  # 384 -> 512
    ("qwen3_235b_a22b", 8, 1, None): (128, 4096, 256, 8),  # 192 -> 256
    ("qwen3_235b_a22b", 4, 4, None): (32, 4096, 1536, 8),
    ("qwen3_235b_a22b", 8, 8, None): (16, 4096, 1536, 8),
    # Qwen3-30B-A3B: 128 experts, topk 8, moe_inter 768, hidden 2048.
    ("qwen3_30b_a3b", 1, 1, None): (128, 2048, 768, 8),
    ("qwen3_30b_a3b", 2, 1, None): (128, 2048, 512, 8),  # 384 -> 512
    ("qwen3_30b_a3b", 4, 1, None): (128, 2048, 256, 8),  # 192 -> 256
    ("qwen3_30b_a3b", 8, 1, None): (128, 2048, 256, 8),  # 96 -> 256
    # Qwen1.5-MoE-A2.7B: 60 experts + a shared expert of 5632 (not 1408: not fused), topk 4.
    ("qwen1_5_moe_a2_7b", 1, 1, None): (60, 2048, 1536, 4),  # 1408 -> 1536
    ("qwen1_5_moe_a2_7b", 2, 1, None): (60, 2048, 768, 4),
    ("qwen1_5_moe_a2_7b", 4, 1, None): (60, 2048, 512, 4),
    ("qwen1_5_moe_a2_7b", 8, 1, None): (60, 2048, 256, 4),
    ("qwen1_5_moe_a2_7b", 4, 4, None): (15, 2048, 1536, 4),
    # gpt-oss-120b: 128 experts, topk 4, inter 2880, hidden 2880 padded to 3072.
    ("gpt_oss_120b", 1, 1, None): (128, 3072, 3072, 4),  # 2880 -> 3072
    ("gpt_oss_120b", 2, 1, None): (128, 3072, 1536, 4),  # 1440 -> 1536
    ("gpt_oss_120b", 4, 1, None): (128, 3072, 768, 4),  # 720 -> 768
    ("gpt_oss_120b", 8, 1, None): (128, 3072, 512, 4),  # 360 -> 512
    ("gpt_oss_120b", 8, 8, None): (16, 3072, 3072, 4),
    # gpt-oss-20b: 32 experts, otherwise as gpt-oss-120b.
    ("gpt_oss_20b", 1, 1, None): (32, 3072, 3072, 4),
    ("gpt_oss_20b", 2, 1, None): (32, 3072, 1536, 4),
    ("gpt_oss_20b", 4, 1, None): (32, 3072, 768, 4),
    ("gpt_oss_20b", 8, 1, None): (32, 3072, 512, 4),
    ("gpt_oss_20b", 8, 8, None): (4, 3072, 3072, 4),
    # Llama-4-Scout (text_config): 16 experts of 8192, topk 1, hidden 5120; its built-in
    # shared expert is never fused.
    ("llama_4_scout", 1, 1, None): (16, 5120, 8192, 1),
    ("llama_4_scout", 2, 1, None): (16, 5120, 4096, 1),
    ("llama_4_scout", 4, 1, None): (16, 5120, 2048, 1),
    ("llama_4_scout", 8, 1, None): (16, 5120, 1024, 1),
    ("llama_4_scout", 8, 8, None): (2, 5120, 8192, 1),
    # Mixtral-8x7B: 8 experts, topk 2, inter 14336, hidden 4096.
    ("mixtral_8x7b", 1, 1, None): (8, 4096, 14336, 2),
    ("mixtral_8x7b", 2, 1, None): (8, 4096, 7168, 2),
    ("mixtral_8x7b", 4, 1, None): (8, 4096, 3584, 2),
    ("mixtral_8x7b", 8, 1, None): (8, 4096, 1792, 2),
    ("mixtral_8x7b", 4, 4, None): (2, 4096, 14336, 2),
}


@pytest.mark.parametrize(("key", "shape"), CASES.items(), ids=lambda v: str(v))
def test_fixture_shapes(key, shape):
    name, tp, ep, fuse = key
    d = shapes_from_config(cfg(name), tp, ep, fuse)
    assert d.shape == shape
    assert d.steps[-1] == f"shape: {shape}"


def test_every_fixture_is_covered_and_names_its_source():
    files = {p.stem for p in DATA.glob("*.json")}
    assert files == {key[0] for key in CASES}
    for name in files:
        source = cfg(name)["_source"]
        assert source.count("/") == 1 and " " not in source, (name, source)


def test_derivation_states_the_rules():
    d = shapes_from_config(cfg("gpt_oss_120b"), 4)
    text = "\n".join(format_derivation(d))
    assert (
        "pad hidden 2880 -> 3072: moe_sort_scales needs model_dim % 256 == 0; pad the activations"
        in text
    )
    assert "TP 4 splits inter: 2880 / 4 = 720" in text
    assert "round inter 720 up to 768" in text
    assert any("padded" in n for n in d.notes)
    assert text.endswith(
        "catalog line: (128, 3072, 768, 4),  # gpt-oss-120b TP4 "
        "(hidden 2880 padded to 3072; inter 2880 / 4 = 720 -> 768)"
    )

    d = shapes_from_config(cfg("deepseek_v3"), 2)
    assert (
        d.fused_shared and d.comment == "DeepSeek-V3 TP2, shared expert fused (moe_inter 2048 / 2)"
    )
    assert "E = 256 routed + 1 fused shared = 257" in d.steps
    assert "topk: num_experts_per_tok = 8 + 1 fused shared = 9" in d.steps
    assert any("intermediate_size 18432 is the dense MLP's" in s for s in d.steps)
    d = shapes_from_config(cfg("deepseek_v3"), 2, fuse_shared=False)
    assert d.comment == "DeepSeek-V3 TP2, shared expert not fused (moe_inter 2048 / 2)"

    d = shapes_from_config(cfg("deepseek_v3"), 8, 8)
    assert not d.fused_shared and any("not fused under EP 8" in s for s in d.steps)
    assert d.comment == (
        "DeepSeek-V3 EP8, shared expert not fused (256 / 8 local experts; moe_inter 2048)"
    )
    d = shapes_from_config(cfg("deepseek_v3"), 8, 8, True)
    assert "E = 32 local + 1 fused shared = 33" in d.steps

    d = shapes_from_config(cfg("qwen1_5_moe_a2_7b"), 1)
    assert any("its inter 5632 is not the routed experts'" in s for s in d.steps)
    d = shapes_from_config(cfg("llama_4_scout"), 1)
    assert d.steps[0].startswith("reading text_config")
    assert any("text_config.intermediate_size_mlp 16384 is the dense MLP's" in s for s in d.steps)
    assert any("router weight" in n for n in d.notes)


def test_qwen_style_shared_expert_of_the_routed_size_is_fused():
    # Qwen3.5 style: text_config, shared_expert_intermediate_size == moe_intermediate_size.
    config = {
        "model_type": "qwen3_5_moe",
        "text_config": {
            "hidden_size": 2048,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "num_experts": 256,
            "num_experts_per_tok": 8,
        },
    }
    d = shapes_from_config(config, 1)
    assert d.shape == (257, 2048, 512, 9)
    assert any("shared_expert_gate" in n for n in d.notes)
    assert shapes_from_config(config, 2, fuse_shared=False).shape == (256, 2048, 256, 8)
    # A shared size of 0 means no shared expert (Qwen3-Coder configs).
    config["text_config"]["shared_expert_intermediate_size"] = 0
    assert shapes_from_config(config, 1).shape == (256, 2048, 512, 8)


def test_two_shared_experts_are_not_fused():
    config = dict(cfg("deepseek_v3"), n_shared_experts=2)
    d = shapes_from_config(config, 1)
    assert d.shape == (256, 7168, 2048, 8)
    assert any("one MLP of 2 x 2048 = 4096" in s for s in d.steps)
    with pytest.raises(ModelConfigError, match="2 shared experts"):
        shapes_from_config(config, 1, fuse_shared=True)


@pytest.mark.parametrize("name", ["qwen3_235b_a22b", "qwen1_5_moe_a2_7b", "llama_4_scout"])
def test_fuse_shared_refused_where_impossible(name):
    with pytest.raises(ModelConfigError, match="cannot fuse the shared expert: ") as e:
        shapes_from_config(cfg(name), 1, fuse_shared=True)
    assert "\n" not in str(e.value)


def test_missing_keys_name_every_key_looked_for():
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008}
    with pytest.raises(ModelConfigError) as e:
        shapes_from_config(config, 1)
    msg = str(e.value)
    assert "(llama)" in msg and "\n" not in msg
    for key in ("n_routed_experts", "num_local_experts", "num_experts", "num_experts_per_tok",
                "experts_per_token", "num_experts_per_token"):  # fmt: skip
        assert key in msg
    assert "moe_intermediate_size" not in msg  # inter and hidden were found
    # null counts as absent
    config = dict(cfg("glm_4_5"), n_routed_experts=None)
    with pytest.raises(ModelConfigError, match=r"no routed experts \(looked for n_routed"):
        shapes_from_config(config, 1)


@pytest.mark.parametrize(
    ("name", "tp", "ep", "match"),
    [
        ("mixtral_8x7b", 3, 1, r"TP 3 does not divide intermediate_size 14336"),
        ("qwen3_235b_a22b", 5, 1, r"TP 5 does not divide moe_intermediate_size 1536"),
        ("qwen1_5_moe_a2_7b", 8, 8, r"EP 8 does not divide the 60 routed experts"),
        ("deepseek_v3", 1, 3, r"EP 3 does not divide the 256 routed experts"),
        ("deepseek_v3", 8, 3, r"EP 3 and TP 8: one must divide the other"),
        ("gpt_oss_20b", 16, 16, r"topk 4 exceeds E = 2 .*EP 16 leaves 2 local experts"),
        ("mixtral_8x7b", 8, 8, r"topk 2 exceeds E = 1"),
        ("deepseek_v3", 0, 1, r"tp must be a positive integer, got 0"),
        ("deepseek_v3", 1, -2, r"ep must be a positive integer, got -2"),
    ],
)
def test_layout_errors(name, tp, ep, match):
    with pytest.raises(ModelConfigError, match=match) as e:
        shapes_from_config(cfg(name), tp, ep)
    assert "\n" not in str(e.value)


def test_limits():
    config = {"hidden_size": 1024, "moe_intermediate_size": 256, "num_experts_per_tok": 8}
    assert shapes_from_config(dict(config, num_experts=1024), 1).shape == (1024, 1024, 256, 8)
    with pytest.raises(ModelConfigError, match="E = 1025 exceeds the 1024 experts"):
        shapes_from_config(dict(config, num_experts=1025), 1)
    fused = dict(config, num_experts=1024, n_shared_experts=1)
    with pytest.raises(ModelConfigError, match="E = 1025 exceeds .* do not fuse"):
        shapes_from_config(fused, 1)
    assert shapes_from_config(fused, 1, fuse_shared=False).shape == (1024, 1024, 256, 8)
    top = dict(config, num_experts=512, num_experts_per_tok=255)
    assert shapes_from_config(top, 1).shape == (512, 1024, 256, 255)
    with pytest.raises(ModelConfigError, match=r"topk 256 exceeds 255 .*min\(E, 255\)"):
        shapes_from_config(dict(top, num_experts_per_tok=256), 1)


def test_bad_values():
    with pytest.raises(ModelConfigError, match="num_experts must be a non-negative integer"):
        shapes_from_config(dict(cfg("qwen3_30b_a3b"), num_experts="128"), 1)
    with pytest.raises(ModelConfigError, match="num_experts is 0: not a MoE layer"):
        shapes_from_config(dict(cfg("qwen3_30b_a3b"), num_experts=0), 1)
    config = dict(cfg("gpt_oss_20b"), experts_per_token=2)
    d = shapes_from_config(config, 1)
    assert d.shape == (32, 3072, 3072, 4)
    assert any("experts_per_token = 2 disagrees with num_experts_per_tok = 4" in n for n in d.notes)


def test_load_config_errors(tmp_path):
    with pytest.raises(ModelConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="is not valid JSON"):
        load_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(ModelConfigError, match="holds a JSON list, not an object"):
        load_config(tmp_path / "list.json")


def test_model_name():
    assert model_name({"_source": "deepseek-ai/DeepSeek-V3"}) == "DeepSeek-V3"
    assert model_name({"_name_or_path": "/models/Qwen3-30B-A3B/"}) == "Qwen3-30B-A3B"
    assert model_name({"model_type": "mixtral"}) == "mixtral"
    assert shapes_from_config(cfg("kimi_k2"), 4, name="Kimi-K2").comment.startswith("Kimi-K2 TP4")


def test_models_served():
    catalog = [
        (257, 7168, 512, 9),
        (256, 7168, 256, 8),
        (32, 7168, 2048, 8),
        (128, 3072, 512, 4),
        (128, 3072, 1500, 4),  # inter rounded here: 1536
        (8, 4096, 1792, 2),
    ]
    configs = {n: cfg(n) for n in ("deepseek_v3", "gpt_oss_120b", "mixtral_8x7b", "glm_4_5")}
    assert models_served(catalog, configs) == [
        Served("deepseek_v3", 4, 1, True, (257, 7168, 512, 9)),
        Served("deepseek_v3", 8, 1, False, (256, 7168, 256, 8)),
        Served("deepseek_v3", 8, 8, False, (32, 7168, 2048, 8)),
        Served("gpt_oss_120b", 2, 1, False, (128, 3072, 1536, 4)),
        Served("gpt_oss_120b", 8, 1, False, (128, 3072, 512, 4)),
        Served("mixtral_8x7b", 8, 1, False, (8, 4096, 1792, 2)),
    ]
    # a list of configs is named by model_name
    assert models_served([(8, 4096, 14336, 2)], [cfg("mixtral_8x7b")]) == [
        Served("Mixtral-8x7B-v0.1", 1, 1, False, (8, 4096, 14336, 2))
    ]


# ------------------------------------------------------------ P6: reading without bounds
def _one_line_naming(e: ModelConfigError, path) -> None:
    assert str(path) in str(e) and "\n" not in str(e), str(e)


@pytest.mark.parametrize(
    "text, message",
    [(b"[" * 200_000 + b"]" * 200_000, "nested"),
     (b'{"model_type": "\xff\xfe"}', "UTF-8"),
     (b'{"hidden_size": ' + b"9" * 5001 + b"}", "digits"),
     (json.dumps({"_name_or_path": "org/Model\u0000X"}).encode(), "control"),
     (json.dumps({"_source": "org/Model\u202eX"}).encode(), "control"),
     (json.dumps({"_name_or_path": "org/" + "M" * 100_000}).encode(), "characters"),
     (json.dumps({"_source": "org/M\udcffX"}).encode(), "surrogates")],
    ids=["deep", "utf8", "digits", "nul", "bidi", "huge-name", "surrogate"],
)  # fmt: skip
def test_every_parse_failure_is_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_bytes(text)
    with pytest.raises(ModelConfigError, match=message) as e:
        load_config(path)
    _one_line_naming(e.value, path)


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "config.json"
    with path.open("wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of zeros, never read
    with pytest.raises(ModelConfigError, match="bytes") as e:
        load_config(path)
    _one_line_naming(e.value, path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_devices_are_refused(device):
    import os

    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(ModelConfigError, match="not a regular file") as e:
        load_config(device)
    _one_line_naming(e.value, device)


def test_fifo_is_refused_without_blocking(tmp_path):
    import os
    import threading

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    result = {}

    def read():
        try:
            load_config(fifo)
        except ModelConfigError as e:
            result["error"] = str(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the test process can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_config blocked on a FIFO")
    assert "not a regular file" in result["error"] and str(fifo) in result["error"]


def test_directory_symlink_loop_and_unreadable_name_the_path(tmp_path):
    import os

    (tmp_path / "dir").mkdir()
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    for path, message in [
        (tmp_path / "dir", r"not a regular file \(a directory\)"),
        (tmp_path / "loop_a", "cannot read"),
        (tmp_path / "missing.json", "No such file"),
    ]:
        with pytest.raises(ModelConfigError, match=message) as e:
            load_config(path)
        _one_line_naming(e.value, path)
        assert "fd " not in str(e.value) and "Errno" not in str(e.value), str(e.value)
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root reads it anyway
        return
    with pytest.raises(ModelConfigError, match="Permission denied") as e:
        load_config(locked)
    _one_line_naming(e.value, locked)


def test_hidden_size_no_padding_serves_is_refused_not_advised():
    """A hidden size whose padded model_dim is over the limit the kernels compile is refused
    in one line; the derivation never advises padding to a value add-shape refuses."""
    from aiter_aux.jit.paths import codegen_module

    L = codegen_module("limits")
    top = L.MODEL_DIM.hi // 256 * 256
    base = dict(cfg("mixtral_8x7b"))
    d = shapes_from_config(dict(base, hidden_size=top - 1), 1)
    assert d.shape[1] == top and any(
        f"pad the activations (and the weights' model_dim) with " f"zeros to {top}" in n
        for n in d.notes
    )
    for hidden in (top + 1, L.MODEL_DIM.hi + 1):
        with pytest.raises(ModelConfigError, match="no padding serves it") as e:
            shapes_from_config(dict(base, hidden_size=hidden), 1)
        assert f"hidden_size {hidden}" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ModelConfigError, match="over the inter_rounded"):
        shapes_from_config(dict(base, intermediate_size=L.INTER.hi), 1)
