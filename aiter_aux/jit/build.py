"""Build ``module_moe_mxfp4_aux`` for one backend into the cache: codegen -> ninja -> publish.

Contract of a build directory (``<cache root>/<backend>-<arch>-<toolchain fingerprint>``):

* Only the holder of the build lock (:mod:`.lock`: ``.lock``, a ``filelock`` lock the OS
  releases when its holder dies, even by SIGKILL, plus ``.lock.workers``, held until the
  holder's ninja and compilers have exited too) writes anything in it.  Waiters report the
  lock path at once and give up after ``$AITER_AUX_LOCK_TIMEOUT`` seconds (default 900).
* ``manifest.json`` names the published module file, its sha256, the *inputs digest* it was
  built from (:class:`~.paths.BuildInputs`: toolchain fingerprint, the generator (codegen/
  but the catalog file), templates/, csrc/, the shapes), and the instance keys it holds.  Reading it
  (:func:`~.paths.published`, :func:`~.paths.current_module`) lives in :mod:`.paths`.
  Module and manifest are published atomically (temp file + ``os.replace``), so a reader
  sees either the old or the new pair, never half a file.
* A module is current for a request only when the manifest's inputs digest equals the
  request's; a module file whose sha256 differs from the manifest is never loaded.
* :func:`build_module` is idempotent: when the published module is current and intact it
  returns at once, taking no lock and writing nothing (so a complete build on a read-only
  cache builds as a no-op).  Otherwise it locks, re-checks, runs ninja (only changed
  translation units compile) and publishes.
* A build never publishes a catalog older than the files: a build of the catalog whose
  process imported codegen/ before it changed on disk (an ``add-shape`` since) raises
  :class:`StaleCatalogError` instead.

Environment: ``AITER_AUX_CACHE_DIR``, ``AITER_AUX_REBUILD=1`` (a build recompiles the
module from scratch), ``AITER_AUX_DISABLE_JIT=1`` (a cache miss raises :class:`JitDisabledError`),
``MAX_JOBS`` (ninja -j), ``AITER_AUX_VERBOSE=1`` (show compiler commands).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ninja import BIN_DIR

from .. import env as aux_env
from . import paths
from . import toolchain as toolchain_mod
from .lock import BuildLock, LockTimeoutError  # noqa: F401 (re-exported)
from .ninja_file import render_build_ninja
from .paths import (  # noqa: F401 (re-exported)
    MANIFEST,
    MODULE_NAME,
    BuildInputs,
    CacheDirError,
    CacheSafetyError,
    JitDisabledError,
    build_dir,
    cache_root,
    check_safe,
    codegen_module,
    current_module,
    published,
    read_manifest,
    sha256_fd,
)
from .paths import sha256_file as _sha256

FORMAT = 2


class BuildError(RuntimeError):
    """Compilation or linking failed; the message holds the compiler output."""


class StaleCatalogError(BuildError):
    """codegen/ (the catalog) changed on disk after this process imported it."""


@dataclass
class BuildResult:
    module_path: Path
    build_dir: Path
    backend: str
    num_shapes: int
    num_instances: int
    compiled: int  # instance translation units compiled by this build
    linked: bool
    wall_s: float
    toolchain: str
    keys: list[str] = field(default_factory=list)
    waited_s: float = 0.0  # time spent waiting for the build lock
    units: int = 0  # translation units compiled by this build (instances and the others)


def _atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    codegen_module("writer").atomic_write(path, data, mode)


def _tidy(directory: Path) -> bool:
    """No leftovers of an interrupted builder (temp files, a second module file)."""
    return (
        not any(directory.glob(".*.tmp")) and len(list(directory.glob(f"{MODULE_NAME}-*.so"))) < 2
    )


def _cleanup_temps(directory: Path) -> None:
    """Remove temp files of builders that died (only called under the lock)."""
    for pattern in (".*.tmp", "src/.*.tmp"):
        for tmp in directory.glob(pattern):
            tmp.unlink(missing_ok=True)


# "[done/total] CXX src/..." / "LINK obj/..."; with -v ninja prints the command instead
_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\] ")


def _run_ninja(directory: Path, verbose: bool, progress, pass_fds=(),
               target: str = MODULE_NAME) -> tuple[int, bool, int]:  # fmt: skip
    """Run ninja in ``directory``: ``(instance TUs compiled, linked, TUs compiled)``.
    ``progress(done, total, what)`` counts translation units, as the first-call note and
    the build's summary do: every build.ninja links one library after all its compiles, so
    ninja's total less that link, and the link line comes at ``[total/total]``."""
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
    lines, compiled, linked, units = [], 0, False, 0
    try:
        for line in proc.stdout:
            lines.append(line)
            m = _STATUS_RE.match(line)
            if m:
                what = line[m.end() :]
                is_link = what.startswith("LINK ") or f"-o obj/{MODULE_NAME}.so" in what
                compiled += not is_link and "src/inst_" in what
                units += not is_link
                linked |= is_link
                if progress:
                    total = max(0, int(m.group(2)) - 1)  # the link is no translation unit
                    done = total if is_link else min(int(m.group(1)), total)
                    progress(done, total, line[m.end() :].strip())
            if verbose:
                sys.stderr.write(line)
    except BaseException:  # e.g. KeyboardInterrupt: ninja stops its compilers on SIGTERM
        proc.terminate()
        proc.wait()
        raise
    if proc.wait() != 0:
        failed = [ln for ln in lines if ln.startswith("FAILED:")]
        raise BuildError(
            f"building {target} in {directory} failed"
            + (f" ({failed[0].strip()})" if failed else "")
            + ":\n"
            + "".join(lines[-80:])
        )
    return compiled, linked, units


def build_module(
    shapes: list[tuple[int, int, int, int]] | None = None,
    backend: str | None = None,
    *,
    verbose: bool | None = None,
    force: bool | None = None,
    progress=None,
) -> BuildResult:
    """Generate, compile and publish the module for ``shapes`` (default: the catalog
    ``SHAPES``); a no-op (no lock, no write) when the published module is current.  Only
    changed translation units are compiled.  Raises :class:`BuildError` (with the
    compiler's message and the failing file; :class:`StaleCatalogError`),
    :class:`JitDisabledError`, :class:`CacheSafetyError` / :class:`CacheDirError` or
    ``ValueError`` (bad catalog)."""
    t0 = time.perf_counter()
    paths.check_source_abi()
    inputs = BuildInputs.of(toolchain_mod.select(backend), shapes)
    force = aux_env.get("AITER_AUX_REBUILD") if force is None else force
    jit_disabled = aux_env.get("AITER_AUX_DISABLE_JIT")
    if jit_disabled or not force:
        path = current_module(inputs)
        # leftovers of a killed builder are removed under the lock, where that can write
        writable = os.access(inputs.directory, os.W_OK)
        if path is not None and (jit_disabled or not writable or _tidy(inputs.directory)):
            return _result(inputs, path, 0, False, t0)
        if jit_disabled:
            raise JitDisabledError(
                f"AITER_AUX_DISABLE_JIT=1 and the cache {inputs.directory} has no current, "
                f"intact {MODULE_NAME} for {inputs.tc.describe()} and these "
                f"{len(inputs.shapes)} shape(s); unset AITER_AUX_DISABLE_JIT or run "
                "`aiter-aux build` first"
            )
    with locked(inputs) as lock:
        return build_locked(inputs, lock, verbose=verbose, force=force, progress=progress, t0=t0)


@contextlib.contextmanager
def locked(inputs: BuildInputs):
    """``with locked(inputs) as lock``: create the cache and build directories (checked:
    :class:`CacheDirError`, :class:`CacheSafetyError`) and hold the build lock."""
    directory = inputs.directory
    paths.ensure_dir(cache_root())
    paths.ensure_dir(directory)
    lock = BuildLock(directory, f"another process building {MODULE_NAME}")
    try:
        lock.__enter__()
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise CacheDirError(
            f"the build cache {directory} is not writable ({e.strerror}) and holds no "
            f"current {MODULE_NAME} for {inputs.tc.describe()}; run `aiter-aux build` "
            "where it is writable, or point AITER_AUX_CACHE_DIR at a writable directory"
        ) from None
    try:
        yield lock
    finally:
        lock.__exit__(None, None, None)


def _check_catalog_current(inputs: BuildInputs) -> None:
    if inputs.catalog and paths.codegen_changed():
        raise StaleCatalogError(
            f"codegen/ (the catalog) under {paths.source_root()} changed on disk after this "
            f"process read it (a shape added or removed since?); not publishing a "
            f"{MODULE_NAME} for the older catalog over {inputs.directory}. Run "
            "`aiter-aux build` again (and restart processes that use the ops)"
        )


def build_locked(
    inputs: BuildInputs, lock: BuildLock, *, verbose=None, force=False, progress=None, t0=None,
    refused: Path | None = None,
) -> BuildResult:  # fmt: skip
    """The build itself; the caller holds ``locked(inputs)``.  Re-checks the cache first.
    ``t0``: when the caller started (``perf_counter``), for the result's wall time.
    ``refused``: a published module the dynamic loader refused although its sha256 matches;
    it counts as no module, and the module is relinked and republished."""
    t0 = time.perf_counter() if t0 is None else t0
    verbose = aux_env.get("AITER_AUX_VERBOSE") if verbose is None else verbose
    directory, tc = inputs.directory, inputs.tc
    _check_catalog_current(inputs)
    _cleanup_temps(directory)
    if not force:
        path = current_module(inputs)  # a concurrent builder may have published it
        if path is not None and path != refused:
            _remove_old_modules(directory, path)
            return _result(inputs, path, 0, False, t0, lock.waited_s)
    gen = codegen_module("gen_instances")
    result = gen.generate(directory / "src", tc.backend, list(inputs.shapes))
    ninja_text = render_build_ninja(
        tc, result.instance_files, result.lookup_file, result.binding_file, result.kernel_files
    )
    codegen_module("writer").write_if_different(directory / "build.ninja", ninja_text)
    if force:
        shutil.rmtree(directory / "obj", ignore_errors=True)
    elif refused is not None:
        (directory / "obj" / f"{MODULE_NAME}.so").unlink(missing_ok=True)  # relink it
    compiled, linked, units = _run_ninja(directory, verbose, progress, lock.pass_fds())
    if not linked and _link_output_changed(directory):
        # ninja saw nothing to do, yet its output is not the module it last published:
        # the link output was truncated or corrupted (or a builder died before
        # publishing).  Relink rather than publish a broken module.
        (directory / "obj" / f"{MODULE_NAME}.so").unlink(missing_ok=True)
        more, linked, more_units = _run_ninja(directory, verbose, progress, lock.pass_fds())
        compiled, units = compiled + more, units + more_units
    keys = [p.stem[len("inst_") :] for p in result.instance_files]
    _check_catalog_current(inputs)  # the catalog may have changed during the compile
    path = _publish(inputs, keys)
    return _result(inputs, path, compiled, linked, t0, lock.waited_s, keys, units)


def _result(inputs, path, compiled, linked, t0, waited_s=0.0, keys=None, units=0) -> BuildResult:
    if keys is None:
        keys = (read_manifest(inputs.directory) or {}).get("keys", [])
    return BuildResult(
        path, inputs.directory, inputs.tc.backend, len(inputs.shapes), len(keys), compiled,
        linked, time.perf_counter() - t0, inputs.tc.describe(), list(keys), waited_s, units,
    )  # fmt: skip


def _link_output_changed(directory: Path) -> bool:
    built = directory / "obj" / f"{MODULE_NAME}.so"
    manifest = read_manifest(directory) or {}
    return not built.is_file() or _sha256(built) != manifest.get("module_sha256")


def _publish(inputs: BuildInputs, keys: list[str]) -> Path:
    directory, tc = inputs.directory, inputs.tc
    built = directory / "obj" / f"{MODULE_NAME}.so"
    sha = _sha256(built)
    dest = directory / f"{MODULE_NAME}-{sha[:16]}.so"
    if not dest.is_file() or _sha256(dest) != sha:
        _atomic_write_bytes(dest, built.read_bytes(), 0o755)
    manifest = {
        "format": FORMAT,
        "module": dest.name,
        "module_sha256": sha,
        "inputs_digest": inputs.digest,
        "sources_digest": inputs.sources_digest,
        "toolchain": tc.describe(),
        "backend": tc.backend,
        "arch": list(tc.arch),
        "keys": sorted(keys),
        "shapes": [list(s) for s in inputs.shapes],
    }
    data = json.dumps(manifest, indent=1).encode()
    if read_manifest(directory) != manifest:
        _atomic_write_bytes(directory / MANIFEST, data)
    _remove_old_modules(directory, dest)
    return dest


def _remove_old_modules(directory: Path, keep: Path) -> None:
    for old in directory.glob(f"{MODULE_NAME}-*.so"):
        if old != keep:
            old.unlink(missing_ok=True)  # processes that mapped it keep their mapping
