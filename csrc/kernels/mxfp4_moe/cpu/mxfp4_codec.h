// MXFP4 (OCP MX v1.0) element/scale codec for the CPU kernels: bf16 <-> fp32,
// the e8m0 scale of a block, e2m1 encode (round to nearest, ties to the even
// code) and decode.  Header-only, no dependencies beyond <cstdint>/<cstring>.
//
// The encode path is pure integer arithmetic on the bf16 bits, so its result
// does not depend on the floating-point environment (FTZ/DAZ, contraction,
// x87 excess precision): it reproduces docs/ops.md exactly, subnormal inputs
// included.  See docs/ops.md, "mxfp4_quant".
#pragma once

#include <cstdint>
#include <cstring>

namespace aiter_aux {
namespace cpu {
namespace codec {

// ---------------------------------------------------------------- bf16 / fp32

inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// fp32 -> bf16, round to nearest even; any NaN -> 0x7FC0 (torch's conversion).
// Overflow rounds to +-Inf as in torch.
inline uint16_t f32_to_bf16_rne(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ------------------------------------------------------------------ e8m0 scale

// The e8m0 scale of a finite block whose max |x| has the (sign-less) bf16 bits
// `amax_bits` (0 <= amax_bits < 0x7F80):
//   w = fp32(amax * fp32(1/6))   (one fp32 multiply, round to nearest even,
//                                 subnormal results kept)
//   s = min(254, (bits(w) + 0x7FFFFF) >> 23)
// computed exactly with integers.  (Checked exhaustively against an fp32
// multiply for all 0x7F80 inputs.)
constexpr uint32_t e8m0_scale_from_amax_bits_exact(uint32_t amax_bits) {
  if (amax_bits == 0) return 0;  // w = +0 -> bits 0 -> s = 0
  const uint32_t e = amax_bits >> 7, m = amax_bits & 0x7Fu;
  // amax = mant * 2^x exactly: bf16 subnormal m * 2^-133, normal
  // (1.m) * 2^(e-127) = (128+m) * 2^(e-134)
  const uint64_t mant = e == 0 ? uint64_t(m) : uint64_t(128u + m);
  const int x = e == 0 ? -133 : static_cast<int>(e) - 134;
  // fp32(1/6) = 0x3E2AAAAB = 0xAAAAAB * 2^-26
  const uint64_t p = mant * 0xAAAAABull;  // < 2^32, exact
  const int y = x - 26;                   // amax * c = p * 2^y exactly
  const int nbits = 64 - __builtin_clzll(p);
  const int exp_unb = y + nbits - 1;  // p * 2^y = 1.f * 2^exp_unb
  // Keep 24 significant bits (normal) or the bits at/above 2^-149 (subnormal);
  // shift: right shift of p to the kept integer significand q.
  const bool normal = exp_unb >= -126;
  const int shift = normal ? nbits - 24 : -(y + 149);
  // Normal: bits = ((exp_unb+127) << 23) + (q - 2^23) = base + q; a carry of
  // the rounding to 2^24 moves into the exponent by itself.  Subnormal:
  // bits = q (a carry to 2^23 gives the smallest normal, also by itself).
  const uint32_t base = normal ? static_cast<uint32_t>(exp_unb + 127 - 1) << 23 : 0u;
  uint64_t q = shift > 0 ? p >> shift : p << (shift < 0 ? -shift : 0);
  if (shift > 0) {
    const uint64_t rem = p & ((1ull << shift) - 1);
    const uint64_t half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }
  const uint32_t wbits = base + static_cast<uint32_t>(q);
  const uint32_t s = (wbits + 0x7FFFFFu) >> 23;
  return s < 254u ? s : 254u;
}

// Fast path: for amax >= 2^-119 (bf16 exponent field >= 8) w is a normal fp32
// whose significand depends only on amax's 7 mantissa bits, so
// s = exponent field + delta[mantissa].
struct E8m0Delta {
  int8_t d[128];
  constexpr E8m0Delta() : d{} {
    for (uint32_t m = 0; m < 128; ++m)
      d[m] = static_cast<int8_t>(
          static_cast<int>(e8m0_scale_from_amax_bits_exact((100u << 7) | m)) - 100);
  }
};
inline constexpr E8m0Delta kE8m0Delta{};

inline uint32_t e8m0_scale_from_amax_bits(uint32_t amax_bits) {
  const uint32_t e = amax_bits >> 7;
  if (e >= 8) {
    const uint32_t s = static_cast<uint32_t>(static_cast<int>(e) + kE8m0Delta.d[amax_bits & 0x7Fu]);
    return s < 254u ? s : 254u;
  }
  return e8m0_scale_from_amax_bits_exact(amax_bits);
}

// -------------------------------------------------------------- e2m1 encode

// bf16 bits of m * 2^e (m odd, 1..7, exactly representable), saturated to
// +Inf (0x7F80) on overflow.  Used to build the decision thresholds.
constexpr uint16_t bf16_bits_of_small(uint32_t m, int e) {
  int nb = 0;
  for (uint32_t t = m; t != 0; t >>= 1) ++nb;
  const int exp_unb = e + nb - 1;
  if (exp_unb > 127) return 0x7F80;
  if (exp_unb >= -126) {
    const uint32_t frac = (m - (1u << (nb - 1))) << (7 - (nb - 1));
    return static_cast<uint16_t>((static_cast<uint32_t>(exp_unb + 127) << 7) | frac);
  }
  // subnormal: m * 2^e = k * 2^-133, exact for all the thresholds used
  return static_cast<uint16_t>(m << (e + 133));
}

// The e2m1 magnitude code of q = x * 2^(127-s) is
//   (|q| > 0.25) + (|q| >= 0.75) + (|q| > 1.25) + (|q| >= 1.75)
//   + (|q| > 2.5) + (|q| >= 3.5) + (|q| > 5)
// and |q| <op> t  <=>  |x| <op> t * 2^(s-127).  Each t * 2^(s-127) (s in
// [0, 254]) is exactly a bf16 value (or beyond bf16 max, where +Inf works as
// the bound since |x| is finite), and for non-negative bf16 values the order
// of the bit patterns is the numeric order, so the comparisons are integer
// comparisons of 15-bit patterns.
struct E2m1Thresholds {
  // t0 = 0.25 (>), t1 = 0.75 (>=), t2 = 1.25 (>), t3 = 1.75 (>=),
  // t4 = 2.5 (>),  t5 = 3.5 (>=),  t6 = 5 (>)
  uint16_t t[255][8];
  constexpr E2m1Thresholds() : t{} {
    // t = m * 2^k
    constexpr uint32_t ms[7] = {1, 3, 5, 7, 5, 7, 5};
    constexpr int ks[7] = {-2, -2, -2, -2, -1, -1, 0};
    for (int s = 0; s < 255; ++s) {
      for (int i = 0; i < 7; ++i) t[s][i] = bf16_bits_of_small(ms[i], ks[i] + s - 127);
      t[s][7] = 0;
    }
  }
};

inline constexpr E2m1Thresholds kE2m1Thresholds{};

// Encode one 32-element block of bf16 bits: writes 16 bytes of e2m1 codes
// (element 2j in the low nibble of byte j) and returns the e8m0 scale byte.
// Blocks holding a NaN or +-Inf give scale 255 and zero codes.  (int16 lanes
// so that the compiler vectorises the loops; magnitudes are < 0x8000.)
inline uint8_t quant_block32(const uint16_t* __restrict x, uint8_t* __restrict q) {
  int16_t a[32];
  for (int i = 0; i < 32; ++i) a[i] = static_cast<int16_t>(x[i] & 0x7FFF);
  int16_t amax = 0;
  for (int i = 0; i < 32; ++i) amax = a[i] > amax ? a[i] : amax;
  if (amax >= 0x7F80) {  // a NaN or +-Inf in the block
    std::memset(q, 0, 16);
    return 255;
  }
  const uint32_t s = e8m0_scale_from_amax_bits(static_cast<uint32_t>(amax));
  const uint16_t* th = kE2m1Thresholds.t[s];
  // v >= t  <=>  v > t - 1 (t >= 1 here: every threshold is > 0)
  const int16_t t0 = static_cast<int16_t>(th[0]), t1 = static_cast<int16_t>(th[1] - 1),
                t2 = static_cast<int16_t>(th[2]), t3 = static_cast<int16_t>(th[3] - 1),
                t4 = static_cast<int16_t>(th[4]), t5 = static_cast<int16_t>(th[5] - 1),
                t6 = static_cast<int16_t>(th[6]);
  int16_t code[32];
  for (int i = 0; i < 32; ++i) {
    const int16_t v = a[i];
    const int16_t c = static_cast<int16_t>((v > t0) + (v > t1) + (v > t2) + (v > t3) + (v > t4) +
                                           (v > t5) + (v > t6));
    code[i] = static_cast<int16_t>(c | ((x[i] >> 12) & 8));
  }
  for (int j = 0; j < 16; ++j) q[j] = static_cast<uint8_t>(code[2 * j] | (code[2 * j + 1] << 4));
  return static_cast<uint8_t>(s);
}

// -------------------------------------------------------------- e2m1 decode

// e2m1 code -> fp32 value (sign bit 0x8).
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// byte of two e2m1 codes -> {value of the low nibble, value of the high nibble}
struct E2m1Pairs {
  float v[256][2];
  constexpr E2m1Pairs() : v{} {
    for (int b = 0; b < 256; ++b) {
      v[b][0] = kE2m1Values[b & 0xF];
      v[b][1] = kE2m1Values[b >> 4];
    }
  }
};
inline constexpr E2m1Pairs kE2m1Pairs{};

// e8m0 byte -> 2^(s-127) as fp32 (s = 0: 2^-127, a subnormal; s = 255: NaN).
inline float e8m0_to_f32(uint32_t s) {
  if (s == 255) return f32_from_bits(0x7FC00000u);
  if (s == 0) return f32_from_bits(0x00400000u);  // 2^-127
  return f32_from_bits(s << 23);
}

}  // namespace codec
}  // namespace cpu
}  // namespace aiter_aux
