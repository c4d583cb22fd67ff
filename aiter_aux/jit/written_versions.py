"""Build and load csrc/autograd/written_versions.cpp: the C++ ``ADInplaceOrView`` kernel of
the ``aiter_aux`` ops that write tensors (bumps their versions, refuses a leaf that requires
grad; see that file).

It uses torch's full C++ API, so it is built apart from the kernel modules (which keep to
torch's stable ABI and ship prebuilt): once per torch build and source, with
``torch.utils.cpp_extension``, into ``$AITER_AUX_CACHE_DIR/autograd-torch-<build>-<source>``.
Where it cannot be built or loaded (no compiler, ``AITER_AUX_DISABLE_JIT=1`` and no copy in
the cache), :func:`load` says why and the ops register the same kernel in Python instead.
A first op call that builds the module of no shape builds this alongside, in a thread
(:func:`aiter_aux.jit.spec.ModuleSpec.load`); a build says on stderr when it is done.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import env
from . import paths

NAME = "aiter_aux_written_versions"
DIR_PREFIX = "autograd-torch-"  # the build directories' names in the cache
SOURCE = "csrc/autograd/written_versions.cpp"  # relative to the source root
#: Its compile flags: the kernel only walks a schema's arguments around a redispatch, and
#: the compile is all torch's headers (-O1 takes about 1 CPU-second less than -O2).
CFLAGS = ["-O1"]
log = logging.getLogger("aiter_aux")


def build_dir() -> Path:
    """Where the library of this torch build and this source lives (its ABI is that
    build's)."""
    import torch

    build = f"{torch.__version__}-{(torch.version.git_version or 'unknown')[:12]}"
    source = paths.sha256_file(paths.source_root() / SOURCE)[:12]
    return paths.cache_root() / f"{DIR_PREFIX}{build.replace('+', '_')}-{source}"


# Set when a prebuilt module (the wheel's) serves: the prebuilt path compiles nothing, so the
# library is loaded only if the cache already holds it.
PREBUILT_SERVES: list[bool] = []


def needs_build() -> bool:
    """:func:`load` would compile: the library is not in the cache, and JIT is enabled
    (False where the source cannot be read: :func:`load` then says why)."""
    try:
        built = build_dir() / f"{NAME}.so"
    except OSError:
        return False
    return not (built.is_file() or env.get("AITER_AUX_DISABLE_JIT") or PREBUILT_SERVES)


def load() -> str | None:
    """Load the library, building it first if it is not in the cache (its loading registers
    the kernels of the ops defined at that moment); None when loaded, else why not (one
    line).  A cache hit loads the file directly; a build goes through
    ``torch.utils.cpp_extension``, which holds a lock file in the directory meanwhile."""
    import torch

    directory = build_dir()
    built = directory / f"{NAME}.so"
    try:
        if built.is_file() and not (directory / "lock").exists():
            torch.ops.load_library(str(built))
            return None
        if env.get("AITER_AUX_DISABLE_JIT"):
            return f"AITER_AUX_DISABLE_JIT=1 and {built} is not built"
        if PREBUILT_SERVES:
            return f"a prebuilt module serves (it compiles nothing) and {built} is not built"
        paths.ensure_dir(directory)
        from torch.utils import cpp_extension

        t0 = time.monotonic()
        cpp_extension.load(  # ninja's lines go to a pipe unless verbose; errors raise
            NAME,
            [str(paths.source_root() / SOURCE)],
            extra_cflags=CFLAGS,
            build_directory=str(directory),
            is_python_module=False,
            verbose=env.get("AITER_AUX_VERBOSE"),
        )
        log.warning("aiter_aux: the autograd kernel %s is built in %s (%.1f s)", SOURCE,
                    directory, time.monotonic() - t0)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (any failure leaves the Python kernels)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{type(e).__name__}: {first}"
    return None
