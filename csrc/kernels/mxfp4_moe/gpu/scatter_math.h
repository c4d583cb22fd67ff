// The per-element arithmetic of moe_scatter_reduce[_q] shared by its kernels (scatter.h,
// scatter_small.h): the vector width, the spec's MXFP4 decode, the routed scaling, the MXFP4
// fast product (proof below) and the bf16 packing.  docs/ops.md is the spec.
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace scatter_detail {

// Threads of a block of the bf16 scatter-reduce and of moe_sum.
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

// acc *= routed_scaling_factor, one fp32 multiply each (skipped for 1.0, which gives the
// same bits: x * 1.0f == x, a NaN's payload is rounded away to 0x7FC0 anyway).
template <int N>
__device__ __forceinline__ void scale_sum(float* acc, float scale) {
  if (scale == 1.0f) return;
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = f32_mul_rn(acc[j], scale);
}

// MXFP4 fast product (per pair, 32-element block): the spec's product
// fp32(decode(nib, s) * w) is the fp32 rounding of the real number
// e2m1(nib) * 2^(s-127) * w whenever decode is exact (s <= 252: no overflow;
// subnormals are exact).  Writing it as x * W with x = e2m1(nib) * 2^-14 and
// W = w * 2^(s-113) is the same real number, so one f32_mul_rn gives the same
// bits -- provided W is exactly w * 2^(s-113): an exponent add on a normal w
// that stays in the normal range (or w = +-0, Inf, NaN, which a scaling does not
// change).  x is exact as an fp16: sign -> bit 15, the 3 magnitude bits
// (e1 e0 m) -> bits 11..9 give 2^(e-15) * (1 + m/2) for e >= 1 and m * 2^-15 for
// e = 0, i.e. e2m1 * 2^-14, and fp16 -> fp32 conversion is exact.  So an element
// costs 1.5 bit ops (the 8 of a word are built with 12: e2m1x8_as_f16x2), one
// conversion, one f32_mul_rn and one f32_add_rn.  Anything else (s > 252,
// subnormal w, W out of range) takes the general per-element decode: same bits,
// rarely taken.

// 16 bytes of e2m1 codes as 4 little-endian words; al16: p is 16-byte aligned.
__device__ __forceinline__ void load_q16(const uint8_t* p, bool al16, uint32_t w[4]) {
  if (al16) {
    load_u32x4(p, w);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = load_u8x4(p + 4 * i, false);
  }
}

// W = w * 2^(s-113) when that is exact and decode(., s) is exact (see above);
// false sends the pair through the general decode.  Exact: s <= 252 and either
// w is +-0, Inf or NaN (W = w) or w is normal and so is W (its exponent field
// ew + s - 113 in [1, 254]).  Branch-free.
__host__ __device__ __forceinline__ bool q_fast_weight(uint32_t w_bits, uint32_t s,
                                                       uint32_t* big_w) {
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

// The rows of the pairs k0 .. k0 + kKB - 1 of a token (rev: its K entries of reverse_sorted):
// ok[i] where 0 <= p < rows; a skipped pair (past K too) loads row 0 and is not accumulated.
template <int K, int kKB>
__device__ __forceinline__ void pair_rows(const int32_t* rev, int k0, int64_t rows, int* ps,
                                          bool* ok) {
#pragma unroll
  for (int i = 0; i < kKB; ++i) {
    const int p = k0 + i < K ? rev[k0 + i] : -1;
    ok[i] = p >= 0 && p < rows;
    ps[i] = ok[i] ? p : 0;
  }
}

// acc[j] += the fast product of element j of raw's kWords words of e2m1 codes (8 a word),
// big_w = W from q_fast_weight.
template <int kWords>
__device__ __forceinline__ void q_fast_accumulate(float* acc, const uint32_t* raw, float big_w) {
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    uint32_t h[4];
    e2m1x8_as_f16x2(raw[w], h);
    float* ac = acc + 8 * w;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ac[j] = f32_add_rn(ac[j], f32_mul_rn(f16_half_to_f32<false>(h[j]), big_w));
      ac[j + 4] = f32_add_rn(ac[j + 4], f32_mul_rn(f16_half_to_f32<true>(h[j]), big_w));
    }
  }
}

// acc[j] += fp32(decode(nib_j, s) * w) for the kN codes of raw, where q_fast_weight is false
// (rare): the 16 products P[nib] by the general decode into this thread's column tid of the
// shared-memory table tab, then one table read per element (keeps the register footprint of
// the fast path and the unrolled pair loop small).
template <int kN, int kCols>
__device__ __forceinline__ void q_table_accumulate(float* acc, const uint32_t* raw, uint32_t s,
                                                   float w, float (*tab)[kCols], int tid) {
#pragma unroll 1
  for (int m = 0; m < 8; ++m) {
    const float pr = f32_mul_rn(as_f32(mx_decode_bits(static_cast<uint32_t>(m), s)), w);
    tab[m][tid] = pr;
    tab[m + 8][tid] = as_f32(as_u32(pr) ^ 0x80000000u);  // exact; a NaN's sign is dropped later
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const uint32_t nib = (raw[j / 8] >> (4 * (j % 8))) & 0xFu;
    acc[j] = f32_add_rn(acc[j], tab[nib][tid]);
  }
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
    w[j] =
        f32_bits_to_bf16_rne(as_u32(v[2 * j])) | (f32_bits_to_bf16_rne(as_u32(v[2 * j + 1])) << 16);
}

}  // namespace scatter_detail
}  // namespace gpu
}  // namespace aiter_aux
