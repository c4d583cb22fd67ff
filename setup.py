"""setuptools entry point.  All metadata lives in pyproject.toml.

``build_py`` also ships the JIT's sources (codegen/, templates/, csrc/) as
``aiter_aux/_src`` in every wheel and, with ``AITER_AUX_PREBUILD=1``, compiles the module
into ``aiter_aux/_prebuilt/<backend>-<arch>/`` (see aiter_aux/jit/aot.py for the
environment variables); such a wheel is tagged ``py3-none-manylinux_2_<N>_<arch>``: the
module does not depend on the Python version (its binding uses torch's stable C ABI), and N
is the newest glibc symbol version the prebuilt module actually requires (read from its
dynamic symbol table), so the tag states what the build really satisfies.
"""

import logging
import platform
import re
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from aiter_aux import env  # noqa: E402  (stdlib only; every variable is read through it)


def _prebuild() -> bool:
    return env.get("AITER_AUX_PREBUILD")


class BuildPy(build_py):
    def run(self):
        super().run()
        if self.editable_mode or self.dry_run:
            return  # an editable install reads the checkout's sources directly
        from aiter_aux.jit.aot import build_into

        build_temp = Path(self.get_finalized_command("build").build_temp).resolve()
        package_dir = Path(self.build_lib).resolve() / "aiter_aux"
        build_into(package_dir, build_temp, HERE, log=self.announce_info)

    def announce_info(self, msg: str) -> None:
        self.announce(msg, level=logging.INFO)


cmdclass = {"build_py": BuildPy}

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a prebuilt module makes the wheel platform-specific
        return _prebuild() or super().has_ext_modules()


def _glibc_needed(build_lib: Path) -> tuple[int, int] | None:
    """The newest GLIBC_x.y symbol version any prebuilt module needs (objdump -T), or None."""
    needed = []
    for so in build_lib.glob("aiter_aux/_prebuilt/*/*.so"):
        try:
            out = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True).stdout
        except OSError:
            return None
        needed += [(int(a), int(b)) for a, b in re.findall(r"GLIBC_(\d+)\.(\d+)", out)]
    return max(needed) if needed else None


class BdistWheel(bdist_wheel):
    def get_tag(self):
        python, abi, plat = super().get_tag()
        if not _prebuild():
            return python, abi, plat
        glibc = None
        if plat.startswith("linux_"):
            build_lib = Path(self.get_finalized_command("build").build_lib)
            glibc = _glibc_needed(build_lib)
        if glibc is not None:
            plat = f"manylinux_{glibc[0]}_{max(glibc[1], 17)}_{platform.machine()}"
        return "py3", "none", plat


cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
