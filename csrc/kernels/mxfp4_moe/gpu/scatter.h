// moe_scatter_reduce and moe_scatter_reduce_q on the GPU; docs/ops.md is the spec.
//
// One thread per (token, V consecutive columns) unit, grid-stride (V = 8 when
// model_dim % 8 == 0; the loads of up to 8 pairs are issued together).  For
// k = 0..topk-1 in order, p = reverse_sorted[t*topk+k];
// p < 0 (not local) is skipped, and so is p >= num_rows (an error in the spec,
// which the Python op reports where it can check; here it only keeps the read
// in bounds).  acc = acc + fp32(x) * w with each product and each sum rounded
// separately (f32_mul_rn / f32_add_rn: never an FMA), starting from +0.0; the
// result is rounded to bf16 (RNE, NaN -> 0x7FC0).  The MXFP4 variant decodes
// e2m1 * 2^(s-127) by constructing the fp32 bits (exact, no float operation;
// s = 255 -> NaN, s = 0 -> 2^-127 subnormal).
//
// This file: the large-M kernels and the host launch; scatter_math.h the shared element
// arithmetic, scatter_small.h the small-M kernel and its launch shapes.
#pragma once

#include "scatter_math.h"
#include "scatter_small.h"

namespace aiter_aux {
namespace gpu {
namespace scatter_detail {

// MXFP4 kernel: 64-thread blocks (a block's threads finish close together, so
// the SMs refill evenly; docs/perf.md, section "Gaps").  Its pairs are loaded in
// ceil(K / 4) equal batches of q_batch_pairs<K>(); the compiler is asked for
// the occupancy q_min_blocks<K, Idx>() of launch_traits.h: on sm_90 14 resident blocks
// per SM (72 registers) when a batch holds at most 3 pairs, else 12 (80
// registers; at 72 those spill); 4 waves per SIMD on CDNA.
constexpr int kThreadsQ = 64;
template <int K>
__host__ __device__ constexpr int q_batch_pairs() {
  return (K + (K + 3) / 4 - 1) / ((K + 3) / 4);
}
template <int K, typename Idx>
__host__ __device__ constexpr int q_min_blocks() {
  return scatter_q_min_occupancy<q_batch_pairs<K>(), (sizeof(Idx) > 4)>();
}

template <int D, int K>
__global__ __launch_bounds__(kThreads) void scatter_reduce_kernel(AiterAuxScatterArgs a,
                                                                  int num_blocks, bool in_al,
                                                                  bool out_al16) {
  const PdlScope pdl;
  constexpr int V = vec_width<D>();
  constexpr int kUnitsPerRow = D / V;
  const int64_t units = a.num_tokens * kUnitsPerRow;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kThreads;
  const int64_t rows = a.num_rows;
  for (int64_t u = static_cast<int64_t>(block_idx()) * kThreads + thread_idx(); u < units;
       u += stride) {
    const int64_t t = u / kUnitsPerRow;
    const int col = static_cast<int>(u - t * kUnitsPerRow) * V;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    const int32_t* rev = a.reverse_sorted + t * K;
    // kKB pairs at a time: their rows are loaded together (latencies overlap),
    // then accumulated strictly in k order.  A pair that is skipped loads row 0
    // instead (rows > 0 whenever any pair is kept) and is not accumulated.
    constexpr int kKB = K < 8 ? K : 8;
    constexpr int kRaw = V == 8 ? 4 : V;  // raw words per pair
    for (int k0 = 0; k0 < K; k0 += kKB) {
      int ps[kKB];
      bool ok[kKB];
      pair_rows<K, kKB>(rev, k0, rows, ps, ok);
      if (rows == 0) continue;  // nothing is kept
      float wt[kKB];
      uint32_t raw[kKB][kRaw];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int64_t p = ps[i];
        wt[i] = a.sorted_weights[p];
        if constexpr (V == 8) {
          load_bf16x8(a.expert_out + p * D + col, in_al, raw[i]);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) raw[i][j] = a.expert_out[p * D + col + j];
        }
      }
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (!ok[i]) continue;
        float v[V];
        if constexpr (V == 8) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            v[2 * j] = as_f32(raw[i][j] << 16);
            v[2 * j + 1] = as_f32(raw[i][j] & 0xFFFF0000u);
          }
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) v[j] = as_f32(raw[i][j] << 16);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = f32_add_rn(acc[j], f32_mul_rn(v[j], wt[i]));
      }
    }
    scale_sum<V>(acc, a.routed_scaling_factor);
    uint16_t* dst = a.out + t * D + col;
    if constexpr (V == 8) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = f32_bits_to_bf16_rne(as_u32(acc[2 * j])) |
               (f32_bits_to_bf16_rne(as_u32(acc[2 * j + 1])) << 16);
      }
      store_bf16x8(dst, out_al16, w);
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i)
        dst[i] = static_cast<uint16_t>(f32_bits_to_bf16_rne(as_u32(acc[i])));
    }
  }
}

// MXFP4 variant.  One thread per (token, 32-column block) unit: per pair it
// loads the 16 bytes (32 e2m1) of the block and its scale byte (kKB pairs'
// loads issued together), then accumulates the pair's 32 products in k order.
//
// Idx: int32_t when num_tokens * D / 32 < 2^31 (cheaper index arithmetic), else int64_t.
template <int D, int K, typename Idx>
__global__ __launch_bounds__(kThreadsQ, (q_min_blocks<K, Idx>())) void scatter_reduce_q_kernel(
    AiterAuxScatterArgs a, int num_blocks, bool in_al16, bool out_al16) {
  const PdlScope pdl;
  constexpr int kBlocksPerRow = D / 32;
  // pairs whose loads are issued together: K split into ceil(K / 4) equal batches
  constexpr int kKB = q_batch_pairs<K>();
  __shared__ float tab[16][kThreadsQ];  // [nib][thread]: thread-private columns, no bank conflicts
  const int tid = thread_idx();
  const Idx units = static_cast<Idx>(a.num_tokens) * kBlocksPerRow;
  const Idx stride = static_cast<Idx>(num_blocks) * kThreadsQ;
  const int rows = a.num_rows > 0x7FFFFFFF ? 0x7FFFFFFF : static_cast<int>(a.num_rows);
  if (rows == 0) {  // nothing is kept: zeros
    for (Idx u = static_cast<Idx>(block_idx()) * kThreadsQ + tid; u < units; u += stride) {
      const uint32_t z[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int g = 0; g < 4; ++g)
        store_bf16x8(a.out + static_cast<int64_t>(u) * 32 + 8 * g, out_al16, z);
    }
    return;
  }
  for (Idx u = static_cast<Idx>(block_idx()) * kThreadsQ + tid; u < units; u += stride) {
    const Idx t = u / kBlocksPerRow;
    const int blk = static_cast<int>(u - t * kBlocksPerRow);
    const uint8_t* q_col = a.expert_out_q + blk * 16;
    const uint8_t* s_col = a.expert_out_scale + blk;
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    const int32_t* rev = a.reverse_sorted + static_cast<int64_t>(t) * K;
    // the next batch's reverse_sorted entries are loaded with this batch's rows:
    // one memory round trip per batch instead of two dependent ones
    int nxt[kKB];
#pragma unroll
    for (int i = 0; i < kKB; ++i) nxt[i] = i < K ? rev[i] : -1;
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += kKB) {
      int ps[kKB];
      bool ok[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int p = nxt[i];
        ok[i] = static_cast<unsigned>(p) < static_cast<unsigned>(rows);  // 0 <= p < rows
        ps[i] = ok[i] ? p : 0;  // a skipped pair loads row 0 (rows > 0) and is not accumulated
        nxt[i] = k0 + kKB + i < K ? rev[k0 + kKB + i] : -1;
      }
      float wt[kKB];
      uint32_t raw[kKB][4];
      uint32_t sc[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        wt[i] = a.sorted_weights[ps[i]];
        load_q16(q_col + static_cast<int64_t>(ps[i]) * (D / 2), in_al16, raw[i]);
        sc[i] = s_col[static_cast<int64_t>(ps[i]) * kBlocksPerRow];
      }
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (!ok[i]) continue;
        uint32_t wb;
        if (q_fast_weight(as_u32(wt[i]), sc[i], &wb)) {
          q_fast_accumulate<4>(acc, raw[i], as_f32(wb));
        } else {
          q_table_accumulate<32>(acc, raw[i], sc[i], wt[i], tab, tid);
        }
      }
    }
    scale_sum<32>(acc, a.routed_scaling_factor);
    uint16_t* dst = a.out + static_cast<int64_t>(u) * 32;  // = t * D + blk * 32
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t w[4];
      pack_bf16x8(acc + 8 * g, w);
      store_bf16x8(dst + 8 * g, out_al16, w);
    }
  }
}

// The large-M launch (grid-stride, 16-byte row loads; MXFP4: 32 columns per unit).
template <int D, int K, bool kQ>
inline int launch_scatter_large(const AiterAuxScatterArgs& a, void* stream, const char* op) {
  const bool out_al16 = is_aligned(a.out, 16);
  if constexpr (kQ) {
    const int64_t units = a.num_tokens * (D / 32);
    const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kThreadsQ), 1, 65535));
    const bool q_al16 = is_aligned(a.expert_out_q, 16);
    if (units + static_cast<int64_t>(blocks) * kThreadsQ <= 0x7FFFFFFF) {
      AITER_AUX_LAUNCH((scatter_reduce_q_kernel<D, K, int32_t>), dim3(blocks), dim3(kThreadsQ),
                       static_cast<hipStream_t>(stream))(a, blocks, q_al16, out_al16);
    } else {
      AITER_AUX_LAUNCH((scatter_reduce_q_kernel<D, K, int64_t>), dim3(blocks), dim3(kThreadsQ),
                       static_cast<hipStream_t>(stream))(a, blocks, q_al16, out_al16);
    }
    return check_launch(op);
  }
  constexpr int V = vec_width<D>();
  const int64_t units = a.num_tokens * (D / V);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kThreads), 1, 8192));
  const bool in_al = is_aligned(a.expert_out, 16);
  AITER_AUX_LAUNCH((scatter_reduce_kernel<D, K>), dim3(blocks), dim3(kThreads),
                   static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al16);
  return check_launch(op);
}

template <int D, int K, bool kQ>
inline int launch_scatter(const AiterAuxScatterArgs& a, void* stream, const char* op) {
  static_assert(D > 0, "model_dim must be positive");
  static_assert(K >= 1 && K <= AITER_AUX_MAX_TOPK, "topk out of [1, AITER_AUX_MAX_TOPK]");
  if (a.model_dim != D)
    return fail_invalid("%s: model_dim %d does not match the instance (%d)", op, a.model_dim, D);
  if (a.topk != K)
    return fail_invalid("%s: topk %d does not match the instance (%d)", op, a.topk, K);
  if (a.num_tokens < 0 || a.num_rows < 0)
    return fail_invalid("%s: negative num_tokens / num_rows", op);
  if (a.num_tokens == 0) return AITER_AUX_OK;
  if (a.reverse_sorted == nullptr || a.out == nullptr)
    return fail_invalid("%s: null tensor pointer", op);
  if (a.num_rows > 0) {
    const bool missing = kQ ? (a.expert_out_q == nullptr || a.expert_out_scale == nullptr)
                            : (a.expert_out == nullptr);
    if (missing || a.sorted_weights == nullptr) return fail_invalid("%s: null tensor pointer", op);
  }
  if (a.num_tokens <= small_max_tokens<kQ>())
    return launch_scatter_small_auto<D, K, kQ>(a, stream, op);
  return launch_scatter_large<D, K, kQ>(a, stream, op);
}

}  // namespace scatter_detail

template <int ModelDim, int TopK>
int moe_scatter_reduce(const AiterAuxScatterArgs& a, void* stream) {
  return scatter_detail::launch_scatter<ModelDim, TopK, false>(a, stream, "moe_scatter_reduce");
}

template <int ModelDim, int TopK>
int moe_scatter_reduce_q(const AiterAuxScatterArgs& a, void* stream) {
  static_assert(ModelDim % 32 == 0, "model_dim must be a multiple of 32 (MXFP4 blocks)");
  return scatter_detail::launch_scatter<ModelDim, TopK, true>(a, stream, "moe_scatter_reduce_q");
}

}  // namespace gpu
}  // namespace aiter_aux
