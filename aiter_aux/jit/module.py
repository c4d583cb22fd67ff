"""The loaded ``module_moe_mxfp4_aux``: :class:`AuxModule`, the one place that loads a
module file into the process.

Which file is loaded, and when, is decided by :mod:`.spec` (prebuilt, cache or JIT source;
at most one module per backend per process).  :func:`load_module` is re-exported from there.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .. import env as aux_env
from . import abi


class InstanceMissingError(KeyError):
    """The loaded module has no instance for the requested key."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class AuxModule:
    """A loaded module.  Loading it registers its torch binding: the ``aiter_aux`` ops' kernels
    for the module's backend (dispatch key CPU, or CUDA for cuda/rocm), so at most one module
    per backend is loaded in a process.  ``keys()`` / ``has()`` inspect its instances.

    ``path`` is the module file; ``load_from`` (default ``path``) is the name handed to the
    dynamic loader: :mod:`.spec` passes ``/proc/self/fd/N`` of a descriptor whose bytes it
    verified, so the file loaded is the file checked.  Raises ``OSError`` when the loader
    refuses the file, ``RuntimeError`` when its ABI differs."""

    def __init__(self, path: Path, load_from: Path | str | None = None):
        import torch

        from ..ops import _library  # the schemas the binding implements

        _library.define()
        self.path = Path(path)
        # What torch.ops.load_library does (dlopen: the binding's static initialisers register
        # the kernels; then the bookkeeping), minus its realpath(): that would turn
        # /proc/self/fd/N back into a path a concurrent republish may have removed.
        self.lib = ctypes.CDLL(str(load_from or self.path), mode=ctypes.RTLD_LOCAL)
        torch.ops.loaded_libraries.add(str(self.path))
        abi.check(self.lib, self.path)  # first: an older module lacks later functions
        abi.declare(self.lib)
        abi.set_pdl(self.lib, aux_env.get("AITER_AUX_PDL"))
        self.backend = self.lib.aiter_aux_backend().decode()
        self._keys = frozenset(abi.keys(self.lib))

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def has(self, key: str) -> bool:
        return key in self._keys

    def kernel_calls(self) -> int:
        """Instance calls made through this module so far (tests: "no kernel ran")."""
        return self.lib.aiter_aux_kernel_calls()


# The load path lives in .spec; re-exported here for existing imports.
from .spec import load_module, loaded_modules  # noqa: E402, F401
