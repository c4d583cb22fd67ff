"""``aiter-aux add-shape --from-config`` and ``aiter-aux list --models``
(:mod:`aiter_aux.model_cli`), on temporary copies of the source tree made with the helpers of
``test_catalog_edit.py``: the derivation printed, the derived line added to both lists as
``add-shape E,D,INTER,TOPK`` adds it (and rebuilt), a shape already there said with exit 0,
user errors in one line with exit 2, and the table of served models.  Then the repository's
own catalog: every layout it promises for a shipped model config, derived by model_config,
is supported by ``is_mxfp4_moe_shape_supported``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from instance_counts import keys_of
from test_catalog_edit import GEN, OPS, ast_test, cli, files, make_copy, snapshot

from aiter_aux import catalog_edit as ce
from aiter_aux.model_config import CONFIG_DIR, load_config, shapes_from_config
from aiter_aux.ops.moe_mxfp4_aux import is_mxfp4_moe_shape_supported

WIDTH = 100  # the project's line length: the catalog files and list's output


def config(name: str) -> str:
    return str(CONFIG_DIR / f"{name}.json")


@pytest.fixture
def tree(tmp_path):
    return make_copy(tmp_path / "tree")


def keep_only(tree: Path, keep: list) -> None:
    """Cut both catalog lists of the copy to ``keep`` (in its file order)."""
    for shape in ce.read_catalog(tree / GEN, "SHAPES"):
        if shape not in keep:
            ce.remove_shape(shape, **files(tree))
    assert set(ce.read_catalog(tree / OPS, "MXFP4_MOE_SUPPORTED_SHAPES")) == set(keep)


def without(tree: Path, *shapes) -> None:
    """The copy without ``shapes`` (where present), as before they were catalogued."""
    present = set(ce.read_catalog(tree / GEN, "SHAPES"))
    for shape in shapes:
        if shape in present:
            ce.remove_shape(shape, **files(tree))


def added_lines(before: dict[Path, bytes]) -> dict[Path, list[str]]:
    """Per catalog file, the lines that are new since ``before`` (stripped)."""
    out = {}
    for path, old in before.items():
        old_lines = set(old.decode().splitlines())
        out[path] = [ln.strip() for ln in path.read_text().splitlines() if ln not in old_lines]
    return out


# ------------------------------------------------------------------------ add-shape
def test_dry_run_prints_the_derivation_and_the_padding_and_edits_nothing(tree):
    without(tree, (128, 3072, 768, 4))
    before = snapshot(tree)
    p = cli(tree, "add-shape", "--from-config", config("gpt_oss_120b"), "--tp", "4", "--dry-run")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    for want in [
        "gpt-oss-120b at TP4:",
        "  routed experts: num_local_experts = 128",
        "  E = 128",
        "  topk: num_experts_per_tok = 4",
        "  pad hidden 2880 -> 3072: moe_sort_scales needs model_dim % 256 == 0; pad the "
        "activations",
        "  TP 4 splits inter: 2880 / 4 = 720",
        "  shape: (128, 3072, 768, 4)",
        "catalog line: (128, 3072, 768, 4),  # gpt-oss-120b TP4 (hidden 2880 padded to 3072; "
        "inter 2880 / 4 -> 768)",
        "dry run: (128, 3072, 768, 4) is not in the catalog; add-shape would add the line to "
        "both lists and rebuild",
    ]:
        assert want in lines, (want, p.stdout)
    assert any(ln.startswith("  round inter 720 up to 768") for ln in lines), p.stdout
    assert snapshot(tree) == before


def test_adds_the_derived_line_to_both_lists_then_says_it_is_there(tree):
    shape = (257, 7168, 1024, 9)
    without(tree, shape)
    before = snapshot(tree)
    args = ("add-shape", "--from-config", config("deepseek_v3"), "--tp", "2", "--no-build")
    p = cli(tree, *args)
    assert p.returncode == 0, p.stderr
    assert "  E = 256 routed + 1 fused shared = 257" in p.stdout.splitlines(), p.stdout
    assert f"added {shape}" in p.stdout and "not rebuilt (--no-build)" in p.stdout
    comment = "DeepSeek-V3 TP2, shared expert fused (moe_inter 2048 / 2)"
    assert added_lines(before) == {path: [f"{shape},  # {comment}"] for path in before}
    assert ast_test(tree).returncode == 0
    after = snapshot(tree)
    p = cli(tree, *args)  # a model the catalog serves: said, no error, nothing edited
    assert p.returncode == 0, p.stderr
    assert f"{shape} is already in the catalog, as {comment!r}" in p.stdout, p.stdout
    assert "aiter-aux run --shape 257,7168,1024,9" in p.stdout
    assert snapshot(tree) == after


@pytest.mark.parametrize(
    "name, options, shape, comment",
    [("deepseek_v3", ["--tp", "2", "--no-fuse-shared"], (256, 7168, 1024, 8),
      "DeepSeek-V3 TP2, shared expert not fused (moe_inter 2048 / 2)"),
     ("glm_4_5", ["--tp", "4"], (161, 5120, 512, 9),
      "GLM-4.5 TP4, shared expert fused (moe_inter 1536 / 4 = 384 -> 512)"),
     ("mixtral_8x7b", ["--tp", "8", "--ep", "2"], (4, 4096, 3584, 2),
      "Mixtral-8x7B-v0.1 TP8 EP2 (8 / 2 local experts; inter 14336 / 4)"),
     # the full comment would pass 100 columns: the line keeps the model and layout
     ("deepseek_v3", ["--tp", "8", "--ep", "8", "--fuse-shared"], (33, 7168, 2048, 9),
      "DeepSeek-V3 EP8, shared expert fused"),
     ("kimi_k2", ["--tp", "1", "--note", "Kimi-K2  TP1"], (385, 7168, 2048, 9), "Kimi-K2 TP1")],
)  # fmt: skip
def test_layout_options_and_note(tree, name, options, shape, comment):
    without(tree, shape)
    before = snapshot(tree)
    p = cli(tree, "add-shape", "--from-config", config(name), *options, "--no-build")
    assert p.returncode == 0, p.stderr
    assert f"catalog line: {shape},  # {comment}" in p.stdout.splitlines(), p.stdout
    added = added_lines(before)
    assert added == {path: [f"{shape},  # {comment}"] for path in before}
    assert all(len(ln) <= WIDTH for path in before for ln in path.read_text().splitlines())


def test_rebuild_compiles_only_the_new_instances(tree):
    """A built one-shape catalog; add-shape --from-config compiles the new shape's instances
    only and says how to run it."""
    keep_only(tree, [(256, 3072, 256, 8)])
    assert cli(tree, "build").returncode == 0
    p = cli(tree, "add-shape", "--from-config", config("gpt_oss_20b"), "--tp", "8")
    assert p.returncode == 0, p.stderr
    keys = keys_of((256, 3072, 256, 8), (32, 3072, 512, 4))
    new = keys - keys_of((256, 3072, 256, 8))  # the keys that spell E or topk
    assert (
        f"{len(keys)} instances, {len(new)} instance TUs compiled, relinked" in p.stdout
    ), p.stdout
    assert "aiter-aux run --shape 32,3072,512,4" in p.stdout


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "make, options, message",
    [(lambda d: str(d / "missing.json"), ["--tp", "2"], "cannot read "),
     (lambda d: _write(d, "{"), ["--tp", "2"], "is not valid JSON"),
     (lambda d: _write(d, "[1, 2]"), ["--tp", "2"], "holds a JSON list, not an object"),
     (lambda d: _write(d, "[" * 200_000), ["--tp", "2"], "JSON nested too deeply to read"),
     (lambda d: _write(d, '{"hidden_size": ' + "7" * 5001 + "}"), ["--tp", "2"],
      "value has 5001 digits"),
     (lambda d: _write(d, json.dumps({"_source": "a/b\u0000c"})), ["--tp", "2"],
      "control or bidi characters (U+0000)"),
     (lambda d: _write(d, json.dumps({"_source": "a/b\udcffc"})), ["--tp", "2"],
      "the model name (_source, _name_or_path or model_type) holds lone surrogates"),
     (lambda d: "/dev/zero", ["--tp", "2"], "not a regular file"),
     (lambda d: str(d), ["--tp", "2"], "not a regular file (a directory)"),
     (lambda d: _write(d, json.dumps({"model_type": "llama", "hidden_size": 4096})), ["--tp", "1"],
      "not a MoE config this derivation reads (llama): the config has no routed experts"),
     (lambda d: config("deepseek_v3"), ["--tp", "3"],
      "TP 3 does not divide moe_intermediate_size 2048"),
     (lambda d: config("deepseek_v3"), ["--tp", "1", "--ep", "3"],
      "EP 3 does not divide the 256 routed experts"),
     (lambda d: config("deepseek_v3"), ["--tp", "4", "--ep", "3"], "one must divide the other"),
     (lambda d: config("deepseek_v3"), ["--tp", "0"], "tp must be a positive integer, got 0"),
     (lambda d: config("llama_4_scout"), ["--tp", "1", "--fuse-shared"],
      "cannot fuse the shared expert"),
     (lambda d: config("deepseek_v3"), [], "--from-config needs --tp N"),
     (lambda d: config("deepseek_v3"), ["--tp", "x"], "argument --tp: invalid int value: 'x'"),
     (lambda d: config("deepseek_v3"), ["--tp", "2", "1,2,3,4"], "not both")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tree, tmp_path, make, options, message):
    before = snapshot(tree)
    p = cli(tree, "add-shape", "--from-config", make(tmp_path), *options, "--no-build")
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiter-aux add-shape: error: "), lines
    assert message in lines[0] and "Traceback" not in p.stderr, lines
    assert snapshot(tree) == before


def test_derivation_errors_name_the_config_file(tree, tmp_path):
    path = _write(tmp_path, json.dumps({"model_type": "llama", "hidden_size": 4096}))
    p = cli(tree, "add-shape", "--from-config", path, "--tp", "1", "--no-build")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert f"error: ModelConfigError: {path}: not a MoE config" in lines[0], lines


@pytest.mark.parametrize(
    "args, message",
    [([], "give the shape E,MODEL_DIM,INTER,TOPK or --from-config CONFIG.json"),
     (["1,2,3,4", "--note", "x", "--tp", "2"], "--tp: only with --from-config"),
     (["1,2,3,4", "--note", "x", "--dry-run"], "--dry-run: only with --from-config"),
     (["160,5120,1536,8"], "the following arguments are required: --note/--model")],
)  # fmt: skip
def test_usage_errors_without_from_config(tree, args, message):
    p = cli(tree, "add-shape", *args, "--no-build")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr


# --------------------------------------------------------------------------- list --models
def test_list_models_on_a_small_catalog(tree):
    keep_only(tree, [(128, 3072, 768, 4), (257, 7168, 1024, 9), (32, 7168, 2048, 8),
                     (33, 7168, 2048, 8)])  # fmt: skip
    p = cli(tree, "list", "--models")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()  # piped: rows whole (on a terminal: test_cli's width test)
    assert not [ln for ln in lines if ln.endswith("...")]
    both = {ln.split("  ", 1)[0]: ln.split("  ", 1)[1].strip() for ln in lines[1:13]}
    rows = {name: text.split(" | ")[0] for name, text in both.items()}  # prebuilt layouts
    assert rows["DeepSeek-V3"] == "fused: TP2; not fused: EP8"
    assert rows["gpt-oss-120b"] == "TP4 (hidden 2880 padded to 3072)"
    assert rows["Kimi-K2-Instruct"] == "none" and rows["Mixtral-8x7B-v0.1"] == "none"
    # every model is served: what the catalog lacks is built on first use
    assert all(" | " in text and not text.endswith("| none") for text in both.values()), both
    assert both["Mixtral-8x7B-v0.1"].startswith("none | TP1 TP2 TP4 TP8"), both
    names = {load_config(p)["_source"].rsplit("/", 1)[1] for p in CONFIG_DIR.glob("*.json")}
    assert set(rows) == names
    assert "catalog shapes serving none of these models: 1 of 4" in lines
    (unused,) = [ln for ln in lines if ln.lstrip().startswith("33 ")]
    assert unused.split() == ["33", "7168", "2048", "8", "no", "public", "model", "(DeepSeek-V3/R1",
                              "EP8", "plus", "one", "expert,", "topk", "8)"]  # fmt: skip


def test_list_models_on_the_catalog(tmp_path):
    """The repository's catalog: every model row, and the shapes no public model uses.  (On a
    terminal the rows fit 100 columns: test_cli.test_list_rows_whole_with_wide_or_off_a_terminal.)
    """
    p = cli(Path(__file__).resolve().parents[1], "list", "--models", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    names = {load_config(c)["_source"].rsplit("/", 1)[1] for c in CONFIG_DIR.glob("*.json")}
    assert names <= {ln.split("  ", 1)[0] for ln in p.stdout.splitlines()}
    assert "no public model" in p.stdout


# ------------------------------------------------------------- the repository's catalog
PROMISED = (
    [("qwen3_235b_a22b", tp, None) for tp in (1, 2, 4, 8)]
    + [("gpt_oss_120b", tp, None) for tp in (1, 2, 4, 8)]
    + [("gpt_oss_20b", tp, None) for tp in (1, 2, 4, 8)]
    + [("deepseek_v3", tp, fuse) for tp in (1, 2, 4, 8) for fuse in (True, False)]
    + [("kimi_k2", tp, fuse) for tp in (1, 4, 8) for fuse in (True, False)]
    + [("deepseek_v4_flash", tp, True) for tp in (1, 2, 4, 8)]
)


@pytest.mark.parametrize("name, tp, fuse", PROMISED)
def test_catalog_serves_the_promised_model_layouts(name, tp, fuse):
    """The layout's shape comes from the shipped config through model_config; the predicate
    gets what a dispatcher passes: the padded model_dim and the per-rank inter (unrounded)."""
    d = shapes_from_config(load_config(config(name)), tp, 1, fuse)
    expert, model_dim, _, topk = d.shape
    assert is_mxfp4_moe_shape_supported(expert, model_dim, d.inter // d.moe_tp, topk), d.shape


def test_shape_added_by_another_process_meanwhile_is_no_error(tree, monkeypatch, capsys):
    """The race of concurrent ``--from-config`` calls of one shape, made deterministic: the
    shape is absent when this call derives it and present once it holds the catalog lock;
    it says so and exits 0, as the sequential case does."""
    from aiter_aux import cli as C
    from aiter_aux import model_cli

    shape = (257, 7168, 1024, 9)
    without(tree, shape)
    monkeypatch.setattr(ce, "default_files", lambda: (tree / GEN, tree / OPS))
    real = model_cli._catalog_view

    def absent_then_added(s):
        view = real(s)
        ce.add_shape(s, "another process", **files(tree))  # it wins the race
        return {}, view[1]

    monkeypatch.setattr(model_cli, "_catalog_view", absent_then_added)
    code = C.main(["add-shape", "--from-config", config("deepseek_v3"), "--tp", "2",
                   "--no-build"])  # fmt: skip
    after = snapshot(tree)
    out = capsys.readouterr().out
    assert code == 0 and f"{shape} is already in the catalog" in out, out
    assert [s for s in ce.read_catalog(tree / GEN, "SHAPES") if s == shape] == [shape]
    assert after == snapshot(tree)


@pytest.mark.robust
def test_concurrent_from_config_of_one_shape_all_exit_0(tree):
    shape = (257, 7168, 1024, 9)
    without(tree, shape)
    env = dict(os.environ, AITER_AUX_SOURCE_DIR=str(tree), AITER_AUX_BACKEND="cpu",
               AITER_AUX_CACHE_DIR=str(tree / "cache"))  # fmt: skip
    cmd = [sys.executable, "-m", "aiter_aux.cli", "add-shape", "--from-config",
           config("deepseek_v3"), "--tp", "2", "--no-build"]  # fmt: skip
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]  # fmt: skip
    results = [(p.wait(120), *p.communicate()) for p in procs]
    assert [r[0] for r in results] == [0] * 8, [r[2] for r in results if r[0]]
    assert sum(f"added {shape}" in r[1] for r in results) == 1
    assert ce.read_catalog(tree / GEN, "SHAPES").count(shape) == 1
    assert ast_test(tree).returncode == 0
