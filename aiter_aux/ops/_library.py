"""How the ``aiter_aux`` torch ops are bound: definition, the lazy loader, autograd and the
error translation of the wrappers.

:func:`define` (called by the generated :mod:`._ops` at import) defines, for every op of the
op table, ``torch.ops.aiter_aux.<op>`` (allocating) and ``torch.ops.aiter_aux.<op>_out``
(mutates its buffers, returns nothing) with the table's schemas, plus:

* the fake (meta) implementation of each (generated in :mod:`._ops`: the reference's
  checks when sizes are static, output shapes from sizes alone), so bad input fails while
  tracing too;
* a ``CompositeExplicitAutograd`` kernel, the *loader*: the first call on a backend loads
  (building if needed) that backend's module, whose C++ binding registers the real CPU or
  CUDA kernels (torch's stable ABI, csrc/kernels/mxfp4_moe/binding/).  A kernel registered
  for a backend key takes precedence over this alias key, so every later call goes straight
  to C++.  Concurrent first calls wait for the one load, then dispatch again;
* a fallthrough kernel for the ``Autograd`` key: the ops are not differentiable, their
  outputs never require grad (as the reference's don't), and tracing sees through them.

When a backend's module loads, :func:`register_written_versions` gives every op that writes
tensors (``Tensor(a!)`` in its schema: the ``_out`` buffers, ``zero_buf``, ``sorted_scales``)
an ``ADInplaceOrView`` kernel, as torch's own ``out=`` ops have: under grad mode it refuses a
written tensor that requires grad before anything runs, and it bumps the version of each
written tensor, so autograd refuses a backward over values the op overwrote.  It is C++
(csrc/autograd, :mod:`aiter_aux.jit.written_versions`); where that cannot be built, the
same in Python (about 3 us more per call).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import torch

from ..jit.paths import renew_after_fork

T = torch.Tensor
_LOCK = threading.RLock()  # held while a backend loads: jit.spec's import, dlopen, registration
renew_after_fork(globals(), "_LOCK", threading.RLock)
#: How long a fork waits for a load in flight before it forks anyway: a load that finds its
#: module built takes well under it; one that builds takes longer, and the child's locks and
#: build (serialized by the cache's file locks) are its own.
FORK_WAIT_S = 2.0
_FORK_HELD = threading.local()


def _before_fork() -> None:
    _FORK_HELD.value = _LOCK.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    if getattr(_FORK_HELD, "value", False):
        _FORK_HELD.value = False
        _LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
_WRITTEN_LOCK = threading.Lock()  # register_written_versions (the loader's, or a build's thread)
renew_after_fork(globals(), "_WRITTEN_LOCK", threading.Lock)
_LIB: torch.library.Library | None = None
_LOADED_BACKENDS: set[str] = set()
_SCHEMAS: dict[str, str] = {}  # the defined ops' schemas
_WRITTEN_VERSIONS: list[str | None] = []  # once registered: None (C++) or why Python
_AGAIN = threading.local()  # set while the loader re-dispatches


class UnsupportedShapeError(ValueError):
    """No compiled instance exists for the requested compile-time parameters."""


def backend_of(device: torch.device) -> str:
    """The module backend serving tensors on ``device``; ValueError for other devices."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    raise ValueError(f"the tensors are on {device}: the compiled ops take cpu or cuda tensors only")


def _tensors(args, kwargs) -> list[T]:
    return [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


def _loader(name: str, check: Callable):
    def kernel(*args, **kwargs):
        tensors = _tensors(args, kwargs)
        if getattr(_AGAIN, "name", None) == name:
            # the re-dispatch landed here again: no kernel for these tensors; the checks
            # name what is wrong (a sparse tensor, another device), else say it plainly
            check(*args, **kwargs)
            devices = sorted({f"{t.device} ({t.layout})" for t in tensors})
            raise RuntimeError(
                f"aiter_aux::{name}: no kernel for tensors on {devices}: the compiled ops take "
                "dense cpu or cuda tensors"
            )
        cuda = [t for t in tensors if t.device.type == "cuda"]
        backend = backend_of((cuda or tensors)[0].device)
        if backend not in _LOADED_BACKENDS:
            with _LOCK:  # concurrent first calls wait here for the one load
                if backend not in _LOADED_BACKENDS:
                    from ..jit.spec import load_module  # under the lock: a fork waits for it

                    load_module(backend)  # its binding registers the backend's kernels
                    _LOADED_BACKENDS.add(backend)
        _AGAIN.name = name
        try:
            return getattr(torch.ops.aiter_aux, name).default(*args, **kwargs)
        finally:
            _AGAIN.name = None

    kernel.__name__ = f"load_then_{name}"
    return kernel


def define(schemas: dict[str, str], fakes: dict[str, Callable]) -> torch.library.Library:
    """Define the ``aiter_aux`` ops (once per process) and return their library."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                if set(schemas) != set(fakes):
                    raise RuntimeError(f"schemas and fakes disagree: {sorted(schemas)}")
                lib = torch.library.Library("aiter_aux", "DEF")
                # This process's catalog and its instance keys are the ones of the ops'
                # definition: import them now (the load path of the first call reads them).
                from ..jit.paths import codegen_module

                codegen_module("instances")
                for name, schema in schemas.items():
                    lib.define(schema)
                    lib.impl(name, _loader(name, fakes[name]), "CompositeExplicitAutograd")
                    lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
                    torch.library.register_fake(f"aiter_aux::{name}", fakes[name], lib=lib)
                _SCHEMAS.update(schemas)
                _LIB = lib
            spec = sys.modules.get("aiter_aux.jit.spec")
            if spec is not None and spec.loaded_modules():  # loaded before the ops existed
                register_written_versions()
    return _LIB


def _written(schema: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The positions and keyword names of the arguments ``schema`` writes (``Tensor(a!)``)."""
    args = torch._C.parse_schema(schema).arguments
    writes = [(i, a) for i, a in enumerate(args) if a.alias_info and a.alias_info.is_write]
    return (tuple(i for i, a in writes if not a.kwarg_only),
            tuple(a.name for _, a in writes if a.kwarg_only))  # fmt: skip


def _python_written_versions(name: str, writes: tuple[tuple[int, ...], tuple[str, ...]]):
    """csrc/autograd/written_versions.cpp's kernel in Python, for where that cannot load."""
    after = torch._C._after_ADInplaceOrView_keyset
    positions, keywords = writes
    handle = getattr(torch.ops.aiter_aux, name).default._handle

    def kernel(keyset, *args, **kwargs):
        # a written option passed as None (by position or keyword) writes nothing
        written = [args[i] for i in positions if i < len(args) and args[i] is not None]
        written += [kwargs[k] for k in keywords if kwargs.get(k) is not None]
        if torch.is_grad_enabled() and any(t.requires_grad for t in written):
            raise grad_error(name)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            result = handle.redispatch_boxed(keyset & after, *args, **kwargs)
        torch._C._increment_version([t for t in written if not t.is_inference()])
        return result

    kernel.__name__ = f"bump_versions_of_{name}"
    return kernel


def written_versions_registered() -> bool:
    """:func:`register_written_versions` has run in this process."""
    return bool(_WRITTEN_VERSIONS)


def register_written_versions() -> str | None:
    """Give the defined ops that write tensors their ``ADInplaceOrView`` kernel (once per
    process; see the module's doc).  None when it is the C++ one, else why it is not."""
    if _LIB is None or _WRITTEN_VERSIONS:
        return _WRITTEN_VERSIONS[0] if _WRITTEN_VERSIONS else None
    with _WRITTEN_LOCK:
        if not _WRITTEN_VERSIONS:
            from ..jit import written_versions

            why = written_versions.load()
            if why is not None:
                for name, schema in _SCHEMAS.items():
                    if any(writes := _written(schema)):
                        kernel = _python_written_versions(name, writes)
                        _LIB.impl(name, kernel, "ADInplaceOrView", with_keyset=True)
            _WRITTEN_VERSIONS.append(why)
    return _WRITTEN_VERSIONS[0]


# ------------------------------------------------------------------ for the wrappers
def _static(*tensors: T | None) -> bool:
    """True when every size is a plain int (not a SymInt of a dynamic-shape trace)."""
    return all(isinstance(s, int) for t in tensors if t is not None for s in t.shape)


def _wide_ids(ids: object) -> bool:
    """``ids`` is an int64 tensor (the wrappers' retry with :func:`_ids32`)."""
    return isinstance(ids, torch.Tensor) and ids.dtype == torch.int64


def _ids32(ids: T | None) -> T | None:
    """int64 ids as int32 with the same meaning for every op: values past int32 are clamped
    to -2 or 2**31 - 1, which every op drops (skips) as it drops the value itself (an id
    < -1, or >= any expert count and any expert_map's length)."""
    if ids is None or ids.dtype != torch.int64:
        return ids
    return ids.clamp(-2, (1 << 31) - 1).to(torch.int32)


_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "UnsupportedShapeError": UnsupportedShapeError,
    "RuntimeError": RuntimeError,
}


def translate(error: Exception, check: Callable[[], object]) -> Exception:
    """The exception a wrapper raises for ``error`` from a torch op (the error path only).

    ``check`` (the reference's checks of the same call) runs first: where the reference
    rejects the call, its error is raised, so a wrapper names an argument exactly as the
    spec does, also for what torch's argument parser rejects before the binding sees it.
    Otherwise the binding's message ``"<Type>: <text>"`` (binding/checks.h) becomes
    ``<Type>(text)``, e.g. :class:`UnsupportedShapeError`; anything else is ``error``."""
    from ..jit.ondemand import take_error

    try:
        check()
    except Exception as spec_error:  # the spec's error replaces the binding's: one traceback
        raise spec_error from None
    built = take_error(str(error))  # an on-demand build's own exception (BuildError, ...)
    if built is not None:
        return built
    kind, sep, text = str(error).partition(": ")
    cls = _ERRORS.get(kind) if sep else None
    if cls is UnsupportedShapeError:
        text = _restart_hint(text)
    if cls is not None and isinstance(error, RuntimeError):
        return cls(text)
    return error


def _restart_hint(text: str) -> str:
    """The binding's missing-instance message, or, when the catalog on disk has the key
    (its shape was added after this process read the catalog), why and what to do: restart
    (``aiter_aux.jit.spec.why_missing``)."""
    import re

    m = re.search(r"no instance '([a-z0-9_]+)'", text)
    if m is None:
        return text
    from ..jit import spec

    for backend in spec.loaded_modules():
        why = spec.explain_missing(backend, m.group(1))
        if why and "restart the process" in why and "catalog on disk" in why and "has it" in why:
            return why
    return text


def grad_error(name: str) -> RuntimeError:
    """torch's rule for ``out=`` arguments, for a buffer that requires grad."""
    return RuntimeError(
        f"{name}(): functions with out=... arguments don't support automatic differentiation, "
        "but one of the arguments requires grad (the aux ops are not differentiable)"
    )
