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
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace scatter_detail {

constexpr int kThreads = 256;

template <int D>
__host__ __device__ constexpr int vec_width() {
  return D % 8 == 0 ? 8 : (D % 4 == 0 ? 4 : (D % 2 == 0 ? 2 : 1));
}

// fp32 bits of e2m1(nib) * 2^(s-127), exactly as an fp32 multiply would give
// (overflow -> inf); s = 255 -> NaN.
__host__ __device__ __forceinline__ uint32_t mx_decode_bits(uint32_t nib, uint32_t s) {
  if (s == 255u) return 0x7FC00000u;
  const uint32_t sign = (nib & 8u) << 28;
  const uint32_t m = nib & 7u;
  if (m == 0u) return sign;
  // e2m1 magnitudes 0.5, 1, 1.5, 2, 3, 4, 6 as 1.f * 2^(field - 127)
  const int field = m < 2u ? 126 : 126 + static_cast<int>(m >> 1);
  const uint32_t mant = m < 2u ? 0u : (m & 1u) << 22;
  const int e = field + static_cast<int>(s) - 127;
  if (e >= 255) return sign | 0x7F800000u;
  if (e >= 1) return sign | (static_cast<uint32_t>(e) << 23) | mant;
  return sign | ((0x800000u | mant) >> (1 - e));  // e >= -1: exact subnormal
}

template <int D, int K, bool kQ>
__global__ __launch_bounds__(kThreads) void scatter_reduce_kernel(AiterAuxScatterArgs a,
                                                                  int num_blocks, bool in_al,
                                                                  bool out_al16) {
  constexpr int V = kQ ? 8 : vec_width<D>();
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
    constexpr int kRaw = kQ ? 1 : (V == 8 ? 4 : V);  // raw words per pair
    for (int k0 = 0; k0 < K; k0 += kKB) {
      int ps[kKB];
      bool ok[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int p = k0 + i < K ? rev[k0 + i] : -1;
        ok[i] = p >= 0 && p < rows;
        ps[i] = ok[i] ? p : 0;
      }
      if (rows == 0) continue;  // nothing is kept
      float wt[kKB];
      uint32_t raw[kKB][kRaw];
      uint32_t sc[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int64_t p = ps[i];
        wt[i] = a.sorted_weights[p];
        sc[i] = 0;
        if constexpr (kQ) {
          raw[i][0] = load_u8x4(a.expert_out_q + p * (D / 2) + col / 2, in_al);
          sc[i] = a.expert_out_scale[p * (D / 32) + col / 32];
        } else if constexpr (V == 8) {
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
        if constexpr (kQ) {
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = as_f32(mx_decode_bits((raw[i][0] >> (4 * j)) & 0xFu, sc[i]));
        } else if constexpr (V == 8) {
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
      for (int i = 0; i < V; ++i) dst[i] = static_cast<uint16_t>(f32_bits_to_bf16_rne(as_u32(acc[i])));
    }
  }
}

// MXFP4 variant.  One thread per (token, 32-column block) unit: per pair it
// loads the 16 bytes (32 e2m1) of the block and its scale byte.  All 32
// products of a pair share the weight w and the scale s, so they take only 16
// values: P[nib] = fp32(decode(nib, s) * w), computed once per (pair, block)
// with f32_mul_rn (P[nib | 8] = -P[nib], exact: rounding is symmetric; only a
// NaN's sign differs, which the final bf16 conversion ignores).  The table is
// thread-private in shared memory, laid out [nib][thread] (bank = thread, no
// conflicts); each element is then one table read and one f32_add_rn, in k
// order -- the same sums as the spec.
template <int D>
__device__ __forceinline__ void load_q16(const uint8_t* p, bool al16, uint32_t w[4]) {
  if (al16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = static_cast<uint32_t>(p[4 * i]) | (static_cast<uint32_t>(p[4 * i + 1]) << 8) |
             (static_cast<uint32_t>(p[4 * i + 2]) << 16) | (static_cast<uint32_t>(p[4 * i + 3]) << 24);
    }
  }
}

// fp32 bits of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (e2m1 codes 0..7).
__host__ __device__ __forceinline__ uint32_t e2m1_mag_bits(int m) {
  return m == 0 ? 0u : (m == 1 ? 0x3F000000u : (m == 2 ? 0x3F800000u : (m == 3 ? 0x3FC00000u :
         (m == 4 ? 0x40000000u : (m == 5 ? 0x40400000u : (m == 6 ? 0x40800000u : 0x40C00000u))))));
}

template <int D, int K>
__global__ __launch_bounds__(kThreads, 3) void scatter_reduce_q_kernel(AiterAuxScatterArgs a,
                                                                    int num_blocks, bool in_al16,
                                                                    bool out_al16) {
  constexpr int kBlocksPerRow = D / 32;
  static_assert(kThreads * 4 == 1024, "table rows of 1024 bytes");
  __shared__ float tab[16][kThreads];
  const int tid = thread_idx();
  const char* tab_bytes = reinterpret_cast<const char*>(&tab[0][0]);
  const uint32_t tb = static_cast<uint32_t>(tid) * 4u;
  const int64_t units = a.num_tokens * kBlocksPerRow;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kThreads;
  const int64_t rows = a.num_rows;
  for (int64_t u = static_cast<int64_t>(block_idx()) * kThreads + tid; u < units; u += stride) {
    const int64_t t = u / kBlocksPerRow;
    const int blk = static_cast<int>(u - t * kBlocksPerRow);
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    const int32_t* rev = a.reverse_sorted + t * K;
    constexpr int kKB = K < 4 ? K : 4;  // pairs loaded together (registers: 3 blocks/SM)
    for (int k0 = 0; k0 < K; k0 += kKB) {
      int ps[kKB];
      bool ok[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int p = k0 + i < K ? rev[k0 + i] : -1;
        ok[i] = p >= 0 && p < rows;
        ps[i] = ok[i] ? p : 0;
      }
      if (rows == 0) continue;
      float wt[kKB];
      uint32_t raw[kKB][4];
      uint32_t sc[kKB];
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int64_t p = ps[i];
        wt[i] = a.sorted_weights[p];
        load_q16<D>(a.expert_out_q + p * (D / 2) + blk * 16, in_al16, raw[i]);
        sc[i] = a.expert_out_scale[p * kBlocksPerRow + blk];
      }
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (!ok[i]) continue;
        const uint32_t s = sc[i];
        if (s >= 2u && s <= 252u) {
          // decode(m, s) is an exponent add here (no overflow, no subnormal)
          const uint32_t es = (s - 127u) << 23;  // mod 2^32
#pragma unroll
          for (int m = 0; m < 8; ++m) {
            const uint32_t vb = m == 0 ? 0u : e2m1_mag_bits(m) + es;
            const float pr = f32_mul_rn(as_f32(vb), wt[i]);
            tab[m][tid] = pr;
            tab[m + 8][tid] = as_f32(as_u32(pr) ^ 0x80000000u);
          }
        } else {
#pragma unroll 1
          for (int m = 0; m < 8; ++m) {  // rare: kept out of the common path
            const float pr = f32_mul_rn(as_f32(mx_decode_bits(static_cast<uint32_t>(m), s)), wt[i]);
            tab[m][tid] = pr;
            tab[m + 8][tid] = as_f32(as_u32(pr) ^ 0x80000000u);
          }
        }
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            // byte offset of tab[nib][tid]: nib << 10 | tid * 4 (one shift, one and-or)
            const uint32_t x = raw[i][w];
            const uint32_t nb = (4 * j >= 10 ? (x >> (4 * j - 10)) : (x << (10 - 4 * j))) & 0x3C00u;
            const float v = *reinterpret_cast<const float*>(tab_bytes + (nb | tb));
            acc[8 * w + j] = f32_add_rn(acc[8 * w + j], v);
          }
        }
      }
    }
    uint16_t* dst = a.out + t * D + blk * 32;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = f32_bits_to_bf16_rne(as_u32(acc[8 * g + 2 * j])) |
               (f32_bits_to_bf16_rne(as_u32(acc[8 * g + 2 * j + 1])) << 16);
      }
      store_bf16x8(dst + 8 * g, out_al16, w);
    }
  }
}

template <int D, int K, bool kQ>
inline int launch_scatter(const AiterAuxScatterArgs& a, void* stream, const char* op) {
  static_assert(D > 0, "model_dim must be positive");
  static_assert(K >= 1 && K <= 255, "topk must be in [1, 255]");
  if (a.model_dim != D)
    return fail_invalid("%s: model_dim %d does not match the instance (%d)", op, a.model_dim, D);
  if (a.topk != K) return fail_invalid("%s: topk %d does not match the instance (%d)", op, a.topk, K);
  if (a.num_tokens < 0 || a.num_rows < 0)
    return fail_invalid("%s: negative num_tokens / num_rows", op);
  if (a.num_tokens == 0) return AITER_AUX_OK;
  if (a.reverse_sorted == nullptr || a.out == nullptr) return fail_invalid("%s: null tensor pointer", op);
  if (a.num_rows > 0) {
    const bool missing = kQ ? (a.expert_out_q == nullptr || a.expert_out_scale == nullptr)
                            : (a.expert_out == nullptr);
    if (missing || a.sorted_weights == nullptr) return fail_invalid("%s: null tensor pointer", op);
  }
  const bool out_al16 = is_aligned(a.out, 16);
  if constexpr (kQ) {
    const int64_t units = a.num_tokens * (D / 32);
    const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kThreads), 1, 65535));
    AITER_AUX_LAUNCH((scatter_reduce_q_kernel<D, K>), dim3(blocks), dim3(kThreads),
                     static_cast<hipStream_t>(stream))(a, blocks, is_aligned(a.expert_out_q, 16),
                                                       out_al16);
    return check_launch(op);
  }
  constexpr int V = vec_width<D>();
  const int64_t units = a.num_tokens * (D / V);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kThreads), 1, 8192));
  const bool in_al = is_aligned(a.expert_out, 16);
  AITER_AUX_LAUNCH((scatter_reduce_kernel<D, K, false>), dim3(blocks), dim3(kThreads),
                   static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al16);
  return check_launch(op);
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
