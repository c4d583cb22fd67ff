"""Locking and publishing of the JIT build cache under concurrency and crashes (CPU backend).

* 8 processes started together on an empty cache: exactly one compiles, the others wait (a
  reported, bounded wait naming the lock file) and every process loads the same bytes.
* SIGKILL of a builder at 20 random moments spread over codegen, compile, link and publish,
  each followed by a successful build (bounded by a timeout) whose module loads and computes
  ``mxfp4_quant`` exactly like the torch reference (called through ctypes in the child).
* Orphaned compilers of a killed builder hold the workers lock; a build waits for them.
* A lock held too long gives a typed, bounded error naming the lock file.

Builders run in child processes (no torch import there) on a snapshot of the sources in a
temporary directory, so concurrent edits of the checkout cannot change the build under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import reference as ref  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
D = 3072
SHAPE_A = [256, D, 256, 8]
SHAPE_B = [257, D, 256, 8]  # differs from A in two instances (moe_sort, moe_sort_quant)
QUANT_KEY = f"mxfp4_quant_d{D}"
PHASES = ("codegen", "compile", "link", "publish")

# The child: optional phase markers (stdout) for the killer, a build, then a load and one
# op call through its torch binding whose output digest is compared with the reference's.
CHILD = r"""
import hashlib, json, os, sys, time
from pathlib import Path
shapes = [tuple(s) for s in json.loads(sys.argv[1])]
xfile = sys.argv[2] if len(sys.argv) > 2 else ""
from aiter_aux.jit import build
from aiter_aux.jit.paths import codegen_module

def mark(phase):
    print("PHASE " + phase, flush=True)

if os.environ.get("T_HOOKS"):
    gen = codegen_module("gen_instances")
    real_generate, real_ninja, real_publish, real_replace = (
        gen.generate, build._run_ninja, build._publish, os.replace)
    def generate(*a, **k):
        mark("codegen"); return real_generate(*a, **k)
    def run_ninja(*a, **k):
        mark("compile"); return real_ninja(*a, **k)
    def publish(*a, **k):
        mark("publish"); return real_publish(*a, **k)
    def replace(*a, **k):  # widen the windows between the atomic steps
        time.sleep(0.02); return real_replace(*a, **k)
    gen.generate, build._run_ninja, build._publish, os.replace = (
        generate, run_ninja, publish, replace)

def progress(done, total, what):
    if what.startswith("LINK ") or ".so" in what:
        mark("link")

if os.environ.get("T_GO"):
    print("READY", flush=True)
    while not os.path.exists(os.environ["T_GO"]):
        time.sleep(0.002)
r = build.build_module(shapes=shapes, backend="cpu", progress=progress)
from aiter_aux.jit.module import AuxModule
mod = AuxModule(r.module_path)
out = {"compiled": r.compiled, "linked": r.linked, "waited": r.waited_s, "keys": mod.keys(),
       "module": str(r.module_path), "dir": str(r.build_dir),
       "sha": hashlib.sha256(Path(r.module_path).read_bytes()).hexdigest()}
if xfile:
    import torch
    import aiter_aux.ops  # defines torch.ops.aiter_aux (a module registers kernels)
    x = torch.frombuffer(bytearray(Path(xfile).read_bytes()), dtype=torch.bfloat16).view(-1, @D@)
    aq = torch.empty(x.shape[0], @D@ // 2, dtype=torch.uint8)
    sc = torch.empty(x.shape[0], @D@ // 32, dtype=torch.uint8)
    torch.ops.aiter_aux.mxfp4_quant_out(x, aq, sc)  # the binding this module registered
    out["quant"] = hashlib.sha256(aq.numpy().tobytes() + sc.numpy().tobytes()).hexdigest()
print("RESULT " + json.dumps(out), flush=True)
""".replace("@D@", str(D)).replace("@KEY@", QUANT_KEY)


@pytest.fixture(scope="module")
def srcdir(tmp_path_factory):
    """A snapshot of the kernel and codegen sources."""
    dst = tmp_path_factory.mktemp("src")
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, dst / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="module")
def quant_case(tmp_path_factory):
    """(file of bf16 input bytes, sha256 of the reference's a_q + a_scale bytes)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, D, generator=g) * 3).bfloat16()
    a_q, a_scale = ref.mxfp4_quant(x)
    path = tmp_path_factory.mktemp("quant") / "x.bin"
    path.write_bytes(x.view(torch.uint8).numpy().tobytes())
    digest = hashlib.sha256(a_q.numpy().tobytes() + a_scale.numpy().tobytes()).hexdigest()
    return str(path), digest


def child_env(cache: Path, srcdir: Path, **extra) -> dict:
    env = dict(os.environ, AITER_AUX_CACHE_DIR=str(cache), AITER_AUX_SOURCE_DIR=str(srcdir))
    for name in ("AITER_AUX_REBUILD", "AITER_AUX_DISABLE_JIT", "AITER_AUX_BACKEND", "T_HOOKS"):
        env.pop(name, None)
    env.update(extra)
    return env


def spawn(shapes, env, xfile="") -> subprocess.Popen:
    args = [sys.executable, "-c", CHILD, json.dumps(shapes)] + ([xfile] if xfile else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def result_of(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result in child output:\n{out[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def build(shapes, env, xfile="", timeout=600.0) -> tuple[dict, str]:
    """Run a build to its end; ``timeout`` only guards against a hang."""
    proc = spawn(shapes, env, xfile)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        msg = f"build did not finish within {timeout} s (hang):\n{err[-3000:]}"
        raise AssertionError(msg) from None
    assert proc.returncode == 0, f"build failed (rc {proc.returncode}):\n{err[-4000:]}"
    return result_of(out), err


def expected_keys(shape) -> set[str]:
    """The instance keys of ``shape``, from the op table (one per op)."""
    from aiter_aux.jit.paths import codegen_module

    return {i.key for i in codegen_module("instances").instances_for_shape(tuple(shape))}


def check_cache_consistent(build_dir: Path) -> None:
    manifest = json.loads((build_dir / "manifest.json").read_text())
    module = build_dir / manifest["module"]
    assert hashlib.sha256(module.read_bytes()).hexdigest() == manifest["module_sha256"]
    assert [p.name for p in build_dir.glob("module_moe_mxfp4_aux-*.so")] == [module.name]
    assert not list(build_dir.glob(".*.tmp")) and not list(build_dir.glob("src/.*.tmp"))


@pytest.fixture(scope="module")
def eight(tmp_path_factory, srcdir):
    """8 builders of [SHAPE_A] started together on an empty cache: (cache env, results,
    stderr texts).  The cache it leaves (holding [SHAPE_A]) serves the later tests."""
    tmp = tmp_path_factory.mktemp("eight")
    go = tmp / "go"
    env = child_env(tmp / "cache", srcdir)
    procs = [spawn([SHAPE_A], dict(env, T_GO=str(go))) for _ in range(8)]
    for p in procs:  # wait until every child has imported and is spinning on the go file
        assert p.stdout.readline().strip() == "READY"
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]  # a hang guard
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return env, [result_of(out) for out, _ in outs], [err for _, err in outs]


def test_eight_processes_one_compile_identical_bytes(eight):
    _env, results, errs = eight
    compiled = [r["compiled"] for r in results]
    n = len(expected_keys(SHAPE_A))
    assert sorted(compiled) == [0] * 7 + [n], f"TUs compiled per process: {compiled}"
    assert len({r["sha"] for r in results}) == 1, "processes loaded different module bytes"
    assert len({r["module"] for r in results}) == 1
    assert all(set(r["keys"]) == expected_keys(SHAPE_A) for r in results)
    lock = str(Path(results[0]["dir"]) / ".lock")
    waiters = [err for r, err in zip(results, errs, strict=True) if r["compiled"] == 0]
    reported = [err for err in waiters if "waiting for another process building" in err]
    assert reported, "no waiter reported its wait"
    assert all(lock in err for err in reported), "a wait report does not name the lock file"
    check_cache_consistent(Path(results[0]["dir"]))


def _kill_build(shapes, env, phase: str, delay: float) -> str | None:
    """Start a hooked build and SIGKILL it ``delay`` seconds after it reports ``phase``.
    Returns the last phase it reported before it died, or None if it finished first."""
    proc = spawn(shapes, dict(env, T_HOOKS="1"))
    for line in proc.stdout:
        if line.strip() == f"PHASE {phase}":
            break
    else:
        proc.communicate()
        return None
    time.sleep(delay)
    if proc.poll() is not None:
        proc.communicate()
        return None
    proc.send_signal(signal.SIGKILL)
    rest, _err = proc.communicate()
    phases = [ln.split()[1] for ln in rest.splitlines() if ln.startswith("PHASE ")]
    return phases[-1] if phases else phase


# Two catalogs: adding SHAPE_B compiles its two new instances, the lookup and the link;
# removing it compiles the lookup and links.  Kills in codegen/compile interrupt an add,
# kills in link/publish a removal, so the builds alternate without extra work.
S1, S2 = [SHAPE_A], [SHAPE_A, SHAPE_B]


@pytest.mark.robust
def test_sigkill_at_random_moments_then_build_recovers(eight, quant_case):
    xfile, want = quant_case
    env = eight[0]
    seed = int(os.environ.get("T_KILL_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    t0 = time.monotonic()
    build(S2, env)
    add_s = time.monotonic() - t0
    build(S1, env)
    windows = {"codegen": 0.1, "compile": max(0.3, add_s - 0.6), "link": 0.25, "publish": 0.06}

    def kill_then_build(phase: str, delay: float, source, target) -> str:
        """Kill a build of ``target`` in ``phase`` (the cache holds ``source``), then build
        ``target`` and check it; returns the phase the kill landed in."""
        for attempt in range(4):  # a kill that came too late is retried on new work, sooner
            where = _kill_build(target, env, phase, delay / 4**attempt if attempt < 3 else 0.0)
            if where:
                break
            build(source, env)
        assert where, f"could not kill a build during {phase} (seed {seed})"
        got, _ = build(target, env, xfile)
        msg = f"after a kill in {where} (seed {seed})"
        assert set(got["keys"]) == set().union(*map(expected_keys, target)), msg
        assert got["quant"] == want, msg
        check_cache_consistent(Path(got["dir"]))
        return where

    adds = ["codegen", "compile"] * 3
    removes = ["link", "publish"] * 3
    rng.shuffle(adds)
    rng.shuffle(removes)
    landed = []
    for pair in zip(adds, removes, strict=True):
        landed.append(kill_then_build(pair[0], rng.uniform(0, windows[pair[0]]), S1, S2))
        landed.append(kill_then_build(pair[1], rng.uniform(0, windows[pair[1]]), S2, S1))
    # A random delay can overshoot a short phase every time on a loaded machine (the kill
    # then lands in the next phase); a phase nothing landed in gets kills right at its start.
    for phase in PHASES:
        add = phase in ("codegen", "compile")
        for _extra in range(6):
            if phase in landed:
                break
            build(S1 if add else S2, env)  # the cache state this phase's build starts from
            landed.append(kill_then_build(phase, 0.0, *((S1, S2) if add else (S2, S1))))
        if not add:
            build(S1, env)
    assert len(landed) >= 12 and set(landed) == set(PHASES), (landed, seed)


@pytest.mark.robust
def test_orphaned_compiler_holds_workers_lock(eight):
    """A process that inherited the workers lock (as a killed builder's compilers do) makes
    the next build wait for it, with a report naming the lock file."""
    env, results, _errs = eight
    build(S1, env)  # so that the build of S2 below has work to do
    workers = Path(results[0]["dir"]) / ".lock.workers"
    fd = os.open(workers, os.O_RDWR)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, sys; fcntl.flock({fd}, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(fd,),
    )  # fmt: skip
    os.close(fd)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = spawn(S2, env)  # not the cached catalog: a build with work, under the lock
        for waiting in proc.stderr:  # the build says at once what it waits for
            if "compiler processes of an interrupted build" in waiting:
                break
        assert str(workers) in waiting and proc.poll() is None, f"it did not wait: {waiting}"
    finally:
        holder.communicate("release\n")  # the holder exits: its lock goes
    out, _err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and set(result_of(out)["keys"]) == set().union(
        *map(expected_keys, S2)
    )


@pytest.mark.robust
def test_lock_wait_is_bounded_and_names_lock(eight):
    from aiter_aux.jit.lock import BuildLock

    env, results, _errs = eight
    directory = Path(results[0]["dir"])
    with BuildLock(directory):  # held until the waiter gave up: its wait is bounded
        proc = spawn(S2, dict(env, AITER_AUX_LOCK_TIMEOUT="1", AITER_AUX_REBUILD="1"))
        _out, err = proc.communicate(timeout=600)  # a hang guard, not a budget
    assert proc.returncode != 0
    assert "LockTimeoutError" in err and str(directory / ".lock") in err


@pytest.mark.robust
def test_truncated_link_output_is_relinked_not_published(eight):
    """ninja trusts mtimes: a link output truncated behind its back looks up to date.  The
    builder compares it with the published sha256 and relinks instead of publishing it."""
    env = eight[0]
    good, _ = build(S1, env)
    built = Path(good["dir"]) / "obj" / "module_moe_mxfp4_aux.so"
    built.write_bytes(built.read_bytes()[:4096])
    with open(good["module"], "ab") as f:  # and the published module: the build must republish
        f.write(b"\0")
    again, _ = build(S1, env)
    assert again["linked"] and again["compiled"] == 0
    assert again["sha"] == good["sha"] and again["module"] == good["module"]
    check_cache_consistent(Path(again["dir"]))


# Three processes whose first op call, together, meets an empty cache: each builds the ops'
# autograd kernel alongside the module (two compile jobs), yet it is compiled once.
FIRST_CALL = r"""
import json, os, sys, time
import torch
from aiter_aux import ops as aux_ops
from aiter_aux.ops import _library
from aiter_aux.jit import written_versions
print("READY", flush=True)
while not os.path.exists(os.environ["T_GO"]):
    time.sleep(0.002)
aux_ops.mxfp4_quant(torch.randn(2, 3072).bfloat16())
print("RESULT " + json.dumps({"why": _library.register_written_versions(),
                              "dir": str(written_versions.build_dir())}))
"""


def test_first_calls_together_compile_the_autograd_kernel_once(tmp_path, srcdir):
    go = tmp_path / "go"
    env = child_env(tmp_path / "cache", srcdir, MAX_JOBS="2", T_GO=str(go))
    cmd = [sys.executable, "-c", FIRST_CALL]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(3)]  # fmt: skip
    for p in procs:
        assert p.stdout.readline().strip() == "READY"
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]  # a hang guard
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [result_of(out) for out, _ in outs]
    assert [r["why"] for r in results] == [None] * 3, results  # the C++ kernel everywhere
    log = (Path(results[0]["dir"]) / ".ninja_log").read_text().splitlines()
    compiles = [ln for ln in log if ln.split("\t")[3:4] == ["written_versions.o"]]
    assert len(compiles) == 1, log
