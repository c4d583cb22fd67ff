"""benchmarks/bench_host.py's command line: what ``--ops`` selects, and an unknown name is a
usage error (exit 2) before anything is timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_host  # noqa: E402


def test_unknown_ops_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench_host.main(["--device", "cpu", "--ops", "moe_route,bogus"])
    assert e.value.code == 2
    assert "--ops: unknown bogus" in capsys.readouterr().err


def test_route_sort_quant_selects_the_rows_with_options(cpu_module, capsys):
    bench_host.main(["--device", "cpu", "--tokens", "0", "--calls", "2", "--repeats", "1",
                     "--ops", "moe_route_sort_quant"])  # fmt: skip
    ops = [line.split()[2] for line in capsys.readouterr().out.splitlines()[2:]]
    assert ops == ["torch.add", "moe_route_out", "moe_route_out", "moe_route_sort_quant_out",
                   "moe_route_sort_quant_out", "moe_route_sort_quant"]  # fmt: skip
