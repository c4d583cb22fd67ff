// mxfp4_quant (per_1x32) on the GPU; docs/ops.md is the spec.
//
// Layout of the work: the tensor is a flat array of 32-element blocks
// (model_dim % 32 == 0, so a block never straddles a row), each of 4 16-byte
// units (8 bf16).  A warp tile is kWarpSize / 2 consecutive blocks: lanes 2p
// and 2p+1 hold block p of the tile, lane 2p + o its units o and o + 2, so
// each 16-byte load instruction of the warp reads whole 32-byte sectors
// (units 4p, 4p+1 of every block, then 4p+2, 4p+3).  The lane pair reduces
// max |x| with one shuffle, both lanes derive the scale, each writes its two
// 4-byte groups of a_q (bytes 4o..4o+3 and 8+4o..11+4o of the block's 16) and
// the even lane the scale byte.  A warp takes kStepTiles consecutive tiles per
// step (all loads issued before any compute; the offsets are constants) and
// steps grid-stride over the warps of the grid.  Loops and the full/partial
// step choice are warp-uniform, so every lane reaches every shuffle.
//
// Arithmetic: the scale needs one fp32 multiply (amax * fp32(1/6)), done on
// normal operands only (tiny amax is pre-scaled by 2^64 exactly, see
// mx_scale_exponent), so no denormal mode can change it.  Element codes: on
// sm_90 (and in the emulation) a block with 2^-103 <= max |x| < inf (every
// block but tiny, NaN or Inf ones) takes the packed bf16x2 path mx_pack8_pk
// (one fma per two elements, exact: see there); the other blocks, and every
// block elsewhere, go through quant8: integer comparisons of |x|'s bits
// against the seven rounding thresholds of the e2m1 grid scaled by 2^(s-127)
// (exact, mode-independent), or on gfx950, for max |x| >= 2^-119,
// v_cvt_scalef32_pk_fp4_bf16 (see quant8 for why its result equals the spec).
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

// e8m0 exponent of a block whose max |x| bits are a16 with 0x0C00 <= a16 <
// 0x7F80, given as a = a16 << 16 (fp32 bits): mx_scale_exponent's normal
// branch without its clamp (s <= 253 for every finite max, checked
// exhaustively by the emulator self-test).
__host__ __device__ __forceinline__ uint32_t mx_scale_exponent_normal(uint32_t a) {
  const float w = as_f32_any(a) * as_f32_any(kOneSixthBits);
  return (as_u32_any(w) + 0x7FFFFFu) >> 23;
}

// Per 16-bit half: max(a, b) unsigned.
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

#if AITER_AUX_QUANT_PK
// Per 16-bit half, signed: max(a + b, c) (one VIADDMNMX on sm_90).  The
// callers' sums never leave the int16 range.
__host__ __device__ __forceinline__ uint32_t pk_addmax_s16(uint32_t a, uint32_t b, uint32_t c) {
#if AITER_AUX_QUANT_PK_HW
  return __viaddmax_s16x2(a, b, c);
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const int32_t sum = static_cast<int16_t>(static_cast<uint16_t>((a >> h) + (b >> h)));
    const int32_t lim = static_cast<int16_t>(static_cast<uint16_t>(c >> h));
    d |= (static_cast<uint32_t>(sum > lim ? sum : lim) & 0xFFFFu) << h;
  }
  return d;
#endif
}

// PTX prmt.b32 (default mode): byte n of the result is byte (sel_n & 7) of
// {b, a} (a = bytes 0-3), or, if sel_n & 8, that byte's top bit replicated.
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t src = static_cast<uint64_t>(a) | (static_cast<uint64_t>(b) << 32);
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t nib = (sel >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (nib & 7u))) & 0xFFu;
    if (nib & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * n);
  }
  return d;
#endif
}

// Bitwise select: bits of b where m is set, of a elsewhere (one LOP3; written
// out because the compiler splits the mask-and-merge into two).
__host__ __device__ __forceinline__ uint32_t bit_select(uint32_t m, uint32_t a, uint32_t b) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(d) : "r"(m), "r"(b), "r"(a));
  return d;
#else
  return (a & ~m) | (b & m);
#endif
}

#if !AITER_AUX_QUANT_PK_HW
// bf16 bits of the real number hi + lo (|lo| <= half an ulp of the double hi,
// as TwoSum leaves it), rounded to nearest even; finite nonzero hi.
inline uint32_t emu_round_bf16(double hi, double lo) {
  uint32_t sign = 0;
  if (hi < 0) {
    hi = -hi;
    lo = -lo;
    sign = 0x8000u;
  }
  int e;
  (void)__builtin_frexp(hi, &e);  // hi = f * 2^e, f in [0.5, 1)
  const int qe = e - 8 > -133 ? e - 8 : -133;  // bf16 quantum at hi (normal or subnormal)
  const double t = __builtin_ldexp(hi, -qe);  // exact
  const double fl = __builtin_floor(t);
  const double fr = t - fl;  // exact
  // lo cannot carry hi across a rounding boundary unless hi lies on one
  bool up = fr > 0.5;
  if (fr == 0.5) up = lo > 0 || (lo == 0 && __builtin_fmod(fl, 2.0) != 0.0);
  const float v = static_cast<float>(__builtin_ldexp(fl + (up ? 1.0 : 0.0), qe));  // exact (or inf)
  return sign | (as_u32_any(v) >> 16);
}
#endif

// Per 16-bit half: bf16(a * b + c) with one rounding (fma.rn.bf16x2).  The
// emulation covers finite operands whose exact result is nonzero.
__host__ __device__ __forceinline__ uint32_t pk_fma_bf16(uint32_t a, uint32_t b, uint32_t c) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const double x = as_f32_any(((a >> h) & 0xFFFFu) << 16);
    const double y = as_f32_any(((b >> h) & 0xFFFFu) << 16);
    const double z = as_f32_any(((c >> h) & 0xFFFFu) << 16);
    volatile double p = x * y;  // exact: 8-bit significands
    volatile double sum = p + z;
    volatile double bz = sum - p;
    const double err = (p - (sum - bz)) + (z - bz);  // TwoSum: sum + err == p + z
    d |= emu_round_bf16(sum, err) << h;
  }
  return d;
#endif
}

// Element codes of 8 elements (w[j] = elements 2j | 2j+1 << 16) of a finite
// block with exponent 3 <= s <= 253, every |x| <= 6 * 2^(s-127) (true of
// every element of a block whose max |x| gave s; see mx_scale_exponent).
// Element i goes to nibble i.  kp, fp: mx_pk_consts(s).
//
// Per element, with e the exponent field of x and q = |x| * 2^(127-s) the
// spec's scaled value (q <= 6):  M = 2^(9 + max(e, s) - s), i.e.
// 512 * max(1, 2^floor(log2 q)) (512 for a zero or subnormal x), whose bf16 ulp
// M/128 is 8 times the e2m1 spacing of q's binade (0.5 below 2, 1 below 4,
// else 2); y = bf16(8q + M) in one fma (exact product |x| * 2^(130-s), one
// rounding to nearest even) rounds 8q to that spacing exactly as the spec's
// thresholds do (<= 0.25 / < 0.75 / <= 1.25 / < 1.75 / <= 2.5 / < 3.5 / <= 5):
// y = M + k ulps, k = round-half-even(q / spacing) <= 4, and the code is
// k + 2 log2(M/512) (its parity is k's: ties go to even codes).  bits(y) =
// (136 + i) << 7 | k with i = log2(M/512) <= 2, so y + (y >> 6) holds
// k + 2i in bits 0-3 of each half ((136 + i) * 2 = 272 + 2i, 272 = 0 mod 16;
// the high half's k lands in bits 10-12 of the low half, the low half never
// carries).  M's bits come from one add-max per half: max(e<<7 + (136-s)<<7,
// 136<<7) (int16: e - s <= 2 keeps the sum in range).  A zero or subnormal x
// gives 8q < 2 = half an ulp of 512 (s >= 3), hence code 0, whether the fma
// reads it as is or flushed.  The sign bits join in the byte gather below
// (prmt with sign replication of the bytes holding bits 15 and 31).
__host__ __device__ __forceinline__ void mx_pk_consts(uint32_t s, uint32_t* kp, uint32_t* fp) {
  *kp = prmt(0x4400u - (s << 7), 0u, 0x1010u);  // (136 - s) << 7 in each int16 half
  *fp = ((257u - s) << 7) * 0x10001u;           // bf16x2 2^(130-s)
}

__host__ __device__ __forceinline__ uint32_t mx_pack8_pk(const uint32_t w[4], uint32_t kp,
                                                         uint32_t fp) {
  uint32_t c[4];
  for (int j = 0; j < 4; ++j) {
    const uint32_t m = pk_addmax_s16(w[j] & 0x7F807F80u, kp, 0x44004400u);
    const uint32_t y = pk_fma_bf16(w[j] & 0x7FFF7FFFu, fp, m);
    c[j] = y + (y >> 6);  // codes in bits 0-2 and 16-18
  }
  // bytes: codes of elements 0, 2, 1, 3 (4, 6, 5, 7), then their signs as
  // 0x00 / 0xFF, merged at bit 3 of each byte
  const uint32_t m8 = 0x08080808u;
  const uint32_t v01 = bit_select(m8, prmt(c[0], c[1], 0x6240u), prmt(w[0], w[1], 0xFBD9u));
  const uint32_t v23 = bit_select(m8, prmt(c[2], c[3], 0x6240u), prmt(w[2], w[3], 0xFBD9u));
  const uint32_t even = prmt(v01, v23, 0x5410u);  // nibbles of elements 0, 2, 4, 6 (bits 0-3 of each byte)
  const uint32_t odd = prmt(v01, v23, 0x7632u);   // elements 1, 3, 5, 7
  return bit_select(0xF0F0F0F0u, even, odd << 4);
}

__host__ __device__ __forceinline__ uint32_t mx_pack8_pk(const uint32_t w[4], uint32_t s) {
  uint32_t kp, fp;
  mx_pk_consts(s, &kp, &fp);
  return mx_pack8_pk(w, kp, fp);
}
#endif  // AITER_AUX_QUANT_PK

// 8 elements of a block whose max |x| bits (after the pair reduction) are
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

// The value of the other lane of the pair (lanes 2p, 2p+1).
__device__ __forceinline__ uint32_t pair_other(uint32_t v) {
#if AITER_AUX_AMDGCN_DEVICE
  // DPP quad_perm [1,0,3,2]: xor 1 inside a quad
  return static_cast<uint32_t>(
      __builtin_amdgcn_update_dpp(0, static_cast<int>(v), 0xB1, 0xF, 0xF, false));
#else
  return shfl_xor_u32(v, 1);
#endif
}

// Work layout (see the top of the file).  kQuantUnroll: units per lane per
// step (sort.h sizes its quant grids as units / (threads * kQuantUnroll)).
constexpr int kQuantUnroll = 4;
constexpr int kStepTiles = kQuantUnroll / 2;  // consecutive warp tiles per step
constexpr int kTileBlocks = kWarpSize / 2;    // 32-element blocks per warp tile

// One step of a warp: kTiles consecutive tiles.  px, pq, ps: this lane's
// x / a_q / a_scale positions in the first tile (its block, unit `odd`);
// pair = lane / 2.  kFull: every block of the step exists; else only the
// first rem (warp-uniform, < kTiles * kTileBlocks).  kAligned: x is 16-byte
// and a_q 4-byte aligned; else x_al16 / q_al4 say.
template <int kTiles, bool kAligned, bool kFull>
__device__ __forceinline__ void quant_step(const uint16_t* px, uint8_t* pq, uint8_t* ps, int odd,
                                           int pair, int rem, bool x_al16, bool q_al4) {
  x_al16 = kAligned || x_al16;
  q_al4 = kAligned || q_al4;
  uint32_t w[kTiles][8];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const bool act = kFull || t * kTileBlocks + pair < rem;
#pragma unroll
    for (int j = 0; j < 8; ++j) w[t][j] = 0u;
    if (act) {
      load_bf16x8(px + t * kTileBlocks * 32, x_al16, &w[t][0]);       // unit odd
      load_bf16x8(px + t * kTileBlocks * 32 + 16, x_al16, &w[t][4]);  // unit odd + 2
    }
  }
  uint32_t amax[kTiles];
#if AITER_AUX_QUANT_PK
  bool slow = false;
#endif
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    amax[t] = 0u;
    if (!kFull && t * kTileBlocks >= rem) break;  // warp-uniform
    const bool act = kFull || t * kTileBlocks + pair < rem;  // whole pairs in or out
    uint32_t m = w[t][0] & 0x7FFF7FFFu;
#pragma unroll
    for (int j = 1; j < 8; ++j) m = pk_max_u16(m, w[t][j] & 0x7FFF7FFFu);
    m = pk_max_u16(m, pair_other(m));  // both halves: the block's max over its 16 pairs
    // max |x| as fp32 bits: amax16 << 16
    amax[t] = (m << 16) > (m & 0xFFFF0000u) ? (m << 16) : (m & 0xFFFF0000u);
#if AITER_AUX_QUANT_PK
    // every block but those with a tiny, NaN or Inf max
    const bool fast = amax[t] - 0x0C000000u < 0x7F800000u - 0x0C000000u;
    slow = slow || (act && !fast);
    const uint32_t s = mx_scale_exponent_normal(amax[t]);
    uint32_t kp, fp;
    mx_pk_consts(s, &kp, &fp);
    const uint32_t q0 = mx_pack8_pk(&w[t][0], kp, fp);
    const uint32_t q1 = mx_pack8_pk(&w[t][4], kp, fp);
    if (act && fast) {
#else
    uint32_t s;
    const uint32_t q0 = quant8(&w[t][0], amax[t] >> 16, &s);
    const uint32_t q1 = quant8(&w[t][4], amax[t] >> 16, &s);
    if (act) {
#endif
      store_u8x4(pq + t * kTileBlocks * 16, q_al4, q0);
      store_u8x4(pq + t * kTileBlocks * 16 + 8, q_al4, q1);
      if (!odd) ps[t * kTileBlocks] = static_cast<uint8_t>(s);
    }
  }
#if AITER_AUX_QUANT_PK
  // Rare: the lane's blocks that mx_pack8_pk does not cover go through quant8,
  // one unit at a time (x read again: the step's registers are free by now).
  if (slow) {
#pragma unroll 1
    for (int i = 0; i < 2 * kTiles; ++i) {
      const int t = i >> 1;
      const int h = i & 1;
      uint32_t am = amax[0];
#pragma unroll
      for (int k = 1; k < kTiles; ++k) am = t == k ? amax[k] : am;
      if (!kFull && t * kTileBlocks + pair >= rem) break;  // this lane's later tiles too
      if (am - 0x0C000000u < 0x7F800000u - 0x0C000000u) continue;
      uint32_t v[4], s;
      load_bf16x8(px + t * kTileBlocks * 32 + h * 16, x_al16, v);
      const uint32_t q = quant8(v, am >> 16, &s);
      store_u8x4(pq + t * kTileBlocks * 16 + h * 8, q_al4, q);
      if (!odd && h == 0) ps[t * kTileBlocks] = static_cast<uint8_t>(s);
    }
  }
#endif
}

// Quantises the whole tensor with warps gwarp, gwarp + nwarps, ...: warp g
// takes the steps at blocks (g + i * nwarps) * kTiles * kTileBlocks.  Every
// lane of a warp must call it.
template <int D, int kTiles, bool kAligned>
__device__ __forceinline__ void quant_steps(const AiterAuxQuantArgs& a, int64_t gwarp,
                                            int64_t nwarps, bool x_al16, bool q_al4) {
  const int64_t nblocks = a.num_tokens * static_cast<int64_t>(D / 32);
  const int lane = lane_id();
  const int odd = lane & 1;
  const int pair = lane >> 1;
  constexpr int kStepBlocks = kTiles * kTileBlocks;
  int64_t bw = gwarp * kStepBlocks;
  const int64_t b0 = bw + pair;
  const int64_t stride = nwarps * kStepBlocks;
  const uint16_t* px = a.x + b0 * 32 + odd * 8;
  uint8_t* pq = a.a_q + b0 * 16 + odd * 4;
  uint8_t* ps = a.a_scale + b0;
  for (; bw + kStepBlocks <= nblocks; bw += stride) {
    quant_step<kTiles, kAligned, true>(px, pq, ps, odd, pair, kStepBlocks, x_al16, q_al4);
    px += stride * 32;
    pq += stride * 16;
    ps += stride;
  }
  if (bw < nblocks)
    quant_step<kTiles, kAligned, false>(px, pq, ps, odd, pair, static_cast<int>(nblocks - bw), x_al16,
                                q_al4);
}

template <int D, int kTiles>
__device__ __forceinline__ void quant_tensor_tiles(const AiterAuxQuantArgs& a, int64_t gwarp,
                                                   int64_t nwarps, bool x_al16, bool q_al4) {
  static_assert(D > 0 && D % 32 == 0, "model_dim must be a positive multiple of 32");
  if (x_al16 && q_al4) {
    quant_steps<D, kTiles, true>(a, gwarp, nwarps, true, true);
  } else {
    quant_steps<D, 1, false>(a, gwarp, nwarps, x_al16, q_al4);
  }
}

// The quant blocks of moe_sort_quant (warps gwarp of nwarps): one tile per
// step, which keeps the sort kernels' register counts where they were (the
// two-tile loop on top of their own code would add up to 16).
template <int D>
__device__ __forceinline__ void quant_tensor(const AiterAuxQuantArgs& a, int64_t gwarp,
                                             int64_t nwarps, bool x_al16, bool q_al4) {
  quant_tensor_tiles<D, 1>(a, gwarp, nwarps, x_al16, q_al4);
}

constexpr int kQuantThreads = 256;

// CUDA: at least 6 blocks of 256 per SM (<= 40 registers; 47 unconstrained,
// no spills either way).  (HIP reads a second argument as waves per EU.)
#if defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_QUANT_BOUNDS __launch_bounds__(kQuantThreads, 6)
#else
#define AITER_AUX_QUANT_BOUNDS __launch_bounds__(kQuantThreads)
#endif

// kTiles: tiles per step (kStepTiles, or 1 for small tensors).
template <int D, int kTiles>
__global__ AITER_AUX_QUANT_BOUNDS void mxfp4_quant_kernel(AiterAuxQuantArgs a, int num_blocks,
                                                          bool x_al16, bool q_al4) {
  constexpr int kWarps = kQuantThreads / kWarpSize;
  const int64_t gwarp = static_cast<int64_t>(block_idx()) * kWarps + warp_id();
  quant_tensor_tiles<D, kTiles>(a, gwarp, static_cast<int64_t>(num_blocks) * kWarps, x_al16,
                                q_al4);
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
  // one step (kQuantUnroll units per lane) per warp, up to 8192 blocks; below
  // 264 such blocks, one tile (2 units per lane) per warp, up to 264 blocks
  const int64_t want = ceil_div_i64(units, int64_t(kQuantThreads) * kQuantUnroll);
  const bool x_al16 = is_aligned(a.x, 16);
  const bool q_al4 = is_aligned(a.a_q, 4);
  hipStream_t st = static_cast<hipStream_t>(stream);
  if (want >= 264) {
    const int blocks = static_cast<int>(clamp_i64(want, 1, 8192));
    AITER_AUX_LAUNCH((mxfp4_quant_kernel<ModelDim, kStepTiles>), dim3(blocks), dim3(kQuantThreads),
                     st)(a, blocks, x_al16, q_al4);
  } else {
    const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kQuantThreads * 2), 1, 264));
    AITER_AUX_LAUNCH((mxfp4_quant_kernel<ModelDim, 1>), dim3(blocks), dim3(kQuantThreads), st)(
        a, blocks, x_al16, q_al4);
  }
  return check_launch("mxfp4_quant");
}

}  // namespace gpu
}  // namespace aiter_aux
