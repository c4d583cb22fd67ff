"""Backend, compiler, flags and target arch of a build, and their identity.

The identity (:attr:`Toolchain.fingerprint`) hashes everything that changes the compiled
bytes but not the shape list: backend, target arch(s), the compiler's resolved path, the
driver it is invoked as (clang's ``clang++`` and ``clang`` are one binary but two drivers)
and its version banner, every flag, the package version, the C ABI version and the torch
build the binding translation unit compiles and links against (its version string, e.g.
``2.13.0+cpu``; the binding targets torch's stable ABI of :data:`TORCH_TARGET`).  It names
the build directory, so a different compiler, flag, arch or torch never reuses a stale
build, while reaching the same compiler through a symlink (or through a ccache masquerade)
does.  Torch is located without importing it (that costs seconds).

Commands invoke the compiler under the name it was found by (``CXX=clang++-22`` runs
``/usr/bin/clang++-22``, never the ``clang`` it resolves to), prefixed for compiles by
the launcher (``$AITER_AUX_CXX_LAUNCHER``, e.g. ccache), which is not part of the identity.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

from .. import __version__, env
from .module import ABI_VERSION
from .paths import codegen_module, kernels_dir, renew_cached_property_locks_after_fork

PACKAGE_VERSION = __version__
#: The stable-ABI version the binding targets (TORCH_TARGET_VERSION): torch 2.11, the oldest
#: torch this project is tested with (pyproject's floor).
TORCH_TARGET = (2, 11)


class ToolchainError(RuntimeError):
    """No usable compiler or target for the requested backend."""


@dataclass(frozen=True)
class Toolchain:
    backend: str
    arch: tuple[str, ...]  # () for cpu; ("sm_90",) / ("gfx950", "gfx942") for GPUs
    compiler: str  # the path commands invoke (not resolved: see the module doc)
    compiler_version: str
    device_flags: tuple[str, ...]  # for instance TUs (kernels)
    host_flags: tuple[str, ...]  # for the lookup / common TUs
    link_flags: tuple[str, ...]
    source_ext: str  # instance TU extension
    compiler_id: str = ""  # resolved path and driver (fingerprint); default: compiler
    launcher: tuple[str, ...] = ()  # compile-command prefix (ccache ...), not in the identity
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    torch_flags: tuple[str, ...] = ()  # for the binding TU (torch includes, target version)
    torch_libs: tuple[str, ...] = ()  # link flags of the torch libraries the binding needs
    torch_version: str = ""

    def identity(self) -> list[str]:
        """The parts :attr:`fingerprint` hashes (extend here, not in the hash)."""
        return [
            self.backend,
            ",".join(self.arch),
            self.compiler_id or self.compiler,
            self.compiler_version,
            " ".join(self.device_flags),
            " ".join(self.host_flags),
            " ".join(self.link_flags),
            PACKAGE_VERSION,
            str(ABI_VERSION),
            " ".join(self.torch_flags),
            " ".join(self.torch_libs),
            self.torch_version,
        ]

    @cached_property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for part in self.identity():
            h.update(part.encode() + b"\0")
        return h.hexdigest()

    def build_dir_name(self) -> str:
        arch = "-".join(self.arch) if self.arch else "host"
        return f"{self.backend}-{arch}-{self.fingerprint[:16]}"

    def describe(self) -> str:
        arch = ",".join(self.arch) if self.arch else "host"
        return f"{self.backend} ({arch}) with {self.compiler} [{self.compiler_version}]"


# What a compiler masquerade (``/usr/lib/ccache/g++ -> ../../bin/ccache``) resolves to.
LAUNCHERS = ("ccache", "sccache", "distcc")


renew_cached_property_locks_after_fork(Toolchain)


@dataclass(frozen=True)
class Compiler:
    path: str  # what commands invoke: found on PATH, symlinks kept (clang++-22 stays so)
    identity: str  # resolved path and driver, for the fingerprint
    version: str
    launcher: tuple[str, ...] = ()


def _is_launcher(path: str) -> bool:
    return os.path.basename(os.path.realpath(path)) in LAUNCHERS


def _behind_masquerade(name: str) -> str | None:
    """The first ``name`` on PATH that is not a launcher's masquerade link."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which(name, path=d or ".")
        if found and not _is_launcher(found):
            return found
    return None


@cache
def _version(path: str, named: str) -> str:
    why = None
    try:
        p = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        if p.returncode:
            why = f"`{path} --version` exited with {p.returncode}: {p.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    if why:
        raise ToolchainError(f"cannot run the compiler {named}: {why}")
    out = p.stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    # nvcc prints its release on the last lines; gcc/clang on the first
    cuda = "nvcc" in out.lower() or "cuda" in out.lower()
    lines = lines[-2:] if cuda else lines[:1]
    prog = os.path.basename(path) + " "  # gcc starts with the name it was invoked as:
    if lines and lines[0].startswith(prog):  # print the resolved one, whatever the link
        lines[0] = os.path.basename(os.path.realpath(path)) + " " + lines[0][len(prog) :]
    return " | ".join(lines) or "unknown"


def _launcher() -> tuple[str, ...]:
    raw = env.get("AITER_AUX_CXX_LAUNCHER")
    if not raw:
        return ()
    words = _split("AITER_AUX_CXX_LAUNCHER", raw)
    found = shutil.which(words[0])
    if not found:
        raise ToolchainError(f"AITER_AUX_CXX_LAUNCHER={raw!r}: {words[0]!r} is not found")
    return (found, *words[1:])


def _split(var: str, raw: str) -> list[str]:
    try:
        words = shlex.split(raw)
    except ValueError as e:
        raise ToolchainError(f"{var}={raw!r}: {e}") from None
    if not words:
        raise ToolchainError(f"{var}={raw!r} names no program")
    return words


def find_compiler(env_var: str, candidates: tuple[str, ...], backend: str) -> Compiler:
    """The compiler named by ``$env_var``, else the first of ``candidates`` on PATH.

    A compiler the user names must exist and run (else :class:`ToolchainError` naming
    it); ``"ccache g++"`` is split into a launcher and a compiler.  A masquerade link of
    ccache/sccache/distcc (first on PATH, or named) is replaced by the compiler behind it
    and, without ``$AITER_AUX_CXX_LAUNCHER``, its launcher is kept as the launcher, so the
    cache key is the same with or without a launcher."""
    launcher = _launcher()
    raw = env.get(env_var)
    if raw:
        words = _split(env_var, raw)
        first = shutil.which(words[0]) if len(words) == 2 else None
        if first and _is_launcher(first):
            if launcher:
                raise ToolchainError(
                    f"{env_var}={raw!r} names a launcher and AITER_AUX_CXX_LAUNCHER is set "
                    f"too; name the compiler alone in {env_var}"
                )
            launcher, words = (first,), words[1:]
        if len(words) != 1:
            raise ToolchainError(
                f"{env_var}={raw!r} must name one compiler executable (no flags); a "
                f"launcher such as ccache goes in AITER_AUX_CXX_LAUNCHER"
            )
        name, named = words[0], f"{env_var}={raw!r}"
        path = shutil.which(name)
        if not path:
            where = "not an executable file" if os.sep in name else "not found on PATH"
            raise ToolchainError(f"{named}: {name!r} is {where}")
    else:
        path = next((p for p in map(shutil.which, candidates) if p), None)
        if not path:
            raise ToolchainError(
                f"no compiler for backend {backend!r}: none of {list(candidates)} is on PATH "
                f"(set {env_var} to choose one)"
            )
        name = os.path.basename(path)
        named = path
    if _is_launcher(path):
        masquerade = os.path.realpath(path)
        path = _behind_masquerade(os.path.basename(name))
        if not path:
            raise ToolchainError(
                f"{named} is a {os.path.basename(masquerade)} link and no "
                f"{os.path.basename(name)} is found behind it on PATH"
            )
        launcher = launcher or (masquerade,)
    real, base = os.path.realpath(path), os.path.basename(path)
    identity = real
    if os.path.basename(real).startswith("clang"):
        # one binary, several drivers chosen by the name: clang++-22 is C++, clang is C
        identity += " as " + ("C++" if "++" in base else base)
    return Compiler(path, identity, _version(path, named), launcher)


def backends() -> tuple[str, ...]:
    """The backends (one list, in codegen/instances.py, which the generator imports too)."""
    return tuple(codegen_module("instances").BACKENDS)


def default_backend() -> str:
    """``$AITER_AUX_BACKEND``, else rocm/cuda when such a GPU is visible, else cpu.
    Looks at device nodes rather than importing torch (which costs seconds)."""
    chosen = env.get("AITER_AUX_BACKEND")
    if chosen:
        if chosen not in backends():
            raise ToolchainError(
                f"AITER_AUX_BACKEND={chosen!r}: expected one of {', '.join(backends())}"
            )
        return chosen
    if os.path.exists("/dev/kfd") and shutil.which("hipcc"):
        return "rocm"
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return "cuda"
    return "cpu"


def _cuda_arch() -> tuple[str, ...]:
    listed = env.get("AITER_AUX_ARCH") or env.get("TORCH_CUDA_ARCH_LIST")
    if listed:
        archs = []
        for item in listed.replace(",", ";").replace(" ", ";").split(";"):
            item = item.strip().replace("+PTX", "")
            if not item:
                continue
            archs.append(item if item.startswith("sm_") else "sm_" + item.replace(".", ""))
        return tuple(dict.fromkeys(archs))
    import torch

    if not torch.cuda.is_available():
        raise ToolchainError("cuda backend: no visible GPU; set AITER_AUX_ARCH (e.g. sm_90)")
    major, minor = torch.cuda.get_device_capability()
    return (f"sm_{major}{minor}",)


def _rocm_arch() -> tuple[str, ...]:
    listed = env.get("AITER_AUX_ARCH")
    if listed:
        return tuple(a.strip() for a in listed.replace(";", ",").split(",") if a.strip())
    import torch

    if not torch.cuda.is_available():
        raise ToolchainError("rocm backend: no visible GPU; set AITER_AUX_ARCH (e.g. gfx950)")
    name = torch.cuda.get_device_properties(0).gcnArchName
    return (name.split(":")[0],)


@cache
def _torch_build() -> tuple[str, Path]:
    """(version string, package directory) of the installed torch, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise ToolchainError("torch is not installed: the module's binding compiles against it")
    return importlib.metadata.version("torch"), Path(spec.origin).parent


#: The CPU binding's optimisation level (its flags follow the host flags' -O3, so it wins).
#: The binding checks arguments and calls torch's C shim, whose calls no level inlines: g++
#: 12 compiles it in about 3.3 CPU-seconds at -O1, 4.8 at -O3, at the same host cost per
#: call (benchmarks/bench_host.py).
CPU_BINDING_OPT = "-O1"


def _torch_parts(backend: str) -> dict:
    """The binding's torch flags: includes and the stable-ABI target (on the CPU, also
    :data:`CPU_BINDING_OPT`), and the libraries holding the C shim (libtorch_cpu, plus
    libtorch_cuda / libtorch_hip for GPU streams)."""
    version, root = _torch_build()
    major, minor = TORCH_TARGET
    target = f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000ULL"
    flags = (f"-I{root / 'include'}", target)
    if backend == "cpu":
        flags += (CPU_BINDING_OPT,)
    libs = ["-L" + str(root / "lib"), "-ltorch_cpu"]
    if backend != "cpu":
        gpu_lib = "torch_hip" if backend == "rocm" else "torch_cuda"
        if not (root / "lib" / f"lib{gpu_lib}.so").exists():
            raise ToolchainError(
                f"{backend} backend: the installed torch {version} has no lib{gpu_lib}.so "
                f"(a CPU-only torch build?); install a {backend} build of torch"
            )
        libs.append("-l" + gpu_lib)
    return {"torch_flags": flags, "torch_libs": tuple(libs), "torch_version": version}


def _toolchain(backend, arch, cc: Compiler, device, host, link, ext) -> Toolchain:
    return Toolchain(
        backend, arch, cc.path, cc.version, device, host, link, ext,
        compiler_id=cc.identity, launcher=cc.launcher, **_torch_parts(backend),
    )  # fmt: skip


def select(backend: str | None = None) -> Toolchain:
    """The toolchain of ``backend`` (default: :func:`default_backend`)."""
    backend = backend or default_backend()
    if backend not in backends():
        raise ToolchainError(f"backend must be one of {backends()}, got {backend!r}")
    inc = f"-I{kernels_dir()}"
    if backend == "cpu":
        cc = find_compiler("CXX", ("c++", "g++", "clang++"), backend)
        common = ("-std=c++17", "-O3", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-fast-math")
        return _toolchain(
            backend, (), cc, common + (inc,), common + (inc,), ("-shared", "-fopenmp"), ".cpp"
        )
    if backend == "cuda":
        cc = find_compiler("AITER_AUX_NVCC", ("nvcc",), backend)
        arch = _cuda_arch()
        gencode = tuple(f"-gencode=arch=compute_{a[3:]},code={a}" for a in arch)
        common = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", inc)
        return _toolchain(
            backend, arch, cc, common + gencode + ("-x", "cu"), common,
            ("-shared",) + gencode, ".cu",
        )  # fmt: skip
    cc = find_compiler("AITER_AUX_HIPCC", ("hipcc", "amdclang++"), backend)
    arch = _rocm_arch()
    offload = tuple(f"--offload-arch={a}" for a in arch)
    common = ("-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", inc)
    return _toolchain(
        backend, arch, cc, common + offload + ("-x", "hip"), common,
        ("-shared", "-fPIC") + offload, ".hip",
    )  # fmt: skip


def sources_digest(backend: str) -> str:
    """sha256 over the bytes of every hand-written kernel source the backend compiles
    (the ABI header, module_common.cpp, the backend's kernel headers and the binding's).
    It is passed
    to the compiler as a -D flag, so any byte change rebuilds every object even when the
    file's mtime went backwards."""
    root = kernels_dir()
    files = sorted(p for p in root.iterdir() if p.is_file())
    for sub in ("cpu" if backend == "cpu" else "gpu", "binding"):
        if (root / sub).is_dir():
            files += sorted(p for p in (root / sub).rglob("*") if p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()
