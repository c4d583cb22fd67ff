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
// MXFP4 kernel: 64-thread blocks (a block's threads finish close together, so
// the SMs refill evenly; docs/perf.md log 33, 35).  Its pairs are loaded in
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

// acc *= routed_scaling_factor, one fp32 multiply each (skipped for 1.0, which gives the
// same bits: x * 1.0f == x, a NaN's payload is rounded away to 0x7FC0 anyway).
template <int N>
__device__ __forceinline__ void scale_sum(float* acc, float scale) {
  if (scale == 1.0f) return;
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = f32_mul_rn(acc[j], scale);
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
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        const int p = k0 + i < K ? rev[k0 + i] : -1;
        ok[i] = p >= 0 && p < rows;
        ps[i] = ok[i] ? p : 0;
      }
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
      for (int i = 0; i < V; ++i) dst[i] = static_cast<uint16_t>(f32_bits_to_bf16_rne(as_u32(acc[i])));
    }
  }
}

// MXFP4 variant.  One thread per (token, 32-column block) unit: per pair it
// loads the 16 bytes (32 e2m1) of the block and its scale byte (kKB pairs'
// loads issued together), then accumulates the pair's 32 products in k order.
//
// Fast path (per pair and block): the spec's product fp32(decode(nib, s) * w)
// is the fp32 rounding of the real number e2m1(nib) * 2^(s-127) * w whenever
// decode is exact (s <= 252: no overflow; subnormals are exact).  Writing it
// as x * W with x = e2m1(nib) * 2^-14 and W = w * 2^(s-113) is the same real
// number, so one f32_mul_rn gives the same bits -- provided W is exactly
// w * 2^(s-113): an exponent add on a normal w that stays in the normal range
// (or w = +-0, Inf, NaN, which a scaling does not change).  x is exact as an
// fp16: sign -> bit 15, the 3 magnitude bits (e1 e0 m) -> bits 11..9 give
// 2^(e-15) * (1 + m/2) for e >= 1 and m * 2^-15 for e = 0, i.e. e2m1 * 2^-14,
// and fp16 -> fp32 conversion is exact.  So an element costs 1.5 bit ops (the
// 8 of a word are built with 12: e2m1x8_as_f16x2), one conversion, one
// f32_mul_rn and one f32_add_rn.  Anything else (s > 252, subnormal w, W out of
// range) takes the general per-element decode: same bits, rarely taken.
__device__ __forceinline__ void load_q16(const uint8_t* p, bool al16, uint32_t w[4]) {
  if (al16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = load_u8x4(p + 4 * i, false);
  }
}

// W = w * 2^(s-113) when that is exact and decode(., s) is exact (see above);
// false sends the pair through the general decode.  Exact: s <= 252 and either
// w is +-0, Inf or NaN (W = w) or w is normal and so is W (its exponent field
// ew + s - 113 in [1, 254]).  Branch-free.
__host__ __device__ __forceinline__ bool q_fast_weight(uint32_t w_bits, uint32_t s, uint32_t* big_w) {
  const uint32_t ew = (w_bits >> 23) & 0xFFu;
  const bool normal = ew - 1u < 254u && ew + s - 114u < 254u;  // unsigned: wraps below
  const bool keep = ew == 255u || (w_bits << 1) == 0u;
  *big_w = normal ? w_bits + ((s - 113u) << 23) : w_bits;  // mod 2^32: adds s - 113 to ew
  return s <= 252u && (normal || keep);
}

// f16_bits_to_f32_any, f16_half_to_f32<kHigh>: target_ops.h.

// fp16 bits of e2m1 * 2^-14 of one nibble s e1 e0 m: s at bit 15, e1 e0 m at
// bits 11..9 (the definition e2m1x8_as_f16x2 is tested against).
__host__ __device__ __forceinline__ uint32_t e2m1_as_f16(uint32_t nib) {
  return ((nib & 8u) << 12) | ((nib & 7u) << 9);
}

// The 8 nibbles of x as 4 fp16x2 words: h[J] holds nibble J (low half) and
// nibble J + 4 (high half), each as e2m1_as_f16.  12 bit operations: in a
// nibble the sign is 1 bit above e1 e0 m, in the fp16 4 bits; z_even takes x's
// bits at the even nibbles' e1 e0 m (kEven) and x << 3's elsewhere, so an even
// nibble's sign sits 4 bits above its magnitude and one shift and one mask
// place both (nibbles 0/4: << 9, 2/6: << 1); z_odd likewise for nibbles 1/5
// (<< 5).  Nibble 7's sign would leave the word that way, so h[3] is built
// from x >> 3 (magnitudes) and x (signs).
__host__ __device__ __forceinline__ void e2m1x8_as_f16x2(uint32_t x, uint32_t h[4]) {
  constexpr uint32_t kF16 = 0x8E008E00u;  // sign and e1 e0 m of both halves
  constexpr uint32_t kEven = 0x07070707u, kOdd = 0x70707070u;
  const uint32_t x3 = x << 3;
  const uint32_t z_even = bit_select(kEven, x3, x);
  const uint32_t z_odd = (x & kOdd) | (x3 & ~kOdd);
  h[0] = (z_even << 9) & kF16;
  h[1] = (z_odd << 5) & kF16;
  h[2] = (z_even << 1) & kF16;
  h[3] = ((x >> 3) & 0x0E000E00u) | (x & 0x80008000u);
}

// bf16 (RNE, NaN -> 0x7FC0) of 8 accumulators as 4 packed words.  On CUDA the
// rounding is the hardware's cvt.rn.bf16x2.f32 (IEEE round-to-nearest-even,
// subnormals kept: the same bits as f32_bits_to_bf16_rne) unless one of them is
// NaN, whose bf16 the hardware need not make 0x7FC0.
__device__ __forceinline__ void pack_bf16x8(const float* v, uint32_t w[4]) {
#if defined(AITER_AUX_GPU_CUDA)
  bool nan = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) nan = nan || v[j] != v[j];
  if (!nan) {
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = cvt_rn_bf16x2_f32(v[2 * j + 1], v[2 * j]);
    return;
  }
#endif
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = f32_bits_to_bf16_rne(as_u32(v[2 * j])) | (f32_bits_to_bf16_rne(as_u32(v[2 * j + 1])) << 16);
}

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
      for (int g = 0; g < 4; ++g) store_bf16x8(a.out + static_cast<int64_t>(u) * 32 + 8 * g, out_al16, z);
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
          const float big_w = as_f32(wb);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            uint32_t h[4];
            e2m1x8_as_f16x2(raw[i][w], h);
            float* ac = acc + 8 * w;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              ac[j] = f32_add_rn(ac[j], f32_mul_rn(f16_half_to_f32<false>(h[j]), big_w));
              ac[j + 4] = f32_add_rn(ac[j + 4], f32_mul_rn(f16_half_to_f32<true>(h[j]), big_w));
            }
          }
        } else {
          // rare: the 16 products P[nib] = fp32(decode(nib, s) * w) by the general
          // decode into this thread's column of a shared-memory table, then one
          // table read per element (keeps the register footprint of the fast path)
#pragma unroll 1
          for (int m = 0; m < 8; ++m) {
            const float pr = f32_mul_rn(as_f32(mx_decode_bits(static_cast<uint32_t>(m), sc[i])), wt[i]);
            tab[m][tid] = pr;
            tab[m + 8][tid] = as_f32(as_u32(pr) ^ 0x80000000u);  // exact; a NaN's sign is dropped later
          }
#pragma unroll
          for (int j = 0; j < 32; ++j) {
            const uint32_t nib = (raw[i][j / 8] >> (4 * (j % 8))) & 0xFu;
            acc[j] = f32_add_rn(acc[j], tab[nib][tid]);
          }
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

// Small-M launch shape (num_tokens <= small_max_tokens<kQ>()): one thread per (token, V
// columns) with V = 4 (bf16; fewer when D % 4 != 0) or 8 (MXFP4: one 4-byte word of
// e2m1 codes), 64-thread blocks, one unit per thread.  All topk pairs of a unit (up to 16;
// more in batches of 16) are loaded together right after the reverse_sorted entries: one
// dependent memory round trip after that load, where the large-M kernels take
// ceil(topk / 8) (bf16) or ceil(topk / 4) (MXFP4).  Each SM gets a few kB, so at M = 1 the
// grid (D / 4 / 64 blocks: 28 at D = 7168) spreads the rows over many SMs instead of 4
// blocks that each pull 36 kB.  Same arithmetic, same order, same bits as the large-M
// kernels (the MXFP4 fast product of scatter_reduce_q_kernel per 8 elements, else the
// general decode per element).
constexpr int kThreadsSmall = 64;
constexpr int kSmallMaxBatch = 16;
template <bool kQ>
__host__ __device__ constexpr int small_max_tokens() {
  // MXFP4: up to M = 256, where the 64-thread kernel's 3 dependent batches (topk 9-12)
  // still dominate; above it its per-pair work per 32 columns is the cheaper shape.
  return kQ ? 256 : 1024;
}
template <int D, bool kQ>
__host__ __device__ constexpr int small_vec_width() {
  return kQ ? 8 : (vec_width<D>() < 4 ? vec_width<D>() : 4);
}

// V consecutive bf16 as (V + 1) / 2 little-endian words; `al`: the V * 2-byte access is aligned.
template <int V>
__device__ __forceinline__ void load_bf16xv(const uint16_t* p, bool al, uint32_t* w) {
  if constexpr (V == 4) {
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

template <int D, int K, bool kQ>
__global__ __launch_bounds__(kThreadsSmall) void scatter_reduce_small_kernel(AiterAuxScatterArgs a,
                                                                             int num_blocks,
                                                                             bool in_al, bool out_al) {
  const PdlScope pdl;
  constexpr int V = small_vec_width<D, kQ>();
  constexpr int kUnitsPerRow = D / V;
  constexpr int kWords = (V + 1) / 2;  // bf16 words per pair (MXFP4: 1 word of 8 codes)
  constexpr int kKB = K < kSmallMaxBatch ? K : kSmallMaxBatch;
  const int64_t units = a.num_tokens * kUnitsPerRow;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kThreadsSmall;
  const int64_t rows = a.num_rows;
  for (int64_t u = static_cast<int64_t>(block_idx()) * kThreadsSmall + thread_idx(); u < units;
       u += stride) {
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
#pragma unroll
        for (int i = 0; i < kKB; ++i) {
          const int p = k0 + i < K ? rev[k0 + i] : -1;
          ok[i] = p >= 0 && p < rows;
          ps[i] = ok[i] ? p : 0;  // a skipped pair loads row 0 and is not accumulated
        }
        float wt[kKB];
        uint32_t raw[kKB][kQ ? 1 : kWords];
        uint32_t sc[kKB];
#pragma unroll
        for (int i = 0; i < kKB; ++i) {
          const int64_t p = ps[i];
          wt[i] = a.sorted_weights[p];
          sc[i] = 0;
          if constexpr (kQ) {
            raw[i][0] = load_u8x4(a.expert_out_q + p * (D / 2) + col / 2, in_al);
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
              const float big_w = as_f32(wb);
              uint32_t h[4];
              e2m1x8_as_f16x2(raw[i][0], h);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                acc[j] = f32_add_rn(acc[j], f32_mul_rn(f16_half_to_f32<false>(h[j]), big_w));
                acc[j + 4] = f32_add_rn(acc[j + 4], f32_mul_rn(f16_half_to_f32<true>(h[j]), big_w));
              }
            } else {
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const float v = as_f32(mx_decode_bits((raw[i][0] >> (4 * j)) & 0xFu, sc[i]));
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
    if constexpr (V == 8) {
      uint32_t w[4];
      pack_bf16x8(acc, w);
      store_bf16x8(dst, out_al, w);
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
  if (a.num_tokens <= small_max_tokens<kQ>()) {
    constexpr int Vs = small_vec_width<D, kQ>();
    const int64_t units = a.num_tokens * (D / Vs);
    const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kThreadsSmall), 1, 65535));
    // vector accesses: MXFP4 4-byte code words (D / 2 % 4 == 0) and 16-byte bf16 stores;
    // bf16 Vs * 2-byte loads and stores (D % Vs == 0 keeps every row aligned like the base)
    const bool in_al = kQ ? is_aligned(a.expert_out_q, 4) : is_aligned(a.expert_out, Vs * 2);
    const bool out_al = kQ ? out_al16 : is_aligned(a.out, Vs * 2);
    AITER_AUX_LAUNCH((scatter_reduce_small_kernel<D, K, kQ>), dim3(blocks), dim3(kThreadsSmall),
                     static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al);
    return check_launch(op);
  }
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
