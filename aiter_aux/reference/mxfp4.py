"""The MXFP4 codec of the reference (OCP Microscaling Formats Specification v1.0).

* Quantisation of bf16 rows to e2m1 elements with one e8m0 scale per 32 elements
  (:func:`_quant_rows`, through the bf16-bit-pattern -> e2m1-code table :func:`_e2m1_lut`).
* Decoding of e2m1 bytes and e8m0 scale bytes to fp32 (:func:`_decode_tables`,
  :func:`_decode_mxfp4_rows`).
* The fp32 -> bf16 round-to-nearest-even conversion with every NaN -> 0x7FC0
  (:func:`_bf16_rne`).
"""

from __future__ import annotations

import math

import torch

#: The 16 e2m1 code values (code & 0x8 is the sign; -0.0 for code 0x8).
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip


# fp32(1/6) as an exact float64 (0x3E2AAAAB).
_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32).item())

# Magnitude-code thresholds on |q|, q = x * 2^(127 - s): code = number of thresholds passed,
# where "> t" for the ties that round down (to the even code) and ">= t" for those that round up.
#   |q| <= 0.25 -> 0; < 0.75 -> 1; <= 1.25 -> 2; < 1.75 -> 3; <= 2.5 -> 4; < 3.5 -> 5;
#   <= 5 -> 6; else 7.
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
               (2.5, False), (3.5, True), (5.0, False))  # fmt: skip


# --------------------------------------------------------------------------------------------
# quantisation
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


# --------------------------------------------------------------------------------------------
# decoding and bf16 rounding
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
