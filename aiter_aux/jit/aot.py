"""Ahead-of-time build for wheels: used by setup.py's ``build_py``, not at run time.

:func:`ship_sources` copies the JIT's sources (codegen/, templates/, csrc/; see
:func:`aiter_aux.jit.prebuilt.source_files`) into ``<build_lib>/aiter_aux/_src`` so a
non-editable install can still JIT-compile.  With ``AITER_AUX_PREBUILD=1``,
:func:`prebuild` then compiles the module from those shipped bytes and stores it with its
manifest in ``<build_lib>/aiter_aux/_prebuilt/<backend>-<arch>/`` (see :mod:`.prebuilt`).

Environment:

* ``AITER_AUX_PREBUILD=1`` -- prebuild (otherwise the wheel carries sources only);
* ``AITER_AUX_PREBUILD_SHAPES`` -- a small catalog, ``"E,D,I,K;E,D,I,K"`` (each shape must
  be in the catalog, ``SHAPES`` of codegen/catalog.py); default: the whole catalog;
* ``AITER_AUX_BACKEND`` (default ``cpu``, never guessed from the build machine's GPU) and
  ``AITER_AUX_ARCH`` (e.g. ``sm_90``, ``gfx950``; required for GPU backends without a GPU);
* ``MAX_JOBS``, ``AITER_AUX_VERBOSE`` as for any build.

Errors: ``ValueError`` (bad ``AITER_AUX_PREBUILD_SHAPES``), and those of
:func:`aiter_aux.jit.build.build_module` (``BuildError``, ``ToolchainError``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

from .. import env as aux_env
from . import prebuilt as pb_mod

ENV_FLAG = "AITER_AUX_PREBUILD"
ENV_SHAPES = "AITER_AUX_PREBUILD_SHAPES"


def prebuild_requested() -> bool:
    return aux_env.get(ENV_FLAG)


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """``"256,3072,256,8;128,3072,512,4"`` -> ``[(256, 3072, 256, 8), (128, 3072, 512, 4)]``
    (:func:`aiter_aux.shapes.parse_shapes`, the one shape parser; ValueError naming
    the variable)."""
    from ..shapes import parse_shapes as parse

    return parse(text, what=ENV_SHAPES)


def ship_sources(src_root: Path, dest: Path) -> int:
    """Replace ``dest`` with a copy of the JIT sources of ``src_root``; returns the count."""
    shutil.rmtree(dest, ignore_errors=True)
    files = pb_mod.source_files(src_root)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_root / rel, dest / rel)
    return len(files)


@contextlib.contextmanager
def _env(**values: str | None):
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prebuild(src: Path, dest_root: Path, work_dir: Path, log=print) -> Path:
    """Compile the module from the shipped sources ``src`` (an ``_src`` copy) in the build
    cache ``work_dir`` and store it in ``dest_root/<backend>-<arch>/`` (``dest_root`` is
    replaced).  Returns the directory written."""
    from . import paths, toolchain
    from .build import _sha256, build_module
    from .module import ABI_VERSION
    from .progress import Reporter

    backend = aux_env.get("AITER_AUX_BACKEND") or "cpu"
    shapes = parse_shapes(aux_env.get(ENV_SHAPES)) if aux_env.get(ENV_SHAPES) else None
    env = dict(
        AITER_AUX_SOURCE_DIR=str(src),
        AITER_AUX_CACHE_DIR=str(work_dir),
        AITER_AUX_BACKEND=backend,
        AITER_AUX_DISABLE_JIT=None,
        AITER_AUX_REBUILD=None,
    )
    with _env(**env):
        paths.source_root.cache_clear()
        catalog = list(paths.codegen_module("catalog").SHAPES)
        unknown = [s for s in shapes or () if s not in catalog]
        if unknown:
            raise ValueError(
                f"{ENV_SHAPES}: {unknown} not in the catalog (SHAPES in codegen/catalog.py)"
            )
        try:
            tc = toolchain.select(backend)
        except toolchain.ToolchainError as e:
            import importlib.util

            if importlib.util.find_spec("torch") is not None:
                raise
            raise toolchain.ToolchainError(  # pip's isolated build environment has no torch
                f"{e}; {ENV_FLAG}=1 compiles against the torch of the build environment: "
                "run `pip wheel . --no-build-isolation` where torch is installed"
            ) from None
        log(f"aiter_aux prebuild: {tc.describe()}, "
            f"{'the whole catalog' if shapes is None else f'{len(shapes)} shape(s)'}")  # fmt: skip
        reporter = Reporter(sys.stdout, tty=False)
        result = build_module(shapes, backend=backend, progress=reporter)
        reporter.finish(result)
        name = f"{backend}-{'-'.join(tc.arch) or 'host'}"
        shutil.rmtree(dest_root, ignore_errors=True)
        out = dest_root / name
        out.mkdir(parents=True)
        module = out / f"{paths.MODULE_NAME}.so"
        shutil.copyfile(result.module_path, module)
        os.chmod(module, 0o755)
        manifest = {
            "format": pb_mod.FORMAT,
            "module": module.name,
            "module_sha256": _sha256(module),
            "backend": backend,
            "arch": list(tc.arch),
            "abi_version": ABI_VERSION,
            "package_version": toolchain.PACKAGE_VERSION,
            "sources_digest": pb_mod.sources_digest(src),
            "kernel_sources_digest": toolchain.sources_digest(backend),
            "toolchain": tc.describe(),
            **pb_mod.platform_tag(),
            "keys": sorted(result.keys),
            "shapes": [list(s) for s in (catalog if shapes is None else shapes)],
        }
        (out / pb_mod.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    paths.source_root.cache_clear()
    log(f"aiter_aux prebuild: {len(result.keys)} instances -> {out}")
    return out


def build_into(package_dir: Path, build_temp: Path, src_root: Path, log=print) -> None:
    """``build_py`` hook: ship the sources into ``package_dir/_src`` and, when requested,
    prebuild into ``package_dir/_prebuilt`` (removed otherwise, so no stale module ships)."""
    n = ship_sources(src_root, package_dir / "_src")
    log(f"aiter_aux: shipped {n} source files in {package_dir / '_src'}")
    prebuilt_dir = package_dir / "_prebuilt"
    if prebuild_requested():
        prebuild(package_dir / "_src", prebuilt_dir, build_temp / "aiter_aux_prebuild", log)
    else:
        shutil.rmtree(prebuilt_dir, ignore_errors=True)
