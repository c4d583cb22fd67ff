// CPU kernel of moe_route (docs/ops.md "moe_route"; aiter_aux/reference/route.py the spec):
// the top-k gate of each row of router_logits, every fp32 operation the reference's
// (../route_math.h).  One instance serves every shape, dtype and option (all run-time fields);
// rows are independent and split across threads.
#pragma once

#include <cstring>

#include "../aiter_aux_limits.h"
#include "../route_math.h"
#include "../sum_codec.h"
#include "cpu_common.h"

namespace aiter_aux {
namespace cpu {
namespace detail {

inline int check_route(const AiterAuxRouteArgs& a, const char* op) {
  if (a.num_tokens < 0) return invalid_arg("%s: negative num_tokens", op);
  if (a.num_experts < 1 || a.num_experts > AITER_AUX_MAX_ROUTE_EXPERTS)
    return invalid_arg("%s: num_experts=%lld out of range", op, (long long)a.num_experts);
  if (a.topk < 1 || a.topk > AITER_AUX_MAX_ROUTE_TOPK || a.topk > a.num_experts)
    return invalid_arg("%s: topk=%lld out of range", op, (long long)a.topk);
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return invalid_arg("%s: unknown dtype code %d", op, a.dtype);
  if (a.scoring < AITER_AUX_SCORING_SOFTMAX || a.scoring > AITER_AUX_SCORING_NONE)
    return invalid_arg("%s: unknown scoring code %d", op, a.scoring);
  const int64_t g = a.num_expert_group, kg = a.topk_group;
  if (g < 0 || kg < 0 || (g == 0) != (kg == 0) || kg > g ||
      (g > 0 && (a.num_experts % g != 0 || a.topk > kg * (a.num_experts / g))))
    return invalid_arg("%s: bad groups (num_expert_group=%lld, topk_group=%lld)", op, (long long)g,
                       (long long)kg);
  if (a.num_tokens == 0) return AITER_AUX_OK;
  if (a.router_logits == nullptr || a.topk_weights == nullptr || a.topk_ids == nullptr)
    return invalid_arg("%s: NULL router_logits / topk_weights / topk_ids", op);
  return AITER_AUX_OK;
}

inline float route_load(const void* p, int64_t i, int dtype) {
  if (dtype == AITER_AUX_DTYPE_F32) {
    float f;
    std::memcpy(&f, static_cast<const char*>(p) + 4 * i, 4);
    return f;
  }
  const uint32_t h = static_cast<const uint16_t*>(p)[i];
  return route_math::bits_f32(dtype == AITER_AUX_DTYPE_F16 ? sum_codec::f16_to_f32_bits(h)
                                                           : h << 16);
}

// Index of the largest packed key among keys[0..n) (n >= 1).
inline int64_t route_argmax(const uint64_t* keys, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (keys[i] > keys[best]) best = i;
  return best;
}

// One row: scores[E], packed keys[E] are scratch of E elements each.
inline void route_row(const AiterAuxRouteArgs& a, int64_t t, float* scores, uint64_t* keys) {
  namespace rm = route_math;
  const int64_t E = a.num_experts, K = a.topk;
  const void* row =
      static_cast<const char*>(a.router_logits) + t * E * (a.dtype == AITER_AUX_DTYPE_F32 ? 4 : 2);
  if (a.scoring == AITER_AUX_SCORING_SOFTMAX) {
    float m = -__builtin_inff();
    for (int64_t i = 0; i < E; ++i) {
      const float x = route_load(row, i, a.dtype);
      scores[i] = x;
      if (x > m) m = x;  // NaN never is
    }
    float p[rm::kSumLanes];
    for (int j = 0; j < rm::kSumLanes; ++j) p[j] = 0.0f;
    for (int64_t i = 0; i < E; ++i) {
      scores[i] = rm::exp_f32(rm::rt_sub(scores[i], m));
      p[i % rm::kSumLanes] = rm::rt_add(p[i % rm::kSumLanes], scores[i]);
    }
    for (int h = rm::kSumLanes / 2; h > 0; h /= 2)
      for (int j = 0; j < h; ++j) p[j] = rm::rt_add(p[j], p[j + h]);
    for (int64_t i = 0; i < E; ++i) scores[i] = rm::rt_div(scores[i], p[0]);
  } else if (a.scoring == AITER_AUX_SCORING_SIGMOID) {
    for (int64_t i = 0; i < E; ++i) scores[i] = rm::sigmoid_f32(route_load(row, i, a.dtype));
  } else {
    for (int64_t i = 0; i < E; ++i) scores[i] = route_load(row, i, a.dtype);
  }
  const float* bias = a.correction_bias;
  for (int64_t i = 0; i < E; ++i) {
    const float c = bias ? rm::rt_add(scores[i], bias[i]) : scores[i];
    keys[i] = rm::pack_key(rm::order_key(c), i);
  }
  if (a.num_expert_group > 0) {
    const int64_t G = a.num_expert_group, S = E / G;
    uint64_t gkeys[AITER_AUX_MAX_ROUTE_EXPERTS];
    for (int64_t g = 0; g < G; ++g) {
      const uint64_t* k = keys + g * S;
      const int64_t b1 = route_argmax(k, S);
      const float c1 = bias ? rm::rt_add(scores[g * S + b1], bias[g * S + b1]) : scores[g * S + b1];
      float gs = c1;
      if (bias && S > 1) {
        int64_t b2 = b1 == 0 ? 1 : 0;
        for (int64_t i = 0; i < S; ++i)
          if (i != b1 && k[i] > k[b2]) b2 = i;
        gs = rm::rt_add(c1, rm::rt_add(scores[g * S + b2], bias[g * S + b2]));
      }
      gkeys[g] = rm::pack_key(rm::order_key(gs), g);
    }
    bool kept[AITER_AUX_MAX_ROUTE_EXPERTS] = {};
    for (int64_t r = 0; r < a.topk_group; ++r) {
      const int64_t g = route_argmax(gkeys, G);
      kept[g] = true;
      gkeys[g] = 0;  // below every packed key of a group not taken yet (their ids differ)
    }
    for (int64_t i = 0; i < E; ++i)
      if (!kept[i / S]) keys[i] = 0;  // never selected: topk <= the kept experts
  }
  float w[AITER_AUX_MAX_ROUTE_TOPK];
  int32_t ids[AITER_AUX_MAX_ROUTE_TOPK];
  float sum = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t i = route_argmax(keys, E);
    keys[i] = 0;
    ids[k] = static_cast<int32_t>(i);
    w[k] = scores[i];
    sum = rm::rt_add(sum, w[k]);
  }
  float* ow = a.topk_weights + t * K;
  int32_t* oi = a.topk_ids + t * K;
  for (int64_t k = 0; k < K; ++k) {
    float v = a.renormalize ? rm::rt_div(w[k], sum) : w[k];
    ow[k] = rm::canonical(rm::rt_mul(v, a.routed_scaling_factor));
    oi[k] = ids[k];
  }
  if (a.token_expert_indices != nullptr)
    for (int64_t k = 0; k < K; ++k)
      a.token_expert_indices[t * K + k] = static_cast<int32_t>(k * a.num_tokens + t);
}

}  // namespace detail

// moe_route: one instance for every shape, dtype and option.
inline int moe_route(const AiterAuxRouteArgs& a) {
  const int rc = detail::check_route(a, "moe_route");
  if (rc != AITER_AUX_OK || a.num_tokens == 0) return rc;
  const bool par = a.num_tokens * a.num_experts >= 16384;
#pragma omp parallel if (par)
  {
    detail::FpEnvGuard fpenv;
    float scores[AITER_AUX_MAX_ROUTE_EXPERTS];
    uint64_t keys[AITER_AUX_MAX_ROUTE_EXPERTS];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < a.num_tokens; ++t) detail::route_row(a, t, scores, keys);
  }
  return AITER_AUX_OK;
}

}  // namespace cpu
}  // namespace aiter_aux
