"""Reference ``moe_sort_scales[_out]``: the e8m0 scales of the sorted rows gathered into the
preshuffled layout of the a4w4 GEMM."""

from __future__ import annotations

import torch

from aiter_aux.validation import _checks as C

__all__ = ["moe_sort_scales", "moe_sort_scales_out"]


def moe_sort_scales_out(
    a_scale: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    num_valid_ids: torch.Tensor,
    block_m: int,
    sorted_scales: torch.Tensor,
) -> torch.Tensor:
    """Gather the e8m0 scales of the sorted rows into the preshuffled layout of the a4w4 GEMM.

    With ``BM = max(32, block_m)``, ``C_M1 = BM / 32``, ``C_K1 = model_dim / 256``, the output
    is ``ceil(max_rows / BM)`` chunks of ``C_M1 * C_K1 * 64`` dwords; dword
    ``w = ((((c*C_M1 + mi)*C_K1 + ku)*4 + kl)*16 + nl)`` holds in byte ``2*ik + ia``
    (``ik, ia in {0, 1}``) ``a_scale[token(row), 8*ku + 4*ik + kl]`` where
    ``row = c*BM + (2*mi + ia)*16 + nl`` and ``token(row) = sorted_token_ids[row] & 0xFFFFFF``.
    A row that is padding (``token >= M``), at/after ``num_valid_ids[0]`` or at/after
    ``max_rows`` gives byte 0.

    Args:
        a_scale: uint8 ``[M, model_dim / 32]`` (e8m0, from mxfp4_quant), ``model_dim % 256 == 0``.
        sorted_token_ids: int32 ``[max_rows]`` from moe_sort, ``max_rows % block_m == 0``.
        num_valid_ids: int32 ``[2]`` from moe_sort (element 0 is read, on the device).
        block_m: the block_m of the sort, one of 16, 32, 64, 128.
        sorted_scales: uint8 ``[>= ceil(max_rows / BM) * BM, model_dim / 32]``; every byte of
            the first ``ceil(max_rows / BM) * BM`` rows is written.

    Returns:
        ``sorted_scales``.

    Raises:
        TypeError, ValueError: wrong types/dtypes/shapes, model_dim % 256 != 0, bad block_m,
            max_rows % block_m != 0, output too small.
    """
    s = C.moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)
    m, d, max_rows, out_rows = s.M, s.model_dim, s.max_rows, s.out_rows
    with torch.no_grad():
        dev = a_scale.device
        cols = d // 32
        bm = max(32, int(block_m))
        nc = out_rows // bm
        row = torch.arange(out_rows, dtype=torch.int64, device=dev)
        tok = torch.zeros(out_rows, dtype=torch.int64, device=dev)
        tok[:max_rows] = sorted_token_ids.to(torch.int64) & 0xFFFFFF
        valid = (row < max_rows) & (row < num_valid_ids[0].to(torch.int64)) & (tok < m)
        if m > 0:
            g = a_scale[torch.where(valid, tok, 0)]
            g.masked_fill_(~valid.unsqueeze(1), 0)
        else:
            g = torch.zeros(out_rows, cols, dtype=torch.uint8, device=dev)
        # row = ((c*C_M1 + mi)*2 + ia)*16 + nl ; col = (ku*2 + ik)*4 + kl
        # byte = ((((((c*C_M1 + mi)*C_K1 + ku)*4 + kl)*16 + nl)*2 + ik)*2 + ia
        g = g.reshape(nc, bm // 32, 2, 16, cols // 8, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
        sorted_scales[:out_rows].copy_(g.reshape(out_rows, cols))
    return sorted_scales


def moe_sort_scales(
    a_scale: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    num_valid_ids: torch.Tensor,
    block_m: int,
) -> torch.Tensor:
    """Allocating form of :func:`moe_sort_scales_out`.

    Returns:
        ``sorted_scales``: uint8 ``[ceil(max_rows / BM) * BM, model_dim / 32]``,
        ``BM = max(32, block_m)``, on the device of ``a_scale``.

    Raises:
        TypeError, ValueError: as :func:`moe_sort_scales_out`.
    """
    s = C.moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)
    d, out_rows = s.model_dim, s.out_rows
    sorted_scales = torch.empty(out_rows, d // 32, dtype=torch.uint8, device=a_scale.device)
    return moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)
