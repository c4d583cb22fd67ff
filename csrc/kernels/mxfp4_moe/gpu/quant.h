// mxfp4_quant (per_1x32) on the GPU; docs/ops.md is the spec.
//
// Layout of the work: the tensor is treated as a flat array of 16-byte units
// (8 bf16).  Lane u of the grid loads unit u; the 4 lanes of an aligned quad
// hold one block of 32 (model_dim % 32 == 0, so a block never straddles a row),
// reduce its max |x| with two quad shuffles, and each writes its 4 bytes of
// a_q; the quad's first lane writes the scale byte.  Loops are warp-uniform
// (grid-stride over warp tiles) so every lane reaches every shuffle.
//
// Arithmetic: the scale needs one fp32 multiply (amax * fp32(1/6)), done on
// normal operands only (tiny amax is pre-scaled by 2^64 exactly, see
// mx_scale_exponent), so no denormal mode can change it.  The element codes are
// integer comparisons of |x|'s bits against the seven rounding thresholds of the
// e2m1 grid scaled by 2^(s-127) -- exact, mode-independent.  On gfx950 a
// block whose max |x| is at least 2^-119 uses v_cvt_scalef32_pk_fp4_bf16 (see
// quant8 for why its result equals the spec there).
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace quant_detail {

// fp32(1/6)
constexpr uint32_t kOneSixthBits = 0x3E2AAAABu;

// e8m0 exponent s of a finite block, from the bf16 bits of its max |x| (sign
// cleared, < 0x7F80):  w = fp32(amax * fp32(1/6)),
// s = min(254, (bits(w) + 0x7FFFFF) >> 23).
__host__ __device__ __forceinline__ uint32_t mx_scale_exponent(uint32_t amax16) {
  if (amax16 == 0) return 0;
  const float c = as_f32_any(kOneSixthBits);
  if (amax16 >= 0x0C00u) {
    // amax >= 2^-103: operands and product are normal fp32.
    const float w = as_f32_any(amax16 << 16) * c;
    const uint32_t s = (as_u32_any(w) + 0x7FFFFFu) >> 23;
    return s < 254u ? s : 254u;
  }
  // amax < 2^-103: compute w' = fp32(amax * 2^64 * c) with normal operands.
  // Where the exact product amax*c is >= 2^-126, w = w' * 2^-64 exactly (both
  // normal, same rounding), so s = s' - 64.  Below 2^-126, w (rounded in the
  // subnormal range) is at most 2^-126 and nonzero, so s = 1; then s' <= 65.
  float a;
  if (amax16 >= 0x0080u) {
    a = as_f32_any((amax16 + (64u << 7)) << 16);  // exponent field + 64
  } else {
    a = static_cast<float>(amax16) * as_f32_any(0x1D000000u);  // m * 2^-133 * 2^64 = m * 2^-69
  }
  const float w = a * c;
  const int s = static_cast<int>((as_u32_any(w) + 0x7FFFFFu) >> 23) - 64;
  return s > 1 ? static_cast<uint32_t>(s) : 1u;
}

// fp32 bits of t * 2^(s-127) for a threshold t = 1.x * 2^k with at most 3
// significant bits and exponent field >= 125; saturates to +inf bits.
__host__ __device__ __forceinline__ uint32_t scale_threshold(uint32_t tbits, uint32_t s) {
  const int e = static_cast<int>(tbits >> 23) + static_cast<int>(s) - 127;
  const uint32_t mant = tbits & 0x7FFFFFu;
  if (e >= 255) return 0x7F800000u;
  if (e >= 1) return (static_cast<uint32_t>(e) << 23) | mant;
  return (0x800000u | mant) >> (1 - e);  // e >= -2 here: exact subnormal
}

// |x| (bf16 bits) > T  <=>  a16 > (T >> 16);  |x| >= T  <=>  a16 > ceil(T / 2^16) - 1.
__host__ __device__ __forceinline__ uint32_t gt_bound(uint32_t t) { return t >> 16; }
__host__ __device__ __forceinline__ uint32_t ge_bound(uint32_t t) { return ((t + 0xFFFFu) >> 16) - 1u; }

// The seven 16-bit bounds of block exponent s: code(|x|) = #{i : a16 > U[i]}.
// Magnitude code: |q| <= 0.25 -> 0; < 0.75 -> 1; <= 1.25 -> 2; < 1.75 -> 3;
// <= 2.5 -> 4; < 3.5 -> 5; <= 5 -> 6; else 7, with q = x * 2^(127-s), i.e.
// |x| compared with t * 2^(s-127).
struct Bounds {
  uint32_t u[7];
};

__host__ __device__ __forceinline__ Bounds mx_bounds(uint32_t s) {
  Bounds b;
  if (s >= 3u && s <= 252u) {
    // Every scaled threshold is a normal fp32 (exponent field 125..129 plus
    // s - 127 stays in [1, 254]) with zero low 16 bits: gt_bound is its bf16
    // bits, ge_bound those minus 1, and scaling adds (s - 127) << 7.
    const uint32_t d = (s - 127u) << 7;  // mod 2^32
    b.u[0] = 0x3E80u + d;
    b.u[1] = 0x3F3Fu + d;
    b.u[2] = 0x3FA0u + d;
    b.u[3] = 0x3FDFu + d;
    b.u[4] = 0x4020u + d;
    b.u[5] = 0x405Fu + d;
    b.u[6] = 0x40A0u + d;
    return b;
  }
  b.u[0] = gt_bound(scale_threshold(0x3E800000u, s));  // q > 0.25
  b.u[1] = ge_bound(scale_threshold(0x3F400000u, s));  // q >= 0.75
  b.u[2] = gt_bound(scale_threshold(0x3FA00000u, s));  // q > 1.25
  b.u[3] = ge_bound(scale_threshold(0x3FE00000u, s));  // q >= 1.75
  b.u[4] = gt_bound(scale_threshold(0x40200000u, s));  // q > 2.5
  b.u[5] = ge_bound(scale_threshold(0x40600000u, s));  // q >= 3.5
  b.u[6] = gt_bound(scale_threshold(0x40A00000u, s));  // q > 5
  return b;
}

// e2m1 nibble of one bf16 element of a finite block.
__host__ __device__ __forceinline__ uint32_t mx_code(uint32_t h, const Bounds& b) {
  const uint32_t a = h & 0x7FFFu;
  uint32_t c = 0;
  for (int i = 0; i < 7; ++i) c += (a > b.u[i]) ? 1u : 0u;
  return c | ((h >> 12) & 0x8u);
}

// (No `#pragma unroll` in these __host__ __device__ helpers: host compilers
// warn about it; the constant-trip loops are unrolled by the device compilers.)
// Software conversion of 8 elements (w[j] = elements 2j | 2j+1 << 16) of a
// finite block with exponent s; element i goes to nibble i.
__host__ __device__ __forceinline__ uint32_t mx_pack8_sw(const uint32_t w[4], uint32_t s) {
  const Bounds b = mx_bounds(s);
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j) {
    out |= mx_code(w[j] & 0xFFFFu, b) << (8 * j);
    out |= mx_code(w[j] >> 16, b) << (8 * j + 4);
  }
  return out;
}

// ---- packed bf16x2 fast path (sm_90 and the emulation) ----
// For 3 <= s <= 253 (every finite block whose max |x| is not tiny), per pair of
// elements packed in a word: q = |x| * 2^(127-s) (bf16x2 multiply by a power
// of two: exact, or below 2^-126 where the code is 0 anyway -- in any
// denormal mode); M = 64 * max(1, 2^floor(log2 q)) in {64, 128, 256}, whose
// bf16 ulp (0.5, 1, 2) is the e2m1 spacing of q's binade; y = bf16(q + M)
// rounds q to that spacing, ties to even -- exactly the spec's thresholds
// (<= 0.25 / < 0.75 / <= 1.25 / < 1.75 / <= 2.5 / < 3.5 / <= 5); the code is
// the number of ulps (y - M) plus 0, 2, 4 for M = 64, 128, 256, i.e.
// (y - M) + (M >> 6) - 266 in each 16-bit half (no carries cross halves).
// A block's elements are at most its max, so q <= 6 (see mx_scale_exponent).
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define AITER_AUX_QUANT_PK_HW 1
#else
#define AITER_AUX_QUANT_PK_HW 0
#endif
#if AITER_AUX_QUANT_PK_HW || defined(AITER_AUX_GPU_EMU)
#define AITER_AUX_QUANT_PK 1
#else
#define AITER_AUX_QUANT_PK 0
#endif

__host__ __device__ __forceinline__ uint32_t pk_max_u16(uint32_t a, uint32_t b) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const uint32_t lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

// q = a * scale for a, q >= 0 bf16 halves and scale a power of two.
__host__ __device__ __forceinline__ uint32_t pk_mul_pow2_bf16(uint32_t a, uint32_t scale) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(scale));
  return d;
#else
  // exact where the result is a normal bf16; a tiny result only needs to stay tiny
  const float lo = as_f32_any(a << 16) * as_f32_any(scale << 16);
  const float hi = as_f32_any(a & 0xFFFF0000u) * as_f32_any(scale & 0xFFFF0000u);
  return (as_u32_any(lo) >> 16) | (as_u32_any(hi) & 0xFFFF0000u);
#endif
}

// bf16(q + m), round to nearest even, for q >= 0 and m in {64, 128, 256}.
__host__ __device__ __forceinline__ uint32_t pk_add_bf16(uint32_t q, uint32_t m) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(q), "r"(m));
  return d;
#else
  // the fp32 sum is exact unless q < m * 2^-16, where bf16 rounding gives m either way
  volatile float lo = as_f32_any(q << 16) + as_f32_any(m << 16);
  volatile float hi = as_f32_any(q & 0xFFFF0000u) + as_f32_any(m & 0xFFFF0000u);
  return f32_bits_to_bf16_rne(as_u32_any(lo)) | (f32_bits_to_bf16_rne(as_u32_any(hi)) << 16);
#endif
}

// 4 a_q bytes of 8 elements (w[j] = elements 2j | 2j+1 << 16) of a finite
// block with 3 <= s <= 253.
__host__ __device__ __forceinline__ uint32_t mx_pack8_pk(const uint32_t w[4], uint32_t s) {
  const uint32_t scale = ((254u - s) << 7) * 0x10001u;  // bf16x2 2^(127-s)
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t q = pk_mul_pow2_bf16(w[j] & 0x7FFF7FFFu, scale);
    const uint32_t m = (pk_max_u16(q, 0x3F803F80u) & 0x7F807F80u) + 0x03000300u;
    const uint32_t y = pk_add_bf16(q, m);
    uint32_t c = (y - m) + (m >> 6) - 0x010A010Au;  // codes at bits 0-2 and 16-18
    c |= (w[j] >> 12) & 0x00080008u;                  // sign bits 15, 31 -> 3, 19
    // bits 4-15 of c are zero: the low byte of c | c >> 12 is lo | hi << 4
    out |= ((c | (c >> 12)) & 0xFFu) << (8 * j);
  }
  return out;
}

// 8 elements of a block whose max |x| bits (after the quad reduction) are
// amax16.  Returns the 4 a_q bytes; *s_out = the block's scale byte.
__device__ __forceinline__ uint32_t quant8(const uint32_t w[4], uint32_t amax16, uint32_t* s_out) {
  if (amax16 >= 0x7F80u) {  // a NaN or an Inf in the block
    *s_out = 255u;
    return 0u;
  }
  const uint32_t s = mx_scale_exponent(amax16);
  *s_out = s;
#if AITER_AUX_AMDGCN_DEVICE && defined(__gfx950__)
  // v_cvt_scalef32_pk_fp4_bf16 converts x / 2^(e-127), e = exponent field
  // of the scale operand (here s << 23), to e2m1 by pure exponent arithmetic
  // on the source (no intermediate rounding), rounding to nearest even and
  // saturating to +-6; zeros keep their sign, and so do values that round to
  // zero.  That is the spec's q = x * 2^(127-s) rounded as specified, for every
  // normal bf16 x.  A bf16 subnormal x is the only input whose handling could
  // depend on a denormal mode; with amax >= 2^-119 we have s >= 3, so
  // |q| < 2^-126 * 2^124 = 0.25 and the spec's code is the sign bit alone --
  // which the instruction gives whether it normalises such an input or flushes
  // it to a signed zero.  Smaller blocks take the exact software path.
  if (amax16 >= 0x0400u) {
    typedef __bf16 bf16x2_t __attribute__((ext_vector_type(2)));
    const float scale = as_f32(s << 23);
    uint32_t r = 0;
    r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[0]), scale, 0);
    r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[1]), scale, 1);
    r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[2]), scale, 2);
    r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[3]), scale, 3);
    return r;
  }
#endif
#if AITER_AUX_QUANT_PK
  if (s >= 3u && s <= 253u) return mx_pack8_pk(w, s);
#endif
  return mx_pack8_sw(w, s);
}

// Quantises the whole tensor with warps gwarp, gwarp + nwarps, ... over warp
// tiles of kWarpSize units; a warp takes kQuantUnroll tiles (nwarps tiles
// apart) per step and issues their loads together, so a small tensor still
// spreads over all warps.  Every lane of a warp must call it.
constexpr int kQuantUnroll = 4;

template <int D>
__device__ __forceinline__ void quant_tensor(const AiterAuxQuantArgs& a, int64_t gwarp,
                                             int64_t nwarps, bool x_al16, bool q_al4) {
  static_assert(D > 0 && D % 32 == 0, "model_dim must be a positive multiple of 32");
  constexpr int U = kQuantUnroll;
  const int64_t units = a.num_tokens * static_cast<int64_t>(D / 8);
  const int lane = lane_id();
  const int64_t sub = nwarps * kWarpSize;  // sub-tile s of a step is s * sub units further
  for (int64_t base = gwarp * kWarpSize; base < units; base += sub * U) {
    uint32_t w[U][4];
#pragma unroll
    for (int s = 0; s < U; ++s) {
      const int64_t u = base + s * sub + lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[s][j] = 0u;
      if (u < units) load_bf16x8(a.x + u * 8, x_al16, w[s]);
    }
#pragma unroll
    for (int s = 0; s < U; ++s) {
      if (base + s * sub >= units) break;  // warp-uniform
      const int64_t u = base + s * sub + lane;
      const bool act = u < units;  // whole quads are in or out (units % 4 == 0)
      const uint32_t m2 = pk_max_u16(pk_max_u16(w[s][0] & 0x7FFF7FFFu, w[s][1] & 0x7FFF7FFFu),
                                     pk_max_u16(w[s][2] & 0x7FFF7FFFu, w[s][3] & 0x7FFF7FFFu));
      uint32_t m = (m2 & 0xFFFFu) > (m2 >> 16) ? (m2 & 0xFFFFu) : (m2 >> 16);
      m = quad_max_u32(m);
      uint32_t sc;
      const uint32_t q = quant8(w[s], m, &sc);
      if (act) {
        store_u8x4(a.a_q + u * 4, q_al4, q);
        if ((lane & 3) == 0) a.a_scale[u >> 2] = static_cast<uint8_t>(sc);
      }
    }
  }
}

constexpr int kQuantThreads = 256;

template <int D>
__global__ __launch_bounds__(kQuantThreads) void mxfp4_quant_kernel(AiterAuxQuantArgs a,
                                                                    int num_blocks, bool x_al16,
                                                                    bool q_al4) {
  constexpr int kWarps = kQuantThreads / kWarpSize;
  const int64_t gwarp = static_cast<int64_t>(block_idx()) * kWarps + warp_id();
  quant_tensor<D>(a, gwarp, static_cast<int64_t>(num_blocks) * kWarps, x_al16, q_al4);
}

// Host-side argument check shared by mxfp4_quant and moe_sort_quant.
template <int D>
inline int check_quant_args(const AiterAuxQuantArgs& a, const char* op) {
  if (a.model_dim != D)
    return fail_invalid("%s: model_dim %d does not match the instance (%d)", op, a.model_dim, D);
  if (a.num_tokens < 0) return fail_invalid("%s: num_tokens %lld < 0", op, (long long)a.num_tokens);
  if (a.num_tokens > 0 && (a.x == nullptr || a.a_q == nullptr || a.a_scale == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  return AITER_AUX_OK;
}

}  // namespace quant_detail

template <int ModelDim>
int mxfp4_quant(const AiterAuxQuantArgs& a, void* stream) {
  using namespace quant_detail;
  const int rc = check_quant_args<ModelDim>(a, "mxfp4_quant");
  if (rc != AITER_AUX_OK) return rc;
  if (a.num_tokens == 0) return AITER_AUX_OK;
  const int64_t units = a.num_tokens * static_cast<int64_t>(ModelDim / 8);
  // one step per warp where the grid allows; at least ~2 blocks per SM of work spread
  const int64_t want = ceil_div_i64(units, kQuantThreads * kQuantUnroll);
  const int64_t spread = ceil_div_i64(units, kQuantThreads);
  const int blocks = static_cast<int>(clamp_i64(want > 264 ? want : (spread < 264 ? spread : 264), 1, 8192));
  const bool x_al16 = is_aligned(a.x, 16);
  const bool q_al4 = is_aligned(a.a_q, 4);
  AITER_AUX_LAUNCH((mxfp4_quant_kernel<ModelDim>), dim3(blocks), dim3(kQuantThreads),
                   static_cast<hipStream_t>(stream))(a, blocks, x_al16, q_al4);
  return check_launch("mxfp4_quant");
}

}  // namespace gpu
}  // namespace aiter_aux
