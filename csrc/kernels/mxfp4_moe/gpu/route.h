// moe_route on the GPU; docs/ops.md "moe_route" is the spec (aiter_aux/reference/route.py).
//
// One warp per token row, kRows rows per block, grid-stride over the rows.  Lane l owns the
// columns i = l + n * kWarpSize (n = 0, 1, ...); the arithmetic is route_math.h's, in the
// reference's order:
//   * softmax: the row's NaN-ignoring max (a warp max), e_i = exp_f32(x_i - m) kept in
//     shared memory, the 64 partial sums p_j (j = i mod 64: lane l holds 64 / kWarpSize of
//     them, each in column order), then the halving tree: the levels h >= kWarpSize inside the lane
//     (a 32-lane warp: p_l + p_{l+32}), the others by xor shuffles kWarpSize / 2 .. 1 (a + b ==
//     b + a, so every lane ends with the tree's sum); score_i = e_i / s;
//   * the choice keys (route_math::order_key of score + bias) in shared memory;
//   * groups: lane g scans group g's E / G experts for its best two keys; the topk_group
//     best groups are taken by topk_group warp-max rounds over the packed group keys;
//   * selection: topk warp-max rounds over the lanes' best packed key (cached per lane,
//     rescanned only by the lane that lost its best); every lane adds the winner's score
//     to the weights' sum in round order; lane k writes output k.
// One instance serves every shape, dtype and option: E, topk and the groups are run-time
// values; the dtype and E's size class (<= 256: 4 rows per block, else 1) pick the kernel.
#pragma once

#include "../aiter_aux_limits.h"
#include "../route_math.h"
#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace route_detail {

namespace rm = ::aiter_aux::route_math;

constexpr uint32_t kTaken = 0xFFFFFFFFu;  // a group key past selection (no value's key)
constexpr int kCols = rm::kSumLanes / kWarpSize;  // partial sums per lane
static_assert(kCols >= 1 && kCols * kWarpSize == rm::kSumLanes, "64 partial sums");

template <int kDT>
__device__ __forceinline__ float load_logit(const void* row, int64_t i) {
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
    return static_cast<const float*>(row)[i];
  } else {
    const uint32_t h = static_cast<const uint16_t*>(row)[i];
    if constexpr (kDT == AITER_AUX_DTYPE_BF16) return as_f32(h << 16);
    return f16_bits_to_f32_any(h);
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
__device__ __forceinline__ uint64_t lane_best(const uint32_t* ck, int64_t E, uint32_t taken) {
  uint64_t best = 0;
  int n = 0;
  for (int64_t i = lane_id(); i < E; i += kWarpSize, ++n) {
    if ((taken >> n) & 1u) continue;
    const uint32_t k = ck[i];
    if (k == kTaken) continue;
    const uint64_t p = rm::pack_key(k, i);
    best = p > best ? p : best;
  }
  return best;
}

template <int kDT, int kMaxE, int kRows>
__global__ __launch_bounds__(kRows* kWarpSize) void route_kernel(AiterAuxRouteArgs a,
                                                                 int num_blocks) {
  const PdlScope pdl;
  static_assert(kMaxE / kWarpSize <= 32, "a lane's columns fit a 32-bit mask");
  __shared__ float sc_all[kRows][kMaxE];
  __shared__ uint32_t ck_all[kRows][kMaxE];
  __shared__ uint32_t gk_all[kRows][kMaxE];
  float* sc = sc_all[warp_id()];
  uint32_t* ck = ck_all[warp_id()];
  uint32_t* gk = gk_all[warp_id()];
  const int lane = lane_id();
  const int64_t E = a.num_experts, K = a.topk, G = a.num_expert_group;
  const int64_t S = G > 0 ? E / G : E;
  const float* bias = a.correction_bias;
  constexpr int64_t kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  for (int64_t t = static_cast<int64_t>(block_idx()) * kRows + warp_id(); t < a.num_tokens;
       t += static_cast<int64_t>(num_blocks) * kRows) {
    const void* row = static_cast<const char*>(a.router_logits) + t * E * kE;
    // ---- scores
    if (a.scoring == AITER_AUX_SCORING_SOFTMAX) {
      float m = -__builtin_inff();
      for (int64_t i = lane; i < E; i += kWarpSize) {
        const float x = load_logit<kDT>(row, i);
        sc[i] = x;
        m = x > m ? x : m;
      }
      m = warp_max_f32(m);
      float p[kCols];
#pragma unroll
      for (int q = 0; q < kCols; ++q) p[q] = 0.0f;
      int n = 0;
      for (int64_t i = lane; i < E; i += kWarpSize, ++n) {
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
      for (int64_t i = lane; i < E; i += kWarpSize) sc[i] = rm::rt_div(sc[i], s);
    } else {
      for (int64_t i = lane; i < E; i += kWarpSize)
        sc[i] = rm::sigmoid_f32(load_logit<kDT>(row, i));
    }
    for (int64_t i = lane; i < E; i += kWarpSize)
      ck[i] = rm::order_key(bias ? rm::rt_add(sc[i], bias[i]) : sc[i]);
    // ---- groups: the topk_group best are kept, the other experts get key kTaken
    if (G > 0) {
      warp_sync();
      for (int64_t g = lane; g < G; g += kWarpSize) {
        const int64_t b = g * S;
        int64_t b1 = 0, b2 = -1;  // best two, ties to the lower id (ascending scan)
        for (int64_t i = 1; i < S; ++i) {
          const uint32_t k = ck[b + i];
          if (k > ck[b + b1]) {
            b2 = b1;
            b1 = i;
          } else if (b2 < 0 || k > ck[b + b2]) {
            b2 = i;
          }
        }
        float gs;
        if (bias) {
          gs = rm::rt_add(sc[b + b1], bias[b + b1]);
          if (b2 >= 0) gs = rm::rt_add(gs, rm::rt_add(sc[b + b2], bias[b + b2]));
        } else {
          gs = sc[b + b1];
        }
        gk[g] = rm::order_key(gs);
      }
      warp_sync();
      for (int64_t r = 0; r < a.topk_group; ++r) {
        uint64_t best = 0;
        for (int64_t g = lane; g < G; g += kWarpSize)
          if (gk[g] != kTaken) {
            const uint64_t p = rm::pack_key(gk[g], g);
            best = p > best ? p : best;
          }
        best = warp_max_u64(best);
        const int64_t g = rm::key_id(best);
        warp_sync();
        if (lane == g % kWarpSize) gk[g] = kTaken;
        warp_sync();
      }
      for (int64_t i = lane; i < E; i += kWarpSize)
        if (gk[i / S] != kTaken) ck[i] = kTaken;  // not in a kept group: never selected
    }
    warp_sync();  // every lane reads every lane's scores and keys below
    // ---- selection
    uint32_t taken = 0;
    uint64_t mine = lane_best(ck, E, taken);
    float sum = 0.0f, my_w = 0.0f;
    int32_t my_id = 0;
    for (int64_t r = 0; r < K; ++r) {
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
    warp_sync();  // the next row reuses the shared arrays
  }
}

// kMaxE: the shared arrays' columns (>= E); max_blocks: the grid's cap (grid-stride rows).
template <int kDT, int kMaxE, int kRows>
inline int launch_route_shape(const AiterAuxRouteArgs& a, void* stream, int max_blocks = 65535) {
  const int blocks =
      static_cast<int>(clamp_i64(ceil_div_i64(a.num_tokens, kRows), 1, max_blocks));
  AITER_AUX_LAUNCH((route_kernel<kDT, kMaxE, kRows>), dim3(blocks), dim3(kRows * kWarpSize),
                   static_cast<hipStream_t>(stream))(a, blocks);
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
  if (a.scoring != AITER_AUX_SCORING_SOFTMAX && a.scoring != AITER_AUX_SCORING_SIGMOID)
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
