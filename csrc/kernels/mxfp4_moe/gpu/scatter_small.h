// moe_scatter_reduce[_q] at small M (num_tokens <= small_max_tokens<kQ>()): one thread per
// (token, V consecutive columns) unit, kT-thread blocks, one unit per thread (the grid
// strides only past 65535 blocks).  All topk pairs of a unit (up to 16; more in batches of
// 16) are loaded together right after the reverse_sorted entries: one dependent memory round
// trip after that load, where the large-M kernels of scatter.h take ceil(topk / 8) (bf16) or
// ceil(topk / 4) (MXFP4).  Same arithmetic, same order, same bits as those kernels
// (scatter_math.h: the MXFP4 fast product per 8 elements, else the general decode per
// element; bf16 rounding by pack_bf16x8 where V is a multiple of 8).
//
// Launch shapes (V, kT): bf16 V = 4 (8-byte loads) or 8 (16-byte loads; fewer when
// model_dim is not a multiple), MXFP4 V = 8, 16 or 32 (4-, 8- or 16-byte code loads, one
// scale byte per pair); kT = 64, 128 or 256.  The shape is chosen by M * model_dim
// (small_shape below); tests/scatter_sweep.cu times every candidate on the device.
#pragma once

#include "scatter_math.h"

namespace aiter_aux {
namespace gpu {
namespace scatter_detail {

constexpr int kSmallMaxBatch = 16;
template <bool kQ>
__host__ __device__ constexpr int small_max_tokens() {
  // MXFP4: up to M = 256, where the 64-thread kernel's 3 dependent batches (topk 9-12)
  // still dominate; above it its per-pair work per 32 columns is the cheaper shape.
  return kQ ? 256 : 1024;
}

// A launch shape: columns per thread (as asked; small_v clamps it to what D allows) and
// threads per block.
struct SmallShape {
  int v;
  int threads;
};

// The shapes by M * model_dim: decode_shape up to kDecodeMaxElems output elements (M <= 4
// at model_dim 7168), small_shape up to kSmallMidElems, mid_shape above.  Measured on the
// H200 (tests/scatter_sweep.cu, every candidate at M = 1-8, model_dim 2560-7168, topk 8-16,
// PDL on): bf16 4 columns per thread in 128-thread blocks (1-3 % faster than 64 threads;
// 8 columns or 256 threads slower), MXFP4 8 columns in 64-thread blocks (16 and 32 columns
// 20-80 % slower).  The same sweep at M = 16-1024 (SWEEP_MS): bf16 8 columns (16-byte
// loads) in 128-thread blocks from M * model_dim > 2^18 (M = 64 at model_dim 7168), 1.1-1.44x
// faster than 4 columns at M = 256 and within 7 % of the best shape from there on (the
// large-M kernel 0-50 % slower); below it 4 columns stay within 4 %.
constexpr int64_t kDecodeMaxElems = 4 * 7168;
constexpr int64_t kSmallMidElems = int64_t(1) << 18;
template <bool kQ>
__host__ __device__ constexpr SmallShape decode_shape() {
  return kQ ? SmallShape{8, 64} : SmallShape{4, 128};
}
template <bool kQ>
__host__ __device__ constexpr SmallShape small_shape() {
  return kQ ? SmallShape{8, 64} : SmallShape{4, 128};
}
template <bool kQ>
__host__ __device__ constexpr SmallShape mid_shape() {
  return kQ ? SmallShape{8, 64} : SmallShape{8, 128};
}

// The columns per thread of a shape asking for kV: MXFP4 kV (8, 16 or 32 divide every
// model_dim, a multiple of 32); bf16 the widest of kV, 4, 2, 1 that divides D.
template <int D, bool kQ, int kV>
__host__ __device__ constexpr int small_v() {
  static_assert(kQ ? (kV == 8 || kV == 16 || kV == 32) : (kV == 4 || kV == 8), "shape");
  return kQ ? kV : (vec_width<D>() < kV ? vec_width<D>() : kV);
}

// V consecutive bf16 as (V + 1) / 2 little-endian words; `al`: the V * 2-byte access is aligned.
template <int V>
__device__ __forceinline__ void load_bf16xv(const uint16_t* p, bool al, uint32_t* w) {
  if constexpr (V == 8) {
    load_bf16x8(p, al, w);
  } else if constexpr (V == 4) {
    if (al) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x;
      w[1] = v.y;
    } else {
      w[0] = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16);
      w[1] = static_cast<uint32_t>(p[2]) | (static_cast<uint32_t>(p[3]) << 16);
    }
  } else if constexpr (V == 2) {
    w[0] = al ? *reinterpret_cast<const uint32_t*>(p)
              : static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16);
  } else {
    w[0] = p[0];
  }
}

// V (< 8) consecutive bf16 from (V + 1) / 2 words; `al`: the V * 2-byte access is aligned.
template <int V>
__device__ __forceinline__ void store_bf16xv(uint16_t* p, bool al, const uint32_t* w) {
  if constexpr (V == 4) {
    if (al) {
      uint2 v;
      v.x = w[0];
      v.y = w[1];
      *reinterpret_cast<uint2*>(p) = v;
      return;
    }
  } else if constexpr (V == 2) {
    if (al) {
      *reinterpret_cast<uint32_t*>(p) = w[0];
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) p[j] = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
}

// kWords words of e2m1 codes (8 per word; 1, 2 or 4 words); `al`: the 4 * kWords-byte access
// is aligned.
template <int kWords>
__device__ __forceinline__ void load_codes(const uint8_t* p, bool al, uint32_t* w) {
  if constexpr (kWords == 4) {
    load_q16(p, al, w);
  } else if constexpr (kWords == 2) {
    if (al) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x;
      w[1] = v.y;
    } else {
      w[0] = load_u8x4(p, false);
      w[1] = load_u8x4(p + 4, false);
    }
  } else {
    w[0] = load_u8x4(p, al);
  }
}

template <int D, int K, bool kQ, int V, int kT>
__global__ __launch_bounds__(kT) void scatter_reduce_small_kernel(AiterAuxScatterArgs a,
                                                                  int num_blocks, bool in_al,
                                                                  bool out_al) {
  const PdlScope pdl;
  constexpr int kUnitsPerRow = D / V;
  // MXFP4, V > 8: the general decode's products, [nib][thread] (thread-private columns)
  __shared__ float tab[kQ && V > 8 ? 16 : 1][kQ && V > 8 ? kT : 1];
  const int tid = thread_idx();
  constexpr int kWords = kQ ? V / 8 : (V + 1) / 2;  // words per pair: e2m1 codes / bf16 pairs
  constexpr int kKB = K < kSmallMaxBatch ? K : kSmallMaxBatch;
  const int64_t units = a.num_tokens * kUnitsPerRow;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kT;
  const int64_t rows = a.num_rows;
  for (int64_t u = static_cast<int64_t>(block_idx()) * kT + tid; u < units; u += stride) {
    const int64_t t = u / kUnitsPerRow;
    const int col = static_cast<int>(u - t * kUnitsPerRow) * V;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    const int32_t* rev = a.reverse_sorted + t * K;
    if (rows > 0) {  // else nothing is kept (and row 0 does not exist)
#pragma unroll 1
      for (int k0 = 0; k0 < K; k0 += kKB) {
        int ps[kKB];
        bool ok[kKB];
        pair_rows<K, kKB>(rev, k0, rows, ps, ok);
        float wt[kKB];
        uint32_t raw[kKB][kWords];
        uint32_t sc[kKB];
#pragma unroll
        for (int i = 0; i < kKB; ++i) {
          const int64_t p = ps[i];
          wt[i] = a.sorted_weights[p];
          sc[i] = 0;
          if constexpr (kQ) {
            load_codes<kWords>(a.expert_out_q + p * (D / 2) + col / 2, in_al, raw[i]);
            sc[i] = a.expert_out_scale[p * (D / 32) + col / 32];
          } else {
            load_bf16xv<V>(a.expert_out + p * D + col, in_al, raw[i]);
          }
        }
#pragma unroll
        for (int i = 0; i < kKB; ++i) {
          if (!ok[i]) continue;
          if constexpr (kQ) {
            uint32_t wb;
            if (q_fast_weight(as_u32(wt[i]), sc[i], &wb)) {
              q_fast_accumulate<kWords>(acc, raw[i], as_f32(wb));
            } else if constexpr (V > 8) {  // rare: the shared-memory table
              q_table_accumulate<V>(acc, raw[i], sc[i], wt[i], tab, tid);
            } else {
#pragma unroll
              for (int j = 0; j < V; ++j) {
                const uint32_t nib = (raw[i][j / 8] >> (4 * (j % 8))) & 0xFu;
                const float v = as_f32(mx_decode_bits(nib, sc[i]));
                acc[j] = f32_add_rn(acc[j], f32_mul_rn(v, wt[i]));
              }
            }
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const uint32_t w = raw[i][j / 2];
              const float v = as_f32((j % 2) ? (w & 0xFFFF0000u) : (w << 16));
              acc[j] = f32_add_rn(acc[j], f32_mul_rn(v, wt[i]));
            }
          }
        }
      }
    }
    // the MXFP4 kernel writes plain zeros when num_rows == 0 (the bf16 one scales them)
    if (!kQ || rows > 0) scale_sum<V>(acc, a.routed_scaling_factor);
    uint16_t* dst = a.out + t * D + col;
    if constexpr (V % 8 == 0) {
#pragma unroll
      for (int g = 0; g < V / 8; ++g) {
        uint32_t w[4];
        pack_bf16x8(acc + 8 * g, w);
        store_bf16x8(dst + 8 * g, out_al, w);
      }
    } else {
      uint32_t w[kWords];
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        w[j] = f32_bits_to_bf16_rne(as_u32(acc[2 * j]));
        if (2 * j + 1 < V) w[j] |= f32_bits_to_bf16_rne(as_u32(acc[2 * j + 1])) << 16;
      }
      store_bf16xv<V>(dst, out_al, w);
    }
  }
}

// One launch of the small-M kernel with the shape (kV, kT) (arguments already checked; the
// device tools call it directly to time every candidate).
template <int D, int K, bool kQ, int kV, int kT>
inline int launch_scatter_small(const AiterAuxScatterArgs& a, void* stream, const char* op) {
  constexpr int V = small_v<D, kQ, kV>();
  const int64_t units = a.num_tokens * (D / V);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kT), 1, 65535));
  // every row (model_dim % V == 0) is aligned like the base pointer: MXFP4 V / 2-byte code
  // loads, bf16 V * 2-byte loads; stores of 16 bytes (V % 8 == 0) or V * 2 bytes
  const bool in_al = kQ ? is_aligned(a.expert_out_q, V / 2) : is_aligned(a.expert_out, V * 2);
  const bool out_al = is_aligned(a.out, V % 8 == 0 ? 16 : V * 2);
  AITER_AUX_LAUNCH((scatter_reduce_small_kernel<D, K, kQ, V, kT>), dim3(blocks), dim3(kT),
                   static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al);
  return check_launch(op);
}

// The small-M launch: the shape of M * model_dim (see small_shape above).
template <int D, int K, bool kQ>
inline int launch_scatter_small_auto(const AiterAuxScatterArgs& a, void* stream, const char* op) {
  constexpr SmallShape kDec = decode_shape<kQ>();
  constexpr SmallShape kSmall = small_shape<kQ>();
  constexpr SmallShape kMid = mid_shape<kQ>();
  if (a.num_tokens * D <= kDecodeMaxElems)
    return launch_scatter_small<D, K, kQ, kDec.v, kDec.threads>(a, stream, op);
  if (kQ || a.num_tokens * D <= kSmallMidElems)
    return launch_scatter_small<D, K, kQ, kSmall.v, kSmall.threads>(a, stream, op);
  return launch_scatter_small<D, K, kQ, kMid.v, kMid.threads>(a, stream, op);
}

}  // namespace scatter_detail
}  // namespace gpu
}  // namespace aiter_aux
