"""Prebuilt modules shipped inside a wheel, and the sources every wheel carries.

A wheel built with ``AITER_AUX_PREBUILD=1`` (see setup.py and :mod:`.aot`) holds
``aiter_aux/_prebuilt/<backend>-<arch>/`` with ``module_moe_mxfp4_aux.so`` and a
``manifest.json``; every wheel holds the JIT's sources (codegen/, templates/, csrc/) under
``aiter_aux/_src``.  At run time :func:`find` returns the prebuilt module that can serve a
backend on this machine: same backend, the target arch among the ones it was built for,
same ABI version, operating system and processor, an intact module file (sha256) and the
same digest of the shipped sources (:func:`sources_digest`).  :func:`aiter_aux.jit.module.
load_module` uses it for every key its manifest lists; the JIT builds only the catalog
shapes outside it (:func:`jit_shapes`) and says so once (:func:`announce_jit`).

Manifest fields: ``format``, ``module``, ``module_sha256``, ``backend``, ``arch`` (list;
empty for cpu), ``abi_version``, ``package_version``, ``sources_digest``,
``kernel_sources_digest``, ``toolchain``, ``system``, ``machine``, ``keys``, ``shapes``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .paths import codegen_module, source_root

FORMAT = 1
PREBUILT_DIR = Path(__file__).resolve().parents[1] / "_prebuilt"
MANIFEST = "manifest.json"
SOURCE_DIRS = ("codegen", "templates", "csrc")
_SKIP_PARTS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".d", ".tmp")

log = logging.getLogger("aiter_aux")


def source_files(root: Path) -> list[Path]:
    """The files the JIT needs under ``root`` (codegen/, templates/, csrc/), sorted, as
    paths relative to ``root``; Python caches and build outputs are left out."""
    files = []
    for sub in SOURCE_DIRS:
        for p in (Path(root) / sub).rglob("*"):
            rel = p.relative_to(root)
            if p.is_file() and not _SKIP_PARTS & set(rel.parts) and p.suffix not in _SKIP_SUFFIXES:
                files.append(rel)
    return sorted(files)


def sources_digest(root: Path | None = None) -> str:
    """sha256 over the relative path and bytes of every :func:`source_files` file of
    ``root`` (default: :func:`aiter_aux.jit.paths.source_root`)."""
    root = Path(root) if root is not None else source_root()
    h = hashlib.sha256()
    for rel in source_files(root):
        h.update(rel.as_posix().encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def platform_tag() -> dict[str, str]:
    return {"system": platform.system(), "machine": platform.machine()}


@dataclass(frozen=True)
class Prebuilt:
    """One ``_prebuilt/<backend>-<arch>/`` directory and its manifest."""

    directory: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def backend(self) -> str:
        return self.manifest.get("backend", "")

    @property
    def arch(self) -> tuple[str, ...]:
        return tuple(self.manifest.get("arch") or ())

    @property
    def module_path(self) -> Path:
        return self.directory / self.manifest.get("module", "")

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.manifest.get("keys", ()))

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.manifest.get("shapes", ())]


def candidates(root: Path | None = None) -> list[Prebuilt]:
    """Every prebuilt directory (under ``root``, default :data:`PREBUILT_DIR`) with a
    readable manifest, by name."""
    found = []
    for manifest in sorted(Path(root or PREBUILT_DIR).glob(f"*/{MANIFEST}")):
        try:
            found.append(Prebuilt(manifest.parent, json.loads(manifest.read_text())))
        except (OSError, ValueError):
            continue
    return found


def runtime_arch(backend: str) -> tuple[str, ...] | None:
    """The target arch this process would build for (``()`` for cpu); None if unknown."""
    from . import toolchain

    try:
        if backend == "cuda":
            return toolchain._cuda_arch()
        if backend == "rocm":
            return toolchain._rocm_arch()
    except toolchain.ToolchainError:
        return None
    return ()


def _arch_base(arch: str) -> str:
    """``sm_90a`` / ``sm_100f`` -> ``sm_90`` / ``sm_100``: code for an arch-specific or family
    target runs on the device of the plain compute capability (ROCm names stay as they are)."""
    return re.sub(r"(?<=\d)[af]$", "", arch) if arch.startswith("sm_") else arch


def mismatch(pb: Prebuilt, backend: str, digest: str | None = None) -> str | None:
    """Why ``pb`` cannot serve ``backend`` here, or None when it can."""
    from . import abi
    from .build import _sha256

    m = pb.manifest
    if m.get("format") != FORMAT:
        return f"manifest format {m.get('format')}, expected {FORMAT}"
    if pb.backend != backend:
        return f"built for backend {pb.backend!r}, not {backend!r}"
    if m.get("abi_version") != abi.ABI_VERSION:
        return f"ABI version {m.get('abi_version')}, this package has {abi.ABI_VERSION}"
    built, here = (m.get("system"), m.get("machine")), tuple(platform_tag().values())
    if built != here:
        return f"built for {'/'.join(map(str, built))}, this is {'/'.join(here)}"
    if backend != "cpu":
        arch = runtime_arch(backend)
        if not arch or not {_arch_base(a) for a in arch} <= {_arch_base(a) for a in pb.arch}:
            return f"built for {','.join(pb.arch)}, the target is {','.join(arch or ('unknown',))}"
    digest = digest if digest is not None else sources_digest()
    if m.get("sources_digest") != digest:
        return f"built from other sources than {source_root()} (sources digest differs)"
    if not pb.module_path.is_file() or _sha256(pb.module_path) != m.get("module_sha256"):
        return f"module file {pb.module_path} is missing or corrupted (sha256 differs)"
    return None


@cache
def find(backend: str) -> tuple[Prebuilt | None, str]:
    """``(prebuilt, "")`` for the prebuilt module that serves ``backend`` in this process, or
    ``(None, reason)``; the reason is ``""`` when the install ships no prebuilt module."""
    found = candidates()
    if not found:
        return None, ""
    reasons = []
    for pb in found:
        why = mismatch(pb, backend)
        if why is None:
            return pb, ""
        reasons.append(f"{pb.name}: {why}")
    return None, "; ".join(reasons)


def jit_shapes(backend: str) -> list[tuple[int, int, int, int]] | None:
    """The catalog shapes the JIT must build for ``backend``: those with a key outside the
    usable prebuilt module, or None (the whole catalog) when there is none."""
    pb, _ = find(backend)
    if pb is None:
        return None
    inst = codegen_module("instances")
    shapes = [
        s
        for s in codegen_module("gen_instances").SHAPES
        if not {i.key for i in inst.instances_for_shape(s)} <= pb.keys
    ]
    return shapes or None


_ANNOUNCED: set[str] = set()
_ANNOUNCE_LOCK = threading.Lock()


def announce_jit(backend: str, key: str | None) -> None:
    """Log once per process and backend (a single warning line) that the JIT serves keys the
    shipped prebuilt module lacks; silent for installs that ship none."""
    pb, reason = find(backend)
    with _ANNOUNCE_LOCK:
        if backend in _ANNOUNCED or (pb is None and not reason):
            return
        _ANNOUNCED.add(backend)
    if pb is not None:
        shapes = jit_shapes(backend)
        what = "the whole catalog" if shapes is None else f"{len(shapes)} catalog shape(s)"
        log.warning(
            "aiter_aux: %s is not in the prebuilt %s module (%s, %d keys); JIT-compiling %s "
            "outside it",
            key or "a key",
            backend,
            pb.directory,
            len(pb.keys),
            what,
        )
    else:
        log.warning("aiter_aux: prebuilt module not used (%s); JIT-compiling", reason)
