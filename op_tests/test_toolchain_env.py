"""Compiler resolution (the name invoked, launchers, bad CXX), ninja path escaping and the
environment module.  Builds run in a subprocess and load the module with ctypes (they need
torch, which the binding links); the other tests are torch-free.  Tests that need clang or
ccache skip when it is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiter_aux import env
from aiter_aux.jit import toolchain
from aiter_aux.jit.paths import codegen_module

N_OPS = len(codegen_module("instances").INSTANCE_OPS)  # the instances of one shape

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (256, 3072, 256, 8)
BUILD = r"""
import ctypes, json, sys
import torch  # the module's binding links libtorch_cpu
from aiter_aux.jit.build import build_module
from aiter_aux.jit.toolchain import select
r = build_module(shapes=[tuple(json.loads(sys.argv[1]))], backend="cpu")
ctypes.CDLL(str(r.module_path))  # RTLD_NOW: an unresolved symbol fails here
tc = select("cpu")
print(json.dumps({"compiled": r.compiled, "dir": str(r.build_dir), "module": str(r.module_path),
                  "fingerprint": tc.fingerprint, "launcher": list(getattr(tc, "launcher", ()))}))
"""


def clean_env(**extra) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in env.VARS}
    return {**base, **extra}


def run_build(cache: Path, **extra) -> dict:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the module's binding compiles against it)")
    e = clean_env(AITER_AUX_CACHE_DIR=str(cache), **extra)
    p = subprocess.run(
        [sys.executable, "-c", BUILD, json.dumps(SHAPE)], capture_output=True, text=True, env=e
    )
    if p.returncode:
        raise AssertionError(p.stderr[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def no_env(monkeypatch):
    for name in env.VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---- D4: a compiler the user names must exist and run -------------------------------------


@pytest.mark.parametrize("cxx", ["/nonexistent/clang++", "clang++-99", "g++ -m64", "'g++"])
def test_bad_cxx_is_an_error_naming_it(no_env, cxx):
    no_env.setenv("CXX", cxx)
    with pytest.raises(toolchain.ToolchainError, match=re.escape(f"CXX={cxx!r}")):
        toolchain.select("cpu")


def test_cxx_that_cannot_run(no_env, tmp_path):
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    no_env.setenv("CXX", str(broken))
    with pytest.raises(toolchain.ToolchainError, match="cannot run the compiler CXX=.*exited"):
        toolchain.select("cpu")


def test_launcher_in_cxx_is_split_or_refused(no_env):
    no_env.setenv("CXX", "ccache g++")
    if not shutil.which("ccache"):
        with pytest.raises(toolchain.ToolchainError, match="AITER_AUX_CXX_LAUNCHER"):
            toolchain.select("cpu")
        return
    tc = toolchain.select("cpu")
    assert os.path.basename(tc.launcher[0]) == "ccache" and tc.compiler == shutil.which("g++")
    no_env.setenv("AITER_AUX_CXX_LAUNCHER", "ccache")
    with pytest.raises(toolchain.ToolchainError, match="AITER_AUX_CXX_LAUNCHER is set too"):
        toolchain.select("cpu")


def test_missing_launcher_is_an_error(no_env):
    no_env.setenv("AITER_AUX_CXX_LAUNCHER", "no-such-launcher-xyz")
    with pytest.raises(toolchain.ToolchainError, match="no-such-launcher-xyz"):
        toolchain.select("cpu")


# ---- D2: the compiler is invoked under the name the user gave ----------------------------


def _clang_cxx_driver() -> str | None:
    """A clang++ whose resolved path is the C driver ``clang`` (the D2 setup)."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for p in sorted(Path(d).glob("clang++*")) if os.path.isdir(d) else ():
            real = os.path.basename(os.path.realpath(p))
            if os.access(p, os.X_OK) and "++" not in real and real.startswith("clang"):
                return p.name
    return None


@pytest.mark.robust
def test_cxx_symlink_to_c_driver_builds_a_loadable_module(tmp_path):
    name = _clang_cxx_driver()
    if not name:
        pytest.skip("no clang++ on PATH that links to the clang C driver")
    probe = tmp_path / "probe.cpp"
    probe.write_text("int f() { return 0; }\n")
    cmd = [name, "-fopenmp", "-shared", "-fPIC", str(probe), "-o", str(tmp_path / "p.so")]
    if subprocess.run(cmd, capture_output=True).returncode:
        pytest.skip(f"{name} cannot link with -fopenmp (libomp missing)")
    got = run_build(tmp_path / "cache", CXX=name)
    assert got["compiled"] == N_OPS  # and the module loaded (ctypes.CDLL in the subprocess)
    ninja = (Path(got["dir"]) / "build.ninja").read_text()
    assert f"cxx = {shutil.which(name)}\n" in ninja


def test_c_and_cxx_driver_of_one_binary_have_different_keys(no_env, tmp_path):
    name = _clang_cxx_driver()
    if not name:
        pytest.skip("no clang++ on PATH that links to the clang C driver")
    link = tmp_path / "clang"  # the C driver name of the same binary
    link.symlink_to(os.path.realpath(shutil.which(name)))
    no_env.setenv("CXX", str(link))
    as_c = toolchain.select("cpu")
    no_env.setenv("CXX", name)
    as_cxx = toolchain.select("cpu")
    assert as_c.compiler == str(link) and as_c.fingerprint != as_cxx.fingerprint
    cxx_link = tmp_path / "clang++"  # another path to the same C++ driver: same key
    cxx_link.symlink_to(os.path.realpath(shutil.which(name)))
    no_env.setenv("CXX", str(cxx_link))
    assert toolchain.select("cpu").fingerprint == as_cxx.fingerprint


# ---- D3: compiler launchers --------------------------------------------------------------


@pytest.mark.robust
def test_launcher_prefixes_compiles_not_the_key(tmp_path):
    log = tmp_path / "launched.log"
    launcher = tmp_path / "my launcher"
    launcher.write_text(f'#!/bin/sh\necho "$*" >> \'{log}\'\nexec "$@"\n')
    launcher.chmod(0o755)
    plain = run_build(tmp_path / "a")
    launched = run_build(tmp_path / "b", AITER_AUX_CXX_LAUNCHER=f"'{launcher}'")
    assert launched["fingerprint"] == plain["fingerprint"]
    assert launched["launcher"] == [str(launcher)] and plain["launcher"] == []
    lines = log.read_text().splitlines()
    units = len(codegen_module("instances").module_units("cpu"))  # binding, lookup, kernels...
    assert len(lines) == N_OPS + units and all(" -c " in ln for ln in lines)


@pytest.mark.robust
def test_ccache_masquerade_first_on_path(tmp_path):
    ccache = shutil.which("ccache")
    if not ccache:
        pytest.skip("ccache is not installed")
    masq = tmp_path / "ccache-bin"
    masq.mkdir()
    for name in ("c++", "g++", "clang++"):
        (masq / name).symlink_to(ccache)
    plain = run_build(tmp_path / "a")
    path = f"{masq}{os.pathsep}{os.environ['PATH']}"
    got = run_build(tmp_path / "b", PATH=path, CCACHE_DIR=str(tmp_path / "ccache"))
    assert got["compiled"] == N_OPS and got["fingerprint"] == plain["fingerprint"]
    assert got["launcher"] == [os.path.realpath(ccache)]


# ---- D12: '$', ':' and spaces in the source and cache paths ------------------------------


@pytest.mark.robust
def test_dollar_colon_space_in_source_and_cache_paths(tmp_path):
    weird = tmp_path / "a $b:c d"
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, weird / sub, ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache $x:y z"
    cold = run_build(cache, AITER_AUX_SOURCE_DIR=str(weird))
    assert cold["compiled"] == N_OPS
    noop = run_build(cache, AITER_AUX_SOURCE_DIR=str(weird))
    assert noop["compiled"] == 0 and noop["module"] == cold["module"]
    header = weird / "csrc" / "kernels" / "mxfp4_moe" / "mxfp4_moe_aux_abi.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert run_build(cache, AITER_AUX_SOURCE_DIR=str(weird))["compiled"] == N_OPS


def test_ninja_path_escaping():
    from aiter_aux.jit.ninja_file import command, path

    assert path("/a $b:c d/x.cpp") == "/a$ $$b$:c$ d/x.cpp"
    assert command(["-I/a $b"]) == "'-I/a $$b'"


# ---- the environment module ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [("MAX_JOBS", "abc"), ("MAX_JOBS", "-1"), ("MAX_JOBS", "0"), ("AITER_AUX_LOCK_TIMEOUT", "abc"),
     ("AITER_AUX_LOCK_TIMEOUT", "nan"), ("AITER_AUX_VERBOSE", "maybe")],
)  # fmt: skip
def test_bad_values_raise_env_error(no_env, name, value):
    no_env.setenv(name, value)
    with pytest.raises(env.EnvError, match=re.escape(f"{name}={value!r}: expected")) as e:
        env.get(name)
    assert isinstance(e.value, ValueError) and e.value.name == name


def test_values_and_defaults(no_env):
    assert env.get("MAX_JOBS") is None and env.get("AITER_AUX_LOCK_TIMEOUT") == 900.0
    assert env.get("AITER_AUX_REBUILD") is False
    no_env.setenv("MAX_JOBS", " 3 ")
    no_env.setenv("AITER_AUX_REBUILD", "true")
    no_env.setenv("AITER_AUX_LOCK_TIMEOUT", "")
    assert env.get("MAX_JOBS") == 3 and env.get("AITER_AUX_REBUILD") is True
    assert env.get("AITER_AUX_LOCK_TIMEOUT") == 900.0 and not env.is_set("AITER_AUX_LOCK_TIMEOUT")
    with pytest.raises(KeyError):
        env.get("AITER_AUX_NOT_A_VARIABLE")


def test_bad_backend_is_a_toolchain_error(no_env):
    no_env.setenv("AITER_AUX_BACKEND", "tpu")
    with pytest.raises(toolchain.ToolchainError, match="AITER_AUX_BACKEND='tpu'.*cpu, cuda, rocm"):
        toolchain.default_backend()


def test_build_doc_lists_every_variable():
    doc = (ROOT / "docs" / "build.md").read_text()
    assert env.render_markdown() in doc, (
        "docs/build.md's environment list differs from aiter_aux/env.py: run "
        "`python codegen/gen_sources.py`"
    )


# os.environ.get("NAME") / os.environ["NAME"] / os.getenv("NAME"), or NAME a constant
_DIRECT_READ = re.compile(
    r"""(?:os\.environ(?:\.get)?|os\.getenv)\s*[\[(]\s*(?:["'](\w+)["']|([A-Z][A-Z0-9_]*)\b)"""
)


def _project_variable(match: re.Match) -> bool:
    literal, constant = match.groups()
    return bool(constant) or literal.startswith("AITER_AUX_") or literal in env.VARS


def test_variables_are_read_only_through_env_module():
    files = [ROOT / "setup.py"]
    for sub in ("aiter_aux", "codegen", "benchmarks", "scripts"):
        files += sorted((ROOT / sub).rglob("*.py"))
    offenders = [
        f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for p in files
        if p.name != "env.py" and "_src" not in p.parts
        for text in [p.read_text()]
        for m in _DIRECT_READ.finditer(text)
        if _project_variable(m)
    ]
    assert not offenders, "read these through aiter_aux.env.get:\n" + "\n".join(offenders)


def test_backend_list_is_defined_once():
    assert toolchain.backends() == ("cpu", "cuda", "rocm")
    literal = re.compile(r"""\(\s*["']cpu["'],\s*["']cuda["'],\s*["']rocm["']\s*\)""")
    hits = [
        str(p.relative_to(ROOT))
        for sub in ("aiter_aux", "codegen")
        for p in sorted((ROOT / sub).rglob("*.py"))
        if "_src" not in p.parts and literal.search(p.read_text())
    ]
    assert hits == ["codegen/instances.py"]


def test_atomic_write_helpers(tmp_path):
    writer = toolchain.codegen_module("writer")
    target = tmp_path / "f.bin"
    writer.atomic_write(target, b"one", 0o640)
    assert target.read_bytes() == b"one" and (target.stat().st_mode & 0o777) == 0o640
    assert writer.write_if_different(target, "one") is False
    assert writer.write_if_different(target, "two") is True and target.read_text() == "two"
    assert not list(tmp_path.glob(".*.tmp"))


def test_env_cli_renders_markdown():
    p = subprocess.run(
        [sys.executable, "-m", "aiter_aux.env", "--markdown"], capture_output=True, text=True
    )
    assert p.returncode == 0 and p.stdout == env.render_markdown()
    assert {m for m in re.findall(r"^- `(\w+)`", p.stdout, re.M)} == set(env.VARS)
