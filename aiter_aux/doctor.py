"""``aiter-aux doctor``: what the JIT would use, what is cached, and what would be rebuilt.

Prints, without writing anything into the cache: the package and where its sources come
from; python, torch and ninja; the backend and why it was chosen, the compiler and its
version, the target arch and the toolchain fingerprint; the cache root (is it safe?) and
every build directory in it (manifest, keys, shapes, module intact?, built from the
current kernel sources?, does it load in a fresh process?, lock held?); the prebuilt
modules shipped in the install and
whether each is usable here; the catalog's coverage; and what ``aiter-aux build`` would
rebuild: the manifest compared with the catalog and the sources, and ``ninja -n`` run on a
temporary copy of the build directory after codegen into it.

:func:`doctor` returns 0, or 1 when it found a problem (an unsafe cache, a corrupted
module or one that does not load, no usable compiler, a failing dry run, op calls that
would all fail: no module and a read-only cache or the JIT disabled); each problem is
listed at the end.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from . import __version__
from . import env as aux_env

_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\] (CXX|LINK) (.*)$")


@dataclass
class DryRun:
    """What ``ninja -n`` would do in a build directory: TUs to compile, relink or not."""

    compile: list[str] = field(default_factory=list)
    link: bool = False
    total: int = 0  # translation units of the build (instances and the module's other TUs)


def dry_run(tc, shapes) -> DryRun:
    """Codegen ``shapes`` into a temporary copy of ``tc``'s build directory (mtimes kept)
    and run ``ninja -n`` there.  Raises ``RuntimeError`` when ninja fails."""
    from ninja import BIN_DIR

    from .jit.ninja_file import render_build_ninja
    from .jit.paths import MODULE_NAME, build_dir, codegen_module, not_regular

    directory = build_dir(tc)
    with tempfile.TemporaryDirectory(prefix="aiter_aux_doctor_") as tmp:
        work = Path(tmp) / directory.name
        if directory.is_dir():
            by_name = shutil.ignore_patterns(".lock*", "*.tmp", f"{MODULE_NAME}-*.so")

            def skip(where: str, names: list[str]) -> set[str]:
                # a FIFO, device or socket (which _cache names) is nothing ninja reads
                odd = {n for n in names if not_regular(Path(where) / n) not in (None,
                       "a directory", "a dangling symlink")}  # fmt: skip
                return set(by_name(where, names)) | odd

            shutil.copytree(directory, work, symlinks=True, ignore=skip)
        gen = codegen_module("gen_instances").generate(work / "src", tc.backend, shapes)
        text = render_build_ninja(
            tc, gen.instance_files, gen.lookup_file, gen.binding_file, gen.kernel_files
        )
        codegen_module("writer").write_if_different(work / "build.ninja", text)
        p = subprocess.run(
            [str(Path(BIN_DIR) / "ninja"), "-C", str(work), "-n"],
            capture_output=True,
            text=True,
            env=dict(os.environ, NINJA_STATUS="[%f/%t] "),
            timeout=120,
        )
    if p.returncode:
        raise RuntimeError(f"ninja -n failed: {(p.stdout + p.stderr).strip()[-500:]}")
    units = codegen_module("instances").module_units(tc.backend)
    result = DryRun(total=len(gen.instance_files) + len(units))
    for line in p.stdout.splitlines():
        m = _STATUS_RE.match(line)
        if m:
            if m.group(3) == "LINK":
                result.link = True
            else:
                result.compile.append(Path(m.group(4).strip()).name)
    return result


def module_load_problem(module: Path) -> str | None:
    """Why ``module`` does not load in a fresh process (None when it loads): its checksum
    matching the manifest does not mean the dynamic loader takes it."""
    code = "import sys; from aiter_aux.jit.module import AuxModule; AuxModule(sys.argv[1])"
    try:
        p = subprocess.run([sys.executable, "-c", code, str(module)], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the load check could not run: {e}"
    if p.returncode == 0:
        return None
    lines = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"the load check exited with {p.returncode}"


def _writable(path: Path) -> bool:
    """Whether ``path``, or the nearest directory above it that exists, is writable."""
    for p in (path, *path.parents):
        if p.exists():
            return os.access(p, os.W_OK)
    return False


def _short(items, n: int = 6) -> str:
    items = list(items)
    more = f" ... (+{len(items) - n})" if len(items) > n else ""
    return ", ".join(str(i) for i in items[:n]) + more


def _lock_state(directory: Path) -> str:
    """Is a build running in ``directory``?  Opens the lock file read-only (it never creates
    it), so it works on a read-only cache."""
    try:
        import fcntl
    except ImportError:  # Windows
        return "unknown"
    from .jit.paths import not_regular, open_regular

    try:
        fd = open_regular(directory / ".lock")  # never waits on a FIFO
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if fd is None:
        odd = not_regular(directory / ".lock")
        return f"{odd}, not a lock file" if odd else "no lock file"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "LOCKED (a build is running)"
    finally:
        os.close(fd)  # closing releases the lock if we took it
    return "idle"


class _Report:
    def __init__(self, out: TextIO):
        self.out = out
        self.problems: list[str] = []

    def line(self, label: str, text: str = "") -> None:
        self.out.write(f"{label:<14}{text}\n" if text else f"{label}\n")

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.out.write(f"  PROBLEM: {text}\n")


def _environment(r: _Report) -> None:
    from ninja import BIN_DIR

    from .jit.paths import source_root

    pkg = Path(__file__).resolve().parent
    r.line("package", f"aiter_aux {__version__} at {pkg}")
    try:
        root = source_root()
        kind = "shipped in the install" if root == pkg / "_src" else "source checkout"
        if aux_env.is_set("AITER_AUX_SOURCE_DIR"):
            kind = "AITER_AUX_SOURCE_DIR"
        r.line("sources", f"{root} ({kind})")
    except FileNotFoundError as e:
        r.problem(str(e))
    r.line("python", f"{platform.python_version()} on {platform.system()} {platform.machine()}")
    try:
        import torch

        cuda = torch.cuda.is_available()
        dev = f", {torch.cuda.get_device_name(0)}" if cuda else ""
        r.line("torch", f"{torch.__version__} (GPU available: {'yes' if cuda else 'no'}{dev})")
    except ImportError:
        r.line("torch", "not installed (the ops need it; the builder does not)")
    ninja = Path(BIN_DIR) / "ninja"
    try:
        version = subprocess.run([str(ninja), "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()  # fmt: skip
        r.line("ninja", f"{version} ({ninja})")
    except OSError as e:
        r.problem(f"ninja at {ninja} cannot run: {e}")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("AITER_AUX_")}
    r.line("environment", _short((f"{k}={v}" for k, v in env.items()), 12) or "(no AITER_AUX_*)")


def _toolchain(r: _Report, backend: str | None):
    from .jit import toolchain

    try:
        chosen = backend or toolchain.default_backend()
        why = ("--backend" if backend else "AITER_AUX_BACKEND" if aux_env.is_set(
            "AITER_AUX_BACKEND") else "detected (GPU device nodes)" if chosen != "cpu"
            else "default (no GPU device node)")  # fmt: skip
        r.line("backend", f"{chosen} ({why})")
        tc = toolchain.select(chosen)
    except toolchain.ToolchainError as e:
        r.problem(f"no toolchain: {e}")
        return None
    r.line("compiler", f"{tc.compiler} [{tc.compiler_version}]")
    r.line("target arch", ",".join(tc.arch) or "host (cpu)")
    r.line("flags", " ".join(tc.device_flags))
    r.line("toolchain id", f"{tc.fingerprint[:16]} -> build dir {tc.build_dir_name()}")
    return tc


def _cache(r: _Report, tc, current) -> None:
    from .jit.paths import (
        MANIFEST,
        MANIFEST_MAX_BYTES,
        CacheSafetyError,
        cache_root,
        cache_root_problem,
        check_safe,
        not_regular,
        read_manifest,
    )
    from .jit.paths import sha256_file as _sha256

    root = cache_root()
    problem = cache_root_problem(root)
    if problem:
        r.line("cache", str(root))
        r.problem(problem)
        return
    if not root.is_dir():
        r.line("cache", f"{root} (does not exist yet: nothing built)")
        return
    try:
        check_safe(root)
        r.line("cache", f"{root} (private)")
    except CacheSafetyError as e:
        r.line("cache", str(root))
        r.problem(str(e))
    from .jit import written_versions

    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    if not dirs:
        r.line("", "no build directories")
    from .jit.ondemand import cached

    found = cached(root)
    if found:
        bad = [key for _build, key, _path, intact in found if not intact]
        r.line("", f"{len(found)} instance(s) built on demand (aiter-aux list --cached)" + (
            f"; {len(bad)} differ from their manifest ({_short(bad, 3)}): their next call "
            "rebuilds them" if bad else ""))  # fmt: skip
    for d in dirs:
        if d.name.startswith(written_versions.DIR_PREFIX):
            built = (d / f"{written_versions.NAME}.so").is_file()
            r.line("", f"{d.name}: the C++ autograd kernel of one torch build, "
                   f"{'built' if built else 'not built'}")  # fmt: skip
            continue
        is_current = tc is not None and d.name == tc.build_dir_name()
        tag = " [current toolchain]" if is_current else ""
        odd = not_regular(d / MANIFEST)
        if odd:
            r.line("", f"{d.name}{tag}: {MANIFEST} is {odd}, lock {_lock_state(d)}")
            r.problem(f"{d / MANIFEST} is {odd}, not a regular file: no module is published "
                      "there; the next `aiter-aux build` replaces it")  # fmt: skip
            continue
        m = read_manifest(d)
        if m is None and (d / MANIFEST).exists():
            r.line("", f"{d.name}{tag}: {MANIFEST} does not read, lock {_lock_state(d)}")
            r.problem(f"{d / MANIFEST} does not read as a manifest (over "
                      f"{MANIFEST_MAX_BYTES} bytes, or not a JSON object): no module is "
                      "published there; the next `aiter-aux build` replaces it")  # fmt: skip
            continue
        if m is None:
            r.line("", f"{d.name}{tag}: no manifest (never published), lock {_lock_state(d)}")
            continue
        module = d / str(m.get("module", ""))
        intact = module.is_file() and _sha256(module) == m.get("module_sha256")
        state = (
            f"{len(m.get('keys', []))} keys, {len(m.get('shapes', []))} shapes, "
            f"module {'intact' if intact else 'MISSING/CORRUPTED'}"
        )
        load_problem = None
        if is_current and current is not None:
            fresh = m.get("sources_digest") == current.sources_digest
            state += f", sources {'current' if fresh else 'changed since'}"
            if intact and importlib.util.find_spec("torch") is not None:
                load_problem = module_load_problem(module)
                state += ", does NOT load" if load_problem else ", loads"
        r.line("", f"{d.name}{tag}: {state}, lock {_lock_state(d)}")
        if not intact:
            r.problem(f"{module} differs from its manifest; the next build rebuilds it")
        if load_problem:
            r.problem(
                f"{module} matches its manifest but does not load ({load_problem}); the "
                "next op call relinks it, or run `aiter-aux build --rebuild`"
            )


def _prebuilt_and_plan(r: _Report, tc, backend: str | None, run_ninja: bool) -> None:
    from .jit import prebuilt
    from .jit.paths import PREBUILT_DIR, build_dir, codegen_module, read_manifest
    from .jit.spec import ModuleSpec

    shapes = codegen_module("catalog").SHAPES
    inst = codegen_module("instances")
    keys = {i.key for i in inst.enumerate_instances(shapes)}
    r.line("catalog", f"{len(shapes)} shapes, {len(keys)} instances")
    found = prebuilt.candidates()
    if not found:
        r.line("prebuilt", f"none in this install ({PREBUILT_DIR})")
    chosen = tc.backend if tc is not None else backend
    for pb in found:
        why = prebuilt.mismatch(pb, pb.backend if chosen is None else chosen)
        state = "usable" if why is None else why
        cover = f"{len(pb.keys)} keys ({len(keys & pb.keys)} of the catalog's)"
        r.line("prebuilt", f"{pb.name}: {cover}, {len(pb.shapes)} shapes; {state}")
    if tc is None:
        return
    source, detail = ModuleSpec(tc.backend).plan()
    r.line("op calls", {"prebuilt": "load the prebuilt module ", "cache": "load ",
                        "jit": "JIT-build the binding first: "}[source] + detail
           + "; instances it lacks are built on demand")  # fmt: skip
    if source == "jit" and aux_env.get("AITER_AUX_DISABLE_JIT"):
        r.problem(
            "AITER_AUX_DISABLE_JIT=1 and no module is in the cache: every op call raises "
            "JitDisabledError; run `aiter-aux build`, or unset AITER_AUX_DISABLE_JIT"
        )
    elif source == "jit" and not _writable(build_dir(tc)):
        r.problem(
            f"the build cache {build_dir(tc)} is not writable and holds no current module for "
            "this catalog: every op call fails; run `aiter-aux build` where it is writable, "
            "or point AITER_AUX_CACHE_DIR at a writable directory"
        )
    m = read_manifest(build_dir(tc)) or {}
    have = set(m.get("keys", ()))
    plan = [f"{len(keys - have)} instance(s) to add" + (f" ({_short(sorted(keys - have), 3)})"
            if keys - have else ""), f"{len(have - keys)} to drop"]  # fmt: skip
    if m and m.get("shapes") is not None and [tuple(s) for s in m["shapes"]] != list(shapes):
        plan.append("catalog differs from the last build")
    r.line("would build", "aiter-aux build: " + ", ".join(plan))
    if not run_ninja:
        return
    try:
        d = dry_run(tc, list(shapes))
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        r.problem(f"dry run failed: {e}")
        return
    if not d.compile and not d.link:
        r.line("", "ninja -n: nothing to do (its objects are current)")
    else:
        r.line("", f"ninja -n: {len(d.compile)} of {d.total} translation unit(s) to compile"
                   f"{', relink' if d.link else ''}: {_short(d.compile, 5)}")  # fmt: skip


def doctor(backend: str | None = None, *, run_ninja: bool = True, out: TextIO | None = None) -> int:
    """Print the report on ``out`` (default stdout); 0 when healthy, 1 on a problem."""
    r = _Report(out or sys.stdout)
    _environment(r)
    tc = _toolchain(r, backend)
    current = None
    if tc is not None:
        from .jit.paths import BuildInputs

        current = BuildInputs.of(tc)
    _cache(r, tc, current)
    _prebuilt_and_plan(r, tc, backend, run_ninja)
    if r.problems:
        r.line("status", f"{len(r.problems)} problem(s):")
        for p in r.problems:
            r.line("", f"- {p}")
        return 1
    r.line("status", "ok")
    return 0
