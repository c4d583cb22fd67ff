"""vLLM's MoE aux kernels as a peer, built from a vLLM source release in a scratch folder.

Nothing of vLLM enters this repository: the caller names an unpacked vLLM sdist
(``vllm-X.Y.Z/``, with its ``csrc/``), and :func:`load` compiles its
``csrc/moe/moe_align_sum_kernels.cu``, ``topk_softmax_kernels.cu`` and
``grouped_topk_kernels.cu`` with torch's extension builder into ``build_dir``, beside a
registration unit written here, which declares the four ops under ``torch.ops.peer_vllm``
with the schemas of vLLM's own ``_moe_C`` library:

* ``moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
  num_tokens_post_pad, maybe_expert_map, scatter_idx)``
* ``moe_sum(input, output, topk_ids, expert_map)``
* ``topk_softmax(topk_weights, topk_indices, token_expert_indices, gating_output,
  renormalize, bias, is_padding)``
* ``grouped_topk(scores, n_group, topk_group, topk, renormalize, routed_scaling_factor,
  bias, scoring_func) -> (weights, ids)``

CUDA only (the kernels use the stable ABI of torch >= 2.11).
"""

from __future__ import annotations

from pathlib import Path

import torch

SOURCES = (
    "csrc/moe/moe_align_sum_kernels.cu",
    "csrc/moe/topk_softmax_kernels.cu",
    "csrc/moe/grouped_topk_kernels.cu",
)

NO_CUDA_TYPE_FEATURES = (
    "HALF_OPERATORS",
    "HALF_CONVERSIONS",
    "BFLOAT16_CONVERSIONS",
    "HALF2_OPERATORS",
)

_REGISTRATION = r"""
// Registration of a vLLM source release's MoE aux kernels as torch.ops.peer_vllm
// (written by benchmarks/auxbench/vllm_peer.py into its scratch build folder).
#include <torch/csrc/stable/library.h>
#include "moe/moe_ops.h"

STABLE_TORCH_LIBRARY(peer_vllm, m) {
  m.def("moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
        "Tensor! sorted_token_ids, Tensor! experts_ids, Tensor! num_tokens_post_pad, "
        "Tensor? maybe_expert_map, Tensor(a!)? scatter_idx=None) -> ()");
  m.def("moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, "
        "Tensor? expert_map=None) -> ()");
  m.def("topk_softmax(Tensor! topk_weights, Tensor! topk_indices, "
        "Tensor! token_expert_indices, Tensor gating_output, bool renormalize, "
        "Tensor? bias, Tensor? is_padding) -> ()");
  m.def("grouped_topk(Tensor scores, int n_group, int topk_group, int topk, "
        "bool renormalize, float routed_scaling_factor, Tensor bias, "
        "int scoring_func) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(peer_vllm, CUDA, m) {
  m.impl("moe_align_block_size", TORCH_BOX(&moe_align_block_size));
  m.impl("moe_sum", TORCH_BOX(&moe_sum));
  m.impl("topk_softmax", TORCH_BOX(&topk_softmax));
  m.impl("grouped_topk", TORCH_BOX(&grouped_topk));
}
"""


def version(src: Path) -> str:
    """The release's name (its folder name, ``vllm-X.Y.Z``)."""
    return Path(src).resolve().name


def missing_sources(src: Path) -> list[str]:
    """The sources of ``SOURCES`` that ``src`` lacks (none: an unpacked vLLM release)."""
    return [s for s in SOURCES if not (Path(src) / s).is_file()]


def load(src: Path, build_dir: Path, verbose: bool = False):
    """Build (or reuse) and load the peer; returns ``torch.ops.peer_vllm``."""
    from torch.utils.cpp_extension import load as load_ext

    src = Path(src).resolve()
    missing = missing_sources(src)
    if missing:
        raise FileNotFoundError(f"{src} is not an unpacked vLLM source release: no {missing[0]}")
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    reg = build_dir / "peer_vllm_registration.cpp"
    if not reg.is_file() or reg.read_text() != _REGISTRATION:
        reg.write_text(_REGISTRATION)
    major, minor = torch.cuda.get_device_capability()
    defines = ["-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020B000000000000ULL"]
    load_ext(
        name="peer_vllm_moe",
        sources=[str(src / s) for s in SOURCES] + [str(reg)],
        extra_include_paths=[str(src / "csrc")],
        extra_cflags=["-O3", "-std=c++17", *defines],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            "--expt-relaxed-constexpr",
            # vLLM builds with CUDA's half/bfloat16 operators and conversions, which torch's
            # extension builder turns off by default
            *(f"-U__CUDA_NO_{x}__" for x in NO_CUDA_TYPE_FEATURES),
            f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}",
            *defines,
        ],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=verbose,
    )
    return torch.ops.peer_vllm
