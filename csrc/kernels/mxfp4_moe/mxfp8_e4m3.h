// MXFP8 (OCP MX v1.0, E4M3 "fn" elements + e8m0 scales) encode, pure integer arithmetic on
// bf16 bits: the same code for the CPU kernels and the GPU kernels' software path (host and
// device), so its result does not depend on the floating-point environment (FTZ/DAZ,
// contraction).  docs/ops.md "mxfp8_quant" is the spec; aiter_aux/reference/mxfp8.py the
// executable form.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIP__) || defined(__HIPCC__) || defined(__host__)
#define AITER_AUX_HD __host__ __device__ __forceinline__
#else
#define AITER_AUX_HD inline
#endif

namespace aiter_aux {
namespace e4m3 {

// e8m0 scale of a finite block from the bf16 bits of its amax (sign cleared, < 0x7F80):
//   amax == 0 -> 0; else clamp(((bits(fp32(amax)) + 0x1FFFFF) >> 23) - 8, 1, 254)
// bits(fp32(amax)) = amax_bits << 16.  The carry happens exactly when the mantissa exceeds
// 0x600000 (amax > 1.75 * 2^E), so this is ceil(log2(amax / 448)) + 127 (448 = 1.75 * 2^8).
AITER_AUX_HD uint32_t scale_from_amax_bits(uint32_t amax_bits) {
  if (amax_bits == 0) return 0;
  const int s = static_cast<int>(((amax_bits << 16) + 0x1FFFFFu) >> 23) - 8;
  return static_cast<uint32_t>(s < 1 ? 1 : (s > 254 ? 254 : s));
}

// Bits of v (1 <= v < 2^8).
AITER_AUX_HD int bit_width(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return 32 - __clz(static_cast<int>(v));
#else
  return 32 - __builtin_clz(v);
#endif
}

// The E4M3 byte of bf16 `x` (finite) times 2^(127 - s), rounded to nearest, ties to the even
// code, subnormals with step 2^-9, saturating at 448 (code 0x7E), sign bit 0x80 from x.
AITER_AUX_HD uint8_t encode(uint32_t x, uint32_t s) {
  const uint32_t sign = (x >> 8) & 0x80u;
  const uint32_t a = x & 0x7FFFu;
  if (a == 0) return static_cast<uint8_t>(sign);
  const int e = static_cast<int>(a >> 7);
  // |x| = mant * 2^lsb exactly; mant has 8 bits (normal) or fewer (subnormal)
  const uint32_t mant = e == 0 ? (a & 0x7Fu) : (0x80u | (a & 0x7Fu));
  const int lsb = (e == 0 ? -133 : e - 134) + 127 - static_cast<int>(s);  // of q = |x| 2^(127-s)
  const int nb = bit_width(mant);         // significant bits of mant
  const int eq = lsb + nb - 1;            // q = 1.f * 2^eq
  const int ulp = eq < -6 ? -9 : eq - 3;  // E4M3 step at q's binade
  const int sh = ulp - lsb;               // q / 2^ulp = mant >> sh
  uint32_t n;
  if (sh <= 0) {
    n = mant << (-sh);  // exact: sh >= -3 (normal binade: sh = nb - 4; subnormal: sh >= nb - 3)
  } else if (sh > 10) {
    n = 0;  // mant < 2^8 <= 2^(sh - 2): below half an ulp
  } else {
    n = mant >> sh;
    const uint32_t rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (n & 1u))) ++n;
  }
  // subnormal binade: n in [0, 8] is the code (8 = 2^-6, the smallest normal);
  // normal binade: n in [8, 16], code = ((eq + 7) << 3) + n - 8 (16 carries into the exponent)
  uint32_t code = ulp == -9 ? n : (static_cast<uint32_t>(eq + 7) << 3) + n - 8u;
  if (code > 0x7Eu) code = 0x7Eu;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace e4m3
}  // namespace aiter_aux
