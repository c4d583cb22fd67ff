// moe_route on the GPU; docs/ops.md "moe_route" is the spec (aiter_aux/reference/route.py).
//
// One warp per token row, kRows rows per block, one row per warp.  Lane l owns the
// columns i = l + n * kWarpSize (n = 0, 1, ...); the arithmetic is route_math.h's, in the
// reference's order:
//   * softmax: the row's NaN-ignoring max (a warp max), e_i = exp_f32(x_i - m) kept in
//     shared memory, the 64 partial sums p_j (j = i mod 64: lane l holds 64 / kWarpSize of
//     them, each in column order), then the halving tree: the levels h >= kWarpSize inside
//     the lane (a 32-lane warp: p_l + p_{l+32}), the others by xor shuffles kWarpSize / 2 ..
//     1 (a + b == b + a, so every lane ends with the tree's sum); score_i = e_i / s;
//   * the choice keys (route_math::order_key of score + bias) in shared memory;
//   * groups: lane g scans group g's E / G experts for its best two keys; the topk_group
//     best groups are taken by topk_group warp-max rounds over the packed group keys;
//   * selection: topk warp-max rounds over the lanes' best packed key (cached per lane,
//     rescanned only by the lane that lost its best); every lane adds the winner's score
//     to the weights' sum in round order; lane k writes output k.
// One instance serves every shape, dtype and option: E, topk and the groups are run-time
// values; the dtype, E's size class (<= 256: 4 rows per block, else 1) and whether there are
// groups pick the kernel.
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

constexpr uint32_t kTaken = 0xFFFFFFFFu;          // a group key past selection (no value's key)
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

__device__ __forceinline__ float warp_max_f32(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    const float o = as_f32(shfl_xor_u32(as_u32(v), off));
    v = o > v ? o : v;  // NaN never wins (none reaches here: the inputs skip NaN)
  }
  return v;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    const uint32_t hi = shfl_xor_u32(static_cast<uint32_t>(v >> 32), off);
    const uint32_t lo = shfl_xor_u32(static_cast<uint32_t>(v), off);
    const uint64_t o = (static_cast<uint64_t>(hi) << 32) | lo;
    v = o > v ? o : v;
  }
  return v;
}

// The best packed key among this lane's columns not taken (bit n of `taken`) and kept
// (excluded columns have key kTaken); 0 if none.
__device__ __forceinline__ uint64_t lane_best(const uint32_t* ck, int E, uint32_t taken) {
  uint64_t best = 0;
  int n = 0;
  for (int i = lane_id(); i < E; i += kWarpSize, ++n) {
    if ((taken >> n) & 1u) continue;
    const uint32_t k = ck[i];
    if (k == kTaken) continue;
    const uint64_t p = rm::pack_key(k, i);
    best = p > best ? p : best;
  }
  return best;
}

// The groups: lane g scores group g (the sum of its two largest choices with a bias, else its
// largest score), the topk_group best are taken by warp arg-max rounds, and every expert of
// another group gets key kTaken (never selected).
__device__ __forceinline__ void keep_groups(const float* sc, uint32_t* ck, uint32_t* gk,
                                            const float* bias, int E, int G, int S,
                                            int topk_group) {
  const int lane = lane_id();
  for (int g = lane; g < G; g += kWarpSize) {
    const int b = g * S;
    // the best two packed keys (unique: ties to the lower id), without branches
    uint64_t p1 = 0, p2 = 0;
    for (int i = 0; i < S; ++i) {
      const uint64_t p = rm::pack_key(ck[b + i], i);
      const uint64_t lo = p < p1 ? p : p1;
      p1 = p > p1 ? p : p1;
      p2 = lo > p2 ? lo : p2;
    }
    const int b1 = b + rm::key_id(p1);
    float gs;
    if (bias) {
      gs = rm::rt_add(sc[b1], bias[b1]);
      if (S >= 2) {  // uniform: p2 is a key
        const int b2 = b + rm::key_id(p2);
        gs = rm::rt_add(gs, rm::rt_add(sc[b2], bias[b2]));
      }
    } else {
      gs = sc[b1];
    }
    gk[g] = rm::order_key(gs);
  }
  warp_sync();
  for (int r = 0; r < topk_group; ++r) {
    uint64_t best = 0;
    for (int g = lane; g < G; g += kWarpSize) {
      const uint32_t k = gk[g];
      const uint64_t p = k != kTaken ? rm::pack_key(k, g) : 0;
      best = p > best ? p : best;
    }
    best = warp_max_u64(best);
    const int g = rm::key_id(best);
    warp_sync();
    if (lane == g % kWarpSize) gk[g] = kTaken;
    warp_sync();
  }
  for (int i = lane; i < E; i += kWarpSize)
    if (gk[i / S] != kTaken) ck[i] = kTaken;  // not in a kept group: never selected
}

// kGrouped: num_expert_group > 0 (a kernel of its own: the other one keeps fewer registers)
template <int kDT, int kMaxE, int kRows, bool kGrouped>
__global__ __launch_bounds__(kRows* kWarpSize) void route_kernel(AiterAuxRouteArgs a) {
  const PdlScope pdl;
  static_assert(kMaxE / kWarpSize <= 32, "a lane's columns fit a 32-bit mask");
  __shared__ float sc_all[kRows][kMaxE];
  __shared__ uint32_t ck_all[kRows][kMaxE];
  __shared__ uint32_t gk_all[kRows][kMaxE];
  float* sc = sc_all[warp_id()];
  uint32_t* ck = ck_all[warp_id()];
  uint32_t* gk = gk_all[warp_id()];
  const int lane = lane_id();
  // E <= 1024, topk <= 16, G <= E: 32-bit indices (fewer scalar registers than int64)
  const int E = static_cast<int>(a.num_experts), K = static_cast<int>(a.topk);
  const int G = a.num_expert_group, S = G > 0 ? E / G : E;
  const float* bias = a.correction_bias;
  constexpr int64_t kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  {
    // one row per warp (a loop over rows would keep more scalar registers live)
    const int64_t t = static_cast<int64_t>(block_idx()) * kRows + warp_id();
    if (t >= a.num_tokens) return;  // the whole warp
    const void* row = static_cast<const char*>(a.router_logits) + t * E * kE;
    // ---- scores
    if (a.scoring == AITER_AUX_SCORING_SOFTMAX) {
      float m = -__builtin_inff();
      for (int i = lane; i < E; i += kWarpSize) {
        const float x = load_logit<kDT>(row, i);
        sc[i] = x;
        m = x > m ? x : m;
      }
      m = warp_max_f32(m);
      float p[kCols];
#pragma unroll
      for (int q = 0; q < kCols; ++q) p[q] = 0.0f;
      int n = 0;
      for (int i = lane; i < E; i += kWarpSize, ++n) {
        const float e = rm::exp_f32(rm::rt_sub(sc[i], m));
        sc[i] = e;
        p[n % kCols] = rm::rt_add(p[n % kCols], e);
      }
      // the tree's levels h = 32 .. kWarpSize inside the lane (p[q] is p_{l + q * kWarpSize})
#pragma unroll
      for (int h = kCols / 2; h > 0; h /= 2)
#pragma unroll
        for (int q = 0; q < h; ++q) p[q] = rm::rt_add(p[q], p[q + h]);
      float s = p[0];
#pragma unroll
      for (int off = kWarpSize / 2; off > 0; off /= 2)
        s = rm::rt_add(s, as_f32(shfl_xor_u32(as_u32(s), off)));
      for (int i = lane; i < E; i += kWarpSize) sc[i] = rm::rt_div(sc[i], s);
    } else if (a.scoring == AITER_AUX_SCORING_SIGMOID) {
      for (int i = lane; i < E; i += kWarpSize) sc[i] = rm::sigmoid_f32(load_logit<kDT>(row, i));
    } else {
      for (int i = lane; i < E; i += kWarpSize) sc[i] = load_logit<kDT>(row, i);
    }
    for (int i = lane; i < E; i += kWarpSize)
      ck[i] = rm::order_key(bias ? rm::rt_add(sc[i], bias[i]) : sc[i]);
    // ---- groups: the topk_group best are kept, the other experts get key kTaken
    if constexpr (kGrouped) {
      warp_sync();
      keep_groups(sc, ck, gk, bias, E, G, S, a.topk_group);
    }
    warp_sync();  // every lane reads every lane's scores and keys below
    // ---- selection
    uint32_t taken = 0;
    uint64_t mine = lane_best(ck, E, taken);
    float sum = 0.0f, my_w = 0.0f;
    int32_t my_id = 0;
    for (int r = 0; r < K; ++r) {
      const uint64_t best = warp_max_u64(mine);
      const int32_t id = rm::key_id(best);
      const float w = sc[id];
      sum = rm::rt_add(sum, w);
      if (r == lane) {
        my_id = id;
        my_w = w;
      }
      if (mine == best) {  // this lane's column (packed keys are unique)
        taken |= 1u << ((id - lane) / kWarpSize);
        mine = lane_best(ck, E, taken);
      }
    }
    if (lane < K) {
      const float v = a.renormalize ? rm::rt_div(my_w, sum) : my_w;
      a.topk_weights[t * K + lane] = rm::canonical(rm::rt_mul(v, a.routed_scaling_factor));
      a.topk_ids[t * K + lane] = my_id;
    }
  }
}

// kMaxE: the shared arrays' columns (>= E).  One row per warp: M < 2^24 rows fit the grid.
template <int kDT, int kMaxE, int kRows>
inline int launch_route_shape(const AiterAuxRouteArgs& a, void* stream) {
  const int blocks = static_cast<int>(ceil_div_i64(a.num_tokens, kRows));
  const hipStream_t st = static_cast<hipStream_t>(stream);
  if (a.num_expert_group > 0)
    AITER_AUX_LAUNCH((route_kernel<kDT, kMaxE, kRows, true>), dim3(blocks), dim3(kRows * kWarpSize),
                     st)(a);
  else
    AITER_AUX_LAUNCH((route_kernel<kDT, kMaxE, kRows, false>), dim3(blocks),
                     dim3(kRows * kWarpSize), st)(a);
  return check_launch("moe_route");
}

template <int kDT>
inline int launch_route(const AiterAuxRouteArgs& a, void* stream) {
  if (a.num_experts <= 256) return launch_route_shape<kDT, 256, 4>(a, stream);
  return launch_route_shape<kDT, AITER_AUX_MAX_ROUTE_EXPERTS, 1>(a, stream);
}

}  // namespace route_detail

// moe_route: one instance for every shape, dtype and option.
inline int moe_route(const AiterAuxRouteArgs& a, void* stream) {
  const char* op = "moe_route";
  const int64_t E = a.num_experts, G = a.num_expert_group, KG = a.topk_group;
  if (a.num_tokens < 0) return fail_invalid("%s: negative num_tokens", op);
  if (E < 1 || E > AITER_AUX_MAX_ROUTE_EXPERTS)
    return fail_invalid("%s: num_experts %lld out of range", op, static_cast<long long>(E));
  if (a.topk < 1 || a.topk > AITER_AUX_MAX_ROUTE_TOPK || a.topk > E)
    return fail_invalid("%s: topk %lld out of range", op, static_cast<long long>(a.topk));
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return fail_invalid("%s: unknown dtype code %d", op, a.dtype);
  if (a.scoring < AITER_AUX_SCORING_SOFTMAX || a.scoring > AITER_AUX_SCORING_NONE)
    return fail_invalid("%s: unknown scoring code %d", op, a.scoring);
  if (G < 0 || KG < 0 || (G == 0) != (KG == 0) || KG > G ||
      (G > 0 && (E % G != 0 || a.topk > KG * (E / G))))
    return fail_invalid("%s: bad groups (num_expert_group %lld, topk_group %lld)", op,
                        static_cast<long long>(G), static_cast<long long>(KG));
  if (a.num_tokens == 0) return AITER_AUX_OK;
  if (a.router_logits == nullptr || a.topk_weights == nullptr || a.topk_ids == nullptr)
    return fail_invalid("%s: null tensor pointer", op);
  switch (a.dtype) {
    case AITER_AUX_DTYPE_F32:
      return route_detail::launch_route<AITER_AUX_DTYPE_F32>(a, stream);
    case AITER_AUX_DTYPE_F16:
      return route_detail::launch_route<AITER_AUX_DTYPE_F16>(a, stream);
    default:
      return route_detail::launch_route<AITER_AUX_DTYPE_BF16>(a, stream);
  }
}

}  // namespace gpu
}  // namespace aiter_aux
