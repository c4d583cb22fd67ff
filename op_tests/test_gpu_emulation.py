"""The GPU kernels' CPU self-test: every GPU thread emulated as a fiber (warp 32 as on NVIDIA,
64 as on AMD), checked against references written from docs/ops.md.  Catches missing
warp/block syncs and index errors without a GPU; real-device runs are still needed for the
memory model and the hardware instructions.  Skips when no C++ compiler is present.

Both warp sizes build and run at once, one process each (the self-test is single-threaded,
so on 2 cores the pair takes the time of one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "csrc" / "kernels" / "mxfp4_moe"
SELFTEST = KERNELS / "gpu" / "tests" / "emu_selftest.cpp"
WARPS = (32, 64)

pytestmark = pytest.mark.slow  # minutes of CPU time: `bash scripts/test.sh --all` runs it


def _compile(warp: int, exe: Path) -> subprocess.Popen:
    return subprocess.Popen(
        # -D_FORTIFY_SOURCE=2: as some distributions' g++ define it by default (emu.h undoes it);
        # -O1: a third less to compile than -O2, the same run time (the fibers' switches)
        ["g++", "-std=c++17", "-O1", "-D_FORTIFY_SOURCE=2", "-ffp-contract=off",
         "-fno-strict-aliasing", "-Wno-unknown-pragmas", f"-DAITER_AUX_EMU_WARP={warp}",
         f"-I{KERNELS}", str(SELFTEST), "-o", str(exe)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _run(exes: dict, env: dict | None = None) -> list[str]:
    runs = {w: subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env) for w, exe in exes.items()}  # fmt: skip
    failed = []
    for w, p in runs.items():
        out, _ = p.communicate()
        last = (out.strip().splitlines() or [""])[-1]
        if p.returncode != 0 or not last.endswith(" 0 failed"):
            failed.append(f"warp {w} (exit {p.returncode}):\n{out[-3000:]}")
    return failed


@pytest.fixture(scope="module")
def exes(tmp_path_factory) -> dict:
    """The self-test compiled once per warp size (both compiles at once), for both tests."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    tmp = tmp_path_factory.mktemp("emu")
    exes = {w: tmp / f"emu{w}" for w in WARPS}
    builds = {w: _compile(w, exe) for w, exe in exes.items()}
    for w, p in builds.items():
        out, _ = p.communicate()
        assert p.returncode == 0, f"warp {w}: the self-test does not compile:\n{out[-3000:]}"
    return exes


def test_moe_sum_emulated(exes):
    """Only the moe_sum cases (``AITER_AUX_EMU_ONLY``); the full run below includes them."""
    failed = _run(exes, env={**os.environ, "AITER_AUX_EMU_ONLY": "moe_sum"})
    assert not failed, "\n".join(failed)


def test_gpu_kernels_emulated(exes):
    failed = _run(exes)
    assert not failed, "\n".join(failed)
