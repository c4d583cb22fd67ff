"""Where the sources, the prebuilt modules and the build cache live, what their bytes are,
and what the cache has published.

Sources (``codegen/``, ``templates/``, ``csrc/``) are read from the source checkout, or
from ``aiter_aux/_src`` inside an installed wheel.  Prebuilt modules ship in
``aiter_aux/_prebuilt`` (:data:`PREBUILT_DIR`, :mod:`.prebuilt`).  The cache root is
``$AITER_AUX_CACHE_DIR`` or ``~/.cache/aiter_aux``; each toolchain gets its own build
directory below it (see :func:`aiter_aux.jit.toolchain.Toolchain.build_dir_name`), whose
``manifest.json`` names the published module (:func:`published`, :func:`current_module`;
the contract is in :mod:`.build`, which writes it).  This is all a cache hit needs: the
load path reads the cache through this module and never imports the builder.

Errors: :class:`CacheSafetyError` (a cache path another user could write) and its subclass
:class:`CacheDirError` (a cache path that cannot be a directory, e.g. it is a file); both
carry a one-line message naming the path and the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .. import env

if TYPE_CHECKING:
    from .toolchain import Toolchain

MODULE_NAME = "module_moe_mxfp4_aux"
MANIFEST = "manifest.json"
# Below a toolchain's build directory (which holds the module of the catalog): the module
# without instances (the binding, and on the CPU the kernels; built by a first call that finds
# no module), and one directory per instance library built on demand (:mod:`.ondemand`).
CORE_DIR = "core"
KEYS_DIR = "keys"
SOURCE_DIRS = ("codegen", "templates", "csrc")
_PKG_DIR = Path(__file__).resolve().parents[1]
PREBUILT_DIR = _PKG_DIR / "_prebuilt"
_SKIP_PARTS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".d", ".tmp")


class CacheSafetyError(RuntimeError):
    """The cache directory or module could be written by another user."""


class CacheDirError(CacheSafetyError):
    """``$AITER_AUX_CACHE_DIR`` (or a directory above it) is not a directory."""


def renew_after_fork(namespace: dict, name: str, factory: Callable[[], object]) -> None:
    """``namespace[name] = factory()`` again in every child of fork: a child has one
    thread, so a lock another thread of the parent held (a worker pool forking while a
    first op call loads or builds) would stay held in it forever."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, factory()))


def renew_cached_property_locks_after_fork(cls: type) -> None:
    """The same for the lock ``functools.cached_property`` holds (per property, Python < 3.12)
    while it computes: a child of a fork taken during the computation would wait on it."""
    for attr in vars(cls).values():
        if isinstance(attr, cached_property) and hasattr(attr, "lock"):
            renew_after_fork(vars(attr), "lock", threading.RLock)


class JitDisabledError(RuntimeError):
    """AITER_AUX_DISABLE_JIT=1 and no module in the cache serves the backend: an op call
    builds none (``aiter_aux.JitDisabledError``; the fix is in the message)."""


@cache
def source_root() -> Path:
    """The directory holding codegen/, templates/ and csrc/: ``$AITER_AUX_SOURCE_DIR``, else
    ``aiter_aux/_src`` of an installed wheel, else the source checkout."""
    given = env.get("AITER_AUX_SOURCE_DIR")
    candidates = [Path(given)] if given else [_PKG_DIR / "_src", _PKG_DIR.parent]
    for candidate in candidates:
        if (candidate / "codegen" / "catalog.py").is_file():
            return candidate
    raise FileNotFoundError(
        f"aiter_aux sources (codegen/, templates/, csrc/) not found next to {_PKG_DIR}"
    )


class SourceAbiError(RuntimeError):
    """The kernel sources are of another ABI version than this package."""


def check_source_abi() -> None:
    """Refuse kernel sources (:func:`source_root`) whose ``AITER_AUX_ABI_VERSION`` differs
    from this package's, before anything is built from them or loaded: a module's static
    initialisers register its kernels with torch as it loads, so a module of another ABI
    must never load (:class:`SourceAbiError`)."""
    import re

    from .module import ABI_VERSION

    header = kernels_dir() / "mxfp4_moe_aux_abi.h"
    m = re.search(r"^#define AITER_AUX_ABI_VERSION (\d+)", header.read_text(), re.M)
    if m is None or int(m.group(1)) != ABI_VERSION:
        found = m.group(1) if m else "none"
        raise SourceAbiError(
            f"the kernel sources at {source_root()} have ABI version {found}, this package "
            f"{ABI_VERSION}: point AITER_AUX_SOURCE_DIR at the sources of this package (or "
            "unset it)"
        )


def kernels_dir() -> Path:
    return source_root() / "csrc" / "kernels" / "mxfp4_moe"


def source_files(root: Path, dirs: tuple[str, ...] = SOURCE_DIRS) -> list[Path]:
    """The files the JIT needs under ``root`` (``dirs``, default codegen/, templates/,
    csrc/), sorted, relative to ``root``; Python caches and build outputs are left out."""
    files = []
    for sub in dirs:
        for p in (Path(root) / sub).rglob("*"):
            rel = p.relative_to(root)
            if p.is_file() and not _SKIP_PARTS & set(rel.parts) and p.suffix not in _SKIP_SUFFIXES:
                files.append(rel)
    return sorted(files)


def sources_digest(
    root: Path | None = None, dirs: tuple[str, ...] = SOURCE_DIRS, exclude: tuple[str, ...] = ()
) -> str:
    """sha256 over the relative path and bytes of every :func:`source_files` file of
    ``root`` (default: :func:`source_root`) but those in ``exclude`` (relative paths)."""
    root = Path(root) if root is not None else source_root()
    h = hashlib.sha256()
    for rel in source_files(root, dirs):
        if rel.as_posix() not in exclude:
            h.update(rel.as_posix().encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def sha256_fd(fd: int) -> str:
    """sha256 of the whole file open as ``fd`` (read with pread: the offset is untouched)."""
    h, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (``"a directory"``, ``"a
    FIFO"``, ...; a symlink is followed), else None.  Only stats it: a FIFO is never opened,
    so never waited on."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else None
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return file_kind(mode)


def file_kind(mode: int) -> str:
    """How messages name a file of ``mode`` (``os.stat``'s ``st_mode``) that is not regular."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return kind
    return "an unknown kind of file"


def open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` when it is a regular file; None when it is missing
    or is something else (a directory, a FIFO: opened without blocking, then refused)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def sha256_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def cache_root() -> Path:
    given = env.get("AITER_AUX_CACHE_DIR")
    return Path(given).expanduser() if given else Path.home() / ".cache" / "aiter_aux"


def cache_root_problem(path: Path | None = None) -> str | None:
    """Why ``path`` (default: the cache root) cannot be or become a directory, or None.
    Writes nothing."""
    path = cache_root() if path is None else Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if p.is_dir():
                return None
            where = "it" if p == path else f"{p}"
            return (
                f"the build cache {path} cannot be used: {where} is not a directory. Fix: "
                f"point AITER_AUX_CACHE_DIR at a directory (or move {p} away)"
            )
    return None


def check_safe(path: Path, st: os.stat_result | None = None) -> None:
    """Refuse a path that another user could write (group/world-writable or foreign owner).
    ``st`` is its stat when the caller already holds it open.  Raises
    :class:`CacheSafetyError` naming the path, the reason and the fix."""
    if st is None:
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


def ensure_dir(path: Path) -> None:
    """Create ``path`` (mode 0700, parents too) if needed and check that it is safe.
    Raises :class:`CacheDirError` when it cannot be a directory."""
    problem = cache_root_problem(path)
    if problem is None:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except FileExistsError:
            problem = cache_root_problem(path)
        except OSError as e:
            problem = f"cannot create the cache directory {path}: {e.strerror}"
    if problem:
        raise CacheDirError(problem)
    check_safe(path)


CATALOG_FILE = "codegen/catalog.py"  # relative to the source root
_IMPORTED: dict[str, str] = {}  # codegen/ when this process imported it: _codegen_digests()


def _codegen_digests() -> dict[str, str]:
    """The digests of codegen/ on disk: the generator (every file but the catalog) and the
    catalog file."""
    root = source_root()
    return {
        "generator": sources_digest(root, ("codegen",), exclude=(CATALOG_FILE,)),
        "catalog": sha256_file(root / CATALOG_FILE),
    }


def catalog_keys_on_disk() -> set[str] | None:
    """The instance keys of the catalog file on disk now, or None while it cannot be read
    (being edited)."""
    try:
        shapes = catalog_on_disk(source_root() / CATALOG_FILE).SHAPES
        return {i.key for i in codegen_module("instances").enumerate_instances(shapes)}
    except Exception:
        return None


@cache
def codegen():
    """The ``codegen`` package of the source root, imported under a private name so it
    cannot clash with another top-level ``codegen`` package, with its catalog (imported at
    once: the catalog as imported is the catalog as digested)."""
    name = "aiter_aux_codegen"
    if name in sys.modules:
        return sys.modules[name]
    init = source_root() / "codegen" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _IMPORTED.update(_codegen_digests())
    spec.loader.exec_module(module)
    importlib.import_module(f"{name}.catalog")
    return module


def catalog_on_disk(path: Path | None = None):
    """``codegen/catalog.py`` as it is on disk now (default: the source root's), executed as
    a fresh module that is not registered in ``sys.modules``: its ``SHAPES`` and rules,
    whatever catalog this process imported."""
    path = Path(path) if path is not None else source_root() / CATALOG_FILE
    name = "aiter_aux_catalog_on_disk"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def codegen_module(submodule: str):
    """``codegen.<submodule>`` (e.g. "catalog", "gen_instances") of the source root."""
    codegen()
    return importlib.import_module(f"aiter_aux_codegen.{submodule}")


def codegen_digest() -> str:
    """The digest of the generator (codegen/ but the catalog file) as this process imported
    it.  A build digests the shapes it builds itself, so an edit of the catalog changes a
    build's inputs only through its shapes: the process that edits the catalog and builds
    the edited shapes publishes exactly what a fresh process asks for."""
    codegen()
    return _IMPORTED["generator"]


def codegen_changed() -> bool:
    """True when codegen/ on disk (generator or catalog) differs from what this process
    imported (e.g. a shape was added since): the process's catalog is then older than the
    files."""
    codegen()
    return _IMPORTED != _codegen_digests()


# ------------------------------------------------------------------ what the cache holds
def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def build_dir(tc: Toolchain) -> Path:
    """The build directory of ``tc`` under the cache root."""
    return cache_root() / tc.build_dir_name()


@dataclass(frozen=True)
class BuildInputs:
    """Everything a build's output depends on, its digest and its build directory, computed
    once (see :mod:`.build`).  ``catalog`` is True when ``shapes`` is the catalog this
    process imported.  No shapes: the module holds the binding (and on the CPU the kernels)
    but no instance (instances are then built on demand), in the ``core`` directory below
    the toolchain's."""

    tc: Toolchain
    shapes: tuple[tuple[int, ...], ...]
    catalog: bool
    sources_digest: str  # toolchain, the generator (as imported), templates/, csrc/
    digest: str  # sources_digest and the shapes
    directory: Path  # the build directory (cache root and toolchain, when computed)

    @classmethod
    def of(cls, tc: Toolchain, shapes=None) -> BuildInputs:
        catalog = shapes is None
        if catalog:
            shapes = codegen_module("catalog").SHAPES
        shapes = tuple(tuple(int(v) for v in s) for s in shapes)
        sources = _digest(
            "aiter_aux build inputs 2",
            tc.fingerprint,
            codegen_digest(),  # the generator, as imported (the shapes are digested below)
            sources_digest(dirs=("templates", "csrc")),  # read at build time
        )
        digest = _digest(sources, json.dumps(shapes))
        directory = build_dir(tc) if shapes else build_dir(tc) / CORE_DIR
        return cls(tc, shapes, catalog, sources, digest, directory)


MANIFEST_MAX_BYTES = 1 << 20  # a manifest lists at most a few thousand keys


def read_manifest(directory: Path) -> dict | None:
    """The manifest of ``directory`` as a dict, or None when there is none that reads: not a
    regular file (a directory, a FIFO: opened without blocking), larger than
    :data:`MANIFEST_MAX_BYTES` (a link to /dev/zero), nested too deeply or not JSON."""
    try:
        fd = open_regular(directory / MANIFEST)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        data = os.read(fd, MANIFEST_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MANIFEST_MAX_BYTES:
        return None
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def published(inputs: BuildInputs) -> tuple[Path, str] | None:
    """``(module path, its sha256)`` from the manifest of ``inputs``' build directory when
    it was published for exactly these inputs; None otherwise.  Does not read the module;
    raises only :class:`CacheSafetyError` (an unsafe cache directory)."""
    directory = inputs.directory
    manifest = read_manifest(directory)
    if not manifest or manifest.get("inputs_digest") != inputs.digest:
        return None
    name = manifest.get("module")
    ours = isinstance(name, str) and name.startswith(f"{MODULE_NAME}-") and name.endswith(".so")
    if not ours or "/" in name or not isinstance(manifest.get("module_sha256"), str):
        return None  # only a module file the builder names counts (not "..", "src", ...)
    check_safe(directory.parent)
    check_safe(directory)
    return directory / name, manifest["module_sha256"]


def current_module(inputs: BuildInputs) -> Path | None:
    """The published module of ``inputs`` if it is current and intact (a regular file with
    the manifest's sha256), else None."""
    hit = published(inputs)
    if hit is None:
        return None
    path, sha = hit
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        check_safe(path, os.fstat(fd))
        return path if sha256_fd(fd) == sha else None
    finally:
        os.close(fd)
