"""Reference of the ops ``moe_align_block_size_vllm[_out]`` and
``moe_align_block_size_sglang[_out]``: our sort in vLLM's and SGLang's output formats.

The formats are those of :mod:`.compat` (docs/compat.md), on the op's inputs: ids and map
values that would make the peers read out of bounds are dropped here (the op does not read
tensor values to check them; :mod:`aiter_aux.compat` raises for them where that is free).
vLLM's ``expert_map`` has two meanings, so the op takes two options: ``expert_map`` (with
``ignore_invalid_experts``: a pair's expert is ``expert_map[id]``, -1 drops it) and
``block_expert_map`` (without it: the blocks of expert ``e`` are labelled
``block_expert_map[e]``, and the blocks past the used ones its last entry).
"""

from __future__ import annotations

import torch

from aiter_aux.validation import _checks as C

from .compat import _align

__all__ = [
    "moe_align_block_size_vllm",
    "moe_align_block_size_vllm_out",
    "moe_align_block_size_sglang",
    "moe_align_block_size_sglang_out",
]


def _outs(topk_ids, cap, n_blocks):
    kw = dict(dtype=torch.int32, device=topk_ids.device)
    n = topk_ids.numel()
    return torch.empty(cap, **kw), torch.empty(n_blocks, **kw), torch.empty(1, **kw), \
        torch.empty(n, **kw)  # fmt: skip


def _capacity(sorted_token_ids, expert_ids, block_size) -> int:
    """The rows the op writes: all of ``sorted_token_ids`` as far as ``expert_ids`` has a
    block for them."""
    return min(sorted_token_ids.numel(), expert_ids.numel() * block_size)


def _write(outs, sorted_ids, expert_ids, total, scatter_idx):
    sti, eid, post, sc = outs
    sti[: sorted_ids.numel()] = sorted_ids
    eid[: expert_ids.numel()] = expert_ids
    post[0] = total[0]
    sc[: scatter_idx.numel()] = scatter_idx
    return outs


@torch.no_grad()
def _vllm(topk_ids, num_experts, block_size, cap, expert_map, block_expert_map):
    ids = topk_ids.reshape(-1).to(torch.int64)
    e = num_experts
    local = torch.where((ids >= 0) & (ids < e), ids, -1)
    if expert_map is not None:
        mapped = expert_map.to(torch.int64)[local.clamp_min(0)]
        local = torch.where((local >= 0) & (mapped >= 0) & (mapped < e), mapped, -1)
    sorted_ids, expert_ids, total = _align(local, e, block_size, cap,
                                           torch.arange(e, device=ids.device))  # fmt: skip
    if block_expert_map is not None:
        expert_ids = block_expert_map.to(torch.int64)[expert_ids.to(torch.int64)].to(torch.int32)
    idx = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    return sorted_ids, expert_ids, total, torch.where(local >= 0, idx, -1)


@torch.no_grad()
def _sglang(topk_ids, num_experts, block_size, cap):
    ids = topk_ids.reshape(-1).to(torch.int64)
    e = num_experts
    bucket = torch.where((ids >= -1) & (ids < e), ids + 1, -1)
    sorted_ids, expert_ids, total = _align(bucket, e + 1, block_size, cap,
                                           torch.arange(-1, e, device=ids.device))  # fmt: skip
    idx = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    return sorted_ids, expert_ids, total, torch.where(bucket >= 0, idx, -1)


Tensor = torch.Tensor
Outs = tuple[Tensor, Tensor, Tensor, Tensor]


def moe_align_block_size_vllm_out(
    topk_ids: Tensor, num_experts: int, block_size: int, sorted_token_ids: Tensor,
    expert_ids: Tensor, num_tokens_post_pad: Tensor, scatter_idx: Tensor, *,
    expert_map: Tensor | None = None, block_expert_map: Tensor | None = None,
) -> Outs:  # fmt: skip
    """vLLM's format into the buffers: rows ``[0, cap)``, ``cap = min(len(sorted_token_ids),
    len(expert_ids) * block_size)`` (a buffer longer than the op's capacity gets padding
    rows), blocks ``[0, ceil(cap / block_size))``, ``num_tokens_post_pad[0]`` and
    ``scatter_idx``; anything past that is untouched.  Returns the four buffers."""
    C.moe_align_block_size_vllm_out(
        topk_ids, num_experts, block_size, sorted_token_ids, expert_ids, num_tokens_post_pad,
        scatter_idx, expert_map=expert_map, block_expert_map=block_expert_map, read_data=True,
    )  # fmt: skip
    cap = _capacity(sorted_token_ids, expert_ids, block_size)
    res = _vllm(topk_ids, num_experts, block_size, cap, expert_map, block_expert_map)
    outs = (sorted_token_ids, expert_ids, num_tokens_post_pad, scatter_idx)
    return _write(outs, *res)


def moe_align_block_size_vllm(
    topk_ids: Tensor, num_experts: int, block_size: int, *, expert_map: Tensor | None = None,
    block_expert_map: Tensor | None = None,
) -> Outs:  # fmt: skip
    """Allocating :func:`moe_align_block_size_vllm_out`: buffers of vLLM's capacity
    without ``pad_sorted_ids``."""
    s = C.moe_align_block_size_vllm(topk_ids, num_experts, block_size, expert_map=expert_map,
                                    block_expert_map=block_expert_map, read_data=True)  # fmt: skip
    outs = _outs(topk_ids, s.cap, s.n_blocks)
    return moe_align_block_size_vllm_out(topk_ids, num_experts, block_size, *outs,
                                         expert_map=expert_map,
                                         block_expert_map=block_expert_map)  # fmt: skip


def moe_align_block_size_sglang_out(
    topk_ids: Tensor, num_experts: int, block_size: int, sorted_token_ids: Tensor,
    expert_ids: Tensor, num_tokens_post_pad: Tensor, scatter_idx: Tensor,
) -> Outs:  # fmt: skip
    """SGLang's format into the buffers, written as
    :func:`moe_align_block_size_vllm_out` writes.  Returns the four."""
    C.moe_align_block_size_sglang_out(
        topk_ids, num_experts, block_size, sorted_token_ids, expert_ids, num_tokens_post_pad,
        scatter_idx, read_data=True,
    )  # fmt: skip
    cap = _capacity(sorted_token_ids, expert_ids, block_size)
    res = _sglang(topk_ids, num_experts, block_size, cap)
    outs = (sorted_token_ids, expert_ids, num_tokens_post_pad, scatter_idx)
    return _write(outs, *res)


def moe_align_block_size_sglang(topk_ids: Tensor, num_experts: int, block_size: int) -> Outs:
    """Allocating :func:`moe_align_block_size_sglang_out`."""
    s = C.moe_align_block_size_sglang(topk_ids, num_experts, block_size, read_data=True)
    outs = _outs(topk_ids, s.cap, s.n_blocks)
    return moe_align_block_size_sglang_out(topk_ids, num_experts, block_size, *outs)
