// moe_sort_scales on the GPU; docs/ops.md is the spec.
//
// Output dword w = ((((c*C_M1 + mi)*C_K1 + ku)*4 + kl)*16 + nl) holds
// in byte 2*ik + ia the scale a_scale[token(row), 8*ku + 4*ik + kl] of row
// c*BM + (2*mi + ia)*16 + nl, or 0 for a row that is padding, at/after
// num_valid_ids[0] (read on the device) or at/after max_rows.  Every byte of
// the output is written.
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace scales_detail {

constexpr int kThreads = 256;
constexpr int kKuPerWarp = 8;  // ku (8-byte column groups) per warp unit

// 8 scale bytes (one ku) of a row, as two little-endian words.
__device__ __forceinline__ void load_u8x8(const uint8_t* p, bool al8, uint32_t* lo, uint32_t* hi) {
  if (al8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    *lo = v.x;
    *hi = v.y;
  } else {
    *lo = load_u8x4(p, false);
    *hi = load_u8x4(p + 4, false);
  }
}

// One warp per unit (tile of 32 rows c*BM + mi*32 + [0, 32), ku group of up
// to kKuPerWarp).  Lane L holds row (ia = L / 16, nl = L % 16); it reads the
// 8 bytes of each ku of its row (contiguous, one token row of a_scale), swaps
// them with lane L ^ 16 (the other ia of the same nl), and writes the dwords
// kl = 2*(L/16) and 2*(L/16) + 1 of the (c, mi, ku) tile: dword kl*16 + nl =
// bytes [row ia0 col kl, row ia1 col kl, row ia0 col 4+kl, row ia1 col 4+kl].
// Each store instruction writes two 64-byte runs.
template <int D>
__global__ __launch_bounds__(kThreads) void sort_scales_kernel(AiterAuxSortScalesArgs a,
                                                               int64_t num_units,
                                                               int64_t total_tiles,
                                                               int num_blocks, bool in_al8,
                                                               bool in_al16, bool out_al4) {
  constexpr int kCK1 = D / 256;
  constexpr int kScaleCols = D / 32;
  constexpr int kGroups = (kCK1 + kKuPerWarp - 1) / kKuPerWarp;
  constexpr int kWarps = kThreads / kWarpSize;
  const int bm = a.block_m > 32 ? a.block_m : 32;
  const int cm1 = bm / 32;
  int64_t lim = a.num_valid_ids[0];
  if (lim > a.max_rows) lim = a.max_rows;
  const uint32_t m = static_cast<uint32_t>(a.num_tokens);
  const int lane = lane_id();
  const int sub = lane & 31;  // row inside the 32-row tile (kWarpSize 64: two tiles)
  const int half = sub >> 4;  // ia
  const int nl = sub & 15;
  constexpr int kTilesPerWarp = kWarpSize / 32;
  const int64_t wstride = static_cast<int64_t>(num_blocks) * kWarps;
  for (int64_t unit = static_cast<int64_t>(block_idx()) * kWarps + warp_id(); unit < num_units;
       unit += wstride) {
    const int grp = static_cast<int>(unit % kGroups);
    const int64_t tile = (unit / kGroups) * kTilesPerWarp + (lane >> 5);  // (c, mi)
    const bool tile_ok = tile < total_tiles;  // kWarpSize 64: the 2nd tile may be past the end
    const int64_t c = tile / cm1;
    const int mi = static_cast<int>(tile - c * cm1);
    const int64_t row = c * bm + mi * 32 + sub;
    const uint8_t* src = nullptr;
    if (row < lim) {
      const uint32_t t = static_cast<uint32_t>(a.sorted_token_ids[row]) & 0xFFFFFFu;
      if (t < m) src = a.a_scale + static_cast<int64_t>(t) * kScaleCols;
    }
    const int ku0 = grp * kKuPerWarp;
    uint32_t lo[kKuPerWarp], hi[kKuPerWarp];
#pragma unroll
    for (int i = 0; i < kKuPerWarp; ++i) {
      lo[i] = 0u;
      hi[i] = 0u;
    }
    if constexpr (kCK1 % 2 == 0) {
      if (in_al16) {  // rows are 16-byte aligned too (D / 32 % 16 == 0): 2 ku per load
#pragma unroll
        for (int i = 0; i < kKuPerWarp; i += 2) {
          if (src != nullptr && ku0 + i < kCK1) {
            const uint4 v = *reinterpret_cast<const uint4*>(src + 8 * (ku0 + i));
            lo[i] = v.x;
            hi[i] = v.y;
            lo[i + 1] = v.z;
            hi[i + 1] = v.w;
          }
        }
      }
    }
    if (!(kCK1 % 2 == 0 && in_al16)) {
#pragma unroll
      for (int i = 0; i < kKuPerWarp; ++i) {
        if (src != nullptr && ku0 + i < kCK1) load_u8x8(src + 8 * (ku0 + i), in_al8, &lo[i], &hi[i]);
      }
    }
    // tile bytes: ((c*cm1 + mi)*kCK1 + ku) * 256
    uint8_t* dst_tile = a.sorted_scales + (tile * kCK1) * 256;
#pragma unroll
    for (int i = 0; i < kKuPerWarp; ++i) {
      if (ku0 + i >= kCK1) break;  // warp-uniform
      const uint32_t plo = shfl_xor_u32(lo[i], 16);
      const uint32_t phi = shfl_xor_u32(hi[i], 16);
      // rows ia0 / ia1 of this nl
      const uint32_t a0 = half ? plo : lo[i], a1 = half ? phi : hi[i];  // ia0: cols 0-3, 4-7
      const uint32_t b0 = half ? lo[i] : plo, b1 = half ? hi[i] : phi;  // ia1
      uint8_t* dst = dst_tile + static_cast<int64_t>(ku0 + i) * 256;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int kl = 2 * half + q;
        const int sh = 8 * kl;
        const uint32_t v = ((a0 >> sh) & 0xFFu) | (((b0 >> sh) & 0xFFu) << 8) |
                           (((a1 >> sh) & 0xFFu) << 16) | (((b1 >> sh) & 0xFFu) << 24);
        if (tile_ok) store_u8x4(dst + (kl * 16 + nl) * 4, out_al4, v);
      }
    }
  }
}

}  // namespace scales_detail

template <int ModelDim>
int moe_sort_scales(const AiterAuxSortScalesArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 256 == 0, "model_dim must be a positive multiple of 256");
  using namespace scales_detail;
  const char* op = "moe_sort_scales";
  if (a.model_dim != ModelDim)
    return fail_invalid("%s: model_dim %d does not match the instance (%d)", op, a.model_dim, ModelDim);
  if (!valid_block_m(a.block_m))
    return fail_invalid("%s: block_m %d not in {16, 32, 64, 128}", op, a.block_m);
  if (a.num_tokens < 0 || a.num_tokens >= (int64_t(1) << 24))
    return fail_invalid("%s: num_tokens %lld out of [0, 2^24)", op, (long long)a.num_tokens);
  if (a.max_rows < 0 || a.max_rows > INT32_MAX)
    return fail_invalid("%s: max_rows %lld out of [0, 2^31)", op, (long long)a.max_rows);
  const int64_t bm = a.block_m > 32 ? a.block_m : 32;
  const int64_t out_rows = ceil_div_i64(a.max_rows, bm) * bm;
  if (out_rows == 0) return AITER_AUX_OK;
  if (a.sorted_scales == nullptr || a.sorted_token_ids == nullptr || a.num_valid_ids == nullptr ||
      (a.num_tokens > 0 && a.a_scale == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  constexpr int kGroups = (ModelDim / 256 + kKuPerWarp - 1) / kKuPerWarp;
  // out_rows is a multiple of 32 (BM >= 32); one warp unit covers kWarpSize rows.
  const int64_t warp_tiles = ceil_div_i64(out_rows, kWarpSize);
  const int64_t num_units = warp_tiles * kGroups;
  constexpr int kWarps = kThreads / kWarpSize;
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(num_units, kWarps), 1, 65535));
  AITER_AUX_LAUNCH((sort_scales_kernel<ModelDim>), dim3(blocks), dim3(kThreads),
                   static_cast<hipStream_t>(stream))(a, num_units, out_rows / 32, blocks,
                                                     is_aligned(a.a_scale, 8),
                                                     is_aligned(a.a_scale, 16) && ModelDim % 512 == 0,
                                                     is_aligned(a.sorted_scales, 4));
  return check_launch(op);
}

}  // namespace gpu
}  // namespace aiter_aux
