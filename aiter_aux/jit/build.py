"""Build ``module_moe_mxfp4_aux`` for one backend: codegen -> ninja -> publish.

Contract of a build directory (``<cache root>/<backend>-<arch>-<toolchain fingerprint>``):

* Only the holder of the build lock (:mod:`.lock`: ``.lock``, a ``filelock`` lock the OS
  releases when its holder dies, even by SIGKILL, plus ``.lock.workers``, held until the
  holder's ninja and compilers have exited too) writes anything in it.  Waiters report the
  lock path at once and give up after ``$AITER_AUX_LOCK_TIMEOUT`` seconds (default 900).
* ``manifest.json`` names the published module file, its sha256, the sources digest and
  the instance keys it holds.  Both are published atomically (temp file + ``os.replace``),
  so a reader sees either the old or the new pair, never half a file.
* A module file whose sha256 differs from the manifest (truncated, corrupted) is never
  loaded: the next build rebuilds and republishes it.

Environment: ``AITER_AUX_CACHE_DIR``, ``AITER_AUX_REBUILD=1`` (rebuild everything),
``AITER_AUX_DISABLE_JIT=1`` (a cache miss raises :class:`JitDisabledError`),
``MAX_JOBS`` (ninja -j), ``AITER_AUX_VERBOSE=1`` (show compiler commands).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ninja import BIN_DIR

from .. import env as aux_env
from . import toolchain as toolchain_mod
from .lock import BuildLock, LockTimeoutError  # noqa: F401 (re-exported)
from .ninja_file import render_build_ninja
from .paths import MODULE_NAME, cache_root, codegen_module

MANIFEST = "manifest.json"


class BuildError(RuntimeError):
    """Compilation or linking failed; the message holds the compiler output."""


class JitDisabledError(RuntimeError):
    """AITER_AUX_DISABLE_JIT=1 and the needed module is not in the cache."""


class CacheSafetyError(RuntimeError):
    """The cache directory or module could be written by another user."""


@dataclass
class BuildResult:
    module_path: Path
    build_dir: Path
    backend: str
    num_shapes: int
    num_instances: int
    compiled: int  # translation units compiled by this build
    linked: bool
    wall_s: float
    toolchain: str
    keys: list[str] = field(default_factory=list)
    waited_s: float = 0.0  # time spent waiting for the build lock


def check_safe(path: Path) -> None:
    """Refuse a path that another user could write (group/world-writable or foreign owner).
    Raises :class:`CacheSafetyError` naming the path, the reason and the fix."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    reason = None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        reason = f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        reason = f"it is group- or world-writable (mode {stat.filemode(st.st_mode)})"
    if reason:
        raise CacheSafetyError(
            f"refusing to use {path}: {reason}; another user could plant code that this "
            f"process would load. Fix: `chmod go-w {path}` (if it is yours), or point "
            f"AITER_AUX_CACHE_DIR at a private directory."
        )


def build_dir(tc: toolchain_mod.Toolchain) -> Path:
    return cache_root() / tc.build_dir_name()


def _ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_safe(path)


def _atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    codegen_module("writer").atomic_write(path, data, mode)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def published_module(tc: toolchain_mod.Toolchain, key: str | None = None) -> Path | None:
    """The published module of ``tc``'s build directory if it is intact (sha256 matches the
    manifest), built from the current kernel sources, and holds ``key`` (if given)."""
    directory = build_dir(tc)
    manifest = read_manifest(directory)
    if not manifest:
        return None
    path = directory / manifest.get("module", "")
    if not path.is_file() or (key is not None and key not in set(manifest.get("keys", ()))):
        return None
    if manifest.get("sources_digest") != toolchain_mod.sources_digest(tc.backend):
        return None
    check_safe(directory.parent)
    check_safe(directory)
    check_safe(path)
    if _sha256(path) != manifest.get("module_sha256"):
        return None
    return path


def _cleanup_temps(directory: Path) -> None:
    """Remove temp files of builders that died (only called under the lock)."""
    for pattern in (".*.tmp", "src/.*.tmp"):
        for tmp in directory.glob(pattern):
            tmp.unlink(missing_ok=True)


# "[done/total] CXX src/..." / "LINK obj/..."; with -v ninja prints the command instead
_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\] ")


def _run_ninja(directory: Path, verbose: bool, progress, pass_fds=()) -> tuple[int, bool]:
    cmd = [str(Path(BIN_DIR) / "ninja"), "-C", str(directory)]
    if aux_env.get("MAX_JOBS"):
        cmd += ["-j", str(aux_env.get("MAX_JOBS"))]
    if verbose:
        cmd.append("-v")
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        pass_fds=pass_fds,
    )  # fmt: skip
    lines, compiled, linked = [], 0, False
    try:
        for line in proc.stdout:
            lines.append(line)
            m = _STATUS_RE.match(line)
            if m:
                what = line[m.end() :]
                is_link = what.startswith("LINK ") or f"-o obj/{MODULE_NAME}.so" in what
                compiled += not is_link and "src/inst_" in what
                linked |= is_link
                if progress:
                    progress(int(m.group(1)), int(m.group(2)), line[m.end() :].strip())
            if verbose:
                sys.stderr.write(line)
    except BaseException:  # e.g. KeyboardInterrupt: ninja stops its compilers on SIGTERM
        proc.terminate()
        proc.wait()
        raise
    if proc.wait() != 0:
        failed = [ln for ln in lines if ln.startswith("FAILED:")]
        raise BuildError(
            f"building {MODULE_NAME} in {directory} failed"
            + (f" ({failed[0].strip()})" if failed else "")
            + ":\n"
            + "".join(lines[-80:])
        )
    return compiled, linked


def build_module(
    shapes: list[tuple[int, int, int, int]] | None = None,
    backend: str | None = None,
    *,
    verbose: bool | None = None,
    force: bool | None = None,
    progress=None,
) -> BuildResult:
    """Generate, compile and publish the module for ``shapes`` (default: the catalog
    ``SHAPES``).  Only changed translation units are compiled.  Raises
    :class:`BuildError` (with the compiler's message and the failing file),
    :class:`JitDisabledError`, :class:`CacheSafetyError` or ``ValueError`` (bad catalog)."""
    t0 = time.perf_counter()
    tc = toolchain_mod.select(backend)
    verbose = aux_env.get("AITER_AUX_VERBOSE") if verbose is None else verbose
    force = aux_env.get("AITER_AUX_REBUILD") if force is None else force
    gen = codegen_module("gen_instances")
    shapes = list(gen.SHAPES if shapes is None else shapes)
    directory = build_dir(tc)
    if aux_env.get("AITER_AUX_DISABLE_JIT"):
        return _cached_or_raise(tc, gen, shapes, t0)
    _ensure_dir(cache_root())
    _ensure_dir(directory)
    lock = BuildLock(directory, f"another process building {MODULE_NAME}")
    with lock:
        _cleanup_temps(directory)
        result = gen.generate(directory / "src", tc.backend, shapes)
        digest = toolchain_mod.sources_digest(tc.backend)
        ninja_text = render_build_ninja(
            tc, result.instance_files, result.lookup_file, digest, result.binding_file
        )
        codegen_module("writer").write_if_different(directory / "build.ninja", ninja_text)
        if force:
            shutil.rmtree(directory / "obj", ignore_errors=True)
        compiled, linked = _run_ninja(directory, verbose, progress, lock.pass_fds())
        if not linked and _link_output_changed(directory):
            # ninja saw nothing to do, yet its output is not the module it last published:
            # the link output was truncated or corrupted (or a builder died before
            # publishing).  Relink rather than publish a broken module.
            (directory / "obj" / f"{MODULE_NAME}.so").unlink(missing_ok=True)
            more, linked = _run_ninja(directory, verbose, progress, lock.pass_fds())
            compiled += more
        keys = [p.stem[len("inst_") :] for p in result.instance_files]
        module_path = _publish(directory, tc, digest, keys, shapes)
    return BuildResult(
        module_path, directory, tc.backend, len(shapes), len(keys), compiled, linked,
        time.perf_counter() - t0, tc.describe(), keys, lock.waited_s,
    )  # fmt: skip


def _cached_or_raise(tc, gen, shapes, t0: float) -> BuildResult:
    """AITER_AUX_DISABLE_JIT=1: the published module if it holds every key of ``shapes``."""
    keys = [i.key for i in codegen_module("instances").enumerate_instances(shapes)]
    path = published_module(tc)
    manifest = read_manifest(build_dir(tc)) or {}
    missing = sorted(set(keys) - set(manifest.get("keys", ()))) if path else keys
    if missing:
        raise JitDisabledError(
            f"AITER_AUX_DISABLE_JIT=1 and the cache {build_dir(tc)} has no intact "
            f"{MODULE_NAME} for {tc.describe()} holding {len(missing)} needed instance(s) "
            f"(e.g. {missing[0]}); unset AITER_AUX_DISABLE_JIT or run `aiter-aux build` first"
        )
    return BuildResult(
        path, build_dir(tc), tc.backend, len(shapes), len(keys), 0, False,
        time.perf_counter() - t0, tc.describe(), keys,
    )  # fmt: skip


def _link_output_changed(directory: Path) -> bool:
    built = directory / "obj" / f"{MODULE_NAME}.so"
    manifest = read_manifest(directory) or {}
    return not built.is_file() or _sha256(built) != manifest.get("module_sha256")


def _publish(directory: Path, tc, digest: str, keys: list[str], shapes) -> Path:
    built = directory / "obj" / f"{MODULE_NAME}.so"
    sha = _sha256(built)
    dest = directory / f"{MODULE_NAME}-{sha[:16]}.so"
    if not dest.is_file() or _sha256(dest) != sha:
        _atomic_write_bytes(dest, built.read_bytes(), 0o755)
    manifest = {
        "module": dest.name,
        "module_sha256": sha,
        "sources_digest": digest,
        "toolchain": tc.describe(),
        "backend": tc.backend,
        "arch": list(tc.arch),
        "keys": sorted(keys),
        "shapes": [list(s) for s in shapes],
    }
    data = json.dumps(manifest, indent=1).encode()
    if read_manifest(directory) != manifest:
        _atomic_write_bytes(directory / MANIFEST, data)
    for old in directory.glob(f"{MODULE_NAME}-*.so"):
        if old != dest:
            old.unlink(missing_ok=True)  # processes that mapped it keep their mapping
    return dest
