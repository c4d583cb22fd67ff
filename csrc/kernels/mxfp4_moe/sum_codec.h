// The element conversions of moe_sum, pure integer arithmetic on the bits: the same code for
// the CPU kernel and the GPU kernel (host and device), so the result does not depend on the
// floating-point environment or on a target's conversion instructions.  docs/ops.md
// "moe_sum" is the spec; aiter_aux/reference/sums.py the executable form.
//
//   * load: float32 bits as they are, bfloat16 bits << 16, float16 widened exactly
//     (subnormals normalised, Inf and NaN kept);
//   * store: round the fp32 sum to the output dtype, to nearest even, subnormals kept,
//     overflow to Inf; every NaN becomes the canonical 0x7FFF (float16, bfloat16) or
//     0x7FFFFFFF (float32).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIP__) || defined(__HIPCC__) || defined(__host__)
#define AITER_AUX_SUM_HD __host__ __device__ __forceinline__
#else
#define AITER_AUX_SUM_HD inline
#endif

namespace aiter_aux {
namespace sum_codec {

constexpr uint32_t kNanF32 = 0x7FFFFFFFu;
constexpr uint32_t kNan16 = 0x7FFFu;

// fp32 bits of the float16 `h` (exact).
AITER_AUX_SUM_HD uint32_t f16_to_f32_bits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31u) return sign | 0x7F800000u | (m << 13);
  if (e != 0u) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0u) return sign;
  uint32_t mm = m, ex = 113u;  // subnormal m * 2^-24: normalise
  while ((mm & 0x400u) == 0u) {
    mm <<= 1;
    --ex;
  }
  return sign | (ex << 23) | ((mm & 0x3FFu) << 13);
}

// float16 bits of the fp32 bits `x`: round to nearest even; NaN -> 0x7FFF.
AITER_AUX_SUM_HD uint32_t f32_bits_to_f16(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return kNan16;
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520: Inf (Inf included)
  if (ax >= 0x38800000u) {                       // >= 2^-14: a normal float16
    const uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u);
    return sign | ((r - 0x38000000u) >> 13);
  }
  const uint32_t e = ax >> 23;
  if (e < 102u) return sign;  // < 2^-25: rounds to zero (2^-25 itself is a tie, to even 0)
  // subnormal (or the smallest normal after rounding): units of 2^-24
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return sign | (q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u));
}

// bfloat16 bits of the fp32 bits `x`: round to nearest even; NaN -> 0x7FFF.
AITER_AUX_SUM_HD uint32_t f32_bits_to_bf16(uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return kNan16;
  return (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
}

// The output bits of the fp32 bits `x` for AiterAuxDType `dtype` (0 f32, 1 f16, 2 bf16).
AITER_AUX_SUM_HD uint32_t f32_bits_to_out(uint32_t x, int dtype) {
  if (dtype == 1) return f32_bits_to_f16(x);
  if (dtype == 2) return f32_bits_to_bf16(x);
  return (x & 0x7FFFFFFFu) > 0x7F800000u ? kNanF32 : x;
}

}  // namespace sum_codec
}  // namespace aiter_aux
