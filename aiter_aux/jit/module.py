"""Load ``module_moe_mxfp4_aux`` and call its instances.

The module is loaded lazily, on the first op call, never at import: a prebuilt module
shipped in the wheel (:mod:`.prebuilt`) serves every key its manifest lists; for other keys
the published module of the backend's build directory is used when it is intact and holds
the key; otherwise the catalog shapes outside the prebuilt module (all of them when there
is none) are (re)built first (:func:`aiter_aux.jit.build.build_module`, with progress on
stderr).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from . import abi
from . import prebuilt as prebuilt_mod
from . import toolchain as toolchain_mod
from .build import build_module, published_module


class InstanceMissingError(KeyError):
    """The catalog has no instance for the requested key."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class AuxModule:
    """A loaded module.  Loading it registers its torch binding: the ``aiter_aux`` ops' kernels
    for the module's backend (dispatch key CPU, or CUDA for cuda/rocm), so at most one module
    per backend is loaded in a process.  ``keys()`` / ``has()`` inspect its instances."""

    def __init__(self, path: Path):
        import torch

        from ..ops import _library  # the schemas the binding implements

        _library.define()
        self.path = Path(path)
        torch.ops.load_library(str(self.path))
        self.lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)  # the same handle
        abi.declare(self.lib)
        abi.check(self.lib, self.path)
        self.backend = self.lib.aiter_aux_backend().decode()
        self._keys = frozenset(abi.keys(self.lib))

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def has(self, key: str) -> bool:
        return key in self._keys

    def kernel_calls(self) -> int:
        """Instance calls made through this module so far (tests: "no kernel ran")."""
        return self.lib.aiter_aux_kernel_calls()


_LOCK = threading.Lock()
_LOADED: dict[str, AuxModule] = {}  # backend -> module
_PREBUILT: dict[str, AuxModule | None] = {}  # backend -> shipped prebuilt module (or None)


def _prebuilt(backend: str, key: str | None) -> AuxModule | None:
    """The shipped prebuilt module of ``backend`` if it is usable here and holds ``key``."""
    if backend not in _PREBUILT:
        with _LOCK:
            if backend not in _PREBUILT:
                pb, _reason = prebuilt_mod.find(backend)
                _PREBUILT[backend] = AuxModule(pb.module_path) if pb is not None else None
    mod = _PREBUILT[backend]
    if mod is not None and (key is None or mod.has(key)):
        return mod
    return None


def _jit_build(backend: str, key: str | None):
    """Build the catalog shapes outside the prebuilt module (say so once), with progress."""
    from .progress import Reporter

    prebuilt_mod.announce_jit(backend, key)
    reporter = Reporter()
    result = build_module(prebuilt_mod.jit_shapes(backend), backend=backend, progress=reporter)
    reporter.finish(result)
    return result


def load_module(backend: str, key: str | None = None) -> AuxModule:
    """The module of ``backend`` holding ``key``: the shipped prebuilt module when it holds
    it, else loaded from the cache, built if needed.  Raises ``InstanceMissingError`` when
    even a fresh build of the catalog lacks ``key``, ``JitDisabledError`` when a build is
    needed under ``AITER_AUX_DISABLE_JIT=1``."""
    pre = _prebuilt(backend, key)
    if pre is not None:
        return pre
    mod = _LOADED.get(backend)
    if mod is not None and (key is None or mod.has(key)):
        return mod
    with _LOCK:
        mod = _LOADED.get(backend)
        if mod is not None and (key is None or mod.has(key)):
            return mod
        tc = toolchain_mod.select(backend)
        path = published_module(tc, key)
        if path is None:
            path = _jit_build(backend, key).module_path
        if mod is None or path != mod.path:
            try:
                mod = AuxModule(path)
            except OSError:
                if path.exists():
                    raise
                # a concurrent build published a newer module and removed this one between
                # our check and the load: build (a no-op unless needed) and load its result
                path = _jit_build(backend, key).module_path
                mod = AuxModule(path)
            _LOADED[backend] = mod
        if key is not None and not mod.has(key):
            raise InstanceMissingError(key)
        return mod


def loaded_modules() -> dict[str, AuxModule]:
    return dict(_LOADED)
