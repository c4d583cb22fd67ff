"""The few plain C functions of ``module_moe_mxfp4_aux`` that Python calls directly (through
``ctypes``) to inspect a module: its ABI version, backend, instance keys and the kernel-call
counter; and its one run-time switch, programmatic dependent launch (:func:`set_pdl`).  The
ops themselves go through the torch binding compiled into the module; no args struct is
mirrored here.

``ABI_VERSION`` must equal ``AITER_AUX_ABI_VERSION`` of ``mxfp4_moe_aux_abi.h`` (a test
checks the header; :func:`check` checks every loaded module).
"""

from __future__ import annotations

import ctypes as C

ABI_VERSION = 6


def declare(lib: C.CDLL) -> None:
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


def check(lib: C.CDLL, path) -> None:
    """Raise RuntimeError when the module was built for another ABI version."""
    version = lib.aiter_aux_abi_version()
    if version != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI version {version}, expected {ABI_VERSION}; rebuild it")


def keys(lib: C.CDLL) -> list[str]:
    """The instance keys the module holds, sorted."""
    return [lib.aiter_aux_instance_key(i).decode() for i in range(lib.aiter_aux_num_instances())]


def set_pdl(lib: C.CDLL, on: bool) -> None:
    """Switch programmatic dependent launch for the module's later kernel launches (the
    ``AITER_AUX_PDL`` variable sets it when the module loads).  It takes effect in CUDA builds
    whose every target is sm_90 or newer; elsewhere the kernels launch as before."""
    lib.aiter_aux_set_pdl(1 if on else 0)


def pdl(lib: C.CDLL) -> bool:
    """The module's PDL switch."""
    return bool(lib.aiter_aux_pdl())
