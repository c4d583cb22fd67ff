// The arithmetic of moe_route, one definition for the CPU kernel and the GPU kernel (host and
// device): docs/ops.md "moe_route" is the spec, aiter_aux/reference/route.py its executable
// form.  Every fp32 operation is one IEEE operation rounded to nearest even, never contracted
// into an FMA (rt_mul / rt_add / rt_div), so the CPU, CUDA and HIP give the reference's bytes:
//
//   * exp_f32(x), x <= 0 or NaN: k = round_even(x * LOG2E) (by adding and subtracting
//     1.5 * 2^23); k < -126 gives +0; else r = (x - k * LN2_HI) - k * LN2_LO,
//     p = ((P(r) * (r * r)) + r) + 1 with P in Horner form, result p * 2^k;
//   * sigmoid_f32(x) = 1 / (1 + exp_f32(-x)) for x >= 0, e / (1 + e), e = exp_f32(x), else;
//   * order_key(v): uint32 keys ordering fp32 values as the selection does (NaN 0, below
//     every number; -0 and +0 equal).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIP__) || defined(__HIPCC__)
#define AITER_AUX_ROUTE_HD __host__ __device__ __forceinline__
#else
#define AITER_AUX_ROUTE_HD inline
#endif
#if defined(__clang__)
#define AITER_AUX_ROUTE_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define AITER_AUX_ROUTE_NO_CONTRACT
#endif

namespace aiter_aux {
namespace route_math {

constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
constexpr float kLog2e = 1.44269502162933349609375f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
// The partial sums of the softmax denominator (the reference's SUM_LANES).
constexpr int kSumLanes = 64;
// Ids are packed in the low bits of the selection keys (E <= 2^kIndexBits).
constexpr int kIndexBits = 11;
constexpr uint32_t kNanF32 = 0x7FFFFFFFu;  // every NaN weight is written as this

AITER_AUX_ROUTE_HD float bits_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}
AITER_AUX_ROUTE_HD uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
}
AITER_AUX_ROUTE_HD bool is_nan(float x) {
  return (f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u;
}

// One IEEE operation each, never fused with another (nvcc contracts a * b + c by default;
// the HIP and CPU builds pass -ffp-contract=off, which the pragma restates).
AITER_AUX_ROUTE_HD float rt_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  AITER_AUX_ROUTE_NO_CONTRACT
  return a * b;
#endif
}
AITER_AUX_ROUTE_HD float rt_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  AITER_AUX_ROUTE_NO_CONTRACT
  return a + b;
#endif
}
AITER_AUX_ROUTE_HD float rt_sub(float a, float b) {
  return rt_add(a, -b);  // exact negation: a - b
}
AITER_AUX_ROUTE_HD float rt_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;  // correctly rounded (HIP: its default for fp32 division)
#endif
}

// exp(x) for fp32 x <= 0 (or NaN), as the reference's exp_f32.  Branch-free (the out-of-range
// cases are selected at the end), so that a GPU warp runs several of them side by side.
AITER_AUX_ROUTE_HD float exp_f32(float x) {
  const float t = rt_mul(x, kLog2e);
  const float kr = rt_sub(rt_add(t, kRound), kRound);
  const bool zero = !(kr >= -126.0f);  // also NaN (returned below)
  const float k = zero ? 0.0f : kr;    // keeps the unused arithmetic in range
  const float r = rt_sub(rt_sub(x, rt_mul(k, kLn2Hi)), rt_mul(k, kLn2Lo));
  float p = kP0;
  p = rt_add(rt_mul(p, r), kP1);
  p = rt_add(rt_mul(p, r), kP2);
  p = rt_add(rt_mul(p, r), kP3);
  p = rt_add(rt_mul(p, r), kP4);
  p = rt_add(rt_mul(p, r), kP5);
  p = rt_add(rt_add(rt_mul(p, rt_mul(r, r)), r), 1.0f);
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(k) + 127);
  const float v = rt_mul(p, bits_f32(e << 23));
  return is_nan(x) ? x : zero ? 0.0f : v;
}

// 1 / (1 + exp_f32(-x)) for x >= 0 (-0 included), e / (1 + e) with e = exp_f32(x) else: both
// are num / (1 + z) with z = exp_f32(-|x|) (a NaN x gives a NaN).
AITER_AUX_ROUTE_HD float sigmoid_parts(float x, float* den) {
  const float z = exp_f32(bits_f32(f32_bits(x) | 0x80000000u));
  *den = rt_add(1.0f, z);
  return x >= 0.0f ? 1.0f : z;
}
AITER_AUX_ROUTE_HD float sigmoid_f32(float x) {
  float den;
  const float num = sigmoid_parts(x, &den);
  return rt_div(num, den);
}

// The selection's order: a larger number has a larger key; -0 == +0; NaN is 0.
AITER_AUX_ROUTE_HD uint32_t order_key(float v) {
  if (is_nan(v)) return 0u;
  const uint32_t b = f32_bits(rt_add(v, 0.0f));  // -0 + 0 = +0
  return (b & 0x80000000u) ? 0x7FFFFFFFu - (b & 0x7FFFFFFFu) : b + 0x80000000u;
}

// The value of a key: order_key(order_value(k)) == k; key 0 gives a NaN, the key of +-0 +0.
AITER_AUX_ROUTE_HD float order_value(uint32_t k) {
  if (k == 0u) return bits_f32(0x7FC00000u);
  return bits_f32((k & 0x80000000u) ? k - 0x80000000u : (0x7FFFFFFFu - k) | 0x80000000u);
}

// A unique key of (value key, id): larger is chosen first, ties to the lower id.
AITER_AUX_ROUTE_HD uint64_t pack_key(uint32_t key, int64_t id) {
  return (static_cast<uint64_t>(key) << kIndexBits) |
         static_cast<uint64_t>(((1 << kIndexBits) - 1) - id);
}
AITER_AUX_ROUTE_HD int32_t key_id(uint64_t packed) {
  return static_cast<int32_t>(((1 << kIndexBits) - 1) -
                              static_cast<int32_t>(packed & ((1u << kIndexBits) - 1)));
}

// The weight as written: a NaN as 0x7FFFFFFF.
AITER_AUX_ROUTE_HD float canonical(float w) {
  return is_nan(w) ? bits_f32(kNanF32) : w;
}

}  // namespace route_math
}  // namespace aiter_aux
