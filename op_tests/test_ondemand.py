"""Instances built on demand (aiter_aux/jit/ondemand.py), CPU backend, each case in child
processes on a copy of the sources whose catalog holds one shape and a cache of its own.

* A key no catalog shape gives: 16 threads of one process and 4 processes asking for it at
  once build it once, and every caller gets the reference's bytes.
* A failed build (a compiler error, SIGKILL, a full disk) publishes nothing, says why
  (the compiler's message and the failing file), and the next call builds it.
* ``aiter-aux list --cached`` shows the libraries, ``aiter-aux clean --on-demand`` removes
  them; the next call rebuilds.
* An edit of one op's CPU kernel header recompiles at most 2 objects after a full build.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from test_load_path import SHAPE_A, env_for, last_json, make_sources, py  # noqa: E402

from aiter_aux.jit.paths import codegen_module  # noqa: E402

NEW_E, NEW_K = 11, 3  # moe_sort_e11_k3: no catalog shape of make_sources gives it
NEW_KEY = f"moe_sort_e{NEW_E}_k{NEW_K}"

# One op call of the new key, compared with the reference; prints {"same": bool}.
CALL = f"""
import json, sys, threading
import torch
import aiter_aux
from aiter_aux import reference as ref
ids = torch.arange(5 * {NEW_K}, dtype=torch.int32).reshape(5, {NEW_K}) % {NEW_E}
w = torch.rand(5, {NEW_K}, generator=torch.Generator().manual_seed(1))
want = ref.moe_sort(ids, w, {NEW_E}, 16)
n = int(want.num_valid_ids[0])

def same():
    got = aiter_aux.moe_sort(ids, w, {NEW_E}, 16)
    return all(bool(torch.equal(a[:n], b[:n])) for a, b in zip(got[:3], want[:3])) and all(
        bool(torch.equal(a, b)) for a, b in zip(got[4:], want[4:]))

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
results = []
if threads > 1:
    aiter_aux.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16))  # the module first
    gate = threading.Barrier(threads)
    def run():
        gate.wait()
        results.append(same())
    ts = [threading.Thread(target=run) for _ in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
else:
    results.append(same())
print(json.dumps({{"same": len(results) == threads and all(results)}}))
"""


def _first_call(src: Path, cache: Path) -> dict:
    """The env of a one-shape catalog whose binding module (and the instance of a first
    op call) a process has built in ``cache``."""
    env = env_for(cache, src, AITER_AUX_BACKEND="cpu")
    p = py("import torch, aiter_aux; aiter_aux.mxfp4_quant(torch.zeros(1, 3072).bfloat16())",
           env)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return env


@pytest.fixture
def small(tmp_path):
    """(sources, env) of a one-shape catalog whose binding module is built."""
    src = make_sources(tmp_path / "src")
    return src, _first_call(src, tmp_path / "cache")


@pytest.fixture(scope="module")
def _small_built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    src = make_sources(tmp / "src")
    _first_call(src, tmp / "cache")
    return src, tmp / "cache"


@pytest.fixture
def small_cache(_small_built, tmp_path):
    """``small`` for a test that never edits the sources: the sources are shared, the cache is
    a copy (modes and mtimes kept) of one built by a first op call; no file of it names the
    cache's own path (build files are relative to their build directory)."""
    src, template = _small_built
    cache = tmp_path / "cache"
    shutil.copytree(template, cache, symlinks=True)
    texts = [f for f in cache.rglob("*") if f.suffix in (".ninja", ".json") and f.is_file()]
    assert texts and not [f for f in texts if str(template) in f.read_text()], texts
    return src, env_for(cache, src, AITER_AUX_BACKEND="cpu")


def key_dir(env: dict) -> Path:
    (build,) = Path(env["AITER_AUX_CACHE_DIR"]).glob("cpu-*")
    return build / "keys" / NEW_KEY


def builds_of(stderr: str) -> int:
    return sum(f"building instance {NEW_KEY}" in ln for ln in stderr.splitlines())


def test_threads_and_processes_build_a_new_key_once(small_cache):
    _src, env = small_cache
    procs = [subprocess.Popen([sys.executable, "-c", CALL, "16" if i == 0 else "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"same": True}, err[-3000:]
    assert sum(builds_of(err) for _out, err in outs) == 1, [err for _o, err in outs]
    assert len(list(key_dir(env).glob(f"inst_{NEW_KEY}-*.so"))) == 1


FAILING = f"""
import torch
import aiter_aux
ids = torch.zeros(1, {NEW_K}, dtype=torch.int32)
try:
    aiter_aux.moe_sort(ids, torch.ones(1, {NEW_K}), {NEW_E}, 16)
except Exception as e:
    print(type(e).__name__, "|", str(e).replace(chr(10), " "))
"""


def test_compiler_error_publishes_nothing_and_names_the_file(small):
    """A key's TU that does not compile (its template broken: the module of no shape, which
    renders no instance, still builds) fails the call with the compiler's message."""
    src, env = small
    template = src / "templates" / "instance.j2"
    good = template.read_text()
    template.write_text(good + "\nthis is not C++;\n")
    p = py(FAILING, env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("BuildError |") and f"inst_{NEW_KEY}" in line, line
    assert f"building instance {NEW_KEY} in " in line and "error" in line, line
    assert not list(key_dir(env).glob("*.so")) and not (key_dir(env) / "manifest.json").exists()
    template.write_text(good)
    assert last_json(py(CALL, env)) == {"same": True}


# A build of the new key that reports each phase, so the test can kill it there.
HOOKED = f"""
import sys, time
import torch
import aiter_aux
from aiter_aux.jit import build
run = build._run_ninja
def slow(*a, **k):
    print("NINJA", flush=True)
    return run(*a, **k)
build._run_ninja = slow
aiter_aux.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16))
ids = torch.zeros(1, {NEW_K}, dtype=torch.int32)
aiter_aux.moe_sort(ids, torch.ones(1, {NEW_K}), {NEW_E}, 16)
print("DONE", flush=True)
"""


@pytest.mark.robust
@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8])
def test_sigkill_during_a_key_build_then_the_next_call_builds_it(small_cache, delay):
    _src, env = small_cache
    proc = subprocess.Popen([sys.executable, "-c", HOOKED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "NINJA", proc.stderr.read()
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)  # the builder; its compilers live on as orphans
    proc.wait()
    assert last_json(py(CALL, env)) == {"same": True}
    assert len(list(key_dir(env).glob(f"inst_{NEW_KEY}-*.so"))) == 1


FULL_DISK = FAILING.replace(
    "ids = ",
    "aiter_aux.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16))\n"
    "import resource\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
    "ids = ",
)


def test_full_disk_during_a_key_build_publishes_nothing(small_cache):
    _src, env = small_cache
    p = py(FULL_DISK, env, preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-2000:]
    assert line.split(" |")[0] in ("BuildError", "OSError"), line
    assert not (key_dir(env) / "manifest.json").exists(), line
    assert not list(key_dir(env).glob(f"inst_{NEW_KEY}-*.so")), line
    assert last_json(py(CALL, env)) == {"same": True}  # and the next call builds it


def test_list_cached_and_clean_on_demand(small_cache):
    _src, env = small_cache
    assert last_json(py(CALL, env)) == {"same": True}
    cli = [sys.executable, "-m", "aiter_aux.cli"]
    p = subprocess.run([*cli, "list", "--cached"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and NEW_KEY in p.stdout and "mxfp4_quant_d3072" in p.stdout, p
    assert "differs from its manifest" not in p.stdout, p.stdout
    (lib,) = key_dir(env).glob(f"inst_{NEW_KEY}-*.so")
    os.truncate(lib, 100)  # list and doctor say so: its next call rebuilds it
    p = subprocess.run([*cli, "list", "--cached"], capture_output=True, text=True, env=env)
    (row,) = [ln for ln in p.stdout.splitlines() if NEW_KEY in ln]
    assert "differs from its manifest: its next call rebuilds it" in row, p.stdout
    p = subprocess.run([*cli, "doctor", "--no-dry-run"], capture_output=True, text=True, env=env)
    assert f"1 differ from their manifest ({NEW_KEY})" in p.stdout, p.stdout
    p = subprocess.run([*cli, "clean", "--on-demand"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "removed" in p.stdout, p
    assert not key_dir(env).exists()
    p = subprocess.run([*cli, "list", "--cached"], capture_output=True, text=True, env=env)
    assert p.stdout.startswith("0 instance(s) built on demand"), p.stdout
    assert last_json(py(CALL, env)) == {"same": True}  # built again


LAUNCHER = """#!/bin/sh
# a compiler launcher that holds the build until the test lets it go
touch "$T_STARTED"
while [ ! -e "$T_GO" ]; do sleep 0.05; done
exec "$@"
"""


def test_clean_waits_for_a_build_in_progress(small_cache, tmp_path):
    """`clean` takes the cache lock exclusively, builders hold it shared: a clean started
    while an instance compiles waits (saying so) and removes the instances afterwards; the
    build is not broken by its directory vanishing under its compiler."""
    _src, env = small_cache
    launcher, started, go = tmp_path / "hold.sh", tmp_path / "started", tmp_path / "go"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    env_b = dict(env, AITER_AUX_CXX_LAUNCHER=str(launcher), T_STARTED=str(started), T_GO=str(go))
    builder = subprocess.Popen([sys.executable, "-c", CALL], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env_b)  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # a bound on a hang, not a performance budget
        while not started.exists():
            assert builder.poll() is None and time.monotonic() < deadline, builder.stderr.read()
            time.sleep(0.05)
        clean = subprocess.Popen([sys.executable, "-m", "aiter_aux.cli", "clean", "--on-demand"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)  # fmt: skip
        first = clean.stderr.readline()  # the wait is reported at once; no line: no wait
        assert "waiting for the builds in progress to finish" in first, first
        go.touch()
        out, err = builder.communicate(timeout=300)
        assert builder.returncode == 0, err[-4000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"same": True}
        c_out, c_err = clean.communicate(timeout=300)
        assert clean.returncode == 0 and "removed" in c_out, c_err
    finally:
        go.touch()
        builder.kill()
    assert not key_dir(env).exists()
    assert last_json(py(CALL, env)) == {"same": True}  # built again


BUILD = """
import json
from aiter_aux.jit.build import build_module
r = build_module(backend="cpu")
print(json.dumps({"compiled": r.compiled, "objects": r.units, "n": r.num_instances}))
"""
CPU_HEADERS = sorted({spec.kernels[0] for spec in codegen_module("ops").OPS.values()
                      if spec.kernels})  # fmt: skip


@pytest.mark.parametrize("header", CPU_HEADERS)
def test_an_op_header_edit_recompiles_at_most_two_objects(tmp_path, header):
    """After a full build of a one-shape catalog, an edit of one op's CPU kernel header
    recompiles at most 2 objects and no instance: the CPU kernels are generic, compiled once
    per module by the kernels TU of each header (core_cpu.h: its own and mxfp8_cpu.h's)."""
    src = make_sources(tmp_path / "src", (SHAPE_A,))
    env = env_for(tmp_path / "cache", src)
    first = last_json(py(BUILD, env))
    path = src / "csrc" / "kernels" / "mxfp4_moe" / "cpu" / header
    path.write_text(path.read_text() + "\n// an edit\n")
    second = last_json(py(BUILD, env))
    assert first["compiled"] == first["n"] and second["compiled"] == 0, second
    assert 1 <= second["objects"] <= 2, second


def test_shape_status_says_servable_and_prebuilt():
    import aiter_aux

    s = aiter_aux.mxfp4_moe_shape_status(257, 7168, 256, 9)  # a catalog shape
    assert s == (True, True, "") and aiter_aux.is_mxfp4_moe_shape_supported(257, 7168, 256, 9)
    s = aiter_aux.mxfp4_moe_shape_status(8, 4096, 14336, 2)  # Mixtral TP1: built on demand
    assert s.servable and not s.prebuilt and s.reason == ""
    s = aiter_aux.mxfp4_moe_shape_status(8, 2880, 2880, 2)  # hidden not padded to 256
    assert not s.servable and not s.prebuilt and "multiple of 256" in s.reason
    assert not aiter_aux.mxfp4_moe_shape_status(2000, 4096, 256, 8).servable


@pytest.mark.parametrize("args, name, kind", [
    ((256.5, 7168, 512, 8), "expert", "float"), ((256, "7168", 512, 8), "model_dim", "str"),
    ((256, 7168, None, 8), "inter_dim", "NoneType"), ((256, 7168, 512, True), "topk", "bool"),
])  # fmt: skip
def test_shape_status_refuses_what_is_no_int(args, name, kind):
    """A float, string, None or bool is refused naming the argument, never converted: by
    both dispatcher predicates (is_mxfp4_moe_shape_supported converted them with int())."""
    import aiter_aux

    with pytest.raises(TypeError, match=f"^{name} must be an int, got {kind}$"):
        aiter_aux.mxfp4_moe_shape_status(*args)
    with pytest.raises(TypeError, match=f"^{name} must be an int, got {kind}$"):
        aiter_aux.is_mxfp4_moe_shape_supported(*args)
    if name in ("model_dim", "topk"):
        with pytest.raises(TypeError, match=f"^{name} must be an int, got {kind}$"):
            aiter_aux.is_mxfp4_moe_scatter_supported(args[1], args[3])


def test_shape_status_names_the_gate_of_a_topk_above_16():
    """topk 17: the layer is served (sort, quant, scatter), the gate is not, and reason says
    so; moe_route refuses it as the reason says."""
    import torch

    import aiter_aux
    from aiter_aux import ops

    s = aiter_aux.mxfp4_moe_shape_status(64, 3072, 256, 17)
    assert s.servable and "moe_route and moe_route_sort_quant serve topk <= 16" in s.reason
    with pytest.raises(ValueError, match="topk"):
        ops.moe_route(torch.randn(2, 64), 17)
    ids = torch.stack([torch.randperm(64)[:17] for _ in range(2)]).to(torch.int32)
    ops.moe_sort(ids, torch.rand(2, 17), 64, 32)


def test_shape_status_names_the_op_that_does_not_serve_a_model_dim():
    import torch

    import aiter_aux
    from aiter_aux import ops

    # gpt-oss's hidden size 2880: a multiple of 32 (the MX block) but not of 256
    s = aiter_aux.mxfp4_moe_shape_status(40, 2880, 2880, 5)
    assert not s.servable and "moe_sort_scales" in s.reason, s.reason
    assert "sorted_scales" in s.reason and "the other ops serve model_dim 2880" in s.reason
    assert "mxfp4_quant" not in s.reason and "pad the hidden size to 3072" in s.reason
    # what the reason says, the ops do: these run at 2880 and moe_sort_scales refuses it
    ids = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], dtype=torch.int32)
    x = torch.randn(2, 2880, dtype=torch.bfloat16)
    out, a_q, a_scale = ops.moe_sort_quant(ids, torch.rand(2, 5), x, 40, 32)
    assert a_q.shape == (2, 1440) and a_scale.shape == (2, 90)
    rows = out.sorted_token_ids.numel()
    y = ops.moe_scatter_reduce_q(torch.zeros(rows, 1440, dtype=torch.uint8),
                                 torch.full((rows, 90), 127, dtype=torch.uint8),
                                 out.reverse_sorted, out.sorted_weights, 5)  # fmt: skip
    assert y.shape == (2, 2880)
    with pytest.raises(ValueError, match="multiple of 256"):
        ops.moe_sort_scales(a_scale, out.sorted_token_ids, out.num_valid_ids, 32)
    # not a multiple of 32 either: the quant ops are named too
    s = aiter_aux.mxfp4_moe_shape_status(40, 2888, 2880, 5)
    assert not s.servable and "moe_sort_scales" in s.reason and "mxfp4_quant" in s.reason
    assert "of 32 for mxfp4_quant" in s.reason, s.reason


FORK = """
import os, signal, sys, threading, time
import torch
import aiter_aux
from aiter_aux.jit import lock, ondemand, spec
from aiter_aux.ops import _library
held = threading.Event()

def first_call_in_progress():  # holds what a first op call holds while it loads and builds
    for name, obj in (("spec", spec), ("library", _library)):
        obj._LOCK.acquire()
    lock._THREAD_LOCK.acquire()
    ondemand._KEY_LOCKS_GUARD.acquire()
    _library._WRITTEN_LOCK.acquire()  # held by the autograd kernel's build alongside
    held.set()
    time.sleep(3600)

threading.Thread(target=first_call_in_progress, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:  # the child: its first op call must not wait for a thread it does not have
    q, s = aiter_aux.mxfp4_quant(torch.zeros(2, 3072, dtype=torch.bfloat16))
    os._exit(0 if int(q.sum()) == 0 else 3)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("CHILD", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.1)
else:
    os.kill(pid, signal.SIGKILL)
    print("HANG")
"""


def test_fork_while_another_thread_holds_the_loader_locks(small_cache):
    """A worker pool that forks while another thread makes the first op call: the child's
    own first op call runs (the locks are new after fork), it does not hang."""
    _src, env = small_cache
    p = py(FORK, env)
    assert p.stdout.strip().splitlines()[-1:] == ["CHILD 0"], p.stdout + p.stderr[-3000:]
