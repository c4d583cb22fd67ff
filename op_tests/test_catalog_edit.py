"""``aiter-aux add-shape`` / ``remove-shape`` (:mod:`aiter_aux.catalog_edit`) on temporary
copies of the source tree: minimal edits that keep both lists in agreement (checked by
re-running the AST test on the copy), refusals, crash safety, and the rebuild that follows.
The repository's own catalog files are never touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiter_aux import catalog_edit as ce

ROOT = Path(__file__).resolve().parents[1]
GEN = Path("codegen/gen_instances.py")
OPS = Path("aiter_aux/ops/moe_mxfp4_aux.py")
NEW = (160, 5120, 1536, 8)


def make_copy(dst: Path) -> Path:
    """codegen/, templates/, csrc/, the ops catalog and the AST test, copied to ``dst``."""
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, dst / sub, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in (OPS, Path("op_tests/test_mxfp4_moe_aux_codegen.py")):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)
    return dst


@pytest.fixture
def tree(tmp_path):
    return make_copy(tmp_path / "tree")


def files(tree: Path) -> dict:
    return {"gen_file": tree / GEN, "ops_file": tree / OPS}


def snapshot(tree: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (tree / GEN, tree / OPS)}


def ast_test(tree: Path) -> subprocess.CompletedProcess:
    """The AST/codegen test, run on the copy (its paths are relative to its own file)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(tree / "op_tests" / "test_mxfp4_moe_aux_codegen.py")],
        capture_output=True, text=True, cwd=tree,
    )  # fmt: skip


def cli(tree: Path, *args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, AITER_AUX_SOURCE_DIR=str(tree), AITER_AUX_BACKEND="cpu")
    env["AITER_AUX_CACHE_DIR"] = str(cache or tree / "cache")
    return subprocess.run([sys.executable, "-m", "aiter_aux.cli", *args], capture_output=True,
                          text=True, env=env)  # fmt: skip


def test_add_then_remove_keeps_lists_agreeing_and_formatting(tree):
    before = snapshot(tree)
    r = ce.add_shape((160, 5120, 1500, 8), "Test-MoE TP4", **files(tree))  # inter -> 1536
    assert r.shape == NEW and NEW in r.shapes
    for path, old in before.items():
        old_lines, new_lines = old.decode().splitlines(), path.read_text().splitlines()
        added = [ln for ln in new_lines if ln not in old_lines]
        assert added == [f"{' ' * (len(added[0]) - len(added[0].lstrip()))}"
                         "(160, 5120, 1536, 8),  # Test-MoE TP4"], added  # fmt: skip
        assert [ln for ln in new_lines if ln != added[0]] == old_lines  # nothing else changed
    assert NEW in ce.read_catalog(tree / GEN, "SHAPES")
    assert NEW in ce.read_catalog(tree / OPS, "MXFP4_MOE_SUPPORTED_SHAPES")
    p = ast_test(tree)
    assert p.returncode == 0, p.stdout[-3000:]
    ce.remove_shape((160, 5120, 1536, 8), **files(tree))
    assert snapshot(tree) == before, "remove-shape did not restore the files byte for byte"


def test_duplicate_is_refused_with_clear_message(tree):
    before = snapshot(tree)
    existing = ce.read_catalog(tree / GEN, "SHAPES")[0]
    with pytest.raises(ce.CatalogEditError, match=r"already in the catalog"):
        ce.add_shape(existing, **files(tree))
    with pytest.raises(ce.CatalogEditError, match=r"not in the catalog"):
        ce.remove_shape(NEW, **files(tree))
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "shape, rule",
    [((0, 5120, 256, 1), "expert"), ((2048, 5120, 256, 8), "expert"),
     ((160, 5000, 256, 8), "model_dim"), ((160, 5120 + 32, 256, 8), "model_dim"),
     ((160, 5120, 0, 8), "inter"), ((8, 5120, 256, 9), "topk"), ((300, 5120, 256, 256), "topk"),
     ((1300, 5120, 256, 8), "shared memory")],
)  # fmt: skip
def test_invalid_shape_is_refused(tree, shape, rule):
    before = snapshot(tree)
    with pytest.raises(ce.CatalogEditError, match=rule):
        ce.add_shape(shape, **files(tree))
    assert snapshot(tree) == before


def test_shared_memory_bound():
    assert ce.sort_smem_bytes(1024) <= ce.SMEM_LIMIT_BYTES < ce.sort_smem_bytes(1228)
    assert ce._sort_warps(ROOT / GEN) == ce.DEFAULT_SORT_WARPS


@pytest.mark.parametrize("fail_on", [1, 2])
def test_crash_mid_edit_leaves_both_files_intact(tree, monkeypatch, fail_on):
    before = snapshot(tree)
    calls = []
    real_replace = os.replace

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == fail_on:
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(ce.os, "replace", replace)
    with pytest.raises(OSError, match="simulated crash"):
        ce.add_shape(NEW, **files(tree))
    monkeypatch.undo()
    assert snapshot(tree) == before
    leftovers = [p for d in (tree / "codegen", tree / "aiter_aux/ops") for p in d.glob(".*.tmp")]
    assert not leftovers


def test_half_applied_edit_is_completed_by_rerunning(tree):
    """A process killed between the two moves leaves the shape in one list; the same command
    run again adds it to the other list only."""
    before = snapshot(tree)
    ce.add_shape(NEW, **files(tree))
    (tree / OPS).write_bytes(before[tree / OPS])  # as if killed between the two moves
    r = ce.add_shape(NEW, **files(tree))
    assert list(r.lines) == [tree / OPS]
    assert ast_test(tree).returncode == 0


def test_cli_add_and_remove_shape_no_build(tree):
    before = snapshot(tree)
    p = cli(tree, "add-shape", "160,5120,1536,8", "--note", "Some model", "--no-build")
    assert p.returncode == 0, p.stderr
    assert "added (160, 5120, 1536, 8)" in p.stdout and "not rebuilt" in p.stdout
    assert "# Some model" in (tree / GEN).read_text()
    p = cli(tree, "add-shape", "160,5120,1536,8", "--no-build")
    assert p.returncode == 2 and "already in the catalog" in p.stderr
    p = cli(tree, "add-shape", "160,5000,1536,8", "--no-build")
    assert p.returncode == 2 and "model_dim" in p.stderr
    p = cli(tree, "remove-shape", "160,5120,1400,8", "--no-build")  # 1400 rounds to 1536
    assert p.returncode == 0, p.stderr
    assert snapshot(tree) == before


def test_cli_add_shape_rebuilds_only_new_instances(tree):
    """On a copy shrunk to one shape: add-shape compiles only the new instances and relinks,
    remove-shape compiles nothing and relinks; the module then holds exactly the catalog."""
    keep = [(256, 3072, 512, 8), (256, 3072, 256, 8)]  # same instances, differ in inter
    for shape in ce.read_catalog(tree / GEN, "SHAPES"):
        if shape not in keep:
            ce.remove_shape(shape, **files(tree))
    assert ce.read_catalog(tree / OPS, "MXFP4_MOE_SUPPORTED_SHAPES") == keep
    assert ast_test(tree).returncode == 0
    p = cli(tree, "build")
    assert p.returncode == 0, p.stderr
    p = cli(tree, "add-shape", "128,3072,512,4", "--note", "shares model_dim 3072")
    assert p.returncode == 0, p.stderr
    # new keys: moe_sort_e128_k4, moe_sort_quant_e128_k4_d3072, scatter(_q)_d3072_k4
    assert "10 instances, 4 instance TUs compiled, relinked" in p.stdout, p.stdout
    manifest = json.loads(next((tree / "cache").glob("cpu-*/manifest.json")).read_text())
    assert "moe_sort_e128_k4" in manifest["keys"] and len(manifest["keys"]) == 10
    p = cli(tree, "remove-shape", "128,3072,512,4")
    assert p.returncode == 0 and "0 instance TUs compiled, relinked" in p.stdout, p.stdout
    manifest = json.loads(next((tree / "cache").glob("cpu-*/manifest.json")).read_text())
    assert len(manifest["keys"]) == 6 and manifest["shapes"] == [list(k) for k in keep]
