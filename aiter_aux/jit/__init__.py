"""The JIT builder of module_moe_mxfp4_aux.

Data flows catalog -> instances (``codegen``) -> rendered sources -> ``build.ninja``
(:mod:`.ninja_file`) -> compiled module (:mod:`.build`) -> ctypes handle (:mod:`.module`).
:mod:`.paths` finds the sources and the cache, :mod:`.toolchain` picks compiler, flags and
their identity; :mod:`.abi` mirrors the C structs.
"""

from .build import BuildError, BuildResult, JitDisabledError, build_module
from .module import AuxModule, load_module

__all__ = [
    "AuxModule",
    "BuildError",
    "BuildResult",
    "JitDisabledError",
    "build_module",
    "load_module",
]
