"""The loaded ``module_moe_mxfp4_aux``: :class:`AuxModule`, the one place that loads a
module file into the process, and the few plain C functions Python calls on it directly
(through ``ctypes``): its ABI version, backend, instance keys and kernel-call counter, and
its one run-time switch, programmatic dependent launch (:meth:`AuxModule.set_pdl`).  The
ops themselves go through the torch binding compiled into the module; no args struct is
mirrored here.

``ABI_VERSION`` must equal ``AITER_AUX_ABI_VERSION`` of ``mxfp4_moe_aux_abi.h`` (a test
checks the header; every loaded module is checked).  Which file is loaded, and when, is
decided by :mod:`.spec` (prebuilt, cache or JIT source; at most one module per backend per
process).  Imports only :mod:`aiter_aux.env` of the project: the load path and the builder
import this.
"""

from __future__ import annotations

import ctypes as C
from pathlib import Path

from .. import env as aux_env

ABI_VERSION = 9


class InstanceMissingError(KeyError):
    """The loaded module has no instance for the requested key."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _declare(lib: C.CDLL) -> None:
    """Set the signatures of the module's introspection functions."""
    lib.aiter_aux_abi_version.restype = C.c_int
    lib.aiter_aux_backend.restype = C.c_char_p
    lib.aiter_aux_num_instances.restype = C.c_int
    lib.aiter_aux_instance_key.restype = C.c_char_p
    lib.aiter_aux_instance_key.argtypes = [C.c_int]
    lib.aiter_aux_kernel_calls.restype = C.c_int64
    lib.aiter_aux_set_pdl.restype = None
    lib.aiter_aux_set_pdl.argtypes = [C.c_int]
    lib.aiter_aux_pdl.restype = C.c_int
    lib.aiter_aux_pdl_flag.restype = C.c_void_p
    lib.aiter_aux_register_instance.restype = C.c_int
    lib.aiter_aux_register_instance.argtypes = [C.c_char_p, C.c_int32, C.POINTER(C.c_int32),
                                                C.c_void_p]  # fmt: skip
    lib.aiter_aux_set_resolver.restype = None
    lib.aiter_aux_set_resolver.argtypes = [C.c_void_p]


class AuxModule:
    """A loaded module.  Loading it registers its torch binding: the kernels of the
    ``aiter_aux`` ops for the module's backend (dispatch key CPU, or CUDA for cuda/rocm), so
    at most one module per backend is loaded in a process.  The ops' schemas may be defined
    before or after (:mod:`aiter_aux.ops` defines them).  ``keys()`` / ``has()`` inspect
    its instances.

    ``path`` is the module file; ``load_from`` (default ``path``) is the name handed to the
    dynamic loader: :mod:`.spec` passes ``/proc/self/fd/N`` of a descriptor whose bytes it
    verified, so the file loaded is the file checked.  Raises ``OSError`` when the loader
    refuses the file, ``RuntimeError`` when its ABI differs (both name ``path``)."""

    def __init__(self, path: Path, load_from: Path | str | None = None):
        import torch  # its libraries first: the binding links against them

        self.path = Path(path)
        # What torch.ops.load_library does (dlopen: the binding's static initialisers register
        # the kernels; then the bookkeeping), minus its realpath(): that would turn
        # /proc/self/fd/N back into a path a concurrent republish may have removed.
        load_from = str(load_from or self.path)
        try:
            self.lib = C.CDLL(load_from, mode=C.RTLD_LOCAL)
        except OSError as e:  # name the module, not the /proc/self/fd/N it was loaded by
            reason = str(e).replace(load_from, str(self.path))
            raise OSError(f"the dynamic loader refused {self.path}: {reason}") from None
        torch.ops.loaded_libraries.add(str(self.path))
        self.lib.aiter_aux_abi_version.restype = C.c_int
        version = self.lib.aiter_aux_abi_version()  # first: an older module lacks later names
        if version != ABI_VERSION:
            raise RuntimeError(
                f"{self.path}: ABI version {version}, expected {ABI_VERSION}; rebuild it"
            )
        _declare(self.lib)
        self.set_pdl(aux_env.get("AITER_AUX_PDL"))
        self.backend = self.lib.aiter_aux_backend().decode()
        n = self.lib.aiter_aux_num_instances()
        self._keys = frozenset(self.lib.aiter_aux_instance_key(i).decode() for i in range(n))
        self._registered: set[str] = set()
        self._resolver = None  # the installed ctypes callback, kept alive
        self.error_setter = C.cast(self.lib.aiter_aux_set_error, C.c_void_p).value
        self.pdl_flag = self.lib.aiter_aux_pdl_flag()
        # aiter_aux_cpu_kernel: the generic kernels a CPU instance library calls (GPU: None)
        cpu = self.backend == "cpu"
        self.cpu_kernel = C.cast(self.lib.aiter_aux_cpu_kernel, C.c_void_p).value if cpu else None

    def keys(self) -> list[str]:
        """The instance keys of the module's own table (its prebuilt set)."""
        return sorted(self._keys)

    def registered(self) -> list[str]:
        """The keys of the instances loaded on demand into this module (:mod:`.ondemand`)."""
        return sorted(self._registered)

    def has(self, key: str) -> bool:
        return key in self._keys or key in self._registered

    def register(self, key: str, op_id: int, values: tuple[int, ...], fn: int) -> None:
        """Add an instance loaded on demand to the binding's lookup."""
        params = (C.c_int32 * len(values))(*values)
        if self.lib.aiter_aux_register_instance(key.encode(), op_id, params, fn) != 0:
            raise RuntimeError(f"{self.path}: no room to register {key} (too many instances)")
        self._registered.add(key)

    def set_resolver(self, resolver) -> None:
        """Install the binding's resolver (a ``ctypes`` callback; None removes it)."""
        self._resolver = resolver
        self.lib.aiter_aux_set_resolver(C.cast(resolver, C.c_void_p) if resolver else None)

    def set_pdl(self, on: bool) -> None:
        """Switch programmatic dependent launch for the module's later kernel launches (the
        ``AITER_AUX_PDL`` variable sets it when the module loads).  It takes effect in CUDA
        builds whose every target is sm_90 or newer; elsewhere kernels launch as before."""
        self.lib.aiter_aux_set_pdl(1 if on else 0)

    def pdl(self) -> bool:
        """The module's PDL switch."""
        return bool(self.lib.aiter_aux_pdl())

    def kernel_calls(self) -> int:
        """Instance calls made through this module so far (tests: "no kernel ran")."""
        return self.lib.aiter_aux_kernel_calls()
