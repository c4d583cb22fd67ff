"""The JIT builder on small temporary catalogs (CPU backend), each build in a fresh process
with its own cache directory: cold / no-op / add / remove, content-keyed rebuilds, corrupted
modules, unsafe cache directories, compiler errors, AITER_AUX_DISABLE_JIT."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from instance_counts import N_OPS, keys_of  # noqa: E402 (op_tests/instance_counts.py)

ROOT = Path(__file__).resolve().parents[1]
SHAPE_A = [256, 3072, 256, 8]
SHAPE_B = [128, 3072, 512, 4]  # shares model_dim with A: only its new keys compile
BUILD = r"""
import json, sys
from aiter_aux.jit.build import build_module
from aiter_aux.jit.module import AuxModule
r = build_module(shapes=[tuple(s) for s in json.loads(sys.argv[1])], backend="cpu")
print(json.dumps({"compiled": r.compiled, "linked": r.linked, "n": r.num_instances,
                  "module": str(r.module_path), "dir": str(r.build_dir),
                  "keys": AuxModule(r.module_path).keys()}))
"""


def run_build(cache: Path, shapes, source_dir: Path | None = None, **env_extra):
    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(cache), **env_extra)
    env.pop("AITER_AUX_REBUILD", None)
    if source_dir:
        env["AITER_AUX_SOURCE_DIR"] = str(source_dir)
    p = subprocess.run(
        [sys.executable, "-c", BUILD, json.dumps(shapes)], capture_output=True, text=True, env=env
    )
    if p.returncode:
        raise AssertionError(p.stderr[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def copy_sources(dst: Path) -> Path:
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, dst / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_cold_noop_add_remove(tmp_path):
    cold = run_build(tmp_path, [SHAPE_A])
    assert cold["compiled"] == cold["n"] == N_OPS and cold["linked"]  # one instance per op
    assert sorted(cold["keys"]) == sorted(keys_of(SHAPE_A))
    noop = run_build(tmp_path, [SHAPE_A])
    assert noop["compiled"] == 0 and not noop["linked"] and noop["module"] == cold["module"]
    added = run_build(tmp_path, [SHAPE_A, SHAPE_B])
    new = keys_of(SHAPE_A, SHAPE_B) - keys_of(SHAPE_A)  # B's keys that spell E or topk
    assert 0 < len(new) < N_OPS and "moe_sort_e128_k4" in new
    assert added["compiled"] == len(new) and added["linked"]
    assert added["n"] == N_OPS + len(new)
    assert sorted(added["keys"]) == sorted(keys_of(SHAPE_A, SHAPE_B))
    removed = run_build(tmp_path, [SHAPE_A])
    assert removed["compiled"] == 0 and removed["linked"]
    assert sorted(removed["keys"]) == sorted(cold["keys"])
    src = Path(removed["dir"]) / "src"
    assert not list(src.glob("inst_moe_sort_e128_k4*")), "stale instance source left behind"
    assert len(list(Path(removed["dir"]).glob("module_moe_mxfp4_aux-*.so"))) == 1


@pytest.mark.robust
def test_header_change_rebuilds_even_when_mtime_goes_backwards(tmp_path):
    srcdir = copy_sources(tmp_path / "src")
    first = run_build(tmp_path / "cache", [SHAPE_A], srcdir)
    header = srcdir / "csrc" / "kernels" / "mxfp4_moe" / "cpu" / "core_cpu.h"
    old = header.stat()
    header.write_text(header.read_text() + "\n// an edit\n")
    os.utime(header, (old.st_atime - 10_000, old.st_mtime - 10_000))
    second = run_build(tmp_path / "cache", [SHAPE_A], srcdir)
    # every instance TU includes it but moe_sum's and moe_route's
    assert second["compiled"] == first["n"] - 2


@pytest.mark.robust
def test_truncated_module_is_detected_and_rebuilt(tmp_path):
    first = run_build(tmp_path, [SHAPE_A])
    module = Path(first["module"])
    data = module.read_bytes()
    module.write_bytes(data[: len(data) // 2])
    second = run_build(tmp_path, [SHAPE_A])
    assert Path(second["module"]).read_bytes() == data


def test_group_writable_cache_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o775)
    with pytest.raises(AssertionError, match="CacheSafetyError.*group- or world-writable"):
        run_build(cache, [SHAPE_A])


def test_compiler_error_names_failing_file(tmp_path):
    srcdir = copy_sources(tmp_path / "src")
    header = srcdir / "csrc" / "kernels" / "mxfp4_moe" / "cpu" / "core_cpu.h"
    header.write_text(header.read_text() + "\nthis is not C++;\n")
    with pytest.raises(AssertionError) as info:
        run_build(tmp_path / "cache", [SHAPE_A], srcdir)
    msg = str(info.value)
    assert "BuildError" in msg and "FAILED" in msg and "core_cpu.h" in msg
    assert "error" in msg


def test_disable_jit_raises_typed_error(tmp_path):
    with pytest.raises(AssertionError, match="JitDisabledError"):
        run_build(tmp_path, [SHAPE_A], AITER_AUX_DISABLE_JIT="1")
