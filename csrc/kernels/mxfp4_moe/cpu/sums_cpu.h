// CPU kernel of moe_sum (docs/ops.md "moe_sum"; aiter_aux/reference/sums.py the spec):
// output[t] = round(fp32(acc) * factor), acc the fp32 sum of input[t, k] for k = 0..topk-1
// in order from +0.0, skipping the non-local slots of topk_ids / expert_map.  Self-contained:
// it includes no other op's kernels.  Generic, as every CPU kernel: one kernel serves every
// shape and dtype (the dtype is a run-time field; the element loops are instantiated per dtype
// here).
#pragma once

#include <type_traits>

#include "../sum_codec.h"
#include "cpu_common.h"

namespace aiter_aux {
namespace cpu {
namespace detail {

inline int check_sum(const AiterAuxSumArgs& a, const char* op) {
  if (a.num_tokens < 0 || a.model_dim < 0)
    return invalid_arg("%s: negative num_tokens / model_dim", op);
  if (a.topk < 1) return invalid_arg("%s: topk=%lld < 1", op, (long long)a.topk);
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return invalid_arg("%s: unknown dtype code %d", op, a.dtype);
  if (a.num_tokens == 0 || a.model_dim == 0) return AITER_AUX_OK;
  if (a.input == nullptr || a.output == nullptr) return invalid_arg("%s: NULL input/output", op);
  if (a.expert_map != nullptr && a.topk_ids == nullptr)
    return invalid_arg("%s: expert_map without topk_ids", op);
  return AITER_AUX_OK;
}

// Slot (t, k) is summed: topk_ids (if any) >= 0 and, with expert_map, maps to >= 0.
inline bool sum_slot_kept(const AiterAuxSumArgs& a, int64_t t, int64_t k) {
  if (a.topk_ids == nullptr) return true;
  const int32_t id = a.topk_ids[t * a.topk + k];
  if (id < 0) return false;
  if (a.expert_map == nullptr) return true;
  return id < a.num_global_experts && a.expert_map[id] >= 0;
}

// fp32 of element i of a row of dtype kDT (exact).
template <int kDT, class T>
inline float sum_load(const T* p, int64_t i) {
  uint32_t bits;
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
    bits = p[i];
  } else if constexpr (kDT == AITER_AUX_DTYPE_BF16) {
    bits = static_cast<uint32_t>(p[i]) << 16;
  } else {
    bits = sum_codec::f16_to_f32_bits(p[i]);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <int kDT>
void sum_impl(const AiterAuxSumArgs& a) {
  using T = std::conditional_t<kDT == AITER_AUX_DTYPE_F32, uint32_t, uint16_t>;
  constexpr int64_t kTile = 1024;  // columns per accumulation tile
  const int64_t M = a.num_tokens, D = a.model_dim, K = a.topk;
  const T* __restrict in = static_cast<const T*>(a.input);
  T* __restrict out = static_cast<T*>(a.output);
  const float scale = a.routed_scaling_factor;
  const bool par = M > 1 && M * D * K >= 32768;
#pragma omp parallel if (par)
  {
    FpEnvGuard fpenv;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t d0 = 0; d0 < D; d0 += kTile) {
        const int64_t nd = D - d0 < kTile ? D - d0 : kTile;
        float acc[kTile];
        for (int64_t d = 0; d < nd; ++d) acc[d] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          if (!sum_slot_kept(a, t, k)) continue;
          const T* __restrict r = in + (t * K + k) * D + d0;
          for (int64_t d = 0; d < nd; ++d) acc[d] = acc[d] + sum_load<kDT>(r, d);
        }
        if (scale != 1.0f)  // acc * 1.0f == acc: 1.0 keeps the plain sum's bytes
          for (int64_t d = 0; d < nd; ++d) acc[d] = acc[d] * scale;
        T* __restrict o = out + t * D + d0;
        for (int64_t d = 0; d < nd; ++d) {
          uint32_t bits;
          std::memcpy(&bits, acc + d, 4);
          const uint32_t r = sum_codec::f32_bits_to_out(bits, kDT);
          if constexpr (sizeof(T) == 4) {
            std::memcpy(o + d, &r, 4);
          } else {
            o[d] = static_cast<T>(r);
          }
        }
      }
    }
  }
}

}  // namespace detail

// moe_sum: one instance for every shape and dtype.
inline int moe_sum(const AiterAuxSumArgs& a) {
  const int rc = detail::check_sum(a, "moe_sum");
  if (rc != AITER_AUX_OK || a.num_tokens == 0 || a.model_dim == 0) return rc;
  if (a.dtype == AITER_AUX_DTYPE_F32)
    detail::sum_impl<AITER_AUX_DTYPE_F32>(a);
  else if (a.dtype == AITER_AUX_DTYPE_F16)
    detail::sum_impl<AITER_AUX_DTYPE_F16>(a);
  else
    detail::sum_impl<AITER_AUX_DTYPE_BF16>(a);
  return AITER_AUX_OK;
}

}  // namespace cpu
}  // namespace aiter_aux
