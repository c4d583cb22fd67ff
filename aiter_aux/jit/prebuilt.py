"""Prebuilt modules shipped inside a wheel, and the sources every wheel carries.

A wheel built with ``AITER_AUX_PREBUILD=1`` (see setup.py and :mod:`.aot`) holds
``aiter_aux/_prebuilt/<backend>-<arch>/`` with ``module_moe_mxfp4_aux.so`` and a
``manifest.json``; every wheel holds the JIT's sources (codegen/, templates/, csrc/) under
``aiter_aux/_src``.  At run time :func:`find` returns the prebuilt module that can serve a
backend on this machine: same backend, the target arch among the ones it was built for,
same ABI version, operating system and processor, an intact module file (sha256) and the
same digest of the shipped sources (:func:`aiter_aux.jit.paths.sources_digest`).  The
load path (:mod:`.spec`) uses it only when it holds every key of the catalog (or under
``AITER_AUX_DISABLE_JIT=1``); otherwise the JIT builds the whole catalog into the cache.

Manifest fields: ``format``, ``module``, ``module_sha256``, ``backend``, ``arch`` (list;
empty for cpu), ``abi_version``, ``package_version``, ``sources_digest``,
``kernel_sources_digest``, ``toolchain``, ``system``, ``machine``, ``keys``, ``shapes``.
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import paths
from .paths import MANIFEST, source_files, source_root, sources_digest  # noqa: F401

FORMAT = 1


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
    """Every prebuilt directory (under ``root``, default :data:`.paths.PREBUILT_DIR`) with a
    readable manifest, by name."""
    found = []
    for manifest in sorted(Path(root or paths.PREBUILT_DIR).glob(f"*/{MANIFEST}")):
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
    from .module import ABI_VERSION

    m = pb.manifest
    if m.get("format") != FORMAT:
        return f"manifest format {m.get('format')}, expected {FORMAT}"
    if pb.backend != backend:
        return f"built for backend {pb.backend!r}, not {backend!r}"
    if m.get("abi_version") != ABI_VERSION:
        return f"ABI version {m.get('abi_version')}, this package has {ABI_VERSION}"
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
    if not pb.module_path.is_file() or paths.sha256_file(pb.module_path) != m.get("module_sha256"):
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
