"""``aiter-aux add-shape`` / ``remove-shape`` (:mod:`aiter_aux.catalog_edit`) on temporary
copies of the source tree: minimal edits that keep both lists in agreement (checked by
re-running the AST test on the copy), refusals, crash safety, and the rebuild that follows.
The repository's own catalog files are never touched."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from instance_counts import keys_of  # op_tests/instance_counts.py

from aiter_aux import catalog_edit as ce
from aiter_aux.jit.progress import format_slowest

ROOT = Path(__file__).resolve().parents[1]
GEN = Path("codegen/catalog.py")
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
    return {"catalog_file": tree / GEN, "ops_file": tree / OPS}


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
        indent = " " * (len(added[0]) - len(added[0].lstrip()))
        assert added == [f"{indent}(160, 5120, 1536, 8),  # Test-MoE TP4 (inter 1500 -> 1536)"]
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
    # the shape as typed, then as rounded (inter 3 -> 256)
    with pytest.raises(
        ce.CatalogEditError, match=r"^\(1, 2, 3, 4\) \(inter rounded: \(1, 2, 256, 4\)\) is not in"
    ):
        ce.remove_shape((1, 2, 3, 4), **files(tree))
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "shape, rule",
    [((0, 5120, 256, 1), "expert"), ((2048, 5120, 256, 8), "expert"),
     ((160, 5000, 256, 8), "model_dim"), ((160, 5120 + 32, 256, 8), "model_dim"),
     ((160, 5120, 0, 8), "inter"), ((8, 5120, 256, 9), "topk"), ((300, 5120, 256, 256), "topk"),
     ((1300, 5120, 256, 8), "expert"), ((-1, 3072, 256, 8), "expert must be positive"),
     ((256, 2**31, 256, 8), "model_dim 2147483648 does not fit a 32-bit int"),
     ((256, 3072, 10**20, 8), "inter 100000000000000000000 does not fit"),
     ((256, 3072, -256, 8), "inter must be positive")],
)  # fmt: skip
def test_invalid_shape_is_refused(tree, shape, rule):
    before = snapshot(tree)
    with pytest.raises(ce.CatalogEditError, match=rule):
        ce.add_shape(shape, "Some model", **files(tree))
    assert snapshot(tree) == before


SMEM_TU = """
#include "gpu/tests/emu.h"
#include "gpu/mxfp4_moe_aux_gpu.h"
namespace sd = aiter_aux::gpu::sort_detail;
static_assert(sd::sort_smem_bytes<SMEM_E>() <= sd::kStaticSmemBytes, "sort smem over 48 KiB");
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("warp", [32, 64])
def test_sort_shared_memory_bound_is_a_static_assert(tmp_path, warp):
    """gpu/sort.h asserts that every sort path's shared memory fits 48 KiB at the catalog's
    largest expert count (1024), so add-shape needs only the catalog's expert bound; the
    same assertion refuses a larger E (checked on the real structs, through the emulator)."""
    src = tmp_path / "smem.cpp"
    src.write_text(SMEM_TU)
    kernels = ROOT / "csrc" / "kernels" / "mxfp4_moe"

    def compile_with(e: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["g++", "-std=c++17", "-fsyntax-only", "-Wno-unknown-pragmas",
             f"-DAITER_AUX_EMU_WARP={warp}", f"-DSMEM_E={e}", f"-I{kernels}", str(src)],
            capture_output=True, text=True,
        )  # fmt: skip

    assert compile_with(1024).returncode == 0, compile_with(1024).stderr[-2000:]
    p = compile_with(1300)
    assert p.returncode != 0 and "sort smem over 48 KiB" in p.stderr
    assert (
        "static_assert(sort_smem_bytes<kMaxSortExperts>()"
        in (kernels / "gpu" / "sort.h").read_text()
    )


@pytest.mark.robust
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
        ce.add_shape(NEW, "Some model", **files(tree))
    monkeypatch.undo()
    assert snapshot(tree) == before
    leftovers = [p for d in (tree / "codegen", tree / "aiter_aux/ops") for p in d.glob(".*.tmp")]
    assert not leftovers


@pytest.mark.robust
def test_half_applied_edit_is_completed_by_rerunning(tree):
    """A process killed between the two moves leaves the shape in one list; the same command
    run again adds it to the other list only."""
    before = snapshot(tree)
    ce.add_shape(NEW, "Some model", **files(tree))
    (tree / OPS).write_bytes(before[tree / OPS])  # as if killed between the two moves
    r = ce.add_shape(NEW, "Some model", **files(tree))
    assert list(r.lines) == [tree / OPS]
    assert ast_test(tree).returncode == 0


def test_cli_add_and_remove_shape_no_build(tree):
    before = snapshot(tree)
    p = cli(tree, "add-shape", "160,5120,1536,8", "--note", "Some model", "--no-build")
    assert p.returncode == 0, p.stderr
    assert "added (160, 5120, 1536, 8)" in p.stdout and "not rebuilt" in p.stdout
    assert "# Some model" in (tree / GEN).read_text()
    p = cli(tree, "add-shape", "160,5120,1536,8", "--note", "x", "--no-build")
    assert p.returncode == 2 and "already in the catalog" in p.stderr
    p = cli(tree, "add-shape", "160,5000,1536,8", "--model", "x", "--no-build")
    assert p.returncode == 2 and "model_dim" in p.stderr
    p = cli(tree, "remove-shape", "160,5120,1400,8", "--no-build")  # 1400 rounds to 1536
    assert p.returncode == 0, p.stderr
    assert snapshot(tree) == before


@pytest.mark.robust
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
    keys = keys_of(*keep, (128, 3072, 512, 4))
    new = keys - keys_of(*keep)  # the keys that spell E or topk
    assert "moe_sort_e128_k4" in new and "mxfp4_quant_d3072" not in new
    assert (
        f"{len(keys)} instances, {len(new)} instance TUs compiled, relinked" in p.stdout
    ), p.stdout
    slow = [ln for ln in p.stderr.splitlines() if "slowest: " in ln]
    assert slow, p.stderr
    named = {item.rsplit(" ", 2)[0] for item in slow[0].split("slowest: ")[1].split(", ")}
    assert named <= new | {"lookup", "module_common"}, slow  # this build's TUs only
    shown = inspect.signature(format_slowest).parameters["n"].default  # names the line holds
    # every TU this build compiled (the new instances and the lookup: on the CPU an instance
    # compiles as fast as the lookup), or a full line of them
    assert len(named) == min(len(new) + 1, shown), slow
    manifest = json.loads(next((tree / "cache").glob("cpu-*/manifest.json")).read_text())
    assert sorted(manifest["keys"]) == sorted(keys)
    p = cli(tree, "remove-shape", "128,3072,512,4")
    assert p.returncode == 0 and "0 instance TUs compiled, relinked" in p.stdout, p.stdout
    manifest = json.loads(next((tree / "cache").glob("cpu-*/manifest.json")).read_text())
    assert sorted(manifest["keys"]) == sorted(keys_of(*keep))
    assert manifest["shapes"] == [list(k) for k in keep]


LOAD_NO_JIT = """
import json
from aiter_aux.jit.spec import load_module
m = load_module("cpu")
print(json.dumps({"keys": sorted(m.keys())}))
"""


def _agrees(tree: Path, keys: set[str]) -> None:
    """A fresh process loads the published module with the JIT disabled, and doctor agrees
    with itself: sources current, nothing to do, op calls load it, status ok."""
    env = dict(os.environ, AITER_AUX_SOURCE_DIR=str(tree), AITER_AUX_BACKEND="cpu",
               AITER_AUX_CACHE_DIR=str(tree / "cache"), AITER_AUX_DISABLE_JIT="1")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", LOAD_NO_JIT], capture_output=True, text=True,
                       env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"keys": sorted(keys)}
    p = cli(tree, "doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "module intact, sources current" in p.stdout, p.stdout
    assert "ninja -n: nothing to do" in p.stdout and "op calls      load " in p.stdout, p.stdout
    assert p.stdout.rstrip().endswith("status        ok"), p.stdout


def test_catalog_edit_publishes_the_module_a_fresh_process_loads(tree):
    """add-shape / remove-shape rebuild; a fresh process with AITER_AUX_DISABLE_JIT=1 then
    loads that module (no rebuild), and doctor says it is current."""
    for shape in ce.read_catalog(tree / GEN, "SHAPES"):
        if shape != (256, 3072, 256, 8):
            ce.remove_shape(shape, **files(tree))
    assert cli(tree, "build").returncode == 0
    p = cli(tree, "add-shape", "128,3072,512,4", "--note", "shares model_dim 3072")
    assert p.returncode == 0, p.stderr
    _agrees(tree, keys_of((256, 3072, 256, 8), (128, 3072, 512, 4)))
    p = cli(tree, "remove-shape", "128,3072,512,4")
    assert p.returncode == 0, p.stderr
    _agrees(tree, keys_of((256, 3072, 256, 8)))


@pytest.mark.robust
def test_concurrent_edits_publish_the_last_catalog(tree):
    """Three add-shapes with rebuild at once: each rebuild runs under the catalog lock, so
    the module published last is the catalog on disk."""
    for shape in ce.read_catalog(tree / GEN, "SHAPES"):
        if shape != (256, 3072, 256, 8):
            ce.remove_shape(shape, **files(tree))
    assert cli(tree, "build").returncode == 0
    env = dict(os.environ, AITER_AUX_SOURCE_DIR=str(tree), AITER_AUX_BACKEND="cpu",
               AITER_AUX_CACHE_DIR=str(tree / "cache"))  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-m", "aiter_aux.cli", "add-shape",
                               f"{e},3072,256,8", "--note", f"concurrent {e}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for e in (96, 160, 224)]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, out + err
    _agrees(tree, keys_of((256, 3072, 256, 8), *((e, 3072, 256, 8) for e in (96, 160, 224))))


# ------------------ D5: concurrent edits, D8: lists changed outside their literal, D7: bad values
ADDER = """
import sys, time
from aiter_aux import catalog_edit as ce
start, gen, ops, e = float(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
time.sleep(max(0.0, start - time.time()))
ce.add_shape((e, 5120, 1536, 8), f"concurrent {e}", catalog_file=gen, ops_file=ops)
"""


@pytest.mark.robust
def test_concurrent_add_shape_loses_no_shape(tree):
    """D5: eight processes add eight different shapes at the same moment; the lock held
    across read, edit and replace keeps all of them (without it most runs lost some)."""
    start = time.time() + 1.5  # every child has imported by then
    experts = [160 + 8 * i for i in range(8)]
    procs = [subprocess.Popen([sys.executable, "-c", ADDER, str(start), str(tree / GEN),
                               str(tree / OPS), str(e)], stderr=subprocess.PIPE, text=True)
             for e in experts]  # fmt: skip
    for p in procs:
        assert p.wait(timeout=900) == 0, p.stderr.read()
    want = {(e, 5120, 1536, 8) for e in experts}
    assert want <= set(ce.read_catalog(tree / GEN, "SHAPES"))
    assert want <= set(ce.read_catalog(tree / OPS, "MXFP4_MOE_SUPPORTED_SHAPES"))
    assert ast_test(tree).returncode == 0


@pytest.mark.parametrize(
    "append, where",
    [("SHAPES += [(128, 3072, 512, 4)]\n", "changed outside its literal"),
     ("SHAPES.append((160, 5120, 1536, 8))\n", "changed outside its literal"),
     ("SHAPES = []\n", "assigned more than once")],
)  # fmt: skip
def test_catalog_changed_outside_its_literal_is_refused(tree, append, where):
    """D8: an entry added outside the literal would be missed (and added twice)."""
    text = (tree / GEN).read_text()
    (tree / GEN).write_text(text + append)
    line = text.count("\n") + 1
    before = snapshot(tree)
    with pytest.raises(ce.CatalogEditError, match=rf"catalog.py:{line}: .*{where}"):
        ce.add_shape((128, 3072, 512, 4), "x", **files(tree))
    with pytest.raises(ce.CatalogEditError, match=where):
        ce.read_catalog(tree / GEN, "SHAPES")
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "old, new, message",
    [("(256, 3072, 256, 8),", "(256, 3072, 256 * 2, 8),", "not a literal tuple of 4 integers"),
     ("(256, 3072, 256, 8),", "(256, 3072, 256, 8),\n    (256, 3072, 256, 8),", "listed twice"),
     ("(256, 3072, 256, 8),", "(256, 3072, 256),", "not a literal tuple of 4 integers")],
)  # fmt: skip
def test_computed_or_duplicate_entry_is_refused_naming_its_line(tree, old, new, message):
    """D8: every entry is seen or the file refused, with the line (no raw ast error)."""
    text = (tree / GEN).read_text()
    at = text.index(old)
    (tree / GEN).write_text(text[:at] + new + text[at + len(old) :])
    line = text[:at].count("\n") + 1 + new.count("\n")
    with pytest.raises(ce.CatalogEditError, match=rf"catalog.py:{line}: .*{message}"):
        ce.add_shape(NEW, "x", **files(tree))
    p = cli(tree, "list")  # the catalog without model names, or a one-line error
    assert p.returncode in (0, 2) and "Traceback" not in p.stderr, p.stderr


def test_new_line_goes_next_to_its_model_then_its_model_dim(tree):
    """The same model (expert, model_dim, topk) first, else the same model_dim."""
    entries = ce.read_entries(tree / GEN)
    ce.add_shape((385, 7168, 1792, 9), "Kimi-K2.5-like test line", **files(tree))
    kimi = max(e.line for e in entries if (e.shape[0], e.shape[1], e.shape[3]) == (385, 7168, 9))
    after = {e.shape: e for e in ce.read_entries(tree / GEN)}
    assert after[(385, 7168, 1792, 9)].line == kimi + 1
    assert after[(385, 7168, 1792, 9)].comment == "Kimi-K2.5-like test line"
    ce.add_shape((160, 3584, 512, 8), "Some 3584 model", **files(tree))
    last_3584 = max(e.line for e in ce.read_entries(tree / GEN) if e.shape[1] == 3584
                    and e.shape != (160, 3584, 512, 8))  # fmt: skip
    after = {e.shape: e for e in ce.read_entries(tree / GEN)}
    assert after[(160, 3584, 512, 8)].line == last_3584 + 1
    assert ast_test(tree).returncode == 0


def test_add_shape_requires_a_note_and_records_the_rounding(tree):
    before = snapshot(tree)
    for note in (None, "", "   "):
        with pytest.raises(ce.CatalogEditError, match="name the model in --note"):
            ce.add_shape(NEW, note, **files(tree))
    for note in ("a\tb", "a\nb", "a\rb"):  # control characters, not whitespace to collapse
        with pytest.raises(ce.CatalogEditError, match="holds control or bidi characters"):
            ce.add_shape(NEW, note, **files(tree))
    assert snapshot(tree) == before
    p = cli(tree, "add-shape", "160,5120,1500,8", "--no-build")
    assert p.returncode == 2 and "--note/--model" in p.stderr
    p = cli(tree, "add-shape", "160,5120,1500,8", "--model", "GLM-4.5 TP1", "--no-build")
    assert p.returncode == 0, p.stderr
    assert "(160, 5120, 1536, 8),  # GLM-4.5 TP1 (inter 1500 -> 1536)" in (tree / GEN).read_text()


@pytest.mark.parametrize(
    "args, message",
    [(["-1,3072,256,8"], "expert must be positive, got -1"),
     (["256,2147483648,256,8"], "model_dim 2147483648 does not fit a 32-bit int"),
     (["256,3072,100000000000000000000,8"], "does not fit a 32-bit int"),
     (["256,3072,2147483647,8"], "inter 2147483647 rounds up to 2147483648 (a multiple of 256), "
      "which does not fit a 32-bit int"),
     (["256,3072,256"], "expected E,MODEL_DIM,INTER,TOPK")],
)  # fmt: skip
def test_cli_refuses_out_of_range_values_in_one_line(tree, args, message):
    """D7: refused before anything is written, one line on stderr, exit 2."""
    before = snapshot(tree)
    p = cli(tree, "add-shape", *args, "--note", "x", "--no-build")
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert snapshot(tree) == before


# ---------------------------------------------------------------- P5: what the kernels compile
def _limits():
    from aiter_aux.jit.paths import codegen_module

    return codegen_module("limits")


def test_catalog_bounds_come_from_the_limits():
    """Every catalog field is bounded by codegen/limits.py, the one place limits live."""
    from aiter_aux.jit.paths import catalog_on_disk, codegen_module

    L, cat = _limits(), codegen_module("catalog")
    top = L.MODEL_DIM.hi // cat.MODEL_DIM_ALIGN * cat.MODEL_DIM_ALIGN  # the largest accepted
    assert cat.validate_shape((8, top, 256, 8)) == []
    assert "model_dim" in " ".join(cat.validate_shape((8, top + cat.MODEL_DIM_ALIGN, 256, 8)))
    assert "inter" in " ".join(cat.validate_shape((8, 256, L.INTER.hi + 1, 8)))
    assert cat.MAX_EXPERTS == L.NUM_EXPERTS.hi and cat.MAX_TOPK == L.TOPK.hi
    alone = catalog_on_disk()  # the catalog file executed alone (add-shape's rules) too
    assert (alone.MAX_MODEL_DIM, alone.MAX_INTER) == (L.MODEL_DIM.hi, L.INTER.hi)


def test_padding_advice_never_names_a_model_dim_the_catalog_refuses():
    """The advice to pad model_dim names a value validate_shape accepts, or says that no
    padded value serves; it never names one over the limit."""
    import re

    from aiter_aux.jit.paths import codegen_module

    L, cat = _limits(), codegen_module("catalog")
    top = L.MODEL_DIM.hi // cat.MODEL_DIM_ALIGN * cat.MODEL_DIM_ALIGN  # the largest accepted
    for model_dim in (2880, top - 1, top + 1, L.MODEL_DIM.hi, L.MODEL_DIM.hi + 1):
        (error,) = cat.validate_shape((8, model_dim, 256, 8))
        advised = re.search(r"pad the hidden size to (\d+)", error)
        if model_dim <= top:
            assert advised and cat.validate_shape((8, int(advised[1]), 256, 8)) == [], error
        else:
            assert not advised and f"at most {L.MODEL_DIM.hi}" in error, error
            assert model_dim % 256 == 0 or "no padding serves it" in error, error


def test_cli_refuses_a_model_dim_that_cannot_compile(tree):
    before = snapshot(tree)
    p = cli(tree, "add-shape", "256,2147482624,256,8", "--note", "x", "--no-build")
    assert p.returncode == 2 and "model_dim" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert snapshot(tree) == before


def test_failed_rebuild_undoes_the_add(tree, monkeypatch, capsys):
    """A rebuild that fails after add-shape's edit takes the shape out again (the catalog
    on disk stays one that builds) and says so; the error is the build's."""
    from aiter_aux import cli as C

    class Boom(Exception):
        pass

    def fail(*a, **k):
        raise Boom("the compiler failed")

    monkeypatch.setattr(C, "_build", fail)
    monkeypatch.setattr(ce, "default_files", lambda: (tree / GEN, tree / OPS))
    before = snapshot(tree)
    with pytest.raises(Boom):
        C.main(["add-shape", ",".join(map(str, NEW)), "--note", "Test-MoE"])
    assert snapshot(tree) == before
    err = capsys.readouterr().err
    assert "taken out of the catalog again" in err and str(NEW) in err


@pytest.mark.parametrize(
    "note, message",
    [("GLM-4.5 \u202eTP4", "control or bidi characters (U+202E)"),
     ("GLM\u0000", "control or bidi characters (U+0000)"),
     ("GLM\u2066x\u2069", "control or bidi characters (U+2066, U+2069)"),
     ("GLM\udcff", "lone surrogates that UTF-8 cannot write (U+DCFF"),
     ("M" * 100_000, "100000 characters long")],
)  # fmt: skip
def test_note_with_control_characters_or_too_long_is_refused(tree, note, message):
    """What a catalog comment may hold: no control or bidi characters, a bounded length."""
    before = snapshot(tree)
    with pytest.raises(ce.CatalogEditError, match=re.escape(message)):
        ce.add_shape(NEW, note, **files(tree))
    assert snapshot(tree) == before


def test_note_of_bytes_that_are_not_utf8_is_one_line_exit_2(tree):
    """A --note of bytes that are not UTF-8 reaches Python as lone surrogates (os.fsdecode):
    one line naming --note, exit 2, nothing written."""
    before = snapshot(tree)
    p = cli(tree, "add-shape", "160,5120,1536,8", "--note", "GLM\udcff", "--no-build")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert "--note holds lone surrogates" in lines[0] and "Traceback" not in p.stderr, lines
    assert snapshot(tree) == before
