"""The MXFP8 codec of the reference (OCP Microscaling Formats Specification v1.0, E4M3).

MXFP8 elements are OCP ``E4M3`` ("fn": exponent bias 7, 3 mantissa bits, max normal 448,
subnormal step 2^-9, no infinities, NaN is ``S.1111.111``), one ``e8m0`` scale per block of 32
consecutive elements of a row.  ``a_q`` holds one element byte per value as **uint8** (the
E4M3 bit pattern; ``a_q.view(torch.float8_e4m3fn)`` reinterprets it), like ``a_scale`` and the
MXFP4 ``a_q``.

Scale of a finite block with ``amax = max |x| > 0``::

    s = clamp(((bits(fp32(amax)) + 0x1FFFFF) >> 23) - 8, 1, 254)

``bits(fp32(amax))`` is the fp32 bit pattern of the (exact) amax; adding ``0x1FFFFF`` carries
into the exponent field exactly when the 23-bit mantissa exceeds ``0x600000``, i.e. when
``amax > 1.75 * 2^E`` (``E`` = the exponent of amax).  Since ``448 = 1.75 * 2^8`` this is
``ceil(log2(amax / 448)) + 127``: the smallest ``s`` with ``amax <= 448 * 2^(s - 127)``.  (A
bf16 subnormal amax has exponent field 0 and gets the clamp's 1.)  ``op_tests/test_mxfp8.py``
checks this formula against that definition for all 65,536 bf16 patterns.
"""

from __future__ import annotations

import torch

from .mxfp4 import _pow2_f64

#: Largest finite E4M3 magnitude and its code.
E4M3_MAX = 448.0
E4M3_MAX_CODE = 0x7E


def e4m3_values() -> torch.Tensor:
    """float64 [127]: the value of each non-negative finite E4M3 code 0x00..0x7E."""
    c = torch.arange(127, dtype=torch.int64)
    e, f = c >> 3, (c & 7).to(torch.float64)
    sub = f * 2.0**-9
    norm = (8.0 + f) * _pow2_f64(e - 10)
    return torch.where(e == 0, sub, norm)


def mxfp8_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """int64 e8m0 scale of finite blocks from their float32 ``amax >= 0`` (the module doc's
    formula; ``amax == 0`` -> 0)."""
    bits = amax.to(torch.float32).view(torch.int32).to(torch.int64)
    s = (((bits + 0x1FFFFF) >> 23) - 8).clamp(1, 254)
    return torch.where(bits == 0, 0, s)


_E4M3_LUT_CACHE: dict[torch.device, torch.Tensor] = {}


def _e4m3_lut(dev: torch.device) -> torch.Tensor:
    """uint8 [65536]: the E4M3 byte of the bf16 value with bit pattern u (round to nearest,
    ties to the even code, saturating at 448, subnormals with step 2^-9, sign bit 0x80 from
    u's sign).  Entries for Inf/NaN patterns are never used (such blocks are zeroed)."""
    lut = _E4M3_LUT_CACHE.get(dev)
    if lut is None:
        u = torch.arange(1 << 16, dtype=torch.int32)
        v = u.to(torch.int16).view(torch.bfloat16).to(torch.float64).abs()
        vals = e4m3_values()
        mid = (vals[:-1] + vals[1:]) / 2  # exact in float64
        # index of the first midpoint >= v (ties left: v == mid[i] gives code i)
        code = torch.searchsorted(mid, v.clamp_max(E4M3_MAX), right=False)
        tie = (code < mid.numel()) & (mid[code.clamp_max(mid.numel() - 1)] == v)
        code = torch.where(tie & (code % 2 == 1), code + 1, code)  # a tie goes to the even code
        code = code.clamp_max(E4M3_MAX_CODE).to(torch.uint8)
        code |= (u >= 0x8000).to(torch.uint8) << 7
        lut = code.to(dev)
        _E4M3_LUT_CACHE[dev] = lut
    return lut


def _quant_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 per_1x32 quantisation of bf16 ``x [m, d]`` -> (uint8 [m, d], uint8 [m, d/32]).

    ``q = x * 2^(127 - s)`` is computed as a bf16 multiply (exact whenever the product is a
    normal bf16 number, as in MXFP4); a product below 2^-126 keeps the sign of x and lies far
    below the smallest E4M3 midpoint 2^-10, so its code (0x00 or 0x80) is the same.  The E4M3
    byte of q is looked up from q's bf16 bit pattern.
    """
    m, d = x.shape
    nb = d // 32
    xb = x.reshape(m, nb, 32)
    lo, hi = torch.aminmax(xb, dim=2)  # NaN propagates
    nonfinite = ~(torch.isfinite(lo) & torch.isfinite(hi))
    amax = torch.maximum(hi, -lo).abs().to(torch.float32)  # exact
    amax = torch.where(nonfinite, 0.0, amax)
    s = mxfp8_scale_from_amax(amax)  # [m, nb], 0..254
    mult = _pow2_f64(127 - s).to(torch.bfloat16).unsqueeze(2)  # 2^(127-s): exact in bf16
    q = (xb * mult).reshape(m, d)
    idx = q.view(torch.int16).to(torch.int64)  # negative patterns wrap to u - 65536
    codes = _e4m3_lut(x.device)[idx]
    if bool(nonfinite.any()):
        codes.view(m, nb, 32).masked_fill_(nonfinite.unsqueeze(2), 0)
    scale_byte = torch.where(nonfinite, 255, s).to(torch.uint8)
    return codes, scale_byte


def _decode_mxfp8_rows(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """uint8 q [n, d], uint8 s [n, d/32] -> float64 [n, d]: E4M3 * 2^(s-127) (s = 255: NaN;
    code 0x7F/0xFF: NaN).  For tests and the pipeline's sanity checks."""
    vals = e4m3_values().to(q.device)
    qi = q.to(torch.int64)
    mag = torch.where((qi & 0x7F) == 0x7F, float("nan"), vals[(qi & 0x7F).clamp_max(126)])
    v = torch.where(qi >= 0x80, -mag, mag)
    n, cs = s.shape
    si = s.to(torch.int64)
    scale = torch.where(si == 255, float("nan"), _pow2_f64(si - 127))
    return (v.reshape(n, cs, 32) * scale.unsqueeze(2)).reshape(n, cs * 32)
