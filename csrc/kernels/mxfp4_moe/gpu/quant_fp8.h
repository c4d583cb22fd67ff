// The MXFP8 steps (E4M3 elements + e8m0 per 1x32) of mxfp8_quant and of the quant blocks of
// moe_sort_quant_fp8; docs/ops.md "mxfp8_quant" is the spec.  Included near the end of
// quant.h, whose quant_tensor / launch_quant pick the format.  The work layout is
// mxfp4_quant's (lanes 2p, 2p+1 hold block p of a warp tile, lane 2p + o its 16-byte units o
// and o + 2), only the output differs: each lane writes the 8 E4M3 bytes of each of its
// units; on the aligned path the pair exchanges two units so that lane 2p + o stores a_q
// bytes 16o..16o+15 of the block in one 16-byte store.
//
// Element conversion (quant8_fp8):
// * sm_90: cvt.rn.satfinite.e4m3x2.f32 of q = fp32(x) * 2^(127-s).  The product is exact
//   whenever it is a normal fp32 (x has 8 significant bits; 2^(127-s) is a power of two, a
//   normal fp32 for 1 <= s <= 253) and then the instruction rounds it to nearest-even E4M3
//   (subnormals included) -- the spec.  When |q| < 2^-126 (an fp32 subnormal or zero, with the
//   sign of x: mul.rn.f32 without .ftz keeps subnormals) the spec's result is the sign alone
//   (|q| < 2^-10, half the smallest E4M3 subnormal), which the instruction gives whether it
//   keeps or flushes such an input.  |q| <= 448 under the scale, so satfinite never clamps.
//   Blocks with s = 0 (all zeros) give the signs alone; NaN/Inf blocks are zeroed before;
//   s <= 247 for every bf16 amax, so 2^(127 - s) is always a normal fp32.
// * elsewhere (gfx950, gfx942, gfx90a, the CPU emulation): the exact integer encoder of
//   ../mxfp8_e4m3.h, the CPU kernels' code.  No gfx950 scaled FP8 conversion is used: its
//   rounding/subnormal behaviour is not proven here against the spec (see README.md).
#pragma once

#include "../mxfp8_e4m3.h"

namespace aiter_aux {
namespace gpu {
namespace quant_detail {

// AITER_AUX_FP8_CVT_HW (sm_89+) and cvt_rn_satfinite_e4m3x2_f32 are in target_ops.h.

// The scale byte of an MXFP8 block from the bf16 bits of its max |x| (sign cleared): 255
// when the block holds a NaN or an Inf.
__host__ __device__ __forceinline__ uint32_t fp8_scale_byte(uint32_t amax16) {
  return amax16 >= 0x7F80u ? 255u : e4m3::scale_from_amax_bits(amax16);
}

// The 8 E4M3 bytes of 8 elements (w[j]: elements 2j (low half), 2j+1) of a block with scale
// byte s (finite block); out[0] = bytes 0-3, out[1] = bytes 4-7.
__device__ __forceinline__ void quant8_fp8(const uint32_t w[4], uint32_t s, uint32_t out[2]) {
#if AITER_AUX_FP8_CVT_HW
  if (s == 0) {  // every element is +-0: its sign alone
    out[0] = byte_perm(w[0], w[1], 0x7531) & 0x80808080u;
    out[1] = byte_perm(w[2], w[3], 0x7531) & 0x80808080u;
    return;
  }
  // 2^(127 - s); s <= 247 for every bf16 amax (s = 254 would need amax > 448 * 2^126)
  const float mult = as_f32((254u - (s < 253u ? s : 253u)) << 23);
  uint32_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float lo = f32_mul_rn(as_f32(w[j] << 16), mult);
    const float hi = f32_mul_rn(as_f32(w[j] & 0xFFFF0000u), mult);
    h[j] = cvt_rn_satfinite_e4m3x2_f32(
        hi, lo);  // byte 0: element 2j (operand b), byte 1: element 2j + 1 (operand a)
  }
  out[0] = h[0] | (h[1] << 16);
  out[1] = h[2] | (h[3] << 16);
#else
  uint32_t b[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    b[2 * j] = e4m3::encode(w[j] & 0xFFFFu, s);
    b[2 * j + 1] = e4m3::encode(w[j] >> 16, s);
  }
  out[0] = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24);
  out[1] = b[4] | (b[5] << 8) | (b[6] << 16) | (b[7] << 24);
#endif
}

// One step of a warp over kTiles consecutive tiles (as quant_step of quant.h): px, pq, ps
// this lane's x / a_q / a_scale positions in the first tile.
template <int kTiles, bool kAligned, bool kFull>
__device__ __forceinline__ void quant_step_fp8(const uint16_t* px, uint8_t* pq, uint8_t* ps,
                                               int odd, int pair, int rem, bool x_al16,
                                               bool q_al4) {
  x_al16 = kAligned || x_al16;
  q_al4 = kAligned || q_al4;
  uint32_t w[kTiles][8];
  load_step<kTiles, kFull>(px, pair, rem, x_al16, w);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    if (!kFull && t * kTileBlocks >= rem) break;  // warp-uniform
    const bool act = kFull || t * kTileBlocks + pair < rem;
    const uint32_t m = block_abs_max2(w[t]);
    const uint32_t amax16 = (m & 0xFFFFu) > (m >> 16) ? (m & 0xFFFFu) : (m >> 16);
    const bool bad = amax16 >= 0x7F80u;                      // a NaN or an Inf in the block
    const uint32_t s = bad ? 255u : fp8_scale_byte(amax16);  // (folds to the encoder's scale)
    uint32_t q0[2] = {0u, 0u}, q1[2] = {0u, 0u};
    if (!bad) {
      quant8_fp8(&w[t][0], s, q0);
      quant8_fp8(&w[t][4], s, q1);
    }
    if (kAligned) {
      // The pair swaps units 1 and 2 (lane 2p holds units 0, 2; lane 2p+1 units 1, 3), so
      // that each lane stores 16 contiguous bytes: one full 32-byte sector per pair.
      const uint32_t give0 = odd ? q0[0] : q1[0], give1 = odd ? q0[1] : q1[1];
      const uint32_t r0 = pair_other(give0), r1 = pair_other(give1);
      if (act) {
        uint4 v;
        v.x = odd ? r0 : q0[0];
        v.y = odd ? r1 : q0[1];
        v.z = odd ? q1[0] : r0;
        v.w = odd ? q1[1] : r1;
        *reinterpret_cast<uint4*>(pq + t * kTileBlocks * 32 + 8 * odd) = v;  // bytes 16 odd..
        if (!odd) ps[t * kTileBlocks] = static_cast<uint8_t>(s);
      }
    } else if (act) {
      uint8_t* p = pq + t * kTileBlocks * 32;
      store_u8x4(p, q_al4, q0[0]);
      store_u8x4(p + 4, q_al4, q0[1]);
      store_u8x4(p + 16, q_al4, q1[0]);
      store_u8x4(p + 20, q_al4, q1[1]);
      if (!odd) ps[t * kTileBlocks] = static_cast<uint8_t>(s);
    }
  }
}

}  // namespace quant_detail
}  // namespace gpu
}  // namespace aiter_aux
