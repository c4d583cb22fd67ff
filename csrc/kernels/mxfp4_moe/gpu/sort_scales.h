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

// One block per 32-row tile (c, mi) (grid-stride).  The tile's 32 token rows
// of a_scale (D/32 bytes each) are read row-contiguous (16- or 4-byte loads,
// consecutive threads on consecutive bytes of a row) into shared memory, rows
// kStride = D/128 + 1 dwords apart (odd: the gather below is conflict-free);
// rows that are padding / at or past num_valid_ids[0] / past max_rows are
// zero.  Then thread q builds the output quad q of the tile (dwords 4q..4q+3:
// ku = q/16, kl = (q/4)%4, nl = 4*(q%4) + j): byte 2*ik + ia of dword
// (ku, kl, nl) = byte kl of shared dword [ia*16 + nl][2*ku + ik], and writes it
// with one 16-byte store (or 4-byte / byte stores when the output is not
// aligned).  The tile's output is kCK1 * 256 contiguous bytes.
template <int D>
__global__ __launch_bounds__(kThreads) void sort_scales_kernel(AiterAuxSortScalesArgs a,
                                                               int64_t total_tiles,
                                                               int num_blocks, bool in_al4,
                                                               bool in_al16, bool out_al4,
                                                               bool out_al16) {
  constexpr int kCK1 = D / 256;
  constexpr int kCols = D / 32;   // scale bytes per row (multiple of 8)
  constexpr int kDw = kCols / 4;  // dwords per row (even)
  constexpr int kStride = kDw + 1;
  constexpr int kQuads = kCK1 * 16;
  __shared__ uint32_t sm[32 * kStride];
  __shared__ int64_t src_off[32];
  const int tid = thread_idx();
  const int bm = a.block_m > 32 ? a.block_m : 32;
  const int cm1 = bm / 32;
  int64_t lim = a.num_valid_ids[0];
  if (lim > a.max_rows) lim = a.max_rows;
  const uint32_t m = static_cast<uint32_t>(a.num_tokens);
  for (int64_t tile = block_idx(); tile < total_tiles; tile += num_blocks) {
    const int64_t c = tile / cm1;
    const int mi = static_cast<int>(tile - c * cm1);
    const int64_t row0 = c * bm + mi * 32;
    block_sync();  // the previous tile's readers of sm / src_off are done
    if (tid < 32) {
      const int64_t row = row0 + tid;
      int64_t off = -1;
      if (row < lim) {
        const uint32_t t = static_cast<uint32_t>(a.sorted_token_ids[row]) & 0xFFFFFFu;
        if (t < m) off = static_cast<int64_t>(t) * kCols;
      }
      src_off[tid] = off;
    }
    block_sync();
    if constexpr (kDw % 4 == 0) {
      if (in_al16) {  // rows 16-byte aligned: one 16-byte load per 4 dwords
        constexpr int kV = kDw / 4;
        for (int i = tid; i < 32 * kV; i += kThreads) {
          const int r = i / kV;
          const int d = (i - r * kV) * 4;
          const int64_t off = src_off[r];
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (off >= 0) v = *reinterpret_cast<const uint4*>(a.a_scale + off + 4 * d);
          uint32_t* dst = sm + r * kStride + d;
          dst[0] = v.x;
          dst[1] = v.y;
          dst[2] = v.z;
          dst[3] = v.w;
        }
      }
    }
    if (!(kDw % 4 == 0 && in_al16)) {
      for (int i = tid; i < 32 * kDw; i += kThreads) {
        const int r = i / kDw;
        const int d = i - r * kDw;
        const int64_t off = src_off[r];
        uint32_t v = 0u;
        if (off >= 0) v = load_u8x4(a.a_scale + off + 4 * d, in_al4);
        sm[r * kStride + d] = v;
      }
    }
    block_sync();
    uint8_t* dst_tile = a.sorted_scales + tile * (kCK1 * 256);
    for (int q = tid; q < kQuads; q += kThreads) {
      const int ku = q >> 4;
      const int kl = (q >> 2) & 3;
      const int nl0 = (q & 3) * 4;
      const int sh = 8 * kl;
      uint32_t v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t* r0 = sm + (nl0 + j) * kStride + 2 * ku;       // ia = 0
        const uint32_t* r1 = sm + (16 + nl0 + j) * kStride + 2 * ku;  // ia = 1
        v[j] = ((r0[0] >> sh) & 0xFFu) | (((r1[0] >> sh) & 0xFFu) << 8) |
               (((r0[1] >> sh) & 0xFFu) << 16) | (((r1[1] >> sh) & 0xFFu) << 24);
      }
      uint8_t* dst = dst_tile + q * 16;
      if (out_al16) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) store_u8x4(dst + 4 * j, out_al4, v[j]);
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
  // out_rows is a multiple of 32 (BM >= 32): one block iteration per 32-row tile.
  const int64_t total_tiles = out_rows / 32;
  const int blocks = static_cast<int>(clamp_i64(total_tiles, 1, 65535));
  AITER_AUX_LAUNCH((sort_scales_kernel<ModelDim>), dim3(blocks), dim3(kThreads),
                   static_cast<hipStream_t>(stream))(
      a, total_tiles, blocks, is_aligned(a.a_scale, 4),
      is_aligned(a.a_scale, 16) && ModelDim % 512 == 0, is_aligned(a.sorted_scales, 4),
      is_aligned(a.sorted_scales, 16));
  return check_launch(op);
}

}  // namespace gpu
}  // namespace aiter_aux
