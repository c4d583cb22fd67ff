"""setuptools entry point.  All metadata lives in pyproject.toml.

``build_py`` also ships the JIT's sources (codegen/, templates/, csrc/) as
``aiter_aux/_src`` in every wheel and, with ``AITER_AUX_PREBUILD=1``, compiles the module
into ``aiter_aux/_prebuilt/<backend>-<arch>/`` (see aiter_aux/jit/aot.py for the
environment variables); such a wheel is tagged for this platform (``py3-none-<platform>``:
the module is a plain C library, independent of the Python version).
"""

import logging
import os
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _prebuild() -> bool:
    return os.environ.get("AITER_AUX_PREBUILD", "").strip() not in ("", "0", "false", "False")


class BuildPy(build_py):
    def run(self):
        super().run()
        if self.editable_mode or self.dry_run:
            return  # an editable install reads the checkout's sources directly
        sys.path.insert(0, str(HERE))
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


class BdistWheel(bdist_wheel):
    def get_tag(self):
        python, abi, plat = super().get_tag()
        return ("py3", "none", plat) if _prebuild() else (python, abi, plat)


cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
