"""The load path of ``module_moe_mxfp4_aux``: one :class:`ModuleSpec` per backend.

A first op call reads top to bottom: :func:`load_module` -> :meth:`ModuleSpec.load` ->
:meth:`~ModuleSpec.try_load` (the sources below, in order) -> lock -> re-check ->
:meth:`~ModuleSpec.build` -> load -> :class:`~.module.AuxModule`.

Contract
--------
``ModuleSpec(backend)`` stands for the module that serves this process's catalog (``SHAPES``
of codegen/catalog.py, as imported) on ``backend``.

* ``try_load()`` returns the module of the first source below that serves the whole
  catalog, loaded, or None.  It never builds, locks or writes, and never raises for a
  stale, missing, corrupt or foreign build (other backend, arch, platform, sources or
  inputs); it raises only ``CacheSafetyError`` (a cache another user could write).
* ``build()`` JIT-builds the whole catalog into the cache and is idempotent: when the
  published module is current it compiles nothing, locks nothing and writes nothing.
* ``load()`` returns the module already loaded for the backend, else ``try_load()``, else
  (JIT enabled) takes the build lock, re-checks the cache, builds, and loads what it built.
  Raises ``JitDisabledError`` (``AITER_AUX_DISABLE_JIT=1`` and no source serves), or the
  build's errors (``BuildError``, ``ToolchainError``, ``CacheSafetyError`` /
  ``CacheDirError``, ``LockTimeoutError``).

At most one module per backend is ever loaded in a process: loading a module registers
its ops, so a second one would register them twice.  A key the loaded module lacks raises
``InstanceMissingError`` (or ``JitDisabledError`` under ``AITER_AUX_DISABLE_JIT=1``)
saying why (:func:`why_missing`): restart the process when the catalog on disk has the key
(added since the process read it), add the shape when it does not.

Sources, in order
-----------------
1. **prebuilt**: the module shipped in the wheel (:mod:`.prebuilt`) when it is usable here
   (backend, arch, ABI, platform, shipped sources) and holds every catalog key; under
   ``AITER_AUX_DISABLE_JIT=1`` also when it holds only part of the catalog.
2. **cache**: the module published in the toolchain's build directory for exactly this
   process's build inputs (:class:`.paths.BuildInputs`: toolchain, the generator,
   templates/, csrc/, the catalog's shapes).
3. **JIT**: the whole catalog built into the cache (:mod:`.build`), then loaded as in 2.

Every module file is opened once, its sha256 is checked against its manifest through that
descriptor, and the loader is given ``/proc/self/fd/N``: a concurrent republish (which
replaces the manifest and removes the old file) cannot remove or swap the file between
the check and the load.  The descriptor stays open while the process runs, so the name
stays unique.  Without ``/proc`` the path is loaded right after the check.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .. import env as aux_env
from . import ondemand, paths
from . import toolchain as toolchain_mod
from .module import AuxModule, InstanceMissingError  # noqa: F401 (re-exported)
from .paths import (
    MODULE_NAME,
    JitDisabledError,
    check_safe,
    codegen_module,
    renew_after_fork,
    sha256_fd,
)

if TYPE_CHECKING:  # imported where used: a cache hit needs neither
    from .build import BuildResult
    from .prebuilt import Prebuilt

log = logging.getLogger("aiter_aux")

_LOCK = threading.RLock()
renew_after_fork(globals(), "_LOCK", threading.RLock)
_LOADED: dict[str, AuxModule] = {}  # backend -> the one module loaded for it
_CHECKED: set[tuple[str, str]] = set()  # (backend, key) known to be in the loaded module
_PINNED: list[int] = []  # descriptors of loaded modules, kept open (see the module doc)
_ANNOUNCED: set[str] = set()


def _jit_disabled() -> bool:
    return bool(aux_env.get("AITER_AUX_DISABLE_JIT"))


def _open_verified(path: Path, sha256: str, safe: bool) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file whose bytes have
    ``sha256``; None if it is missing, no regular file or differs.  ``safe``: refuse
    (``CacheSafetyError``) a file others can write."""
    fd = paths.open_regular(path)
    if fd is None:
        return None
    try:
        if safe:
            check_safe(path, os.fstat(fd))
        if sha256_fd(fd) == sha256:
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


class _Refused(Exception):
    """The loader refused a module whose bytes match its manifest (``path``, ``reason``)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(reason)
        self.path, self.reason = path, reason


def _load(path: Path, sha256: str, *, safe: bool) -> AuxModule | None:
    """Open, verify and load ``path``.  None when it is missing, no regular file or differs
    from ``sha256``; :class:`_Refused` when the loader refuses it (its message names
    ``path``)."""
    fd = _open_verified(path, sha256, safe)
    if fd is None:
        return None
    proc = Path(f"/proc/self/fd/{fd}")
    try:
        module = AuxModule(path, load_from=proc if proc.exists() else path)
    except (OSError, RuntimeError, AttributeError) as e:  # not a loadable module of this ABI
        # The descriptor stays open: glibc knows a loaded object by its name, so a reused
        # /proc/self/fd/N would hand a later load the refused object.
        _PINNED.append(fd)
        reason = str(e) if str(path) in str(e) else f"{path}: {e}"
        raise _Refused(path, reason) from e
    _PINNED.append(fd)
    return module


class ModuleSpec:
    """The module of ``backend`` for this process's catalog (see the module doc)."""

    def __init__(self, backend: str):
        self.backend = backend
        self.shapes = list(codegen_module("catalog").SHAPES)
        self.refused: _Refused | None = None  # the cached module the loader refused last

    @cached_property
    def keys(self) -> frozenset[str]:
        """The instance keys of the catalog."""
        enumerate_instances = codegen_module("instances").enumerate_instances
        return frozenset(i.key for i in enumerate_instances(self.shapes))

    @cached_property
    def inputs(self) -> paths.BuildInputs:
        """The build inputs of the catalog (selects the toolchain: needs a compiler)."""
        return paths.BuildInputs.of(toolchain_mod.select(self.backend))

    # ---------------------------------------------------------------- the sources
    def prebuilt(self) -> tuple[Prebuilt | None, str]:
        """``(prebuilt, "")`` when the shipped prebuilt module serves, else ``(None, why)``;
        ``why`` is ``""`` when the install ships none."""
        if not paths.PREBUILT_DIR.is_dir():
            return None, ""
        from . import prebuilt as prebuilt_mod

        pb, why = prebuilt_mod.find(self.backend)
        if pb is None:
            return None, why
        return pb, ""  # keys it lacks are built on demand

    def _from_prebuilt(self) -> AuxModule | None:
        pb, _ = self.prebuilt()
        if pb is None:
            return None
        try:
            return _load(pb.module_path, pb.manifest.get("module_sha256", ""), safe=False)
        except _Refused:
            return None

    @cached_property
    def core_inputs(self) -> paths.BuildInputs:
        """The build inputs of the module without instances (the binding; CPU: the kernels)."""
        return paths.BuildInputs.of(self.inputs.tc, ())

    def _from_cache(self, strict: bool = False, core: bool = False) -> AuxModule | None:
        """The published module of the catalog (``core``: of no shape), loaded; or None."""
        try:
            inputs = self.core_inputs if core else self.inputs
        except toolchain_mod.ToolchainError:
            if strict:
                raise
            return None
        if not core:
            self.refused = None
        for _attempt in range(3):  # a republish between manifest and open: read it again
            hit = paths.published(inputs)
            if hit is None:
                return None
            try:
                module = _load(*hit, safe=True)
            except _Refused as e:  # counts as no module; the build under the lock relinks it
                self.refused = e
                if strict:
                    raise OSError(e.reason) from None
                return None
            if module is not None:
                return module
        return None

    # ---------------------------------------------------------------- the contract
    def try_load(self) -> AuxModule | None:
        """A module from the prebuilt or the cache source (the catalog's, else the one of no
        shape), loaded; or None."""
        return self._from_prebuilt() or self._from_cache() or self._from_cache(core=True)

    def build(self, progress=None) -> BuildResult:
        """Build the whole catalog into the cache (a no-op when it is current)."""
        from .build import build_module

        return build_module(backend=self.backend, progress=progress)

    def load(self, key: str | None = None) -> AuxModule:
        """The backend's module (loaded once per process), holding ``key`` if given."""
        module = _LOADED.get(self.backend)
        if module is None:
            with _LOCK:
                module = _LOADED.get(self.backend)
                if module is None:
                    paths.check_source_abi()  # before any module (of them) can load
                    module = self.try_load() or self._build_and_load()
                    ondemand.install(module)
                    _LOADED[self.backend] = module
                    if paths.PREBUILT_DIR in Path(module.path).parents:
                        from . import written_versions

                        written_versions.PREBUILT_SERVES.append(True)
                    library = sys.modules.get("aiter_aux.ops._library")
                    if library is not None:  # the ops exist: their version bumps too
                        library.register_written_versions()
        if key is not None and (self.backend, key) not in _CHECKED:
            self._require(module, key)
        return module

    def _build_and_load(self) -> AuxModule:
        """Build the module of no shape (the binding, and on the CPU the kernels: instances
        are built as they are called) into the cache and load it."""
        from . import build as build_mod
        from .progress import Reporter

        if _jit_disabled():
            why = self.plan()[1]
            if self.refused is not None:
                why = f"the cached module does not load ({self.refused.reason})"
            raise JitDisabledError(
                f"no {self.backend} {MODULE_NAME} and AITER_AUX_DISABLE_JIT=1 builds none (fix: "
                f"unset it or run `aiter-aux build` first): {why}"
            )
        # the catalog's module when the loader refused it (relinked: its objects are there),
        # else the module of no shape
        core = self.refused is None
        inputs = self.core_inputs if core else self.inputs
        with build_mod.locked(inputs) as lock:
            module = self._from_cache(core=core)  # a concurrent builder may have built it
            if module is None:
                # the ops' autograd kernel: built alongside, in a thread, when MAX_JOBS
                # allows two compiles at once (its compile is mostly torch's headers, as long
                # as the module's on one core), else after the module
                needed = _written_versions_needed()
                alongside = needed and aux_env.get("MAX_JOBS") != 1
                self._announce(alongside, needed and not alongside)
                if alongside:  # not a daemon: an exit waits for it (no half build left)
                    library = sys.modules["aiter_aux.ops._library"]
                    threading.Thread(target=library.register_written_versions).start()
                reporter = Reporter()
                refused = self.refused.path if self.refused is not None else None
                result = build_mod.build_locked(inputs, lock, progress=reporter, refused=refused)
                reporter.finish(result)
                module = self._from_cache(strict=True, core=core)
        if module is None:
            raise build_mod.BuildError(f"{inputs.directory}: no module after its build")
        return module

    def _require(self, module: AuxModule, key: str) -> None:
        """``key`` in ``module``: from its own table, or loaded (built) on demand."""
        if not module.has(key):
            ondemand.ensure(module, codegen_module("instances").instance_of_key(key))
        _CHECKED.add((self.backend, key))

    def plan(self) -> tuple[str, str]:
        """``(source, detail)`` that :meth:`load` would use now, without loading anything:
        ``"prebuilt"`` / ``"cache"`` (the module path) or ``"jit"`` (why)."""
        pb, why = self.prebuilt()
        if pb is not None:
            return "prebuilt", str(pb.module_path)
        for inputs in (self.inputs, self.core_inputs):
            path = paths.current_module(inputs)
            if path is not None:
                return "cache", str(path)
        why = f"prebuilt module not used ({why}); " if why else ""
        return "jit", f"{why}no current module in {self.inputs.directory}"

    def _announce(self, autograd: bool = False, autograd_after: bool = False) -> None:
        """One warning line per process and backend before an op call compiles: what (with
        ``autograd``, also the autograd kernel alongside; ``autograd_after``: after the
        module), about how long, how to avoid it
        (and why a shipped prebuilt module is not used)."""
        from .progress import first_build_note

        if self.backend in _ANNOUNCED:
            return
        _ANNOUNCED.add(self.backend)
        _pb, why = self.prebuilt()
        why = f"prebuilt {self.backend} module not used ({why}); " if why else ""
        from . import written_versions

        where = written_versions.build_dir() if autograd else None
        after = written_versions.build_dir() if autograd_after else None
        note = first_build_note(
            self.backend, self.core_inputs.directory, aux_env.get("MAX_JOBS"), where, after
        )
        log.warning("aiter_aux: %s%s", why, note)


paths.renew_cached_property_locks_after_fork(ModuleSpec)


def _written_versions_needed() -> bool:
    """Whether the first op call compiles the ops' autograd kernel too: the ops are defined,
    that kernel is not registered yet and must be compiled."""
    library = sys.modules.get("aiter_aux.ops._library")
    if library is None or library.written_versions_registered():
        return False
    from . import written_versions

    return written_versions.needs_build()


def why_missing(module: AuxModule, key: str) -> str:
    """Why ``module`` (loaded in this process) lacks ``key``, and what to do: restart the
    process when the catalog on disk has the key (its shape was added after this process read
    the catalog), build it when the module is the one of no shape, add the shape when the
    catalog lacks it."""
    where = f"{key} is not in this process's {module.backend} module"
    keys = paths.catalog_keys_on_disk()
    if keys is None:  # a catalog file being edited: say only what is sure
        return f"{where} (fix: `aiter-aux build`, then restart the process)"
    if key in keys and not module.keys():  # the module of no shape: no catalog build loaded
        return (
            f"{where}, the module of no shape (fix: unset AITER_AUX_DISABLE_JIT, or run "
            "`aiter-aux build`, then restart the process)"
        )
    if key in keys:  # a process loads one module per backend: loading registers its ops
        return (
            f"{where}, but the catalog on disk has it (fix: restart the process; its shape "
            "was added after the module loaded)"
        )
    return (
        f"{where} nor in any catalog shape (fix: `aiter-aux add-shape E,MODEL_DIM,INTER,TOPK`, "
        "then restart the process)"
    )


def explain_missing(backend: str, key: str) -> str | None:
    """:func:`why_missing` for the module loaded for ``backend``, or None when none is
    loaded or it has ``key``: the text for an op's missing-instance error."""
    module = _LOADED.get(backend)
    if module is None or module.has(key):
        return None
    return why_missing(module, key)


def load_module(backend: str, key: str | None = None) -> AuxModule:
    """The module of ``backend`` (see :meth:`ModuleSpec.load`)."""
    module = _LOADED.get(backend)
    if module is not None and (key is None or (backend, key) in _CHECKED):
        return module
    return ModuleSpec(backend).load(key)


def loaded_modules() -> dict[str, AuxModule]:
    return dict(_LOADED)
