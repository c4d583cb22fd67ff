"""Cache key, safety and environment controls of the JIT builder (CPU backend).

* The build directory is keyed by the compiler's identity (resolved path + version), not by
  the name it was reached through.
* A module file or build directory that another user could write (or owns) is refused.
* ``AITER_AUX_REBUILD=1`` recompiles everything, ``AITER_AUX_VERBOSE=1`` shows the compiler
  commands, ``MAX_JOBS`` bounds ninja's parallelism, ``AITER_AUX_DISABLE_JIT=1`` serves a
  complete cached module, ``aiter-aux clean`` removes the cache.

Builds run in child processes on a snapshot of the sources (see test_build.py for the
incremental, content-keyed, truncated-module and group-writable-cache cases).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("filelock")

from instance_counts import keys_of, n_edges  # noqa: E402 (op_tests/instance_counts.py)

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [[256, 3072, 256, 8]]
CHILD = r"""
import json, sys
from aiter_aux.jit import build, toolchain
if sys.argv[1] == "build":
    r = build.build_module(shapes=[tuple(s) for s in json.loads(sys.argv[2])], backend="cpu")
    print(json.dumps({"compiled": r.compiled, "linked": r.linked, "module": str(r.module_path),
                      "dir": str(r.build_dir)}))
else:
    inputs = build.BuildInputs.of(toolchain.select("cpu"), json.loads(sys.argv[2]))
    print(json.dumps({"published": str(build.current_module(inputs))}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(env, first build's result) for a snapshot of the sources and a fresh cache."""
    tmp = tmp_path_factory.mktemp("controls")
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, tmp / "src" / sub, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(tmp / "cache"),
               AITER_AUX_SOURCE_DIR=str(tmp / "src"))  # fmt: skip
    for name in ("AITER_AUX_REBUILD", "AITER_AUX_DISABLE_JIT", "AITER_AUX_VERBOSE", "MAX_JOBS"):
        env.pop(name, None)
    out, _ = child(env, "build")
    return env, out


def child(env: dict, what: str, expect_ok: bool = True, **extra) -> tuple[dict | None, str]:
    p = subprocess.run([sys.executable, "-c", CHILD, what, json.dumps(SHAPES)],
                       capture_output=True, text=True, env=dict(env, **extra))  # fmt: skip
    assert (p.returncode == 0) == expect_ok, p.stderr[-3000:]
    return (json.loads(p.stdout.splitlines()[-1]) if expect_ok else None), p.stderr


def test_build_dir_keyed_by_compiler_identity_not_its_name(tmp_path, monkeypatch):
    from aiter_aux.jit import toolchain

    real = os.path.realpath(shutil.which("c++") or shutil.which("g++"))
    (tmp_path / "cxx-link").symlink_to(real)
    wrapper = tmp_path / "cxx-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    names = {}
    for name in (real, str(tmp_path / "cxx-link"), str(wrapper)):
        monkeypatch.setenv("CXX", name)
        names[name] = toolchain.select("cpu").build_dir_name()
    assert names[real] == names[str(tmp_path / "cxx-link")], "same compiler via a symlink"
    assert names[real] != names[str(wrapper)], "another compiler must not share the cache"


def test_rebuild_verbose_and_max_jobs(built):
    env, first = built
    out, err = child(env, "build", AITER_AUX_REBUILD="1", AITER_AUX_VERBOSE="1", MAX_JOBS="1")
    n_keys = len(keys_of(*SHAPES))
    assert out["compiled"] == n_keys and out["linked"]
    assert err.count(" -c src/inst_") == n_keys, "verbose must show every compiler command"
    log = (Path(out["dir"]) / ".ninja_log").read_text().splitlines()[1:]
    this_build = log[-n_edges(n_keys) :]  # obj/ was removed: every edge ran again
    assert len({ln.split("\t")[3] for ln in this_build}) == n_edges(n_keys), this_build
    spans = sorted(tuple(map(int, ln.split("\t")[:2])) for ln in this_build)
    assert all(a[1] <= b[0] for a, b in pairwise(spans)), "MAX_JOBS=1 ran edges at once"
    again, _ = child(env, "build")
    assert again["compiled"] == 0 and again["module"] == out["module"]


def test_disable_jit_serves_a_complete_cached_module(built):
    env, first = built
    out, _ = child(env, "build", AITER_AUX_DISABLE_JIT="1")
    assert out["compiled"] == 0 and not out["linked"] and out["module"] == first["module"]


@pytest.mark.robust
def test_module_writable_by_others_is_refused(built):
    env, first = built
    module = Path(first["module"])
    mode = module.stat().st_mode
    try:
        module.chmod(mode | stat.S_IWGRP)
        _, err = child(env, "load", expect_ok=False)
        assert "CacheSafetyError" in err and str(module) in err and "chmod go-w" in err
    finally:
        module.chmod(mode)
    out, _ = child(env, "load")
    assert out["published"] == first["module"]


@pytest.mark.robust
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_build_dir_owned_by_another_user_is_refused(built):
    env, first = built
    directory = Path(first["dir"])
    try:
        os.chown(directory, 4242, -1)
        _, err = child(env, "load", expect_ok=False)
        assert "CacheSafetyError" in err and "owned by uid 4242" in err
        _, err = child(env, "build", expect_ok=False)
        assert "CacheSafetyError" in err
    finally:
        os.chown(directory, os.getuid(), -1)


def test_clean_removes_the_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / "cpu-host-0").mkdir(parents=True)
    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(cache))
    p = subprocess.run([sys.executable, "-m", "aiter_aux.cli", "clean", "--yes"],
                       capture_output=True, text=True, env=env)  # fmt: skip
    assert p.returncode == 0 and not cache.exists() and str(cache) in p.stdout
