"""The load path (aiter_aux/jit/spec.py) and the build cache's edge cases, CPU backend.

Every case runs in child processes on a copy of the sources whose catalog holds one shape
(``AITER_AUX_SOURCE_DIR``) and a cache of its own, so an edit never touches the checkout.

* D1: after a template edit, a fresh process's op call rebuilds, and ``aiter-aux doctor``
  agrees with its own dry run.
* D6: a build whose process read the catalog before an add-shape never republishes it.
* D10: a complete build on a read-only mount loads, builds as a no-op, and ``doctor`` runs.
* D11: ``AITER_AUX_CACHE_DIR`` naming a file: a typed one-line error; doctor reports it.
* D13: processes loading while another republishes all load a verified module.
* One module per backend and process: a prebuilt module serves even when it holds part of
  the catalog; a key outside the loaded module is built on demand into it, never by
  loading a second module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from hashlib import sha256
from pathlib import Path

import pytest

pytest.importorskip("torch")

from instance_counts import N_OPS, keys_of, n_tus  # noqa: E402 (op_tests/instance_counts.py)

ROOT = Path(__file__).resolve().parents[1]
SHAPE_A = (256, 3072, 256, 8)
SHAPE_B = (128, 3072, 512, 4)
KEY_A = "mxfp4_quant_d3072"
KEY_B = "moe_sort_e128_k4"  # in SHAPE_B only


def set_catalog(src: Path, shapes) -> None:
    gen = src / "codegen" / "catalog.py"
    text = gen.read_text()
    start = text.index("SHAPES = [")
    end = text.index("]\n", start)
    lines = "".join(f"    {tuple(s)},\n" for s in shapes)
    gen.write_text(text[:start] + "SHAPES = [\n" + lines + text[end:])


def make_sources(dst: Path, shapes=(SHAPE_A,)) -> Path:
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, dst / sub, ignore=shutil.ignore_patterns("__pycache__"))
    set_catalog(dst, shapes)
    return dst


def env_for(cache: Path, src: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_AUX_")}
    env.update(AITER_AUX_CACHE_DIR=str(cache), AITER_AUX_SOURCE_DIR=str(src), **extra)
    return env


def py(code: str, env: dict, *args: str, prefix=(), **kw) -> subprocess.CompletedProcess:
    cmd = [*prefix, sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, **kw)


def last_json(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


BUILD = """
import json
from aiter_aux.jit.build import build_module
r = build_module(backend="cpu")
print(json.dumps({"module": str(r.module_path), "dir": str(r.build_dir),
                  "compiled": r.compiled, "linked": r.linked}))
"""
LOAD = """
import json, sys
from aiter_aux.jit.spec import load_module, loaded_modules
m = load_module("cpu", sys.argv[1])
print(json.dumps({"module": str(m.path), "keys": m.keys(), "n": len(loaded_modules())}))
"""


@pytest.fixture
def small(tmp_path):
    """(sources, cache, env, first build) for a one-shape catalog."""
    src = make_sources(tmp_path / "src")
    cache = tmp_path / "cache"
    env = env_for(cache, src)
    return src, cache, env, last_json(py(BUILD, env))


@pytest.fixture(scope="module")
def _small_built(tmp_path_factory):
    """One-shape catalog sources and a cache of their first build, made once per module."""
    tmp = tmp_path_factory.mktemp("small")
    src = make_sources(tmp / "src")
    cache = tmp / "cache"
    return src, cache, last_json(py(BUILD, env_for(cache, src)))


@pytest.fixture
def small_cache(_small_built, tmp_path):
    """``small`` for a test that never edits the sources: the sources are shared, the cache is
    a copy (modes and mtimes kept) of one first build, which names no absolute path of its
    own (build.ninja and the manifest are relative to the build directory)."""
    src, template, first = _small_built
    cache = tmp_path / "cache"
    shutil.copytree(template, cache, symlinks=True)
    here = {k: v.replace(str(template), str(cache), 1) if isinstance(v, str) else v
            for k, v in first.items()}  # fmt: skip
    assert Path(here["module"]).is_file() and Path(here["dir"]).is_relative_to(cache), here
    return src, cache, env_for(cache, src), here


def doctor(env: dict, prefix=()) -> subprocess.CompletedProcess:
    code = "import sys; from aiter_aux.cli import main; sys.exit(main(sys.argv[1:]))"
    return py(code, env, "doctor", "--backend", "cpu", prefix=prefix)


# ------------------------------------------------------------------------------------ D1
@pytest.mark.robust
def test_template_edit_rebuilds_on_the_op_path_and_doctor_agrees(small):
    src, _cache, env, first = small
    template = src / "templates" / "instance.j2"
    old = template.stat()
    template.write_text(template.read_text() + "// D1: an edit of the template\n")
    os.utime(template, (old.st_atime - 10_000, old.st_mtime - 10_000))  # mtime goes back

    p = doctor(env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sources changed since" in p.stdout and "sources current" not in p.stdout, p.stdout
    n = len(keys_of(SHAPE_A))  # instance.j2 changed: the instance TUs, not the others
    assert f"ninja -n: {n} of {n_tus(n)} translation unit(s) to compile" in p.stdout, p.stdout
    assert "JIT-build the binding first" in p.stdout, p.stdout

    # a fresh process's first op call: the binding's module (not stale: the template is no
    # input of it), then the call's instance, built on demand from the edited template
    got = last_json(py(LOAD, env, KEY_A))
    assert "/core/" in got["module"], got
    rendered = Path(first["dir"]) / "keys" / KEY_A / "src" / f"inst_{KEY_A}.cpp"
    assert "D1: an edit of the template" in rendered.read_text(), "the op path did not rebuild"

    last_json(py(BUILD, env))  # `aiter-aux build`: the catalog's module again
    p = doctor(env)
    assert "sources current" in p.stdout and "ninja -n: nothing to do" in p.stdout, p.stdout


# ------------------------------------------------------------------------------------ D6
STALE = """
import json, os, sys, time
from aiter_aux.jit import build
from aiter_aux.jit.paths import codegen_module
codegen_module("catalog")  # the process reads the catalog (one shape) now
print("READY", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
try:
    r = build.build_module(backend="cpu")
    print(json.dumps({"published": r.num_shapes}))
except build.BuildError as e:
    print(json.dumps({"error": type(e).__name__, "msg": str(e)}))
"""


@pytest.mark.robust
def test_build_never_republishes_an_older_catalog(small, tmp_path):
    src, _cache, env, first = small
    go = tmp_path / "go"
    old = subprocess.Popen([sys.executable, "-c", STALE, str(go)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert old.stdout.readline().strip() == "READY"
    set_catalog(src, [SHAPE_A, SHAPE_B])  # an add-shape, built by another process
    new = last_json(py(BUILD, env))
    go.touch()
    out, err = old.communicate(timeout=900)
    got = json.loads(out.strip().splitlines()[-1])
    assert got.get("error") == "StaleCatalogError", (got, err[-2000:])
    assert "changed on disk" in got["msg"] and "aiter-aux build" in got["msg"]
    manifest = json.loads((Path(first["dir"]) / "manifest.json").read_text())
    assert len(manifest["shapes"]) == 2 and new["module"].endswith(manifest["module"])
    assert last_json(py(BUILD, env))["compiled"] == 0, "the next build recompiled"


# ----------------------------------------------------------------------------------- D10
def _read_only(cache: Path) -> tuple[str, ...]:
    """A command prefix that runs its command with ``cache`` mounted read-only."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    c = str(cache)
    script = f'mount --bind {c} {c} && mount -o remount,bind,ro {c} && exec "$@"'
    prefix = ("unshare", "-m", "--map-root-user", "sh", "-c", script, "sh")
    if os.geteuid() == 0:
        prefix = ("unshare", "-m", "sh", "-c", script, "sh")
    probe = subprocess.run([*prefix, "sh", "-c", f"touch {c}/.probe"], capture_output=True,
                           text=True)  # fmt: skip
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot mount read-only here: {probe.stderr.strip()[:200]}")
    return prefix


def test_read_only_cache_loads_builds_as_noop_and_doctor_runs(small):
    src, cache, env, first = small
    ro = _read_only(cache)
    code = "import sys; from aiter_aux.cli import main; sys.exit(main(sys.argv[1:]))"
    p = py(code, env, "build", "--backend", "cpu", prefix=ro)
    assert p.returncode == 0 and "(0 instance TUs compiled" in p.stdout, p.stdout + p.stderr
    got = last_json(py(LOAD, env, KEY_A, prefix=ro))
    assert got["module"] == first["module"]
    op = (
        "import torch; from aiter_aux import ops; from aiter_aux import "
        "reference as ref; x = torch.randn(3, 3072).bfloat16(); "
        "assert all(map(torch.equal, ops.mxfp4_quant(x), ref.mxfp4_quant(x))); print('{}')"
    )
    last_json(py(op, env, prefix=ro))
    p = doctor(env, prefix=ro)
    assert p.returncode == 0 and "module intact, sources current" in p.stdout, p.stdout + p.stderr

    # a stale module on a read-only cache: one clear, typed error
    (src / "templates" / "instance.j2").write_text(
        (src / "templates" / "instance.j2").read_text() + "// stale\n"
    )
    p = py(BUILD, env, prefix=ro)
    assert p.returncode != 0 and "CacheDirError" in p.stderr and "not writable" in p.stderr
    assert str(cache) in p.stderr.splitlines()[-1]


# ------------------------------------------------------------------------------ N3, N4, N9
def _manifest(first) -> tuple[Path, dict]:
    path = Path(first["dir"]) / "manifest.json"
    return path, json.loads(path.read_text())


@pytest.mark.robust
@pytest.mark.parametrize("name", ["..", ".", "src", "fifo"])
def test_manifest_naming_no_regular_file_counts_as_no_module(small_cache, name):
    """N3: the op call, ``build`` and ``doctor`` rebuild or report; none dies."""
    _src, _cache, env, first = small_cache
    path, manifest = _manifest(first)
    if name == "fifo":
        name = "module_moe_mxfp4_aux-0123456789abcdef.so"
        os.mkfifo(Path(first["dir"]) / name)
    path.write_text(json.dumps(dict(manifest, module=name)))
    p = doctor(env)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert f"PROBLEM: {Path(first['dir']) / name} differs from its manifest" in p.stdout
    assert "JIT-build the binding first" in p.stdout, p.stdout
    got = last_json(py(LOAD, env, KEY_A))  # the op path: the binding's module, KEY_A on demand
    assert "/core/" in got["module"], got
    got = last_json(py(BUILD, env))  # the catalog's module, republished without compiling
    assert got["module"] == first["module"] and got["compiled"] == 0
    assert _manifest(first)[1]["module"] == Path(first["module"]).name


def _forge(first) -> Path:
    """Garbage bytes in place of the published module, with the manifest's sha256 updated
    to match: intact by checksum, refused by the dynamic loader."""
    path, manifest = _manifest(first)
    module = Path(first["module"])
    module.write_bytes(b"\x7fELF not really a shared object\n")
    path.write_text(
        json.dumps(dict(manifest, module_sha256=sha256(module.read_bytes()).hexdigest()))
    )
    return module


@pytest.mark.robust
def test_module_the_loader_refuses_counts_as_no_module(small_cache):
    """N4: messages name the module, never /proc/self/fd/N; doctor checks that it loads; the
    op path relinks and republishes it under the lock."""
    _src, _cache, env, first = small_cache
    module = _forge(first)
    p = doctor(env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"PROBLEM: {module} matches its manifest but does not load" in p.stdout, p.stdout
    assert "/proc/self/fd" not in p.stdout
    p = py(LOAD, dict(env, AITER_AUX_DISABLE_JIT="1"), KEY_A)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and last.startswith("aiter_aux.jit.paths.JitDisabledError"), last
    assert "the cached module does not load (the dynamic loader refused" in last, last
    assert str(module) in last and "/proc/self" not in last
    got = last_json(py(LOAD, env, KEY_A))  # relinked and republished
    manifest = _manifest(first)[1]
    assert got["module"] == str(Path(first["dir"]) / manifest["module"])
    assert sha256(Path(got["module"]).read_bytes()).hexdigest() == manifest["module_sha256"]
    assert doctor(env).returncode == 0


def test_empty_read_only_cache_is_a_problem_for_doctor(tmp_path):
    """N9: every op call would fail (no module, nothing can be built): not 'status ok'."""
    src = make_sources(tmp_path / "src")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = env_for(cache, src)
    p = doctor(env, prefix=_read_only(cache))
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"PROBLEM: the build cache {cache}/cpu-" in p.stdout and "not writable" in p.stdout
    assert "every op call fails" in p.stdout
    p = doctor(dict(env, AITER_AUX_DISABLE_JIT="1"))
    assert p.returncode == 1 and "every op call raises JitDisabledError" in p.stdout, p.stdout


def test_clean_of_a_read_only_cache_names_the_cache(small_cache):
    """N11: one line naming the directory it could not remove (not only .ninja_log)."""
    _src, cache, env, _first = small_cache
    code = "import sys; from aiter_aux.cli import main; sys.exit(main(sys.argv[1:]))"
    p = py(code, env, "clean", "--yes", prefix=_read_only(cache))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].endswith(f"cannot remove {cache}: Read-only file system (-v for a traceback)")
    assert any(cache.iterdir())


FULL_DISK = """
import json, resource
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
from aiter_aux.jit.build import build_module
try:
    build_module(backend="cpu")
    print(json.dumps({}))
except OSError as e:
    print(json.dumps({"error": str(e), "filename": e.filename}))
"""


@pytest.mark.robust
def test_publish_on_a_full_disk_names_the_file(small_cache):
    """N12: a write that fails while publishing (here: a file-size limit, as a full disk
    would) raises an OSError naming the file."""
    _src, _cache, env, first = small_cache
    Path(first["module"]).unlink()  # the next build republishes it from obj/
    got = last_json(py(FULL_DISK, env))
    assert got.get("filename") == first["module"], got
    assert first["module"] in got["error"] and "File too large" in got["error"], got


# ----------------------------------------------------------------------------------- D11
@pytest.mark.robust
def test_cache_dir_that_is_a_file(tmp_path):
    src = make_sources(tmp_path / "src")
    cache = tmp_path / "cache"
    cache.write_text("not a directory\n")
    env = env_for(cache, src)
    p = py(BUILD, env)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("aiter_aux.jit.paths.CacheDirError: ") and str(cache) in last, last
    assert "not a directory" in last and "AITER_AUX_CACHE_DIR" in last
    from aiter_aux.jit.build import CacheSafetyError
    from aiter_aux.jit.paths import CacheDirError

    assert issubclass(CacheDirError, CacheSafetyError)
    p = doctor(env)
    assert p.returncode == 1 and "PROBLEM" in p.stdout and "not a directory" in p.stdout
    assert "does not exist yet" not in p.stdout
    env = env_for(cache / "sub", src)  # a file above the cache directory
    p = py(BUILD, env)
    assert p.returncode != 0 and "CacheDirError" in p.stderr and str(cache) in p.stderr


# ----------------------------------------------------------------------------------- D13
# The child republishes the module (as a concurrent build does: a new file, the manifest
# replaced, the old file removed) just before the first open of a module file ("before"),
# or just after every open of one ("after": only a load through the opened descriptor can
# succeed then), and loads with AITER_AUX_DISABLE_JIT=1 (no rebuild can hide a failure).
RACE = """
import builtins, hashlib, io, json, os, sys
from pathlib import Path
directory, mode, done = Path(sys.argv[2]), sys.argv[3], []

def republish():
    m = json.loads((directory / "manifest.json").read_text())
    old = directory / m["module"]
    blob = old.read_bytes() + bytes(64)  # trailing bytes: another sha, the same module
    sha = hashlib.sha256(blob).hexdigest()
    new = directory / f"module_moe_mxfp4_aux-{sha[:16]}.so"
    new.write_bytes(blob)
    os.chmod(new, 0o755)
    (directory / ".m.tmp").write_text(json.dumps(dict(m, module=new.name, module_sha256=sha)))
    os.replace(directory / ".m.tmp", directory / "manifest.json")
    old.unlink()

def wrap(real):
    def opener(file, *args, **kwargs):
        hit = "module_moe_mxfp4_aux-" in str(file) and "busy" not in done
        hit = hit and (mode == "after" or not done)
        if hit:
            done.append("busy")
            if mode == "before":
                republish()
        result = real(file, *args, **kwargs)
        if hit and mode == "after":
            republish()
        if hit:
            done[-1] = file
        return result
    return opener

os.open, io.open = wrap(os.open), wrap(io.open)
builtins.open = io.open
from aiter_aux.jit.spec import load_module
m = load_module("cpu", sys.argv[1])
print(json.dumps({"keys": len(m.keys()), "raced": bool(done)}))
"""


@pytest.mark.robust
@pytest.mark.parametrize("when", ["before", "after"])
def test_loading_while_another_process_republishes(small_cache, when):
    _src, _cache, env, first = small_cache
    got = last_json(py(RACE, dict(env, AITER_AUX_DISABLE_JIT="1"), KEY_A, first["dir"], when))
    assert got == {"keys": len(keys_of(SHAPE_A)), "raced": True}  # the module holds SHAPE_A


# --------------------------------------------------------- one module per backend/process
PREBUILT = """
import json, sys
from pathlib import Path
from aiter_aux.jit import paths
paths.PREBUILT_DIR = Path(sys.argv[1])
from aiter_aux.jit.build import JitDisabledError
from aiter_aux.jit.module import InstanceMissingError
from aiter_aux.jit.spec import load_module
m = load_module("cpu", sys.argv[2])
out = {"module": str(m.path)}
try:
    load_module("cpu", sys.argv[3])
    out["second"] = "ok"
except (InstanceMissingError, JitDisabledError) as e:
    out["second"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


@pytest.mark.robust
def test_partial_prebuilt_serves_and_the_rest_is_built_on_demand(small, tmp_path):
    from aiter_aux.jit import prebuilt
    from aiter_aux.jit.build import _sha256
    from aiter_aux.jit.module import ABI_VERSION

    src, _cache, env, first = small
    pre = tmp_path / "prebuilt" / "cpu-host"
    pre.mkdir(parents=True)
    shutil.copyfile(first["module"], pre / "m.so")
    set_catalog(src, [SHAPE_A, SHAPE_B])  # the prebuilt module holds SHAPE_A's keys only
    keys = keys_of(SHAPE_A)
    assert KEY_A in keys and KEY_B not in keys
    manifest = {"format": prebuilt.FORMAT, "module": "m.so", "backend": "cpu", "arch": [],
                "module_sha256": _sha256(pre / "m.so"), "abi_version": ABI_VERSION,
                "sources_digest": prebuilt.sources_digest(src), **prebuilt.platform_tag(),
                "keys": sorted(keys), "shapes": [list(SHAPE_A)]}  # fmt: skip
    (pre / "manifest.json").write_text(json.dumps(manifest))
    args = (str(pre.parent), KEY_A, KEY_B)

    # JIT disabled: the partial prebuilt module serves, a key outside it names the fix
    p = py(PREBUILT, dict(env, AITER_AUX_DISABLE_JIT="1"), *args)
    got = last_json(p)
    assert got["module"] == str(pre / "m.so"), got
    assert got["second"].startswith(f"JitDisabledError: no instance '{KEY_B}' (fix: "), got

    # JIT enabled: the prebuilt module serves, the key it lacks is built on demand
    p = py(PREBUILT, env, *args)
    got = last_json(p)
    assert got["module"] == str(pre / "m.so") and got["second"] == "ok", got
    built = [ln for ln in p.stderr.splitlines() if "building instance" in ln]
    assert len(built) == 1 and KEY_B in built[0], p.stderr


SECOND = """
import json, sys
from aiter_aux.jit.build import build_module
from aiter_aux.jit.module import InstanceMissingError
from aiter_aux.jit.spec import load_module, loaded_modules
first = load_module("cpu", sys.argv[1])
build_module(shapes=[(256, 3072, 256, 8), (128, 3072, 512, 4)], backend="cpu")
try:
    second = str(load_module("cpu", sys.argv[2]).path)
except InstanceMissingError as e:
    second = "InstanceMissingError: " + str(e)
print(json.dumps({"second": second, "n": len(loaded_modules()),
                  "same": loaded_modules()["cpu"] is first}))
"""


def test_one_module_per_backend_and_process(small_cache):
    """A key the loaded module lacks is built on demand into it: the process never loads a
    second module for the backend, not even after the catalog's module was rebuilt."""
    _src, _cache, env, _first = small_cache
    got = last_json(py(SECOND, env, KEY_A, KEY_B))
    assert got["n"] == 1 and got["same"], got
    assert not got["second"].startswith("InstanceMissingError"), got


RUNNING = """
import json, os, sys, time
from aiter_aux.jit.module import InstanceMissingError
from aiter_aux.jit.spec import explain_missing, load_module
load_module("cpu", sys.argv[1])
print("READY", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
out = {}
for key in sys.argv[3:]:
    try:
        load_module("cpu", key)
    except InstanceMissingError as e:
        out[key] = str(e)
        assert explain_missing("cpu", key) == str(e)
print(json.dumps(out))
"""


def test_running_process_asking_for_a_key_added_since_gets_it(small, tmp_path):
    """N2: a key whose shape the catalog on disk gained after the process loaded its module,
    and a key of no catalog shape: both are built on demand in the running process."""
    src, _cache, env, _first = small
    go, nowhere = tmp_path / "go", "moe_sort_e64_k4"
    proc = subprocess.Popen([sys.executable, "-c", RUNNING, KEY_A, str(go), KEY_B, nowhere],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    set_catalog(src, [SHAPE_A, SHAPE_B])  # an add-shape by another process
    go.touch()
    out, err = proc.communicate(timeout=900)
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {}, got  # no InstanceMissingError
    assert KEY_B in err and nowhere in err, err  # each said it built


# ------------------------------------------------------------------ the ModuleSpec contract
CONTRACT = """
import json, sys
from pathlib import Path
from aiter_aux.jit.spec import ModuleSpec
spec = ModuleSpec("cpu")
if sys.argv[1] == "try_load":
    m = spec.try_load()
    print(json.dumps({"loaded": None if m is None else str(m.path)}))
else:
    r1, r2 = spec.build(), spec.build()
    print(json.dumps({"compiled": [r1.compiled, r2.compiled], "linked": r2.linked,
                      "same": r1.module_path == r2.module_path, "plan": spec.plan()}))
"""


def test_try_load_never_raises_and_build_is_idempotent(tmp_path):
    src = make_sources(tmp_path / "src")
    cache = tmp_path / "cache"
    env = env_for(cache, src)

    def try_load(**extra):
        return last_json(py(CONTRACT, dict(env, **extra), "try_load"))["loaded"]

    assert try_load() is None  # no cache at all
    got = last_json(py(CONTRACT, env, "build"))
    assert got["compiled"][1] == 0 and not got["linked"] and got["same"], got
    assert got["compiled"][0] == N_OPS and got["plan"][0] == "cache", got  # one key per op
    module = Path(got["plan"][1])
    manifest = module.parent / "manifest.json"
    assert try_load() == str(module)

    data, text = module.read_bytes(), manifest.read_text()
    module.write_bytes(data[: len(data) // 2])  # corrupt (sha256 differs)
    assert try_load() is None
    module.write_bytes(data)
    manifest.write_text("[1, 2]")  # garbage manifest
    assert try_load() is None
    manifest.write_text(json.dumps(dict(json.loads(text), module="../../elsewhere.so")))
    assert try_load() is None
    manifest.write_text(text)
    set_catalog(src, [SHAPE_A, SHAPE_B])  # another catalog: another build's inputs
    assert try_load() is None
    set_catalog(src, [SHAPE_A])
    assert try_load() == str(module)
    assert try_load(AITER_AUX_CACHE_DIR=str(tmp_path / "nothing")) is None


OP_RUNNING = """
import os, sys, time
import torch
import aiter_aux
from aiter_aux import reference as ref
aiter_aux.mxfp4_quant(torch.zeros(1, 3072, dtype=torch.bfloat16))  # loads the module
print("READY", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
ids, w = torch.tensor([[3, 0, 127, 5]], dtype=torch.int32), torch.rand(1, 4)
got, want = aiter_aux.moe_sort(ids, w, 128, 32), ref.moe_sort(ids, w, 128, 32)
n = int(want.num_valid_ids[0])
print("SAME", all(bool(torch.equal(a[:n], b[:n])) for a, b in zip(got[:3], want[:3])))
"""


def test_op_call_for_a_key_added_since_is_built_on_demand(small, tmp_path):
    """N2 on the op path: the instance of a shape added after the module loaded is built on
    demand by the op call, which then returns the reference's bytes."""
    src, _cache, env, _first = small
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", OP_RUNNING, str(go)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    set_catalog(src, [SHAPE_A, SHAPE_B])
    go.touch()
    out, err = proc.communicate(timeout=900)
    assert "SAME True" in out, out + err[-2000:]


OTHER_ABI = """
import torch
import aiter_aux
x = torch.zeros(2, 3072, dtype=torch.bfloat16)
for i in range(3):
    try:
        aiter_aux.mxfp4_quant(x)
        print("RAN", i)
    except Exception as e:
        print("ERROR", i, type(e).__name__, str(e)[:300])
"""


def test_sources_of_another_abi_never_load_a_module(tmp_path):
    """P1: kernel sources whose ABI version differs from the package's are refused before
    any module is built or loaded from them, on every call (a module's static initialisers
    register its kernels as it loads: a refused module must never have loaded)."""
    src = make_sources(tmp_path / "src")
    header = src / "csrc" / "kernels" / "mxfp4_moe" / "mxfp4_moe_aux_abi.h"
    text = header.read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("#define AITER_AUX_ABI_VERSION"))
    header.write_text(text.replace(old, "#define AITER_AUX_ABI_VERSION 5"))
    cache = tmp_path / "cache"
    p = py(OTHER_ABI, env_for(cache, src))
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 3 and all(ln.startswith(f"ERROR {i} ") for i, ln in enumerate(lines)), p
    assert all("ABI version 5" in ln and "AITER_AUX_SOURCE_DIR" in ln for ln in lines), lines
    assert not list(cache.rglob("*.so")), "a module was built from them"


def test_manifest_that_is_no_regular_json_file_counts_as_no_manifest(small_cache):
    """P7: a directory, a deeply nested document, a FIFO or a link to /dev/zero at the
    manifest's name: the op call and the build go on (they replace it under the lock);
    nothing hangs, grows without bound or raises a traceback."""
    _src, _cache, env, first = small_cache
    manifest = Path(first["dir"]) / "manifest.json"
    for kind in ("directory", "nested", "fifo", "dev_zero"):
        manifest.unlink()
        if kind == "directory":
            manifest.mkdir()
        elif kind == "nested":
            manifest.write_text("[" * 200_000 + "]" * 200_000)
        elif kind == "fifo":
            os.mkfifo(manifest)
        else:
            manifest.symlink_to("/dev/zero")
        got = last_json(py(LOAD, env, KEY_A))  # no current catalog module: the binding's
        assert got["n"] == 1, (kind, got)
        got = last_json(py(BUILD, env))  # republishes the catalog's module and its manifest
        assert got["module"] == first["module"], (kind, got)
        assert manifest.is_file() and not manifest.is_symlink(), kind
        assert json.loads(manifest.read_text())["module"] == Path(first["module"]).name, kind
