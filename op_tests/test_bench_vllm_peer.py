"""benchmarks/bench_vllm_peer.py on the CPU: its comparison helpers on hand cases (vLLM's
buffer capacity, the order inside an expert compared as a set), the build's refusal of a
folder that is not a vLLM source release, and its one-line refusal without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_vllm_peer as B  # noqa: E402
from auxbench import vllm_peer  # noqa: E402


def test_align_buffers_have_vllms_capacity():
    # cap = numel + E * (block - 1); min(numel * block, cap) when numel < E; poisoned
    s, e, n = B.align_buffers(numel=40, e=8, block=16, dev=torch.device("cpu"))
    assert s.numel() == 40 + 8 * 15 and e.numel() == -(-(40 + 8 * 15) // 16) and n.numel() == 1
    s, e, _ = B.align_buffers(numel=5, e=256, block=16, dev=torch.device("cpu"))
    assert s.numel() == 80 and e.numel() == 5
    assert (s == -7).all() and (e == -7).all()


def test_canonical_rows_sort_inside_each_experts_blocks_only():
    # blocks of 2: expert 3 owns blocks 0-1, expert 5 block 2; rows past the total untouched
    ids = torch.tensor([9, 4, 7, 1, 8, 6, 30, 31], dtype=torch.int32)
    experts = torch.tensor([3, 3, 5, -1], dtype=torch.int32)
    got = B.canonical_rows(ids, post=6, block=2, expert_ids=experts)
    assert got.tolist() == [1, 4, 7, 9, 6, 8, 30, 31]


def test_load_refuses_a_folder_without_vllms_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an unpacked vLLM source release: no "
                       "csrc/moe/moe_align_sum_kernels.cu"):  # fmt: skip
        vllm_peer.load(tmp_path, tmp_path / "build")
    assert not (tmp_path / "build").exists()


def test_user_errors_are_one_line_before_any_build(tmp_path, capsys):
    for argv, want in ((["--vllm-src", str(tmp_path)], "nothing to do: give --check"),
                       (["--vllm-src", str(tmp_path), "--check"],
                        "not an unpacked vLLM source release (no csrc/moe/")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            B.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert want in err[-1], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_says_so(tmp_path, capsys):
    for f in vllm_peer.SOURCES:  # a folder that looks like a release
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    assert B.main(["--vllm-src", str(tmp_path), "--check"]) == 2
    assert capsys.readouterr().out.strip() == "bench_vllm_peer: needs a CUDA GPU"
