// mxfp4_quant and mxfp8_quant (per_1x32) on the GPU, and the quant work of the fused
// moe_sort_quant[_fp8] blocks (quant_tensor); docs/ops.md is the spec.  The MXFP8 steps are
// in quant_fp8.h; the launch is one template for both formats (launch_quant).
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
// The per-block arithmetic (scale, element codes, quant8) is in quant_codes.h.
#pragma once

#include <type_traits>

#include "common.h"
#include "quant_codes.h"

namespace aiter_aux {
namespace gpu {
namespace quant_detail {

// Work layout (see the top of the file).  kQuantUnroll: units per lane per
// step (sort.h sizes its quant grids as units / (threads * kQuantUnroll)).
constexpr int kQuantUnroll = 4;
constexpr int kStepTiles = kQuantUnroll / 2;  // consecutive warp tiles per step
constexpr int kTileBlocks = kWarpSize / 2;    // 32-element blocks per warp tile

// The x of a step's kTiles tiles, this lane's units odd (w[t][0..3]) and odd + 2 (w[t][4..7]);
// zeros where the lane's block does not exist (kFull false: the first rem blocks do).
template <int kTiles, bool kFull>
__device__ __forceinline__ void load_step(const uint16_t* px, int pair, int rem, bool x_al16,
                                          uint32_t (*w)[8]) {
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
}

// Max |x| (bf16 bits) of a block from its lane pair's w (loaded by load_step), in both halves:
// the block's max over its 16 pairs.  Every lane of the warp must call it (pair_other).
__device__ __forceinline__ uint32_t block_abs_max2(const uint32_t w[8]) {
  uint32_t m = w[0] & 0x7FFF7FFFu;
#pragma unroll
  for (int j = 1; j < 8; ++j) m = pk_max_u16(m, w[j] & 0x7FFF7FFFu);
  return pk_max_u16(m, pair_other(m));
}

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
  load_step<kTiles, kFull>(px, pair, rem, x_al16, w);
  uint32_t amax[kTiles];
#if AITER_AUX_QUANT_PK
  bool slow = false;
#endif
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    amax[t] = 0u;
    if (!kFull && t * kTileBlocks >= rem) break;             // warp-uniform
    const bool act = kFull || t * kTileBlocks + pair < rem;  // whole pairs in or out
    const uint32_t m = block_abs_max2(w[t]);
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
// lane of a warp must call it.  The format: kQBytes bytes of a_q per block of 32
// elements (a lane of a pair starts a quarter block in) and step(full, px, pq, ps, odd,
// pair, rem), one step (full: std::true_type when every block of the step exists).
template <int kQBytes, int D, int kTiles, class Step>
__device__ __forceinline__ void quant_steps_of(const AiterAuxQuantArgs& a, int64_t gwarp,
                                               int64_t nwarps, Step step) {
  const int64_t nblocks = a.num_tokens * static_cast<int64_t>(D / 32);
  const int lane = lane_id();
  const int odd = lane & 1;
  const int pair = lane >> 1;
  constexpr int kStepBlocks = kTiles * kTileBlocks;
  int64_t bw = gwarp * kStepBlocks;
  const int64_t b0 = bw + pair;
  const int64_t stride = nwarps * kStepBlocks;
  const uint16_t* px = a.x + b0 * 32 + odd * 8;
  uint8_t* pq = a.a_q + b0 * kQBytes + odd * (kQBytes / 4);
  uint8_t* ps = a.a_scale + b0;
  for (; bw + kStepBlocks <= nblocks; bw += stride) {
    step(std::true_type{}, px, pq, ps, odd, pair, kStepBlocks);
    px += stride * 32;
    pq += stride * kQBytes;
    ps += stride;
  }
  if (bw < nblocks) step(std::false_type{}, px, pq, ps, odd, pair, static_cast<int>(nblocks - bw));
}

constexpr int kQuantThreads = 256;

// CUDA: at least kQuantMinOccupancy = 6 blocks of 256 per SM (launch_traits.h).
// (HIP reads a second argument as waves per EU; none there.)
#if defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_QUANT_BOUNDS __launch_bounds__(kQuantThreads, kQuantMinOccupancy)
#else
#define AITER_AUX_QUANT_BOUNDS __launch_bounds__(kQuantThreads)
#endif

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

// The grid of mxfp4_quant / mxfp8_quant for `units` 8-element units: one step
// (kQuantUnroll units per lane) per warp, up to 8192 blocks; below 2 blocks per SM
// (264 on an H200) of such blocks, one tile (2 units per lane) per warp (tiled =
// false), up to that many blocks.
struct QuantGrid {
  int blocks;
  bool tiled;  // kStepTiles tiles per step, else 1
};

inline QuantGrid quant_grid(int64_t units) {
  const int spread = two_blocks_per_sm();
  const int64_t want = ceil_div_i64(units, int64_t(kQuantThreads) * kQuantUnroll);
  if (want >= spread) return {static_cast<int>(clamp_i64(want, 1, 8192)), true};
  return {static_cast<int>(clamp_i64(ceil_div_i64(units, kQuantThreads * 2), 1, spread)), false};
}

}  // namespace quant_detail
}  // namespace gpu
}  // namespace aiter_aux

#include "quant_fp8.h"  // the MXFP8 steps (quant_step_fp8)

namespace aiter_aux {
namespace gpu {
namespace quant_detail {

// quant_steps_of in format F: 16 bytes of a_q per block (MXFP4, quant_step) or 32 (MXFP8,
// quant_step_fp8).
template <QuantFormat F, int D, int kTiles, bool kAligned>
__device__ __forceinline__ void quant_steps(const AiterAuxQuantArgs& a, int64_t gwarp,
                                            int64_t nwarps, bool x_al16, bool q_al4) {
  constexpr bool kFp8 = F == QuantFormat::Mxfp8;
  quant_steps_of<kFp8 ? 32 : 16, D, kTiles>(a, gwarp, nwarps, [=](auto full, auto... at) {
    if constexpr (kFp8) {
      quant_step_fp8<kTiles, kAligned, decltype(full)::value>(at..., x_al16, q_al4);
    } else {
      quant_step<kTiles, kAligned, decltype(full)::value>(at..., x_al16, q_al4);
    }
  });
}

// The quant work of warps gwarp of nwarps in format F (the standalone kernels' and the quant
// blocks of moe_sort_quant[_fp8]); kTiles tiles per step.  One tile per step keeps the sort
// kernels' register counts where they were; the mid path on wide MXFP4 tensors and the large
// path's place launch take kStepTiles as mxfp4_quant does (sort_mid.h, sort_large.h).
template <QuantFormat F, int D, int kTiles = 1>
__device__ __forceinline__ void quant_tensor(const AiterAuxQuantArgs& a, int64_t gwarp,
                                             int64_t nwarps, bool x_al16, bool q_al4) {
  static_assert(F != QuantFormat::None, "quant_tensor needs a format");
  static_assert(D > 0 && D % 32 == 0, "model_dim must be a positive multiple of 32");
  // the aligned path stores 4 bytes per lane for MXFP4, 16 for MXFP8 (a_q 16-byte aligned)
  const bool q_al =
      F == QuantFormat::Mxfp8 ? q_al4 && (reinterpret_cast<uintptr_t>(a.a_q) & 15u) == 0 : q_al4;
  if (x_al16 && q_al) {
    quant_steps<F, D, kTiles, true>(a, gwarp, nwarps, true, true);
  } else {
    quant_steps<F, D, 1, false>(a, gwarp, nwarps, x_al16, q_al4);
  }
}

// mxfp4_quant / mxfp8_quant; kTiles: tiles per step (kStepTiles, or 1 for small tensors).
template <QuantFormat F, int D, int kTiles>
__global__ AITER_AUX_QUANT_BOUNDS void quant_kernel(AiterAuxQuantArgs a, int num_blocks,
                                                    bool x_al16, bool q_al4) {
  const PdlScope pdl;
  constexpr int kWarps = kQuantThreads / kWarpSize;
  const int64_t gwarp = static_cast<int64_t>(block_idx()) * kWarps + warp_id();
  quant_tensor<F, D, kTiles>(a, gwarp, static_cast<int64_t>(num_blocks) * kWarps, x_al16, q_al4);
}

// The host side of mxfp4_quant / mxfp8_quant: argument check, grid, launch.
template <QuantFormat F, int D>
inline int launch_quant(const AiterAuxQuantArgs& a, void* stream, const char* op) {
  const int rc = check_quant_args<D>(a, op);
  if (rc != AITER_AUX_OK) return rc;
  if (a.num_tokens == 0) return AITER_AUX_OK;
  const QuantGrid g = quant_grid(a.num_tokens * static_cast<int64_t>(D / 8));
  const bool x_al16 = is_aligned(a.x, 16);
  const bool q_al4 = is_aligned(a.a_q, 4);
  hipStream_t st = static_cast<hipStream_t>(stream);
  if (g.tiled) {
    AITER_AUX_LAUNCH((quant_kernel<F, D, kStepTiles>), dim3(g.blocks), dim3(kQuantThreads), st)(
        a, g.blocks, x_al16, q_al4);
  } else {
    AITER_AUX_LAUNCH((quant_kernel<F, D, 1>), dim3(g.blocks), dim3(kQuantThreads), st)(
        a, g.blocks, x_al16, q_al4);
  }
  return check_launch(op);
}

}  // namespace quant_detail

template <int ModelDim>
int mxfp4_quant(const AiterAuxQuantArgs& a, void* stream) {
  return quant_detail::launch_quant<QuantFormat::Mxfp4, ModelDim>(a, stream, "mxfp4_quant");
}

template <int ModelDim>
int mxfp8_quant(const AiterAuxQuantArgs& a, void* stream) {
  return quant_detail::launch_quant<QuantFormat::Mxfp8, ModelDim>(a, stream, "mxfp8_quant");
}

}  // namespace gpu
}  // namespace aiter_aux
