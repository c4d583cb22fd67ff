// The per-element / per-block arithmetic of mxfp4_quant (docs/ops.md is the
// spec): scale exponent, the exact general path (threshold compares), the
// packed bf16x2 path (sm_90 and the emulation), the gfx950 instruction path
// and quant8, which picks among them.  The kernels are in quant.h.
//
// Arithmetic: the scale needs one fp32 multiply (amax * fp32(1/6)), done on
// normal operands only (tiny amax is pre-scaled by 2^64 exactly, see
// mx_scale_exponent), so no denormal mode can change it.  Element codes: on
// sm_90 (and in the emulation) a block with 2^-103 <= max |x| < inf (every
// block but tiny, NaN or Inf ones) takes the packed bf16x2 path mx_pack8_pk
// (one fma per two elements, exact: see there); the other blocks, and every
// block elsewhere, go through quant8: integer comparisons of |x|'s bits
// against the seven rounding thresholds of the e2m1 grid scaled by 2^(s-127)
// (exact, mode-independent), or on gfx950, for max |x| >= 2^-119,
// v_cvt_scalef32_pk_fp4_bf16 (see quant8 for why its result equals the spec).
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace quant_detail {

// fp32(1/6)
constexpr uint32_t kOneSixthBits = 0x3E2AAAABu;

// e8m0 exponent s of a finite block, from the bf16 bits of its max |x| (sign
// cleared, < 0x7F80):  w = fp32(amax * fp32(1/6)),
// s = min(254, (bits(w) + 0x7FFFFF) >> 23).
__host__ __device__ __forceinline__ uint32_t mx_scale_exponent(uint32_t amax16) {
  if (amax16 == 0) return 0;
  const float c = as_f32_any(kOneSixthBits);
  if (amax16 >= 0x0C00u) {
    // amax >= 2^-103: operands and product are normal fp32.
    const float w = as_f32_any(amax16 << 16) * c;
    const uint32_t s = (as_u32_any(w) + 0x7FFFFFu) >> 23;
    return s < 254u ? s : 254u;
  }
  // amax < 2^-103: compute w' = fp32(amax * 2^64 * c) with normal operands.
  // Where the exact product amax*c is >= 2^-126, w = w' * 2^-64 exactly (both
  // normal, same rounding), so s = s' - 64.  Below 2^-126, w (rounded in the
  // subnormal range) is at most 2^-126 and nonzero, so s = 1; then s' <= 65.
  float a;
  if (amax16 >= 0x0080u) {
    a = as_f32_any((amax16 + (64u << 7)) << 16);  // exponent field + 64
  } else {
    a = static_cast<float>(amax16) * as_f32_any(0x1D000000u);  // m * 2^-133 * 2^64 = m * 2^-69
  }
  const float w = a * c;
  const int s = static_cast<int>((as_u32_any(w) + 0x7FFFFFu) >> 23) - 64;
  return s > 1 ? static_cast<uint32_t>(s) : 1u;
}

// fp32 bits of t * 2^(s-127) for a threshold t = 1.x * 2^k with at most 3
// significant bits and exponent field >= 125; saturates to +inf bits.
__host__ __device__ __forceinline__ uint32_t scale_threshold(uint32_t tbits, uint32_t s) {
  const int e = static_cast<int>(tbits >> 23) + static_cast<int>(s) - 127;
  const uint32_t mant = tbits & 0x7FFFFFu;
  if (e >= 255) return 0x7F800000u;
  if (e >= 1) return (static_cast<uint32_t>(e) << 23) | mant;
  return (0x800000u | mant) >> (1 - e);  // e >= -2 here: exact subnormal
}

// |x| (bf16 bits) > T  <=>  a16 > (T >> 16);  |x| >= T  <=>  a16 > ceil(T / 2^16) - 1.
__host__ __device__ __forceinline__ uint32_t gt_bound(uint32_t t) {
  return t >> 16;
}
__host__ __device__ __forceinline__ uint32_t ge_bound(uint32_t t) {
  return ((t + 0xFFFFu) >> 16) - 1u;
}

// The seven 16-bit bounds of block exponent s: code(|x|) = #{i : a16 > U[i]}.
// Magnitude code: |q| <= 0.25 -> 0; < 0.75 -> 1; <= 1.25 -> 2; < 1.75 -> 3;
// <= 2.5 -> 4; < 3.5 -> 5; <= 5 -> 6; else 7, with q = x * 2^(127-s), i.e.
// |x| compared with t * 2^(s-127).
struct Bounds {
  uint32_t u[7];
};

__host__ __device__ __forceinline__ Bounds mx_bounds(uint32_t s) {
  Bounds b;
  if (s >= 3u && s <= 252u) {
    // Every scaled threshold is a normal fp32 (exponent field 125..129 plus
    // s - 127 stays in [1, 254]) with zero low 16 bits: gt_bound is its bf16
    // bits, ge_bound those minus 1, and scaling adds (s - 127) << 7.
    const uint32_t d = (s - 127u) << 7;  // mod 2^32
    b.u[0] = 0x3E80u + d;
    b.u[1] = 0x3F3Fu + d;
    b.u[2] = 0x3FA0u + d;
    b.u[3] = 0x3FDFu + d;
    b.u[4] = 0x4020u + d;
    b.u[5] = 0x405Fu + d;
    b.u[6] = 0x40A0u + d;
    return b;
  }
  b.u[0] = gt_bound(scale_threshold(0x3E800000u, s));  // q > 0.25
  b.u[1] = ge_bound(scale_threshold(0x3F400000u, s));  // q >= 0.75
  b.u[2] = gt_bound(scale_threshold(0x3FA00000u, s));  // q > 1.25
  b.u[3] = ge_bound(scale_threshold(0x3FE00000u, s));  // q >= 1.75
  b.u[4] = gt_bound(scale_threshold(0x40200000u, s));  // q > 2.5
  b.u[5] = ge_bound(scale_threshold(0x40600000u, s));  // q >= 3.5
  b.u[6] = gt_bound(scale_threshold(0x40A00000u, s));  // q > 5
  return b;
}

// e2m1 nibble of one bf16 element of a finite block.
__host__ __device__ __forceinline__ uint32_t mx_code(uint32_t h, const Bounds& b) {
  const uint32_t a = h & 0x7FFFu;
  uint32_t c = 0;
  for (int i = 0; i < 7; ++i) c += (a > b.u[i]) ? 1u : 0u;
  return c | ((h >> 12) & 0x8u);
}

// (No `#pragma unroll` in these __host__ __device__ helpers: host compilers
// warn about it; the constant-trip loops are unrolled by the device compilers.)
// Software conversion of 8 elements (w[j] = elements 2j | 2j+1 << 16) of a
// finite block with exponent s; element i goes to nibble i.
__host__ __device__ __forceinline__ uint32_t mx_pack8_sw(const uint32_t w[4], uint32_t s) {
  const Bounds b = mx_bounds(s);
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j) {
    out |= mx_code(w[j] & 0xFFFFu, b) << (8 * j);
    out |= mx_code(w[j] >> 16, b) << (8 * j + 4);
  }
  return out;
}

// ---- packed bf16x2 fast path (sm_90 and the emulation) ----
// AITER_AUX_QUANT_PK (the path exists) / AITER_AUX_QUANT_PK_HW (with the sm_90
// instructions) and its packed operations pk_max_u16, pk_addmax_s16 and
// pk_fma_bf16 are in target_ops.h.

// e8m0 exponent of a block whose max |x| bits are a16 with 0x0C00 <= a16 <
// 0x7F80, given as a = a16 << 16 (fp32 bits): mx_scale_exponent's normal
// branch without its clamp (s <= 253 for every finite max, checked
// exhaustively by the emulator self-test).
__host__ __device__ __forceinline__ uint32_t mx_scale_exponent_normal(uint32_t a) {
  const float w = as_f32_any(a) * as_f32_any(kOneSixthBits);
  return (as_u32_any(w) + 0x7FFFFFu) >> 23;
}

#if AITER_AUX_QUANT_PK
// Element codes of 8 elements (w[j] = elements 2j | 2j+1 << 16) of a finite
// block with exponent 3 <= s <= 253, every |x| <= 6 * 2^(s-127) (true of
// every element of a block whose max |x| gave s; see mx_scale_exponent).
// Element i goes to nibble i.  kp, fp: mx_pk_consts(s).
//
// Per element, with e the exponent field of x and q = |x| * 2^(127-s) the
// spec's scaled value (q <= 6):  M = 2^(9 + max(e, s) - s), i.e.
// 512 * max(1, 2^floor(log2 q)) (512 for a zero or subnormal x), whose bf16 ulp
// M/128 is 8 times the e2m1 spacing of q's binade (0.5 below 2, 1 below 4,
// else 2); y = bf16(8q + M) in one fma (exact product |x| * 2^(130-s), one
// rounding to nearest even) rounds 8q to that spacing exactly as the spec's
// thresholds do (<= 0.25 / < 0.75 / <= 1.25 / < 1.75 / <= 2.5 / < 3.5 / <= 5):
// y = M + k ulps, k = round-half-even(q / spacing) <= 4, and the code is
// k + 2 log2(M/512) (its parity is k's: ties go to even codes).  bits(y) =
// (136 + i) << 7 | k with i = log2(M/512) <= 2, so y + (y >> 6) holds
// k + 2i in bits 0-3 of each half ((136 + i) * 2 = 272 + 2i, 272 = 0 mod 16;
// the high half's k lands in bits 10-12 of the low half, the low half never
// carries).  M's bits come from one add-max per half: max(e<<7 + (136-s)<<7,
// 136<<7) (int16: e - s <= 2 keeps the sum in range).  A zero or subnormal x
// gives 8q < 2 = half an ulp of 512 (s >= 3), hence code 0, whether the fma
// reads it as is or flushed.  The sign bits join in the byte gather below
// (prmt with sign replication of the bytes holding bits 15 and 31).
__host__ __device__ __forceinline__ void mx_pk_consts(uint32_t s, uint32_t* kp, uint32_t* fp) {
  *kp = byte_perm(0x4400u - (s << 7), 0u, 0x1010u);  // (136 - s) << 7 in each int16 half
  *fp = ((257u - s) << 7) * 0x10001u;                // bf16x2 2^(130-s)
}

__host__ __device__ __forceinline__ uint32_t mx_pack8_pk(const uint32_t w[4], uint32_t kp,
                                                         uint32_t fp) {
  uint32_t c[4];
  for (int j = 0; j < 4; ++j) {
    const uint32_t m = pk_addmax_s16(w[j] & 0x7F807F80u, kp, 0x44004400u);
    const uint32_t y = pk_fma_bf16(w[j] & 0x7FFF7FFFu, fp, m);
    c[j] = y + (y >> 6);  // codes in bits 0-2 and 16-18
  }
  // bytes: codes of elements 0, 2, 1, 3 (4, 6, 5, 7), then their signs as
  // 0x00 / 0xFF, merged at bit 3 of each byte
  const uint32_t m8 = 0x08080808u;
  const uint32_t v01 =
      bit_select(m8, byte_perm(c[0], c[1], 0x6240u), byte_perm(w[0], w[1], 0xFBD9u));
  const uint32_t v23 =
      bit_select(m8, byte_perm(c[2], c[3], 0x6240u), byte_perm(w[2], w[3], 0xFBD9u));
  const uint32_t even =
      byte_perm(v01, v23, 0x5410u);  // nibbles of elements 0, 2, 4, 6 (bits 0-3 of each byte)
  const uint32_t odd = byte_perm(v01, v23, 0x7632u);  // elements 1, 3, 5, 7
  return bit_select(0xF0F0F0F0u, even, odd << 4);
}

__host__ __device__ __forceinline__ uint32_t mx_pack8_pk(const uint32_t w[4], uint32_t s) {
  uint32_t kp, fp;
  mx_pk_consts(s, &kp, &fp);
  return mx_pack8_pk(w, kp, fp);
}
#endif  // AITER_AUX_QUANT_PK

// The scale byte of a block from the bf16 bits of its max |x| (sign cleared): 255 when the
// block holds a NaN or an Inf, else mx_scale_exponent (<= 254).
__host__ __device__ __forceinline__ uint32_t mx_scale_byte(uint32_t amax16) {
  return amax16 >= 0x7F80u ? 255u : mx_scale_exponent(amax16);
}

// 8 elements of a block whose max |x| bits (after the pair reduction) are
// amax16.  Returns the 4 a_q bytes; *s_out = the block's scale byte.
__device__ __forceinline__ uint32_t quant8(const uint32_t w[4], uint32_t amax16, uint32_t* s_out) {
  if (amax16 >= 0x7F80u) {           // a NaN or an Inf in the block
    *s_out = mx_scale_byte(amax16);  // 255
    return 0u;
  }
  const uint32_t s = mx_scale_byte(amax16);
  *s_out = s;
#if AITER_AUX_AMDGCN_DEVICE && defined(__gfx950__)
  // v_cvt_scalef32_pk_fp4_bf16 converts x / 2^(e-127), e = exponent field
  // of the scale operand (here s << 23), to e2m1 by pure exponent arithmetic
  // on the source (no intermediate rounding), rounding to nearest even and
  // saturating to +-6; zeros keep their sign, and so do values that round to
  // zero.  That is the spec's q = x * 2^(127-s) rounded as specified, for every
  // normal bf16 x.  A bf16 subnormal x is the only input whose handling could
  // depend on a denormal mode; with amax >= 2^-119 we have s >= 3, so
  // |q| < 2^-126 * 2^124 = 0.25 and the spec's code is the sign bit alone --
  // which the instruction gives whether it normalises such an input or flushes
  // it to a signed zero.  Smaller blocks take the exact software path.
  if (amax16 >= 0x0400u) {
    const float scale = as_f32(s << 23);
    return cvt_scalef32_pk_fp4_bf16x8(w, scale);  // target_ops.h
  }
#endif
#if AITER_AUX_QUANT_PK
  if (s >= 3u && s <= 253u) return mx_pack8_pk(w, s);
#endif
  return mx_pack8_sw(w, s);
}

}  // namespace quant_detail
}  // namespace gpu
}  // namespace aiter_aux
