"""Where the sources and the build cache live.

Sources (``codegen/``, ``templates/``, ``csrc/``) are read from the source checkout, or
from ``aiter_aux/_src`` inside an installed wheel.  The cache root is
``$AITER_AUX_CACHE_DIR`` or ``~/.cache/aiter_aux``; each toolchain gets its own build
directory below it (see :func:`aiter_aux.jit.toolchain.Toolchain.build_dir_name`).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path

from .. import env

MODULE_NAME = "module_moe_mxfp4_aux"
_PKG_DIR = Path(__file__).resolve().parents[1]


@cache
def source_root() -> Path:
    """The directory holding codegen/, templates/ and csrc/: ``$AITER_AUX_SOURCE_DIR``, else
    ``aiter_aux/_src`` of an installed wheel, else the source checkout."""
    given = env.get("AITER_AUX_SOURCE_DIR")
    candidates = [Path(given)] if given else [_PKG_DIR / "_src", _PKG_DIR.parent]
    for candidate in candidates:
        if (candidate / "codegen" / "gen_instances.py").is_file():
            return candidate
    raise FileNotFoundError(
        f"aiter_aux sources (codegen/, templates/, csrc/) not found next to {_PKG_DIR}"
    )


def kernels_dir() -> Path:
    return source_root() / "csrc" / "kernels" / "mxfp4_moe"


def cache_root() -> Path:
    given = env.get("AITER_AUX_CACHE_DIR")
    return Path(given).expanduser() if given else Path.home() / ".cache" / "aiter_aux"


@cache
def codegen():
    """The ``codegen`` package of the source root, imported under a private name so it
    cannot clash with another top-level ``codegen`` package."""
    name = "aiter_aux_codegen"
    if name in sys.modules:
        return sys.modules[name]
    init = source_root() / "codegen" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def codegen_module(submodule: str):
    """``codegen.<submodule>`` (e.g. "instances", "gen_instances") of the source root."""
    codegen()
    return importlib.import_module(f"aiter_aux_codegen.{submodule}")
