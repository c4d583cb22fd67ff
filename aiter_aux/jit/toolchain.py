"""Backend, compiler, flags and target arch of a build, and their identity.

The identity (:attr:`Toolchain.fingerprint`) hashes everything that changes the compiled
bytes but not the shape list: backend, target arch(s), the compiler's resolved path and
version banner, every flag, the package version and the C ABI version.  It names the
build directory, so a different compiler, flag or arch never reuses a stale build, while
reaching the same compiler through a symlink does.  The module links no torch library, so
the torch version is deliberately not part of it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache

from .. import __version__
from . import abi
from .paths import kernels_dir

BACKENDS = ("cpu", "cuda", "rocm")
PACKAGE_VERSION = __version__


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
            str(abi.ABI_VERSION),
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


def select(backend: str | None = None) -> Toolchain:
    """The toolchain of ``backend`` (default: :func:`default_backend`)."""
    backend = backend or default_backend()
    inc = f"-I{kernels_dir()}"
    if backend == "cpu":
        compiler, version = _compiler_identity(_find("CXX", ("c++", "g++", "clang++"), backend))
        common = ("-std=c++17", "-O3", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-fast-math")
        return Toolchain(
            backend, (), compiler, version, common + (inc,), common + (inc,),
            ("-shared", "-fopenmp"), ".cpp",
        )  # fmt: skip
    if backend == "cuda":
        compiler, version = _compiler_identity(_find("AITER_AUX_NVCC", ("nvcc",), backend))
        arch = _cuda_arch()
        gencode = tuple(f"-gencode=arch=compute_{a[3:]},code={a}" for a in arch)
        common = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", inc)
        return Toolchain(
            backend, arch, compiler, version, common + gencode + ("-x", "cu"), common,
            ("-shared",) + gencode, ".cu",
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
            ("-shared", "-fPIC") + offload, ".hip",
        )  # fmt: skip
    raise ToolchainError(f"backend must be one of {BACKENDS}, got {backend!r}")


def sources_digest(backend: str) -> str:
    """sha256 over the bytes of every hand-written kernel source the backend compiles
    (the ABI header, module_common.cpp and the backend's kernel headers).  It is passed
    to the compiler as a -D flag, so any byte change rebuilds every object even when the
    file's mtime went backwards."""
    root = kernels_dir()
    sub = "cpu" if backend == "cpu" else "gpu"
    files = sorted(p for p in root.iterdir() if p.is_file())
    if (root / sub).is_dir():
        files += sorted(p for p in (root / sub).rglob("*") if p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()
