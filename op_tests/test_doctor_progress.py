"""Build progress (aiter_aux/jit/progress.py), ``aiter-aux doctor`` (aiter_aux/doctor.py) and
the run-time checks of prebuilt modules (aiter_aux/jit/prebuilt.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from instance_counts import keys_of, n_tus

from aiter_aux.jit import progress as P

ROOT = Path(__file__).resolve().parents[1]
SHAPE_A = (256, 3072, 256, 8)


# ------------------------------------------------------------------------------- progress
def feed(reporter, total=94):
    for i in range(1, total + 1):
        reporter(i, total, f"CXX src/inst_{i}.cpp")


def test_reporter_plain_lines_every_tenth():
    out = io.StringIO()
    feed(P.Reporter(out, tty=False, interval_s=1e9))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 10 <= len(lines) <= 12, lines  # the first line, one per 10%, the last
    assert lines[0].startswith("aiter_aux: [1/94]") and lines[-1].startswith("aiter_aux: [94/94]")


class FakeClock:
    """``time`` for :mod:`aiter_aux.jit.progress`: only ``advance`` moves it."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_reporter_plain_lines_every_few_seconds(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(P, "time", clock)
    out = io.StringIO()
    r = P.Reporter(out, tty=False, step=0, interval_s=1.0)
    r(1, 1000, "a")
    clock.advance(0.99)
    r(2, 1000, "b")  # too soon: not printed
    clock.advance(0.01)
    r(3, 1000, "c")
    assert [ln.split()[-1] for ln in out.getvalue().splitlines()] == ["a", "c"]


def test_reporter_tty_one_updating_line():
    out = io.StringIO()
    r = P.Reporter(out, tty=True)
    feed(r, 10)
    text = out.getvalue()
    assert text.count("\r\033[K") == 10 and text.count("\n") == 1 and text.endswith("\n")


def write_log(directory: Path, rows) -> None:
    lines = ["# ninja log v7"] + ["\t".join(map(str, row)) for row in rows]
    (directory / ".ninja_log").write_text("\n".join(lines) + "\n")


def test_read_ninja_log_last_entry_wins_and_since(tmp_path):
    new = time.time_ns()
    write_log(tmp_path, [
        (0, 9000, new - 10**12, "obj/inst_old.o", "h"),  # an earlier build's output
        (0, 500, new - 10**12, "obj/inst_a.o", "h"),
        (10, 2510, new + 1, "obj/inst_a.o", "h"),  # rebuilt: this entry wins
        (5, 1005, new + 2, "obj/lookup.o", "h"),
        (2600, 2900, new + 3, "obj/module_moe_mxfp4_aux.so", "h"),
    ])  # fmt: skip
    every = P.read_ninja_log(tmp_path)
    assert [t.name for t in every] == ["old", "a", "lookup", "module_moe_mxfp4_aux.so"]
    assert every[1].seconds == pytest.approx(2.5)
    recent = P.read_ninja_log(tmp_path, since_ns=new)
    assert [t.name for t in recent] == ["a", "lookup", "module_moe_mxfp4_aux.so"]
    assert P.format_slowest(recent, 2) == "a 2.5 s, lookup 1.0 s"
    fast = [P.Timing("obj/inst_b.o", 0.04), P.Timing("obj/lookup.o", 0.0004)]
    assert P.format_slowest(fast) == "b 40 ms, lookup 0 ms"
    assert P.read_ninja_log(tmp_path / "missing") == []


def test_reporter_finish_prints_slowest(tmp_path):
    out = io.StringIO()
    r = P.Reporter(out, tty=False)
    write_log(tmp_path, [(0, 3000, time.time_ns() + 5, "obj/inst_moe_sort_e257_k9.o", "h")])

    class Result:
        units, compiled, wall_s, build_dir = 4, 1, 3.2, tmp_path

    r.finish(Result)
    assert (
        "compiled 4 translation unit(s) (1 instance(s)) in 3.2 s; slowest: moe_sort_e257_k9 3.0 s"
        in out.getvalue()
    )


def test_reporter_finish_reports_a_build_of_no_instance(tmp_path):
    """The first call's build of the binding alone (no instance TU) is summarised too."""
    out = io.StringIO()

    class Result:
        units, compiled, wall_s, build_dir = 3, 0, 5.0, tmp_path

    P.Reporter(out, tty=False).finish(Result)
    assert "compiled 3 translation unit(s) (0 instance(s)) in 5.0 s" in out.getvalue()


def test_finish_reports_this_builds_outputs_from_begin(tmp_path):
    """The slowest TUs are those made since begin(), also the ones ninja finished before the
    first progress line (the CLI's reporter used to start its clock at that line and so
    missed them, listing only the lookup after an add-shape)."""
    out = io.StringIO()
    r = P.Reporter(out, tty=False)
    r.begin()
    now = time.time_ns()
    write_log(tmp_path, [
        (0, 9000, now - 10**10, "obj/inst_earlier_build.o", "h"),
        (0, 800, now + 10**6, "obj/inst_first.o", "h"),  # finished before any progress line
        (800, 900, now + 10**8, "obj/lookup.o", "h"),
    ])  # fmt: skip
    time.sleep(0.2)
    r(2, 3, "CXX src/lookup.cpp")

    class Result:
        units, compiled, wall_s, build_dir = 2, 1, 1.0, tmp_path

    r.finish(Result)
    assert "slowest: first 0.8 s, lookup 0.1 s" in out.getvalue(), out.getvalue()


# --------------------------------------------------------------------- build + doctor
BUILD = r"""
import sys
from aiter_aux.jit.build import build_module
from aiter_aux.jit.progress import Reporter
rep = Reporter(sys.stdout, tty=False)
r = build_module(shapes=[(256, 3072, 256, 8)], backend="cpu", progress=rep)
rep.finish(r)
"""


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


def run_py(args, env, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=900, **kw)  # fmt: skip


def test_build_progress_then_doctor(tmp_path):
    pytest.importorskip("torch")
    from aiter_aux.jit.paths import codegen_module

    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(tmp_path / "cache"))
    for k in ("AITER_AUX_DISABLE_JIT", "AITER_AUX_REBUILD", "AITER_AUX_SOURCE_DIR"):
        env.pop(k, None)
    p = run_py(["-c", BUILD], env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    built = len(keys_of(SHAPE_A))
    tus = n_tus(built)  # the instances and the other TUs: the counter, the link at the end
    assert lines[0].startswith("aiter_aux: [1/"), lines
    assert all(f"/{tus}] " in ln for ln in lines[:-1]), lines
    assert f"[{tus}/{tus}] 100%" in lines[-2] and "LINK" in lines[-2], lines
    assert f"compiled {tus} translation unit(s) ({built} instance(s))" in lines[-1], lines
    assert "slowest: " in lines[-1], lines

    cache = tmp_path / "cache"
    before = snapshot(cache)
    p = run_py(["-m", "aiter_aux.cli", "doctor"], env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert snapshot(cache) == before, "doctor wrote into the cache"
    out = p.stdout
    current = f"[current toolchain]: {built} keys, 1 shapes, module intact, sources current"
    assert current in out, out
    n_keys = len(keys_of(*codegen_module("catalog").SHAPES))
    # every catalog instance but those built, plus the lookup; then the link
    todo = f"ninja -n: {n_keys - built + 1} of {n_tus(n_keys)} translation unit(s) to compile"
    assert f"{todo}, relink" in out, out
    assert f"{n_keys - built} instance(s) to add" in out and out.rstrip().endswith("ok")

    manifest = json.loads(next(cache.glob("*/manifest.json")).read_text())
    module = next(cache.glob("*/" + manifest["module"]))
    with module.open("ab") as f:
        f.write(b"\0")
    p = run_py(["-m", "aiter_aux.cli", "doctor", "--no-dry-run"], env)
    assert p.returncode == 1 and "MISSING/CORRUPTED" in p.stdout and "PROBLEM" in p.stdout


def test_doctor_up_to_date(cpu_module):
    from aiter_aux.doctor import doctor

    out = io.StringIO()
    assert doctor("cpu", out=out) == 0, out.getvalue()
    assert "ninja -n: nothing to do" in out.getvalue(), out.getvalue()


# ---------------------------------------------------------------- prebuilt run-time checks
def test_prebuilt_mismatch_reasons(tmp_path, cpu_module):
    from aiter_aux.jit import prebuilt
    from aiter_aux.jit.module import ABI_VERSION

    directory = tmp_path / "cpu-host"
    directory.mkdir()
    shutil.copyfile(cpu_module.path, directory / "m.so")
    from aiter_aux.jit.build import _sha256

    good = {"format": prebuilt.FORMAT, "module": "m.so", "module_sha256": _sha256(cpu_module.path),
            "backend": "cpu", "arch": [], "abi_version": ABI_VERSION,
            "sources_digest": prebuilt.sources_digest(), **prebuilt.platform_tag(),
            "keys": cpu_module.keys(), "shapes": []}  # fmt: skip
    (directory / "manifest.json").write_text(json.dumps(good))
    (pb,) = prebuilt.candidates(tmp_path)
    assert prebuilt.mismatch(pb, "cpu") is None
    assert "backend 'cpu', not 'cuda'" in prebuilt.mismatch(pb, "cuda")
    for field, value, reason in (
        ("abi_version", 99, "ABI version 99"),
        ("machine", "riscv64", "built for Linux/riscv64"),
        ("sources_digest", "0" * 64, "sources digest differs"),
        ("module_sha256", "0" * 64, "missing or corrupted"),
    ):
        bad = prebuilt.Prebuilt(directory, dict(good, **{field: value}))
        assert reason in prebuilt.mismatch(bad, "cpu"), field


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev_zero", "nested"])
def test_doctor_names_a_manifest_that_is_no_regular_json_file(tmp_path, monkeypatch, kind):
    """A FIFO, a directory, a link to /dev/zero or a document nested too deeply at the
    manifest's name of the current build directory: one line naming it, a problem (not
    'status ok'), no Python repr, and nothing blocks (the dry run copies the directory)."""
    pytest.importorskip("torch")
    from aiter_aux.jit import toolchain
    from aiter_aux.jit.paths import build_dir

    cache = tmp_path / "cache"
    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(cache))
    for k in ("AITER_AUX_DISABLE_JIT", "AITER_AUX_REBUILD", "AITER_AUX_SOURCE_DIR"):
        env.pop(k, None)
    monkeypatch.setenv("AITER_AUX_CACHE_DIR", str(cache))
    directory = build_dir(toolchain.select("cpu"))
    cache.mkdir(mode=0o700)
    directory.mkdir(mode=0o700)
    manifest = directory / "manifest.json"
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "directory":
        manifest.mkdir()
    elif kind == "dev_zero":
        manifest.symlink_to("/dev/zero")
    else:
        manifest.write_text("[" * 200_000 + "]" * 200_000)
    args = ["doctor", "--backend", "cpu"] + ([] if kind == "fifo" else ["--no-dry-run"])
    p = run_py(["-m", "aiter_aux.cli", *args], env)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    what = {"fifo": "is a FIFO", "directory": "is a directory", "dev_zero": "is a character device",
            "nested": "does not read as a manifest"}[kind]  # fmt: skip
    problems = [ln for ln in p.stdout.splitlines() if ln.startswith("  PROBLEM: ")]
    assert problems == [f"  PROBLEM: {manifest} {what}" + problems[0].split(what, 1)[1]], problems
    assert "[(" not in p.stdout and "status        ok" not in p.stdout, p.stdout
