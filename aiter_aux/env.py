"""Every environment variable aiter_aux reads: its parsing, default and one doc line.

Code reads a variable only through :func:`get` (``env.get("MAX_JOBS")``), at the moment it
needs it, so a variable set after import (setup.py's prebuild does that) still counts.  An
empty value means "unset".  A value that does not parse raises :class:`EnvError`, a
``ValueError`` naming the variable, its value and what is expected.  docs/build.md's list is
rendered from :data:`VARS` by ``python -m aiter_aux.env --markdown`` (a test checks that
they agree).  Stdlib only: setup.py imports it before anything is installed.
"""

from __future__ import annotations

import math
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class EnvError(ValueError):
    """An environment variable holds a value that does not parse."""

    def __init__(self, name: str, value: str, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name}={value!r}: expected {expected}")


def _flag(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def _str(text: str) -> str:
    return text


def _source_dir(text: str) -> str:
    """A directory holding the JIT's sources (checked here, before anything uses it)."""
    root = os.path.expanduser(text)
    if not (
        os.path.isfile(os.path.join(root, "codegen", "catalog.py"))
        and os.path.isdir(os.path.join(root, "templates"))
        and os.path.isdir(os.path.join(root, "csrc"))
    ):
        raise ValueError(text)
    return root


@dataclass(frozen=True)
class Var:
    name: str
    parse: Callable[[str], Any]
    expected: str  # what a valid value looks like, for EnvError
    default: Any
    default_doc: str  # the default as the docs spell it ("" when unset means "nothing")
    doc: str


_FLAG = "1/0 (also true/false, yes/no, on/off)"

# Whether the kernels launch with programmatic dependent launch when AITER_AUX_PDL is unset:
# on (H200, CUDA-graph replay: 9-16 % less time for moe_sort, moe_scatter_reduce and the
# decode pipeline at M <= 64, no slower case; docs/perf.md).
PDL_DEFAULT = True
VARS: dict[str, Var] = {
    v.name: v
    for v in (
        Var("AITER_AUX_CACHE_DIR", _str, "a directory", None, "`~/.cache/aiter_aux`",
            "the build cache root; one directory per toolchain below it"),
        # checked by aiter_aux.jit.toolchain against codegen/instances.py's BACKENDS
        Var("AITER_AUX_BACKEND", _str, "a backend", None,
            "the visible GPU's, else `cpu`", "`cpu`, `cuda` or `rocm`: the backend of "
            "`aiter-aux build`, `doctor` and a prebuild; an op call ignores it and uses the "
            "backend of its tensors' device (cpu tensors: the cpu module)"),
        Var("AITER_AUX_ARCH", _str, "a target arch list", None,
            "the visible GPU's; for cuda `TORCH_CUDA_ARCH_LIST` first",
            "target arch(s), comma-separated, e.g. `sm_90`, `gfx950`"),
        Var("TORCH_CUDA_ARCH_LIST", _str, "a CUDA arch list", None, "",
            "cuda: target archs when `AITER_AUX_ARCH` is unset, e.g. `9.0;10.0`"),
        Var("CXX", _str, "a C++ compiler", None, "`c++`, `g++` or `clang++` on PATH",
            "cpu: the C++ compiler, invoked under this name; `\"ccache g++\"` is split into "
            "launcher and compiler"),
        Var("AITER_AUX_NVCC", _str, "a compiler", None, "`nvcc` on PATH",
            "cuda: the compiler, also of scripts/compile_check.py"),
        Var("AITER_AUX_HIPCC", _str, "a compiler", None, "`hipcc` or `amdclang++` on PATH",
            "rocm: the compiler"),
        Var("AITER_AUX_CXX_LAUNCHER", _str, "a launcher command", None, "",
            "prepended to every compile command, e.g. `ccache`, `sccache`; not part of "
            "the cache key"),
        Var("MAX_JOBS", _positive_int, "a positive integer", None, "ninja's default",
            "parallel compile jobs"),
        Var("AITER_AUX_REBUILD", _flag, _FLAG, False, "0",
            "`1`: `aiter-aux build` (`build_module`) recompiles the module from scratch; op "
            "calls and on-demand instances use the cache as always (`aiter-aux clean "
            "--on-demand` drops those)"),
        Var("AITER_AUX_DISABLE_JIT", _flag, _FLAG, False, "0",
            "`1`: never compile; a cache miss raises `JitDisabledError`"),
        Var("AITER_AUX_VERBOSE", _flag, _FLAG, False, "0", "`1`: show the compiler commands"),
        Var("AITER_AUX_LOCK_TIMEOUT", _seconds, "a number of seconds >= 0", 900.0, "900",
            "seconds to wait for another process's build lock"),
        Var("AITER_AUX_SOURCE_DIR", _source_dir,
            "an existing directory holding codegen/catalog.py, templates/ and csrc/", None,
            "`aiter_aux/_src` of a wheel, else the checkout",
            "the directory holding `codegen/`, `templates/`, `csrc/`"),
        Var("AITER_AUX_TIMING", _flag, _FLAG, False, "0",
            "`1`: the CLI prints its wall time to stderr"),
        Var("AITER_AUX_PREBUILD", _flag, _FLAG, False, "0",
            "`1`: `pip wheel . --no-build-isolation` also compiles the module into the "
            "wheel (against the environment's torch)"),
        Var("AITER_AUX_PREBUILD_SHAPES", _str, "E,D,I,K;E,D,I,K", None, "the whole catalog",
            "the shapes a prebuild compiles, e.g. `\"256,3072,256,8;128,3072,512,4\"`"),
        Var("AITER_AUX_PDL", _flag, _FLAG, PDL_DEFAULT, "1" if PDL_DEFAULT else "0",
            "`1`: cuda, every target sm_90 or newer: launch every kernel with programmatic "
            "dependent launch (PDL: a kernel's launch overlaps the end of the one before it, "
            "in CUDA graphs too); `0`: plain launches. Read when the module loads; "
            "`AuxModule.set_pdl` switches a loaded module. No effect on cpu and rocm"),
        Var("HIP_CLANG", _str, "a compiler", "clang++-22", "`clang++-22`",
            "scripts/compile_check.py: the clang that compiles the AMD targets"),
    )
}  # fmt: skip


def get(name: str) -> Any:
    """The parsed value of ``name`` (which must be in :data:`VARS`), or its default when it
    is unset or empty.  Raises :class:`EnvError` for a value that does not parse."""
    var = VARS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return var.default
    try:
        return var.parse(raw)
    except (ValueError, OverflowError):
        raise EnvError(name, raw, var.expected) from None


def check_all() -> None:
    """Parse every variable that is set (the CLI's first step, so that a bad value is
    refused before anything is done, also by commands that would not read it)."""
    for name in VARS:
        get(name)


def is_set(name: str) -> bool:
    """Whether ``name`` (in :data:`VARS`) holds a non-empty value."""
    return bool(os.environ.get(VARS[name].name, "").strip())


def render_markdown() -> str:
    """docs/build.md's environment list: one item per variable, in table order."""
    items = []
    for v in VARS.values():
        default = f" (default: {v.default_doc})" if v.default_doc else ""
        item = f"- `{v.name}`: {v.doc}{default}."
        items.append(textwrap.fill(item, 92, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False))  # fmt: skip
    return "\n".join(items) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--markdown"]:
        print("usage: python -m aiter_aux.env --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
