// CPU kernels of the MXFP8 ops (a8w4): mxfp8_quant and the fused moe_sort_quant_fp8.
// Built on core_cpu.h's sort and checks, and generic as those (model_dim is read at run
// time); the E4M3 encode is the shared integer code of ../mxfp8_e4m3.h (docs/ops.md
// "mxfp8_quant").
#pragma once

#include "../mxfp8_e4m3.h"
#include "core_cpu.h"

namespace aiter_aux {
namespace cpu {
namespace detail {

// E4M3 byte of every bf16 pattern u taken as q itself (scale 127: q = x): e4m3::encode(u, 127).
struct E4m3Lut {
  uint8_t v[65536];
  E4m3Lut() {
    for (uint32_t u = 0; u < 65536u; ++u)
      v[u] = (u & 0x7FFFu) >= 0x7F80u ? 0 : e4m3::encode(u, 127);
  }
};
inline const E4m3Lut& e4m3_lut() {
  static const E4m3Lut lut;  // built once (thread-safe static init), 64 KiB
  return lut;
}

// e4m3::encode(x, s) for finite x and 1 <= s <= 254: a normal bf16 x gives q's bf16 bits by
// exponent arithmetic (q = x * 2^(127 - s) exactly) and the table; q below 2^-126 is the sign
// alone (|q| < 2^-10); bf16 subnormals and zeros take the general encoder.
inline uint8_t encode_fast(const uint8_t* lut, uint32_t x, uint32_t s) {
  const int e = static_cast<int>((x >> 7) & 0xFFu);
  if (e == 0) return e4m3::encode(x, s);
  const int eq = e + 127 - static_cast<int>(s);
  if (eq <= 0) return static_cast<uint8_t>((x >> 8) & 0x80u);
  return lut[(x & 0x807Fu) | (static_cast<uint32_t>(eq) << 7)];
}

// One block of 32: the e8m0 scale byte; 32 E4M3 bytes into q.
inline uint8_t quant_block32_fp8(const uint16_t* __restrict x, uint8_t* __restrict q) {
  uint32_t amax = 0;
  for (int i = 0; i < 32; ++i) {
    const uint32_t a = x[i] & 0x7FFFu;
    amax = a > amax ? a : amax;
  }
  if (amax >= 0x7F80u) {  // a NaN or +-Inf in the block
    std::memset(q, 0, 32);
    return 255;
  }
  const uint32_t s = e4m3::scale_from_amax_bits(amax);
  if (s == 0) {  // all +-0
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>((x[i] >> 8) & 0x80u);
    return 0;
  }
  const uint8_t* lut = e4m3_lut().v;
  for (int i = 0; i < 32; ++i) q[i] = encode_fast(lut, x[i], s);
  return static_cast<uint8_t>(s);
}

inline void quant_fp8_impl(const AiterAuxQuantArgs& a) {
  quant_rows<32>(a, [](const uint16_t* x, uint8_t* q) { return quant_block32_fp8(x, q); });
}

}  // namespace detail

inline int mxfp8_quant(const AiterAuxQuantArgs& a) {
  int rc = detail::check_quant(a, "mxfp8_quant");
  if (rc != AITER_AUX_OK) return rc;
  detail::quant_fp8_impl(a);
  return AITER_AUX_OK;
}

inline int moe_sort_quant_fp8(const AiterAuxSortQuantArgs& a) {
  return detail::sort_quant(a, "moe_sort_quant_fp8", detail::quant_fp8_impl);
}

}  // namespace cpu
}  // namespace aiter_aux
