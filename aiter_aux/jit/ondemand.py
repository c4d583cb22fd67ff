"""Instances built on demand: an op call whose instance the loaded module lacks builds just
that instance into a small library of its own, loads it and registers it with the module.

The module's binding looks an instance up in the module's own table (the prebuilt set: the
catalog, or nothing for the module a first call builds), then among the instances
registered at run time; on a miss it calls the *resolver* installed here
(:func:`install`), a ``ctypes`` callback that runs :func:`ensure`:

1. the instance library of the key in the cache, current and intact: loaded;
2. else, unless ``AITER_AUX_DISABLE_JIT=1``: one line on stderr, then the instance TU is
   rendered, compiled and linked with ``instance_lib.cpp`` in the key's own build
   directory (``<toolchain dir>/keys/<key>/``, under that directory's build lock, so
   threads and processes asking for one key build it once) and published atomically;
3. the library is opened, its bytes checked against its manifest through the descriptor,
   loaded through ``/proc/self/fd/N``, linked to the module (error setter, PDL flag, and
   on the CPU the module's generic kernels, which a CPU instance calls) and its instance
   registered.  Then the binding looks again and runs the call.

What fails is raised by the binding as ``"<ErrorType>: <message>"`` and re-raised by the
op wrappers as the original exception (:func:`take_error`): ``BuildError`` with the
compiler's message, ``JitDisabledError``, ``ToolchainError``; a CUDA call inside CUDA-graph
capture raises at once (building and loading would break the capture).

Manifest of a key directory: ``format``, ``key``, ``inputs_digest`` (toolchain, generator,
the TU's text and the kernel files it includes), ``module`` (``inst_<key>-<sha16>.so``),
``module_sha256``.
"""

from __future__ import annotations

import ctypes as C
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import env as aux_env
from . import paths
from .paths import KEYS_DIR, MANIFEST, JitDisabledError, codegen_module, renew_after_fork

log = logging.getLogger("aiter_aux")
FORMAT = 1
_RESOLVER_T = C.CFUNCTYPE(
    C.c_int, C.c_int32, C.POINTER(C.c_int32), C.c_int32, C.POINTER(C.c_char), C.c_int32
)
_STATE = threading.local()  # .error: the exception of this thread's last failed resolve
_KEY_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
renew_after_fork(globals(), "_KEY_LOCKS", dict)
renew_after_fork(globals(), "_KEY_LOCKS_GUARD", threading.Lock)
_PINNED: list[int] = []  # descriptors of loaded instance libraries (names stay unique)
_LIBS: list[C.CDLL] = []


@dataclass(frozen=True)
class KeyBuild:
    """The instance library of ``key`` for toolchain ``tc``: its sources, inputs digest and
    build directory."""

    tc: object  # Toolchain
    inst: object  # codegen Instance
    digest: str  # inputs digest
    directory: Path

    @classmethod
    def of(cls, tc, inst) -> KeyBuild:
        """Its inputs digest from the files, without rendering (a cache hit imports no
        generator): the toolchain, the generator and the template, the key, and the kernel
        files the TU and ``instance_lib.cpp`` include."""
        from . import includes

        kernels = paths.kernels_dir()
        headers = codegen_module("instances").instance_headers(tc.backend, inst.op)
        text = "".join(f'#include "{h}"\n' for h in headers)  # what the TU includes
        link = kernels / "instance_lib.cpp"
        digest = paths._digest(
            "aiter_aux instance library 1",
            tc.fingerprint,
            paths.codegen_digest(),
            paths.sources_digest(dirs=("templates",)),
            inst.key,
            includes.digest(kernels / "instance.tu", text.encode()),
            includes.digest(link, link.read_bytes()) + link.read_text(),
        )
        directory = paths.build_dir(tc) / KEYS_DIR / inst.key
        return cls(tc, inst, digest, directory)

    def render(self) -> tuple[str, str]:
        """``(file name, text)`` of the instance TU."""
        renderer = codegen_module("render").Renderer(self.tc.backend)
        return renderer.instance_filename(self.inst), renderer.render_instance(self.inst)

    def published(self) -> tuple[Path, str] | None:
        """``(library path, sha256)`` when the manifest names a library of these inputs."""
        manifest = paths.read_manifest(self.directory)
        if not manifest or manifest.get("inputs_digest") != self.digest:
            return None
        name = manifest.get("module")
        ours = isinstance(name, str) and name.startswith(f"inst_{self.inst.key}-")
        if not ours or "/" in name or not isinstance(manifest.get("module_sha256"), str):
            return None
        paths.check_safe(self.directory)
        return self.directory / name, manifest["module_sha256"]

    def build(self, lock) -> Path:
        """Render, compile, link and publish (the caller holds the directory's lock)."""
        from . import build as build_mod
        from .ninja_file import render_instance_ninja

        writer = codegen_module("writer")
        filename, text = self.render()
        src = self.directory / "src" / filename
        writer.write_if_different(src, text)
        ninja = render_instance_ninja(self.tc, src)
        writer.write_if_different(self.directory / "build.ninja", ninja)
        build_mod._cleanup_temps(self.directory)
        build_mod._run_ninja(self.directory, aux_env.get("AITER_AUX_VERBOSE"), None,
                             lock.pass_fds(), target=f"instance {self.inst.key}")  # fmt: skip
        built = self.directory / "obj" / f"{src.stem}.so"
        sha = paths.sha256_file(built)
        dest = self.directory / f"inst_{self.inst.key}-{sha[:16]}.so"
        if not dest.is_file() or paths.sha256_file(dest) != sha:
            writer.atomic_write(dest, built.read_bytes(), 0o755)
        manifest = {
            "format": FORMAT,
            "key": self.inst.key,
            "inputs_digest": self.digest,
            "module": dest.name,
            "module_sha256": sha,
        }
        writer.atomic_write(self.directory / MANIFEST, json.dumps(manifest, indent=1).encode())
        for old in self.directory.glob(f"inst_{self.inst.key}-*.so"):
            if old != dest:
                old.unlink(missing_ok=True)  # a process that mapped it keeps its mapping
        return dest


def _load_library(path: Path, sha256: str, module, inst) -> bool:
    """Open ``path``, check its bytes, load it, link it to ``module`` and register its
    instance ``inst``.  False when it is missing or differs from ``sha256``."""
    from .module import ABI_VERSION

    fd = paths.open_regular(path)
    if fd is None:
        return False
    try:
        paths.check_safe(path, os.fstat(fd))
        if paths.sha256_fd(fd) != sha256:
            os.close(fd)
            return False
    except BaseException:
        os.close(fd)
        raise
    proc = Path(f"/proc/self/fd/{fd}")
    try:
        lib = C.CDLL(str(proc if proc.exists() else path), mode=C.RTLD_LOCAL)
    except OSError as e:
        os.close(fd)
        raise OSError(f"the dynamic loader refused {path}: {e}") from None
    _PINNED.append(fd)
    _LIBS.append(lib)
    lib.aiter_aux_abi_version.restype = C.c_int
    if lib.aiter_aux_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI version {lib.aiter_aux_abi_version()}, expected "
                           f"{ABI_VERSION}; remove it (`aiter-aux clean`)")  # fmt: skip
    lib.aiter_aux_link_module.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
    lib.aiter_aux_link_module(module.error_setter, module.pdl_flag, module.cpu_kernel)
    fn = C.cast(getattr(lib, inst.symbol), C.c_void_p).value
    module.register(inst.key, inst.spec.op_id, inst.padded_values, fn)
    return True


def _key_lock(backend: str, key: str) -> threading.Lock:
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault((backend, key), threading.Lock())


def ensure(module, inst) -> None:
    """Make ``inst`` (a codegen Instance) available in ``module`` (an AuxModule): load its
    library from the cache, or build it first (see the module doc)."""
    from . import toolchain as toolchain_mod

    if module.has(inst.key):
        return
    with _key_lock(module.backend, inst.key):
        if module.has(inst.key):
            return
        _refuse_in_capture(module.backend, inst.key)
        try:
            tc = toolchain_mod.select(module.backend)
        except toolchain_mod.ToolchainError as e:
            if aux_env.get("AITER_AUX_DISABLE_JIT"):  # no cache to look in: nothing to load
                raise JitDisabledError(
                    f"no instance '{inst.key}' (fix: install the {module.backend} compiler and "
                    f"unset AITER_AUX_DISABLE_JIT): {e}"
                ) from None
            raise
        kb = KeyBuild.of(tc, inst)
        hit = kb.published()
        if hit is not None and _load_library(*hit, module, inst):
            return
        if aux_env.get("AITER_AUX_DISABLE_JIT"):
            fix = "unset AITER_AUX_DISABLE_JIT or call once with JIT on to cache it"
            if not module.keys() and inst.key in (paths.catalog_keys_on_disk() or ()):
                # a catalog shape served by the module of no shape: the catalog's is not current
                fix = ("`aiter-aux build`: the cache's catalog module is out of date; or unset "
                       "AITER_AUX_DISABLE_JIT")  # fmt: skip
            raise JitDisabledError(f"no instance '{inst.key}' (fix: {fix})")
        from . import build as build_mod

        paths.ensure_dir(paths.cache_root())
        paths.ensure_dir(kb.directory.parent.parent)
        paths.ensure_dir(kb.directory.parent)
        paths.ensure_dir(kb.directory)
        t0 = time.perf_counter()
        with build_mod.BuildLock(kb.directory, f"another process building {inst.key}") as lock:
            hit = kb.published()  # a concurrent builder may have published it
            if hit is None or not _load_library(*hit, module, inst):
                log.warning(
                    "aiter_aux: building instance %s for %s (not in the loaded module's "
                    "prebuilt set%s) into %s",
                    inst.key, module.backend,
                    "; its cached copy does not load" if hit is not None else " nor in the cache",
                    kb.directory,
                )  # fmt: skip
                path = kb.build(lock)
                if not _load_library(path, paths.sha256_file(path), module, inst):
                    raise build_mod.BuildError(f"{path}: no library after its build")
                log.info("aiter_aux: built %s in %.1f s", inst.key, time.perf_counter() - t0)


def _refuse_in_capture(backend: str, key: str) -> None:
    if backend == "cpu":
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"instance {key} is not loaded yet, and this call is inside CUDA-graph capture, "
            "where building or loading it would break the capture: run the call once "
            "before capturing (a warm-up step)"
        )


def take_error(message: str) -> BaseException | None:
    """The exception of this thread's last failed resolve, if ``message`` (the error the
    binding raised) carries its text; cleared either way.  None for ``JitDisabledError``:
    the binding raised it as the ``UnsupportedShapeError`` it was before JIT."""
    error = getattr(_STATE, "error", None)
    _STATE.error = None
    if isinstance(error, JitDisabledError):
        return None
    if error is not None and str(error) and str(error) in message:
        return error
    return None


def install(module) -> None:
    """Make ``module``'s binding call :func:`ensure` on a miss."""

    def resolve(op_id, params, num_params, error, error_size):
        try:
            from .paths import codegen_module as cg

            spec = next(s for s in cg("ops").OPS.values() if s.op_id == op_id)
            values = tuple(int(params[i]) for i in range(num_params))
            key = cg("instances").instance_key(
                spec.name, **dict(zip(spec.params, values, strict=True))
            )
            ensure(module, cg("instances").Instance(key, spec.name, values))
            _STATE.error = None
            return 0
        except BaseException as e:  # noqa: BLE001 (handed to the binding, which raises it)
            _STATE.error = e
            kind = "UnsupportedShapeError" if isinstance(e, JitDisabledError) else "RuntimeError"
            text = f"{kind}: {e}".encode(errors="replace")[: max(0, error_size - 1)]
            C.memmove(error, text + b"\0", len(text) + 1)
            return 1

    module.set_resolver(_RESOLVER_T(resolve))


def cached(root: Path | None = None) -> list[tuple[str, str, Path, bool]]:
    """The instance libraries built on demand in the cache (default: the cache root):
    ``(build directory name, key, library path, intact)``, sorted; ``intact``: its sha256
    is its manifest's (else its next call rebuilds it).  A key directory without a published
    library is left out."""
    root = Path(root) if root is not None else paths.cache_root()
    found = []
    for key_dir in sorted(root.glob(f"*/{KEYS_DIR}/*")):
        manifest = paths.read_manifest(key_dir) or {}
        name = manifest.get("module")
        if isinstance(name, str) and "/" not in name and (key_dir / name).is_file():
            intact = paths.sha256_file(key_dir / name) == manifest.get("module_sha256")
            found.append((key_dir.parent.parent.name, key_dir.name, key_dir / name, intact))
    return found
