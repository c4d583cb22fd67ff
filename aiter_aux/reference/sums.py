"""Reference ``moe_sum[_out]``: the sum of each token's ``topk`` rows in fp32, rounded once to
the rows' dtype (float32, float16 or bfloat16), with vLLM's skipping of non-local slots and
SGLang's routed scaling as options.  The arithmetic is that of
:func:`aiter_aux.reference.compat.vllm_moe_sum` and
:func:`~aiter_aux.reference.compat.sglang_moe_sum_reduce` (docs/compat.md)."""

from __future__ import annotations

import torch

from aiter_aux.validation import _checks as C

from .compat import _reduce_into, sum_slots

__all__ = ["moe_sum", "moe_sum_out"]


@torch.no_grad()
def moe_sum_out(
    input: torch.Tensor,
    output: torch.Tensor,
    *,
    topk_ids: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Sum of each token's ``topk`` rows, into ``output``.

    ``output[t] = round(fp32(acc) * fp32(routed_scaling_factor))`` with ``acc`` the fp32 sum
    over ``k = 0..topk-1`` in order of ``fp32(input[t, k])``, starting from +0.0, each add
    rounded to fp32; ``round`` is to the dtype of ``input`` (round to nearest even, subnormals
    kept) and writes every NaN as 0x7FFF (float16, bfloat16) or 0x7FFFFFFF (float32).  With
    ``topk_ids`` a slot ``(t, k)`` with ``topk_ids[t, k] < 0`` adds nothing; with
    ``expert_map`` too, neither does one whose id is ``>= expert_map.numel()`` or has
    ``expert_map[id] < 0``.  A token with no slot summed gets +0.0 (times the factor).
    1.0 gives the plain sum's bytes.

    Args:
        input: float32, float16 or bfloat16 ``[M, topk, model_dim]``, ``topk >= 1``.
        output: ``input``'s dtype, ``[>= M, model_dim]``; the first M rows are written.
        topk_ids: optional int32 ``[M, topk]``.
        expert_map: optional int32 1-D (global id -> local expert); needs ``topk_ids``.
        routed_scaling_factor: a float (rounded to fp32).

    Returns:
        ``output``.

    Raises:
        TypeError, ValueError: wrong types/dtypes/shapes, mixed devices, ``output`` too small
            or overlapping an input.
    """
    s = C.moe_sum_out(
        input, output, topk_ids=topk_ids, expert_map=expert_map,
        routed_scaling_factor=routed_scaling_factor, read_data=True,
    )  # fmt: skip
    scale = float(routed_scaling_factor)
    _reduce_into(
        input, output[: s.M], sum_slots(topk_ids, expert_map), None if scale == 1.0 else scale
    )
    return output


def moe_sum(
    input: torch.Tensor,
    *,
    topk_ids: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Allocating form of :func:`moe_sum_out`.

    Returns:
        ``output``: ``input``'s dtype, ``[M, model_dim]``.

    Raises:
        TypeError, ValueError: as :func:`moe_sum_out`.
    """
    s = C.moe_sum(
        input, topk_ids=topk_ids, expert_map=expert_map,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
    output = torch.empty(s.M, s.model_dim, dtype=input.dtype, device=input.device)
    return moe_sum_out(
        input, output, topk_ids=topk_ids, expert_map=expert_map,
        routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip
