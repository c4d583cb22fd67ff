"""Types shared by the reference (:mod:`aiter_aux.reference`) and the compiled ops.

This module is deliberately tiny and imports nothing of the package, so that the reference,
the validation and the ops can all import it without an import cycle.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["MoeSortOutput", "empty_moe_sort_output"]


class MoeSortOutput(NamedTuple):
    """The six outputs of ``moe_sort`` (see docs/ops.md), all on the device of ``topk_ids``.

    With ``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)``:

    * ``sorted_token_ids`` -- int32 ``[max_rows]``: ``t | (k << 24)`` for the pair ``(t, k)``
      placed in that row; padding rows hold ``M``.
    * ``sorted_weights`` -- float32 ``[max_rows]``: ``topk_weights[t, k]``; padding rows 0.0.
    * ``m_indices`` -- int32 ``[max_rows]``: the token ``t``; padding rows hold ``M``.
    * ``sorted_expert_ids`` -- int32 ``[max_rows // block_m]``: the expert of rows
      ``[b * block_m, (b + 1) * block_m)``.
    * ``num_valid_ids`` -- int32 ``[2]``: ``[rows including padding, M]``.
    * ``reverse_sorted`` -- int32 ``[M * topk]``: the row holding pair ``(t, k)`` at index
      ``t * topk + k``, or -1 when the pair is not local.

    Rows (and blocks) at or past ``num_valid_ids[0]`` are not written by the ops.
    """

    sorted_token_ids: torch.Tensor
    sorted_weights: torch.Tensor
    m_indices: torch.Tensor
    sorted_expert_ids: torch.Tensor
    num_valid_ids: torch.Tensor
    reverse_sorted: torch.Tensor


def empty_moe_sort_output(
    num_tokens: int, topk: int, max_rows: int, block_m: int, device
) -> MoeSortOutput:
    """Uninitialised (``torch.empty``) sort buffers of capacity ``max_rows`` on ``device``:
    int32/float32 ``[max_rows]`` x3, int32 ``[max_rows // block_m]``, int32 ``[2]`` and int32
    ``[num_tokens * topk]``.  The sort ops write only the rows they fill."""
    i32 = dict(dtype=torch.int32, device=device)
    return MoeSortOutput(
        torch.empty(max_rows, **i32),
        torch.empty(max_rows, dtype=torch.float32, device=device),
        torch.empty(max_rows, **i32),
        torch.empty(max_rows // block_m, **i32),
        torch.empty(2, **i32),
        torch.empty(num_tokens * topk, **i32),
    )
