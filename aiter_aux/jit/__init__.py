"""The JIT builder and loader of module_moe_mxfp4_aux.

Data flows catalog -> instances (``codegen``) -> rendered sources -> ``build.ninja``
(:mod:`.ninja_file`) -> compiled module (:mod:`.build`) -> loaded module (:mod:`.module`).
:mod:`.spec` is the load path (prebuilt, cache or JIT; one module per backend and process),
:mod:`.paths` finds the sources and the cache, :mod:`.toolchain` picks compiler, flags and
their identity; :mod:`.abi` declares the module's few plain C functions that Python calls
through ``ctypes`` (ABI version, backend, instance keys, kernel-call counter) and checks the
ABI version; the ops themselves go through the torch binding.
"""

from .build import BuildError, BuildResult, JitDisabledError, build_module
from .module import AuxModule, InstanceMissingError  # before .spec, which imports it
from .spec import ModuleSpec, load_module

__all__ = [
    "AuxModule",
    "BuildError",
    "BuildResult",
    "InstanceMissingError",
    "JitDisabledError",
    "ModuleSpec",
    "build_module",
    "load_module",
]
