"""The GPU kernels' CPU self-test: every GPU thread emulated as a fiber (warp 32 as on NVIDIA,
64 as on AMD), checked against references written from docs/ops.md.  Catches missing
warp/block syncs and index errors without a GPU; real-device runs are still needed for the
memory model and the hardware instructions.  Skips when no C++ compiler is present."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "csrc" / "kernels" / "mxfp4_moe"
SELFTEST = KERNELS / "gpu" / "tests" / "emu_selftest.cpp"


pytestmark = pytest.mark.slow  # ~3 min on 2 cores: `bash scripts/test.sh --all` runs it


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("warp", [32, 64])
def test_gpu_kernels_emulated(warp, tmp_path):
    exe = tmp_path / f"emu{warp}"
    subprocess.run(
        ["g++", "-std=c++17", "-O2", "-ffp-contract=off", "-fno-strict-aliasing",
         "-Wno-unknown-pragmas", f"-DAITER_AUX_EMU_WARP={warp}", f"-I{KERNELS}", str(SELFTEST),
         "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    last = (p.stdout.strip().splitlines() or [""])[-1]
    assert p.returncode == 0 and last.endswith(" 0 failed"), p.stdout[-3000:] + p.stderr[-2000:]
