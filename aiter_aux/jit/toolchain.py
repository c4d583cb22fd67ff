"""Backend, compiler, flags and target arch of a build, and their identity.

The identity (:attr:`Toolchain.fingerprint`) hashes everything that changes the compiled
bytes but not the shape list: backend, target arch(s), the compiler's resolved path and
version banner, every flag, the package version, the C ABI version and the torch build
the binding translation unit compiles and links against (its version string, e.g.
``2.13.0+cpu``; the binding targets torch's stable ABI of :data:`TORCH_TARGET`).  It names
the build directory, so a different compiler, flag, arch or torch never reuses a stale
build, while reaching the same compiler through a symlink does.  Torch is located without
importing it (that costs seconds).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from .. import __version__
from .paths import kernels_dir

BACKENDS = ("cpu", "cuda", "rocm")
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
    compiler: str  # resolved path
    compiler_version: str
    device_flags: tuple[str, ...]  # for instance TUs (kernels)
    host_flags: tuple[str, ...]  # for the lookup / common TUs
    link_flags: tuple[str, ...]
    source_ext: str  # instance TU extension
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    torch_flags: tuple[str, ...] = ()  # for the binding TU (torch includes, target version)
    torch_libs: tuple[str, ...] = ()  # link flags of the torch libraries the binding needs
    torch_version: str = ""

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for part in (
            self.backend,
            ",".join(self.arch),
            self.compiler,
            self.compiler_version,
            " ".join(self.device_flags),
            " ".join(self.host_flags),
            " ".join(self.link_flags),
            PACKAGE_VERSION,
            " ".join(self.torch_flags),
            " ".join(self.torch_libs),
            self.torch_version,
        ):
            h.update(part.encode() + b"\0")
        return h.hexdigest()

    def build_dir_name(self) -> str:
        arch = "-".join(self.arch) if self.arch else "host"
        return f"{self.backend}-{arch}-{self.fingerprint[:16]}"

    def describe(self) -> str:
        arch = ",".join(self.arch) if self.arch else "host"
        return f"{self.backend} ({arch}) with {self.compiler} [{self.compiler_version}]"


@cache
def _compiler_identity(path: str) -> tuple[str, str]:
    real = os.path.realpath(path)
    try:
        out = subprocess.run(
            [real, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except OSError as e:
        raise ToolchainError(f"cannot run compiler {real}: {e}") from e
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    # nvcc prints its release on the last lines; gcc/clang on the first
    version = " | ".join(
        lines[-2:] if "nvcc" in out.lower() or "cuda" in out.lower() else lines[:1]
    )
    return real, version or "unknown"


def _find(env_var: str | None, candidates: tuple[str, ...], backend: str) -> str:
    names = ([os.environ[env_var]] if env_var and os.environ.get(env_var) else []) + list(
        candidates
    )
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise ToolchainError(
        f"no compiler for backend {backend!r}: tried {names}"
        + (f" (set {env_var} to choose one)" if env_var else "")
    )


def default_backend() -> str:
    """``$AITER_AUX_BACKEND``, else rocm/cuda when such a GPU is visible, else cpu.
    Looks at device nodes rather than importing torch (which costs seconds)."""
    env = os.environ.get("AITER_AUX_BACKEND")
    if env:
        if env not in BACKENDS:
            raise ToolchainError(f"AITER_AUX_BACKEND must be one of {BACKENDS}, got {env!r}")
        return env
    if os.path.exists("/dev/kfd") and shutil.which("hipcc"):
        return "rocm"
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return "cuda"
    return "cpu"


def _cuda_arch() -> tuple[str, ...]:
    env = os.environ.get("AITER_AUX_ARCH") or os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        archs = []
        for item in env.replace(",", ";").replace(" ", ";").split(";"):
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
    env = os.environ.get("AITER_AUX_ARCH")
    if env:
        return tuple(a.strip() for a in env.replace(";", ",").split(",") if a.strip())
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


def _torch_parts(backend: str) -> dict:
    """The binding's torch flags: includes and the stable-ABI target, and the libraries
    holding the C shim (libtorch_cpu, plus libtorch_cuda / libtorch_hip for GPU streams)."""
    version, root = _torch_build()
    major, minor = TORCH_TARGET
    target = f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000ULL"
    flags = (f"-I{root / 'include'}", target)
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


def select(backend: str | None = None) -> Toolchain:
    """The toolchain of ``backend`` (default: :func:`default_backend`)."""
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ToolchainError(f"backend must be one of {BACKENDS}, got {backend!r}")
    torch_parts = _torch_parts(backend)
    inc = f"-I{kernels_dir()}"
    if backend == "cpu":
        compiler, version = _compiler_identity(_find("CXX", ("c++", "g++", "clang++"), backend))
        common = ("-std=c++17", "-O3", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-fast-math")
        return Toolchain(
            backend, (), compiler, version, common + (inc,), common + (inc,),
            ("-shared", "-fopenmp"), ".cpp", **torch_parts,
        )  # fmt: skip
    if backend == "cuda":
        compiler, version = _compiler_identity(_find("AITER_AUX_NVCC", ("nvcc",), backend))
        arch = _cuda_arch()
        gencode = tuple(f"-gencode=arch=compute_{a[3:]},code={a}" for a in arch)
        common = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", inc)
        return Toolchain(
            backend, arch, compiler, version, common + gencode + ("-x", "cu"), common,
            ("-shared",) + gencode, ".cu", **torch_parts,
        )  # fmt: skip
    if backend == "rocm":
        compiler, version = _compiler_identity(
            _find("AITER_AUX_HIPCC", ("hipcc", "amdclang++"), backend)
        )
        arch = _rocm_arch()
        offload = tuple(f"--offload-arch={a}" for a in arch)
        common = ("-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", inc)
        return Toolchain(
            backend, arch, compiler, version, common + offload + ("-x", "hip"), common,
            ("-shared", "-fPIC") + offload, ".hip", **torch_parts,
        )  # fmt: skip
    raise ToolchainError(f"backend must be one of {BACKENDS}, got {backend!r}")


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
