"""Plain-PyTorch reference of the MXFP4 MoE auxiliary ops: the executable form of docs/ops.md.

Every backend must reproduce these functions bit for bit.  The functions work on any device
(CPU or CUDA tensors) with ordinary tensor ops, vectorised and processed in chunks of rows
(on one CPU core, M = 65,536 tokens with model_dim = 7168: sort < 1 s, quant ~5 s,
sort_scales ~2 s, scatter_reduce ~15 s and scatter_reduce_q ~40 s at topk = 8).  A few
data-dependent sizes are read back to the host (a synchronisation on GPU).  Subnormal fp32
values must not be flushed (``torch.set_flush_denormal(False)``, the default).

Formats follow the OCP Microscaling (MX) Formats Specification v1.0: FP4 ``e2m1`` elements
(values ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` with a sign bit), ``e8m0`` shared scales (value
``2^(s - 127)``, ``s = 255`` is NaN), one scale per block of 32 consecutive elements of a row
(``per_1x32``).  Two e2m1 codes are packed per byte: element ``2j`` in the low nibble of byte
``j``, element ``2j + 1`` in the high nibble.

Each op has an allocating form and an ``_out`` form.  The allocating form allocates its
outputs with :func:`torch.empty` and calls the ``_out`` form, which writes only the region the
spec defines (rows of the sort outputs at or past ``num_valid_ids[0]`` keep whatever the
buffer held).  Input checks are in :mod:`aiter_aux.validation` and run before anything is
computed or written.
"""

from __future__ import annotations

import math

import torch

from aiter_aux import validation as V
from aiter_aux.types import MoeSortOutput, moe_sort_capacity

__all__ = [
    "MoeSortOutput",
    "moe_sort_capacity",
    "moe_sort",
    "moe_sort_out",
    "mxfp4_quant",
    "mxfp4_quant_out",
    "moe_sort_quant",
    "moe_sort_quant_out",
    "moe_sort_scales",
    "moe_sort_scales_out",
    "moe_scatter_reduce",
    "moe_scatter_reduce_out",
    "moe_scatter_reduce_q",
    "moe_scatter_reduce_q_out",
    "E2M1_VALUES",
]

#: The 16 e2m1 code values (code & 0x8 is the sign; -0.0 for code 0x8).
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip

# Process about this many elements per chunk (bounds temporary memory on big inputs).
_CHUNK_ELEMS = 1 << 22

# fp32(1/6) as an exact float64 (0x3E2AAAAB).
_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32).item())

# Magnitude-code thresholds on |q|, q = x * 2^(127 - s): code = number of thresholds passed,
# where "> t" for the ties that round down (to the even code) and ">= t" for those that round up.
#   |q| <= 0.25 -> 0; < 0.75 -> 1; <= 1.25 -> 2; < 1.75 -> 3; <= 2.5 -> 4; < 3.5 -> 5;
#   <= 5 -> 6; else 7.
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
               (2.5, False), (3.5, True), (5.0, False))  # fmt: skip


# --------------------------------------------------------------------------------------------
# moe_sort
# --------------------------------------------------------------------------------------------


def _as_int32(v: torch.Tensor) -> torch.Tensor:
    """int64 values in [-2^31, 2^32) -> int32 with two's-complement wrap-around."""
    return torch.where(v >= (1 << 31), v - (1 << 32), v).to(torch.int32)


@torch.no_grad()
def _sort_into(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    zero_buf: torch.Tensor | None,
) -> None:
    dev = topk_ids.device
    m, topk = topk_ids.shape
    n = m * topk
    e = num_experts
    i64 = dict(dtype=torch.int64, device=dev)

    ids = topk_ids.reshape(-1).to(torch.int64)
    local = (ids >= 0) & (ids < e)
    # Unique key: expert-major, pair index (t * topk + k) minor; non-local pairs sort last.
    key = torch.where(local, ids, e) * max(n, 1) + torch.arange(n, **i64)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(ids[local], minlength=e)[:e]  # pairs per expert
    n_local = int(counts.sum())
    padded = (counts + block_m - 1) // block_m * block_m  # rows per expert
    seg_start = torch.cumsum(padded, 0) - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    total = int(padded.sum())  # num_valid_ids[0]

    pairs = order[:n_local]  # local pair indices, in sorted order
    pe = ids[pairs]
    row = seg_start[pe] + (torch.arange(n_local, **i64) - cnt_start[pe])
    t = pairs // topk
    k = pairs % topk

    sti = torch.full((total,), m, **i64)
    sti[row] = t | (k << 24)
    sw = torch.zeros(total, dtype=torch.float32, device=dev)
    sw[row] = topk_weights.reshape(-1)[pairs]
    mi = torch.full((total,), m, **i64)
    mi[row] = t
    seid = torch.repeat_interleave(torch.arange(e, **i64), padded // block_m)
    rev = torch.full((n,), -1, **i64)
    rev[pairs] = row

    out.sorted_token_ids[:total].copy_(_as_int32(sti))
    out.sorted_weights[:total].copy_(sw)
    out.m_indices[:total].copy_(mi.to(torch.int32))
    out.sorted_expert_ids[: total // block_m].copy_(seid.to(torch.int32))
    out.num_valid_ids[:2].copy_(torch.tensor([total, m], dtype=torch.int32))
    out.reverse_sorted[:n].copy_(rev.to(torch.int32))
    if zero_buf is not None:
        zero_buf.zero_()


def _alloc_sort_out(m: int, topk: int, max_rows: int, block_m: int, dev) -> MoeSortOutput:
    i32 = dict(dtype=torch.int32, device=dev)
    return MoeSortOutput(
        torch.empty(max_rows, **i32),
        torch.empty(max_rows, dtype=torch.float32, device=dev),
        torch.empty(max_rows, **i32),
        torch.empty(max_rows // block_m, **i32),
        torch.empty(2, **i32),
        torch.empty(m * topk, **i32),
    )


def moe_sort_out(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    *,
    zero_buf: torch.Tensor | None = None,
) -> MoeSortOutput:
    """Sort the (token, k) routing pairs by expert into block_m-padded segments, into ``out``.

    A pair ``(t, k)`` with ``0 <= topk_ids[t, k] < num_experts`` is *local* and goes to that
    expert; any other id (-1 from an expert-parallel map, or out of range) is not placed and
    gets ``reverse_sorted[t * topk + k] = -1``.  Experts appear in ascending order; each
    expert's pairs are contiguous in ascending ``(t, k)`` order, and its segment is padded up to
    a multiple of ``block_m`` rows; an expert with no pairs takes no rows.

    Args:
        topk_ids: int32 ``[M, topk]``; ``M < 2**24``, ``1 <= topk <= 255``.
        topk_weights: float32 ``[M, topk]``.
        num_experts: ``1 <= num_experts <= 1024``.
        block_m: rows per block, one of 16, 32, 64, 128.
        out: the output buffers (see :class:`MoeSortOutput`), each exactly 1-D, contiguous,
            with at least ``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)``
            elements (``max_rows // block_m`` for sorted_expert_ids, 2 for num_valid_ids,
            ``M * topk`` for reverse_sorted).  Written: ``sorted_token_ids`` (``t | (k << 24)``,
            pad rows ``M``), ``sorted_weights`` (pad 0.0), ``m_indices`` (``t``, pad ``M``) for
            rows ``< num_valid_ids[0]``; ``sorted_expert_ids`` for blocks
            ``< num_valid_ids[0] / block_m``; ``num_valid_ids[:2] = [rows incl. padding, M]``;
            ``reverse_sorted[:M * topk]``.  Everything past that is left untouched.
        zero_buf: optional contiguous bf16 tensor (typically ``[M, model_dim]``), all of whose
            elements are set to +0.0.

    Returns:
        ``out`` as a :class:`MoeSortOutput`.

    Raises:
        TypeError: a tensor argument is not a tensor or has the wrong dtype; an int is not an int.
        ValueError: wrong shape, non-contiguous, mixed devices, ints out of range, buffers too
            small.
    """
    m, topk, max_rows = V.validate_moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf)
    out = V.validate_moe_sort_out(out, m, topk, max_rows, block_m, topk_ids.device)
    _sort_into(topk_ids, topk_weights, int(num_experts), int(block_m), out, zero_buf)
    return out


def moe_sort(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: torch.Tensor | None = None,
) -> MoeSortOutput:
    """Allocating form of :func:`moe_sort_out` (buffers from :func:`torch.empty`).

    Returns:
        A :class:`MoeSortOutput` on the device of ``topk_ids`` with ``sorted_token_ids``,
        ``sorted_weights``, ``m_indices`` of ``max_rows`` elements, ``sorted_expert_ids`` of
        ``max_rows // block_m``, ``num_valid_ids`` of 2 and ``reverse_sorted`` of ``M * topk``
        (``max_rows = moe_sort_capacity(M, topk, num_experts, block_m)``).  Rows at or past
        ``num_valid_ids[0]`` are uninitialised.

    Raises:
        TypeError, ValueError: as :func:`moe_sort_out`.
    """
    m, topk, max_rows = V.validate_moe_sort(topk_ids, topk_weights, num_experts, block_m, zero_buf)
    out = _alloc_sort_out(m, topk, max_rows, int(block_m), topk_ids.device)
    return moe_sort_out(topk_ids, topk_weights, num_experts, block_m, out, zero_buf=zero_buf)


# --------------------------------------------------------------------------------------------
# mxfp4_quant
# --------------------------------------------------------------------------------------------


def _pow2_f64(e: torch.Tensor) -> torch.Tensor:
    """Exact 2^e as float64 for int64 ``e`` in the normal float64 range."""
    return ((e + 1023) << 52).view(torch.float64)


_E2M1_LUT_CACHE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _e2m1_lut(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [65536] tables: e2m1 code (and code << 4) of the bf16 value with bit pattern u.

    Magnitude code of ``v = |bf16(u)|`` per the spec: ``v <= 0.25 -> 0; < 0.75 -> 1;
    <= 1.25 -> 2; < 1.75 -> 3; <= 2.5 -> 4; < 3.5 -> 5; <= 5 -> 6; else 7`` (round to
    nearest, ties to the even code, saturating at 6), plus 0x8 when the sign bit of u is set.
    Entries for Inf/NaN patterns are never used (such blocks are zeroed).
    """
    lut = _E2M1_LUT_CACHE.get(dev)
    if lut is None:
        u = torch.arange(1 << 16, dtype=torch.int32)
        v = u.to(torch.int16).view(torch.bfloat16).to(torch.float64).abs()
        code = torch.zeros(1 << 16, dtype=torch.uint8)
        for t, inclusive in _THRESHOLDS:
            code += (v >= t) if inclusive else (v > t)
        code |= (u >= 0x8000).to(torch.uint8) << 3
        lut = (code.to(dev), (code << 4).to(dev))
        _E2M1_LUT_CACHE[dev] = lut
    return lut


def _quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 per_1x32 quantisation of bf16 ``x [m, d]`` -> (uint8 [m, d/2], uint8 [m, d/32]).

    ``q = x * 2^(127 - s)`` is computed as a bf16 multiply: torch multiplies bf16 operands in
    fp32 and rounds to bf16, and the product of a bf16 value by a power of two is exact in both
    whenever it is a normal number.  When it is not (``|q| < 2^-126``) the rounded product
    keeps the sign of x and stays far below the first threshold 0.25, so the code (0 or 0x8) is
    the same.  The e2m1 code of q is then looked up from q's bf16 bit pattern.
    """
    m, d = x.shape
    nb = d // 32
    xb = x.reshape(m, nb, 32)
    lo, hi = torch.aminmax(xb, dim=2)  # NaN propagates
    nonfinite = ~(torch.isfinite(lo) & torch.isfinite(hi))  # some element is +-Inf or NaN
    amax = torch.maximum(hi, -lo).abs().to(torch.float64)  # exact; abs: max(+0, -0) may be -0
    amax = torch.where(nonfinite, 0.0, amax)
    # w = fp32(amax * fp32(1/6)): the float64 product is exact, so one rounding to fp32 (RNE).
    w = (amax * _SIXTH_F32).to(torch.float32)
    wb = w.view(torch.int32).to(torch.int64)
    s = ((wb + 0x7FFFFF) >> 23).clamp_max(254)  # [m, nb], 0..254
    mult = _pow2_f64(127 - s).to(torch.bfloat16).unsqueeze(2)  # 2^(127-s): exact in bf16
    q = (xb * mult).reshape(m, d)
    idx = q.view(torch.int16).to(torch.int64)  # negative patterns wrap to u - 65536
    lut, lut_hi = _e2m1_lut(x.device)
    packed = lut[idx[:, 0::2]] | lut_hi[idx[:, 1::2]]  # element 2j low nibble, 2j+1 high
    if bool(nonfinite.any()):
        packed.view(m, nb, 16).masked_fill_(nonfinite.unsqueeze(2), 0)
    scale_byte = torch.where(nonfinite, 255, s).to(torch.uint8)
    return packed, scale_byte


@torch.no_grad()
def _quant_into(x: torch.Tensor, a_q: torch.Tensor, a_scale: torch.Tensor) -> None:
    m, d = x.shape
    step = max(1, _CHUNK_ELEMS // d)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        q, s = _quant_rows(x[r0:r1])
        a_q[r0:r1].copy_(q)
        a_scale[r0:r1].copy_(s)


def mxfp4_quant_out(
    x: torch.Tensor, a_q: torch.Tensor, a_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (per_1x32) quantisation of ``x`` into ``a_q`` and ``a_scale``.

    Per block of 32 consecutive elements of a row (OCP MX spec v1.0, e2m1 + e8m0):

    * any NaN or +-Inf in the block -> scale byte 255 and the block's 16 bytes 0;
    * else ``amax = max |x|``, ``w = fp32(amax * fp32(1/6))`` (one RNE multiply),
      ``s = min(254, (bits(w) + 0x7FFFFF) >> 23)`` (the exponent of w rounded up);
    * each element: ``q = x * 2^(127 - s)`` exactly (subnormal inputs are not flushed), rounded
      to the nearest e2m1 value, ties to the even code, saturating at 6; the sign bit 0x8 is
      the sign bit of x (so -0.0 and small negatives give 0x8).

    Args:
        x: bf16 ``[M, model_dim]``, contiguous, ``model_dim`` a positive multiple of 32.
        a_q: uint8 ``[>= M, model_dim / 2]``: element ``2j`` in the low nibble of byte ``j``.
        a_scale: uint8 ``[>= M, model_dim / 32]``: e8m0 scale bytes, row-major.

    Returns:
        ``(a_q, a_scale)``; only their first M rows are written.

    Raises:
        TypeError: not tensors, or wrong dtypes.
        ValueError: wrong shapes, non-contiguous, mixed devices, model_dim % 32 != 0,
            buffers too small.
    """
    m, d = V.validate_mxfp4_quant(x)
    V.validate_mxfp4_quant_out(a_q, a_scale, m, d, x.device)
    _quant_into(x, a_q, a_scale)
    return a_q, a_scale


def mxfp4_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`mxfp4_quant_out`.

    Args:
        x: bf16 ``[M, model_dim]``, contiguous, ``model_dim % 32 == 0``.

    Returns:
        ``(a_q, a_scale)``: uint8 ``[M, model_dim / 2]`` (e2m1 pairs) and uint8
        ``[M, model_dim / 32]`` (e8m0), on the device of ``x``.

    Raises:
        TypeError, ValueError: as :func:`mxfp4_quant_out`.
    """
    m, d = V.validate_mxfp4_quant(x)
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=x.device)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=x.device)
    return mxfp4_quant_out(x, a_q, a_scale)


# --------------------------------------------------------------------------------------------
# moe_sort_quant
# --------------------------------------------------------------------------------------------


def moe_sort_quant_out(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x: torch.Tensor,
    num_experts: int,
    block_m: int,
    out: MoeSortOutput,
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    *,
    zero_buf: torch.Tensor | None = None,
) -> tuple[MoeSortOutput, torch.Tensor, torch.Tensor]:
    """:func:`moe_sort_out` and :func:`mxfp4_quant_out` in one call (one launch on GPU).

    ``x`` is bf16 ``[M, model_dim]`` with the same M as ``topk_ids``; every other argument is
    as in the two ops, and the outputs are identical to those of the separate ops.  All
    arguments are checked before anything is written.

    Returns:
        ``(out, a_q, a_scale)``.

    Raises:
        TypeError, ValueError: as the two ops, plus a ValueError if ``x`` has not M rows.
    """
    m, topk, max_rows, d = V.validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf
    )
    dev = topk_ids.device
    out = V.validate_moe_sort_out(out, m, topk, max_rows, block_m, dev)
    V.validate_mxfp4_quant_out(a_q, a_scale, m, d, dev)
    _sort_into(topk_ids, topk_weights, int(num_experts), int(block_m), out, zero_buf)
    _quant_into(x, a_q, a_scale)
    return out, a_q, a_scale


def moe_sort_quant(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x: torch.Tensor,
    num_experts: int,
    block_m: int,
    *,
    zero_buf: torch.Tensor | None = None,
) -> tuple[MoeSortOutput, torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, a_scale)``
    shaped as by :func:`moe_sort` and :func:`mxfp4_quant`.

    Raises:
        TypeError, ValueError: as :func:`moe_sort_quant_out`.
    """
    m, topk, max_rows, d = V.validate_moe_sort_quant(
        topk_ids, topk_weights, x, num_experts, block_m, zero_buf
    )
    dev = topk_ids.device
    out = _alloc_sort_out(m, topk, max_rows, int(block_m), dev)
    a_q = torch.empty(m, d // 2, dtype=torch.uint8, device=dev)
    a_scale = torch.empty(m, d // 32, dtype=torch.uint8, device=dev)
    return moe_sort_quant_out(
        topk_ids, topk_weights, x, num_experts, block_m, out, a_q, a_scale, zero_buf=zero_buf
    )


# --------------------------------------------------------------------------------------------
# moe_sort_scales
# --------------------------------------------------------------------------------------------


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
    m, d, max_rows, out_rows = V.validate_moe_sort_scales(
        a_scale, sorted_token_ids, num_valid_ids, block_m
    )
    V.validate_moe_sort_scales_out(sorted_scales, out_rows, d, a_scale.device)
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
    _, d, _, out_rows = V.validate_moe_sort_scales(
        a_scale, sorted_token_ids, num_valid_ids, block_m
    )
    sorted_scales = torch.empty(out_rows, d // 32, dtype=torch.uint8, device=a_scale.device)
    return moe_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales)


# --------------------------------------------------------------------------------------------
# moe_scatter_reduce / moe_scatter_reduce_q
# --------------------------------------------------------------------------------------------


_DECODE_CACHE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _decode_tables(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 [256, 2], float32 [256]): the two e2m1 values of a byte (low nibble first) and
    the e8m0 value 2^(s - 127) of a scale byte (s = 0: the fp32 subnormal 2^-127; s = 255: NaN).
    """
    tabs = _DECODE_CACHE.get(dev)
    if tabs is None:
        e2m1 = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        b = torch.arange(256)
        pair = torch.stack((e2m1[b & 0xF], e2m1[b >> 4]), dim=1)
        e8m0 = [math.ldexp(1.0, v - 127) for v in range(255)] + [math.nan]
        scale = torch.tensor(e8m0, dtype=torch.float64).to(torch.float32)  # all exact
        tabs = (pair.to(dev), scale.to(dev))
        _DECODE_CACHE[dev] = tabs
    return tabs


def _decode_mxfp4_rows(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """uint8 q [n, d/2], uint8 s [n, d/32] -> float32 [n, d]: e2m1 * 2^(s-127), one fp32 mul."""
    n, cs = s.shape
    pair, scale = _decode_tables(q.device)
    # gather both floats of a byte at once (as one 64-bit word): element 2j from the low nibble
    vals = torch.take(pair.view(torch.int64).reshape(256), q.to(torch.int64))
    vals = vals.view(torch.float32).reshape(n, cs, 32)
    vals.mul_(scale[s.to(torch.int64)].unsqueeze(2))
    return vals.reshape(n, cs * 32)


@torch.no_grad()
def _scatter_into(rows_fn, reverse_sorted, sorted_weights, topk, m, d, out) -> None:
    """out[t] = bf16(sum_k fp32(rows(p)) * w[p]) with separately rounded fp32 mul and add.

    ``rows_fn(p)`` returns the rows ``p`` of expert_out as a new float32 tensor (modified in
    place).  A pair with ``p < 0`` contributes +0.0 instead of being skipped, which gives the
    same bits: the accumulator starts at +0.0 and an fp32 sum is -0.0 only when both operands
    are -0.0 (an exact zero sum rounds to +0.0, and sums never underflow to zero), so the
    accumulator is never -0.0 and ``acc + 0.0 == acc`` (a NaN stays a NaN, output 0x7FC0).
    """
    rev = reverse_sorted.view(m, topk).to(torch.int64)
    step = max(1, _CHUNK_ELEMS // d)
    for t0 in range(0, m, step):
        t1 = min(m, t0 + step)
        acc = torch.zeros(t1 - t0, d, dtype=torch.float32, device=out.device)
        for k in range(topk):
            p = rev[t0:t1, k]
            valid = p >= 0
            n_valid = int(valid.sum())
            if n_valid == 0:
                continue
            pc = p.clamp_min(0)  # rows >= 1 here, since some p is a valid row
            prod = rows_fn(pc).mul_(sorted_weights[pc].unsqueeze(1))  # fp32 product
            if n_valid < p.numel():
                prod.index_fill_(0, torch.nonzero(~valid).squeeze(1), 0.0)
            acc.add_(prod)  # fp32 sum: a separate op, no fused multiply-add
        out[t0:t1].copy_(_bf16_rne(acc))


def _bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, round to nearest even, every NaN -> 0x7FC0 (the canonical quiet NaN).

    Written out with integer ops rather than ``x.to(torch.bfloat16)``: torch's scalar
    conversion (c10::BFloat16) gives 0x7FC0 for NaN, but ``Tensor.to(torch.bfloat16)`` of a
    float32 CPU tensor gives 0xFFFF (torch 2.13), and other devices' conversions may differ.
    For every non-NaN input this equals torch's round-to-nearest-even conversion.
    """
    bits = x.view(torch.int32)
    r = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16  # no overflow for non-NaN inputs
    r = r.to(torch.int16).masked_fill_(torch.isnan(x), 0x7FC0)
    return r.view(torch.bfloat16)


def moe_scatter_reduce_out(
    expert_out: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """Weighted sum of each token's expert rows back in token order, into ``out``.

    ``out[t] = bf16_rne(sum over k = 0..topk-1, in order, of fp32(expert_out[p]) *
    sorted_weights[p])`` with ``p = reverse_sorted[t*topk + k]``, skipping ``p < 0``; each
    product and each sum is rounded to fp32 separately (no fused multiply-add), starting from
    +0.0.  A token with no local pairs gets +0.0.  ``bf16_rne(NaN)`` is 0x7FC0 for every NaN
    (whatever its sign and payload).

    Args:
        expert_out: bf16 ``[rows, model_dim]`` in sorted order.
        reverse_sorted: int32 ``[M * topk]`` from moe_sort.
        sorted_weights: float32 ``[>= rows]`` from moe_sort.
        topk: ``1 <= topk <= 255``; ``M = len(reverse_sorted) // topk``.
        out: bf16 ``[>= M, model_dim]``; the first M rows are written.

    Returns:
        ``out``.

    Raises:
        TypeError, ValueError: wrong types/dtypes/shapes, topk out of range, mixed devices,
            output too small, or some ``p >= rows`` (ValueError).
    """
    m, rows, d = V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    V.validate_moe_scatter_reduce_out(out, m, d, expert_out.device)
    V.validate_reverse_sorted_range(reverse_sorted, rows)
    _scatter_into(
        lambda p: torch.index_select(expert_out, 0, p).to(torch.float32),
        reverse_sorted,
        sorted_weights,
        int(topk),
        m,
        d,
        out,
    )
    return out


def moe_scatter_reduce(
    expert_out: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Allocating form of :func:`moe_scatter_reduce_out`.

    Returns:
        ``out``: bf16 ``[M, model_dim]``, ``M = len(reverse_sorted) // topk``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_out`.
    """
    m, _, d = V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out.device)
    return moe_scatter_reduce_out(expert_out, reverse_sorted, sorted_weights, topk, out)


def moe_scatter_reduce_q_out(
    expert_out_q: torch.Tensor,
    expert_out_scale: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """:func:`moe_scatter_reduce_out` with ``expert_out`` in MXFP4.

    Each element is decoded as ``e2m1 * 2^(s - 127)`` in fp32 (one fp32 multiply; ``s = 255``
    gives NaN for the whole block, ``s = 0`` gives the fp32 subnormal 2^-127, not flushed),
    then reduced exactly as in :func:`moe_scatter_reduce_out`.

    Args:
        expert_out_q: uint8 ``[rows, model_dim / 2]`` (e2m1, element 2j in the low nibble).
        expert_out_scale: uint8 ``[rows, model_dim / 32]`` (e8m0, row-major).
        reverse_sorted: int32 ``[M * topk]``.
        sorted_weights: float32 ``[>= rows]``.
        topk: ``1 <= topk <= 255``.
        out: bf16 ``[>= M, model_dim]``; the first M rows are written.

    Returns:
        ``out``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_out`.
    """
    m, rows, d = V.validate_moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )
    V.validate_moe_scatter_reduce_out(out, m, d, expert_out_q.device)
    V.validate_reverse_sorted_range(reverse_sorted, rows)
    _scatter_into(
        lambda p: _decode_mxfp4_rows(
            torch.index_select(expert_out_q, 0, p), torch.index_select(expert_out_scale, 0, p)
        ),
        reverse_sorted,
        sorted_weights,
        int(topk),
        m,
        d,
        out,
    )
    return out


def moe_scatter_reduce_q(
    expert_out_q: torch.Tensor,
    expert_out_scale: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Allocating form of :func:`moe_scatter_reduce_q_out`.

    Returns:
        ``out``: bf16 ``[M, model_dim]``, ``M = len(reverse_sorted) // topk``.

    Raises:
        TypeError, ValueError: as :func:`moe_scatter_reduce_q_out`.
    """
    m, _, d = V.validate_moe_scatter_reduce_q(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
    )
    out = torch.empty(m, d, dtype=torch.bfloat16, device=expert_out_q.device)
    return moe_scatter_reduce_q_out(
        expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out
    )
