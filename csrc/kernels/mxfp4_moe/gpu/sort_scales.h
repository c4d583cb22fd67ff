// moe_sort_scales on the GPU; docs/ops.md is the spec.
//
// One thread per output dword w = ((((c*C_M1 + mi)*C_K1 + ku)*4 + kl)*16 + nl),
// grid-stride; consecutive threads write consecutive dwords.  The dword holds
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

template <int D>
__global__ __launch_bounds__(kThreads) void sort_scales_kernel(AiterAuxSortScalesArgs a,
                                                               int64_t total_dwords,
                                                               int num_blocks, bool out_al4) {
  constexpr int kCK1 = D / 256;
  constexpr int kScaleCols = D / 32;
  const int bm = a.block_m > 32 ? a.block_m : 32;
  const int cm1 = bm / 32;
  int64_t lim = a.num_valid_ids[0];
  if (lim > a.max_rows) lim = a.max_rows;
  const uint32_t m = static_cast<uint32_t>(a.num_tokens);
  const int64_t stride = static_cast<int64_t>(num_blocks) * kThreads;
  for (int64_t w = static_cast<int64_t>(block_idx()) * kThreads + thread_idx(); w < total_dwords;
       w += stride) {
    const int nl = static_cast<int>(w & 15);
    const int kl = static_cast<int>((w >> 4) & 3);
    int64_t r = w >> 6;
    const int ku = static_cast<int>(r % kCK1);
    r /= kCK1;
    const int mi = static_cast<int>(r % cm1);
    const int64_t c = r / cm1;
    const int64_t row0 = c * bm + (2 * mi) * 16 + nl;  // ia = 0
    const int64_t row1 = row0 + 16;                     // ia = 1
    const int col = 8 * ku + kl;                         // ik = 0; ik = 1 is col + 4
    uint32_t v = 0;
    if (row0 < lim) {
      const uint32_t t = static_cast<uint32_t>(a.sorted_token_ids[row0]) & 0xFFFFFFu;
      if (t < m) {
        const uint8_t* s = a.a_scale + static_cast<int64_t>(t) * kScaleCols + col;
        v |= static_cast<uint32_t>(s[0]);         // byte 0: ik 0, ia 0
        v |= static_cast<uint32_t>(s[4]) << 16;   // byte 2: ik 1, ia 0
      }
    }
    if (row1 < lim) {
      const uint32_t t = static_cast<uint32_t>(a.sorted_token_ids[row1]) & 0xFFFFFFu;
      if (t < m) {
        const uint8_t* s = a.a_scale + static_cast<int64_t>(t) * kScaleCols + col;
        v |= static_cast<uint32_t>(s[0]) << 8;    // byte 1: ik 0, ia 1
        v |= static_cast<uint32_t>(s[4]) << 24;   // byte 3: ik 1, ia 1
      }
    }
    store_u8x4(a.sorted_scales + w * 4, out_al4, v);
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
  const int64_t total_dwords = ceil_div_i64(a.max_rows, bm) * bm * (ModelDim / 32) / 4;
  if (total_dwords == 0) return AITER_AUX_OK;
  if (a.sorted_scales == nullptr || a.sorted_token_ids == nullptr || a.num_valid_ids == nullptr ||
      (a.num_tokens > 0 && a.a_scale == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(total_dwords, kThreads), 1, 8192));
  AITER_AUX_LAUNCH((sort_scales_kernel<ModelDim>), dim3(blocks), dim3(kThreads),
                   static_cast<hipStream_t>(stream))(a, total_dwords, blocks,
                                                     is_aligned(a.sorted_scales, 4));
  return check_launch(op);
}

}  // namespace gpu
}  // namespace aiter_aux
