// moe_sum on the GPU; docs/ops.md "moe_sum" is the spec (aiter_aux/reference/sums.py).
//
// output[t] = round(fp32(acc) * factor), acc = +0.0 then acc + fp32(input[t, k]) for
// k = 0..topk-1 in order (f32_add_rn: each add rounded, never contracted), skipping the slots
// that topk_ids / expert_map mark non-local; round = sum_codec (RNE, canonical NaN).  One
// instance serves every shape and dtype: model_dim and topk are run-time values, the dtype
// selects one of the kernels below.
//
// The row policies are moe_scatter_reduce's (scatter.h, scatter_small.h), with the same
// memory traffic per output element (topk rows read once, the output written once) minus the
// scatter's indirection (a slot's row is input[t, k], no reverse_sorted / weight load):
// one thread per (token, V consecutive columns) unit, grid-stride; at
// M <= small_max_tokens<false>() 8-byte loads in small_shape<false>().threads-thread blocks
// with up to kSmallMaxBatch slots' loads issued together, above it 16-byte loads in
// kThreads-thread blocks, 8 slots at a time.  model_dim not a multiple of the vector: one
// element per thread (same order, same bits).  A skipped slot issues no load.
#pragma once

#include "../sum_codec.h"
#include "scatter_small.h"

namespace aiter_aux {
namespace gpu {
namespace sum_detail {

using scatter_detail::kSmallMaxBatch;
using scatter_detail::kThreads;

// Bytes per element of an AiterAuxDType.
template <int kDT>
__host__ __device__ constexpr int elem_bytes() {
  return kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
}

// Slot (t, k) is summed: no topk_ids, or its id >= 0 and (with expert_map) < the map's
// length and mapped to >= 0.
__device__ __forceinline__ bool slot_kept(const AiterAuxSumArgs& a, int64_t t, int64_t k) {
  if (a.topk_ids == nullptr) return true;
  const int32_t id = a.topk_ids[t * a.topk + k];
  if (id < 0) return false;
  if (a.expert_map == nullptr) return true;
  return id < a.num_global_experts && a.expert_map[id] >= 0;
}

// V elements (kB = V * elem bytes: 16, 8, 4 or 2) as kB / 4 words (1 word for kB = 2);
// `al`: the kB-byte access is aligned.
template <int kB>
__device__ __forceinline__ void load_vec(const void* p, bool al, uint32_t* w) {
  const uint16_t* h = static_cast<const uint16_t*>(p);
  if constexpr (kB == 16) {
    load_bf16x8(h, al, w);
  } else if constexpr (kB == 8) {
    scatter_detail::load_bf16xv<4>(h, al, w);
  } else if constexpr (kB == 4) {
    scatter_detail::load_bf16xv<2>(h, al, w);
  } else {
    w[0] = h[0];
  }
}

template <int kB>
__device__ __forceinline__ void store_vec(void* p, bool al, const uint32_t* w) {
  uint16_t* h = static_cast<uint16_t*>(p);
  if constexpr (kB == 16) {
    store_bf16x8(h, al, w);
  } else if constexpr (kB == 8) {
    scatter_detail::store_bf16xv<4>(h, al, w);
  } else if constexpr (kB == 4) {
    scatter_detail::store_bf16xv<2>(h, al, w);
  } else {
    h[0] = static_cast<uint16_t>(w[0]);
  }
}

// Element j of a vector of kDT as fp32 (exact).
template <int kDT>
__device__ __forceinline__ float elem_f32(const uint32_t* w, int j) {
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
    return as_f32(w[j]);
  } else {
    const uint32_t x = w[j / 2];
    if constexpr (kDT == AITER_AUX_DTYPE_BF16)
      return as_f32((j % 2) ? (x & 0xFFFF0000u) : (x << 16));
    return (j % 2) ? f16_half_to_f32<true>(x) : f16_half_to_f32<false>(x);
  }
}

// kDT: the dtype; V: elements per thread (V divides model_dim); kT: threads per block;
// kKB: slots whose loads are issued together.
template <int kDT, int V, int kT, int kKB>
__global__ __launch_bounds__(kT) void sum_kernel(AiterAuxSumArgs a, int num_blocks, bool in_al,
                                                 bool out_al) {
  const PdlScope pdl;
  constexpr int kB = V * elem_bytes<kDT>();
  constexpr int kWords = kB < 4 ? 1 : kB / 4;
  const int64_t D = a.model_dim, K = a.topk;
  const int64_t per_row = D / V;
  const int64_t units = a.num_tokens * per_row;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kT;
  const char* in = static_cast<const char*>(a.input);
  char* out = static_cast<char*>(a.output);
  constexpr int64_t kE = elem_bytes<kDT>();
  int64_t u = static_cast<int64_t>(block_idx()) * kT + thread_idx();
  if (u >= units) return;
  // (t, column unit) of u, advanced without a division per step
  int64_t t = u / per_row, cu = u - t * per_row;
  const int64_t dt = stride / per_row, dc = stride - dt * per_row;
  for (; u < units; u += stride) {
    const int64_t col = cu * V;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    const char* row = in + ((t * K) * D + col) * kE;
#pragma unroll 1
    for (int64_t k0 = 0; k0 < K; k0 += kKB) {
      bool ok[kKB];
      uint32_t raw[kKB][kWords];
#pragma unroll
      for (int i = 0; i < kKB; ++i) ok[i] = k0 + i < K && slot_kept(a, t, k0 + i);
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (ok[i]) {
          load_vec<kB>(row + (k0 + i) * D * kE, in_al, raw[i]);
        } else {
#pragma unroll
          for (int w = 0; w < kWords; ++w) raw[i][w] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (!ok[i]) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = f32_add_rn(acc[j], elem_f32<kDT>(raw[i], j));
      }
    }
    scatter_detail::scale_sum<V>(acc, a.routed_scaling_factor);
    uint32_t w[kWords];
    if constexpr (kDT == AITER_AUX_DTYPE_F32) {
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = sum_codec::f32_bits_to_out(as_u32(acc[j]), kDT);
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        w[j] = sum_codec::f32_bits_to_out(as_u32(acc[2 * j]), kDT);
        if (2 * j + 1 < V) w[j] |= sum_codec::f32_bits_to_out(as_u32(acc[2 * j + 1]), kDT) << 16;
      }
    }
    store_vec<kB>(out + (t * D + col) * kE, out_al, w);
    t += dt;
    cu += dc;
    if (cu >= per_row) {
      cu -= per_row;
      ++t;
    }
  }
}

template <int kDT, int V, int kT, int kKB>
inline int launch_sum_shape(const AiterAuxSumArgs& a, void* stream, int max_blocks) {
  constexpr int kB = V * elem_bytes<kDT>();
  const int64_t units = a.num_tokens * (a.model_dim / V);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kT), 1, max_blocks));
  // model_dim % V == 0: every row is aligned like the base pointer
  const bool in_al = is_aligned(a.input, kB), out_al = is_aligned(a.output, kB);
  AITER_AUX_LAUNCH((sum_kernel<kDT, V, kT, kKB>), dim3(blocks), dim3(kT),
                   static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al);
  return check_launch("moe_sum");
}

// The shape of M and model_dim (scatter's policy: small_max_tokens / small_shape / kThreads).
template <int kDT>
inline int launch_sum(const AiterAuxSumArgs& a, void* stream) {
  constexpr int kE = elem_bytes<kDT>();
  constexpr int kSmallT = scatter_detail::small_shape<false>().threads;
  if (a.num_tokens <= scatter_detail::small_max_tokens<false>()) {
    if (a.model_dim % (8 / kE) == 0)
      return launch_sum_shape<kDT, 8 / kE, kSmallT, kSmallMaxBatch>(a, stream, 65535);
  } else if (a.model_dim % (16 / kE) == 0) {
    return launch_sum_shape<kDT, 16 / kE, kThreads, 8>(a, stream, 8192);
  }
  return launch_sum_shape<kDT, 1, kThreads, 8>(a, stream, 65535);
}

}  // namespace sum_detail

// moe_sum: one instance for every shape and dtype.
inline int moe_sum(const AiterAuxSumArgs& a, void* stream) {
  const char* op = "moe_sum";
  if (a.num_tokens < 0 || a.model_dim < 0)
    return fail_invalid("%s: negative num_tokens / model_dim", op);
  if (a.topk < 1) return fail_invalid("%s: topk %lld < 1", op, static_cast<long long>(a.topk));
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return fail_invalid("%s: unknown dtype code %d", op, a.dtype);
  if (a.num_tokens == 0 || a.model_dim == 0) return AITER_AUX_OK;
  if (a.input == nullptr || a.output == nullptr) return fail_invalid("%s: null tensor pointer", op);
  if (a.expert_map != nullptr && a.topk_ids == nullptr)
    return fail_invalid("%s: expert_map without topk_ids", op);
  switch (a.dtype) {
    case AITER_AUX_DTYPE_F32:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_F32>(a, stream);
    case AITER_AUX_DTYPE_F16:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_F16>(a, stream);
    default:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_BF16>(a, stream);
  }
}

}  // namespace gpu
}  // namespace aiter_aux
