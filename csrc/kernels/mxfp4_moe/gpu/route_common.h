// What both moe_route kernels share (route.h: a warp per row; route_wide.h: a block per row):
// the logit loads, the divisions, a group's key, the softmax denominator's tree and the row's
// outputs.  docs/ops.md "moe_route" is the spec (aiter_aux/reference/route.py).
#pragma once

#include "common.h"  // first: the portability layer defines what route_math.h's HIP path uses
// clang-format off
#include "../aiter_aux_limits.h"
#include "../route_math.h"
// clang-format on

namespace aiter_aux {
namespace gpu {
namespace route_detail {

namespace rm = ::aiter_aux::route_math;

constexpr int kCols = rm::kSumLanes / kWarpSize;  // partial sums per lane
static_assert(kCols >= 1 && kCols * kWarpSize == rm::kSumLanes, "64 partial sums");

template <int kDT>
__device__ __forceinline__ float load_logit(const void* row, int64_t i) {
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
    return static_cast<const float*>(row)[i];
  } else {
    const uint32_t h = static_cast<const uint16_t*>(row)[i];
    if constexpr (kDT == AITER_AUX_DTYPE_BF16) return as_f32(h << 16);
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0u) {  // zero or subnormal: m * 2^-24, exact in fp32 (branch-free, no loop)
      const float v = rm::rt_mul(static_cast<float>(m), 5.9604644775390625e-8f);
      return as_f32(as_u32(v) | sign);
    }
    return as_f32(sign | (e == 31u ? 0x7F800000u : (e + 112u) << 23) | (m << 13));
  }
}

// rt_div(a, b) without a branch per division on CUDA: the steps of nvcc's own fp32 division
// (MUFU reciprocal, one Newton step, the quotient, one remainder step), which give the
// correctly rounded quotient wherever no step can over- or underflow; nvcc guards them with
// FCHK and a call per division, which keeps a warp from running several divisions side by
// side.  Here the guard is a range (a is +0, or both exponent fields lie in [40, 214] and
// differ by at most 80: every step normal), and *slow marks the rest, which the caller
// divides with rt_div.  Other targets: rt_div, never slow.
__device__ __forceinline__ float div_quick(float a, float b, bool* slow) {
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__)
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));
  const float r1 = __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
  const float q0 = __fmaf_rn(r1, a, 0.0f);
  const float q1 = __fmaf_rn(r1, __fmaf_rn(-b, q0, a), q0);
  const int ea = static_cast<int>((as_u32(a) >> 23) & 0xFFu);
  const int eb = static_cast<int>((as_u32(b) >> 23) & 0xFFu);
  const int d = ea - eb;
  const bool ok = as_u32(a) == 0u || (ea >= 40 && ea <= 214 && eb >= 40 && eb <= 214 && d >= -80 &&
                                      d <= 80 && (as_u32(b) >> 31) == 0u);
  *slow = !ok;
  return q1;
#else
  *slow = false;
  return rm::rt_div(a, b);
#endif
}

// v[c] = rt_div(v[c], den[c]) for every column: div_quick side by side, then rt_div for the
// columns it marks (a warp-uniform branch, taken only when some lane has one).
template <int kC>
__device__ __forceinline__ void div_cols(float (&v)[kC], const float (&den)[kC]) {
  bool slow[kC], any = false;
  float q[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    q[c] = div_quick(v[c], den[c], &slow[c]);
    any = any || slow[c];
  }
  if (warp_ballot(any) != 0) {
#pragma unroll
    for (int c = 0; c < kC; ++c)
      if (slow[c]) q[c] = rm::rt_div(v[c], den[c]);
  }
#pragma unroll
  for (int c = 0; c < kC; ++c) v[c] = q[c];
}

// The softmax denominator from this lane's partial sums p[q] = p_{lane + q * kWarpSize} (each
// in column order): the halving tree's levels h = 32 .. kWarpSize inside the lane, the others
// by xor shuffles kWarpSize / 2 .. 1 (a + b == b + a, so every lane ends with the tree's sum).
__device__ __forceinline__ float softmax_den(float (&p)[kCols]) {
#pragma unroll
  for (int h = kCols / 2; h > 0; h /= 2)
#pragma unroll
    for (int q = 0; q < h; ++q) p[q] = rm::rt_add(p[q], p[q + h]);
  float s = p[0];
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2)
    s = rm::rt_add(s, as_f32(shfl_xor_u32(as_u32(s), off)));
  return s;
}

// A group's score from its two largest value keys k1 >= k2 (a multiset: equal keys count
// twice): with a bias the sum of the two (one when the group has one expert), else the largest.
__device__ __forceinline__ uint32_t group_key(uint32_t k1, uint32_t k2, bool two) {
  const float gs = two ? rm::rt_add(rm::order_value(k1), rm::order_value(k2)) : rm::order_value(k1);
  return rm::order_key(gs);
}

// The key of the group whose value keys are k, one per lane of the warp (a group of kWarpSize
// experts): the largest by a warp maximum, the second with one copy of the first taken out.
__device__ __forceinline__ uint32_t group_key_warp(uint32_t k, bool bias) {
  const uint32_t k1 = warp_max_u32(k);
  uint32_t k2 = 0;
  if (bias) {  // uniform
    const lane_mask_t top = warp_ballot(k == k1);
    const bool first = k == k1 && (top & lanemask_lt(lane_id())) == 0;
    k2 = warp_max_u32(first ? 0u : k);
  }
  return group_key(k1, k2, bias);
}

// The key of group g from the value keys ck of its S experts g * S .. (g + 1) * S - 1.
__device__ __forceinline__ uint32_t group_key_scan(const uint32_t* ck, int g, int S, bool bias) {
  uint32_t k1 = 0, k2 = 0;
  for (int i = g * S; i < (g + 1) * S; ++i) {
    const uint32_t k = ck[i];
    const uint32_t lo = k < k1 ? k : k1;
    k1 = k > k1 ? k : k1;
    k2 = lo > k2 ? lo : k2;
  }
  return group_key(k1, k2, bias && S >= 2);
}

// Row t's outputs from its selection (ws, wi: output r's score and id, in shared memory;
// every lane of the calling warp reads them): the weights' sum in output order, lane k
// writes output k (and token_expert_indices' k * M + t when given).
__device__ __forceinline__ void write_row(const AiterAuxRouteArgs& a, int64_t t, int K,
                                          const float* ws, const int32_t* wi) {
  const int lane = lane_id();
  float sum = 0.0f;
  for (int r = 0; r < K; ++r) sum = rm::rt_add(sum, ws[r]);
  if (lane < K) {
    const float w = ws[lane];
    const float v = a.renormalize ? rm::rt_div(w, sum) : w;
    const int64_t o = t * K + lane;
    a.topk_weights[o] = rm::canonical(rm::rt_mul(v, a.routed_scaling_factor));
    a.topk_ids[o] = wi[lane];
    if (a.token_expert_indices != nullptr)
      a.token_expert_indices[o] = static_cast<int32_t>(lane * a.num_tokens + t);
  }
}

}  // namespace route_detail
}  // namespace gpu
}  // namespace aiter_aux
