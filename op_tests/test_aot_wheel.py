"""AOT wheel: build a small-catalog prebuilt wheel on CPU, install it into a fresh venv and
run ops there without compiling anything; then JIT from the wheel's shipped sources.

Steps (the timings printed at the end are information; nothing here asserts a time):

1. copy the package sources to a temp dir and ``pip wheel . --no-deps --no-build-isolation``
   with ``AITER_AUX_PREBUILD=1 AITER_AUX_PREBUILD_SHAPES=<2 shapes> AITER_AUX_BACKEND=cpu``;
2. a fresh venv (no system site-packages): ``torch==2.13.0`` (the CPU wheel from local disk)
   with ninja/jinja2/filelock, then the wheel with ``--no-deps``;
3. in that venv, from another directory, with an empty ``AITER_AUX_CACHE_DIR`` and
   ``AITER_AUX_DISABLE_JIT=1``: the aux pipeline of both shapes matches the reference, the
   module comes from ``aiter_aux/_prebuilt``, the cache stays empty, and a key outside the
   prebuilt catalog raises an error naming it (one module per backend and process);
4. then, in a new process, without ``AITER_AUX_DISABLE_JIT`` and with another cache: the
   prebuilt module serves, the key it lacks is built on demand from the shipped
   ``aiter_aux/_src`` (non-editable install) and matches the reference, and a one-shape JIT
   build of the module from those sources works.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from instance_counts import N_OPS, keys_of  # noqa: E402 (op_tests/instance_counts.py)

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 1800  # per command: a guard against a hang, not a budget
SHAPES = "256,3072,256,8;128,3072,512,4"
PREBUILT_KEYS = keys_of(*(map(int, s.split(",")) for s in SHAPES.split(";")))
JIT_SHAPE = (257, 7168, 256, 9)
PACKAGE_FILES = ("aiter_aux", "codegen", "templates", "csrc", "setup.py", "pyproject.toml",
                 "README.md", "MANIFEST.in")  # fmt: skip

CHECK = r"""
import json, os, pathlib, sys, time
t0 = time.perf_counter()
import torch
import aiter_aux
from aiter_aux import reference as ref
from aiter_aux.jit.build import JitDisabledError
from aiter_aux.jit.spec import load_module
from aiter_aux import ops
from aiter_aux.pipeline import run_one
t_import = time.perf_counter() - t0
x = torch.randn(8, 3072).bfloat16()
t1 = time.perf_counter()
q, s = ops.mxfp4_quant(x)
first_call = time.perf_counter() - t1
ok = [torch.equal(q, ref.mxfp4_quant(x)[0]), torch.equal(s, ref.mxfp4_quant(x)[1])]
gen = torch.Generator().manual_seed(0)
run_ops = []
for shape in [(256, 3072, 256, 8), (128, 3072, 512, 4)]:
    for m in (1, 33):
        rows = run_one(shape, m, 32, gen, torch.device("cpu"))
        ok += [row[3] for row in rows]
        run_ops.append([row[0] for row in rows])
errors = []
for _ in range(2):  # the same error each time, nothing compiled
    try:
        ops.mxfp4_quant(torch.randn(2, 7168).bfloat16())
    except (JitDisabledError, ops.UnsupportedShapeError) as e:  # the binding's lookup
        errors.append(f"{type(e).__name__}: {e}")
cache_files = [str(p) for p in pathlib.Path(os.environ["AITER_AUX_CACHE_DIR"]).rglob("*")]
out = {"file": aiter_aux.__file__, "module": str(load_module("cpu").path), "ok": all(ok),
       "n": len(ok), "run_ops": run_ops, "errors": errors, "import_s": t_import,
       "first_call_s": first_call, "cache_files": cache_files}
print(json.dumps(out))
"""

# JIT from the shipped sources: what an op call loads, a key the prebuilt module lacks
# built on demand, then a one-shape build of the module
JIT = r"""
import json, sys
import torch
from aiter_aux import ops, reference as ref
from aiter_aux.jit.build import build_module
from aiter_aux.jit.module import AuxModule
from aiter_aux.jit.paths import source_root
from aiter_aux.jit.spec import ModuleSpec, load_module
plan = ModuleSpec("cpu").plan()
x = torch.randn(2, 7168).bfloat16()
same = all(bool(torch.equal(a, b)) for a, b in zip(ops.mxfp4_quant(x), ref.mxfp4_quant(x)))
loaded = load_module("cpu")
r = build_module(shapes=[tuple(json.loads(sys.argv[1]))], backend="cpu")
print(json.dumps({"source_root": str(source_root()), "compiled": r.compiled, "plan": plan,
                  "module": str(r.module_path), "keys": AuxModule(r.module_path).keys(),
                  "on_demand": loaded.registered(), "same": same, "loaded": str(loaded.path)}))
"""


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, **kwargs)
    if p.returncode:
        raise AssertionError(f"{cmd[:4]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                             f"{p.stderr[-5000:]}")  # fmt: skip
    return p


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AITER_AUX_", "PYTHON", "VIRTUAL_ENV"))}  # fmt: skip
    return dict(env, **extra)


def test_prebuilt_wheel_in_fresh_venv(tmp_path):
    t0 = time.monotonic()
    src = tmp_path / "src"
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "_src",
                                            "_prebuilt")  # fmt: skip
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    wheelhouse = tmp_path / "wheelhouse"
    env = clean_env(AITER_AUX_PREBUILD="1", AITER_AUX_PREBUILD_SHAPES=SHAPES,
                    AITER_AUX_BACKEND="cpu")  # fmt: skip
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-w", str(wheelhouse)], cwd=src, env=env)  # fmt: skip
    (wheel,) = wheelhouse.glob("aiter_aux-*.whl")
    assert re.search(r"-py3-none-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name
    t_wheel = time.monotonic() - t0

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile",
           "--disable-pip-version-check"]  # fmt: skip
    run(pip + ["torch==2.13.0", "ninja", "jinja2", "filelock"], env=clean_env())
    run(pip + ["--no-deps", str(wheel)], env=clean_env())
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"])
                .stdout.strip())  # fmt: skip
    assert (site / "aiter_aux" / "_src" / "codegen" / "catalog.py").is_file()
    manifest = json.loads(next((site / "aiter_aux" / "_prebuilt").glob("*/manifest.json"))
                          .read_text())  # fmt: skip
    assert manifest["backend"] == "cpu" and sorted(manifest["keys"]) == sorted(PREBUILT_KEYS)
    t_install = time.monotonic() - t0 - t_wheel

    cache, jit_cache = tmp_path / "empty_cache", tmp_path / "jit_cache"
    cache.mkdir(mode=0o700)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = clean_env(AITER_AUX_CACHE_DIR=str(cache), AITER_AUX_DISABLE_JIT="1")
    p = run([py, "-W", "ignore", "-c", CHECK], cwd=work, env=env)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(site)), got
    assert "/_prebuilt/cpu-host/" in got["module"], got
    # the quant's 2 checks, then 4 runs of the pipeline: the route, 6 ops and the preamble in
    # one call (the shapes have no fused shared expert), each checked
    want = ["moe_route", "moe_route_sort_quant"]
    assert all(
        ops[0] == want[0] and want[1] in ops and len(ops) == 8 for ops in got["run_ops"]
    ), got
    assert got["ok"] and got["n"] == 2 + 4 * 8, got
    # the loaded (prebuilt) module lacks the key: an error naming it, nothing compiled
    assert len(got["errors"]) == 2 and all("mxfp4_quant_d7168" in e for e in got["errors"])
    assert "JIT-compiling" not in p.stderr, p.stderr
    assert got["cache_files"] == [], "something was compiled or written into the cache"
    assert list(cache.rglob("*")) == []
    env = clean_env(AITER_AUX_CACHE_DIR=str(jit_cache))
    jit = json.loads(run([py, "-W", "ignore", "-c", JIT, json.dumps(JIT_SHAPE)], cwd=work,
                         env=env).stdout.strip().splitlines()[-1])  # fmt: skip
    assert jit["source_root"] == str(site / "aiter_aux" / "_src"), jit
    assert jit["plan"][0] == "prebuilt" and "/_prebuilt/cpu-host/" in jit["loaded"], jit
    assert jit["on_demand"] == ["mxfp4_quant_d7168"] and jit["same"], jit
    # one instance per op of the op table for the one shape built
    assert jit["compiled"] == N_OPS and jit["module"].startswith(str(jit_cache)), jit
    assert "mxfp4_quant_d7168" in jit["keys"], jit
    assert sorted(jit["keys"]) == sorted(keys_of(JIT_SHAPE)), jit

    total = time.monotonic() - t0
    print(f"\n[aot wheel] {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, built in "
          f"{t_wheel:.1f} s; venv + install {t_install:.1f} s; first op call without "
          f"compiling {got['first_call_s'] * 1e3:.0f} ms (import {got['import_s']:.1f} s); "
          f"total {total:.1f} s")  # fmt: skip
