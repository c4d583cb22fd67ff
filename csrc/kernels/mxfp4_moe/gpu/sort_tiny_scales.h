// moe_sort_quant[_fp8] with sorted_scales at decode (M*topk <= kTinyThreads): the tiny
// path's one launch also writes moe_sort_scales' output (docs/ops.md), so a decode step's
// sort, quant and sorted scales are one launch, with no inter-block dependency.  Part of
// sort.h, which includes it after sort_tiny.h; not a standalone header.
//
// Grid: num_g ranking blocks, then z_blocks, then the quant / zero_buf blocks (aux_block).
//  * Ranking block g ranks every pair (tiny_rank) and writes its slice of the sort rows
//    (tiny_write_rows), as the tiny path does.  Besides, it owns the tokens
//    [g * tpb, (g + 1) * tpb) of M: before the ranking each thread loads one 32-element
//    block of their x rows, after it turns it into the block's scale byte with the
//    quantiser's own function (so it equals a_scale's byte) and writes the sorted-scale
//    bytes of the rows of those tokens' pairs.  Last, it writes the zeros of the 32-row
//    tiles of its slice below zrow = round_up(num_valid_ids[0], 32).
//  * The z blocks write the zeros of the tiles from zrow to out_rows.  Each finds zrow
//    itself, by a histogram of the ids (shared atomics) and the sum of the padded counts,
//    without the ranking.
// Who writes the bytes of a tile below zrow: the output dword (tile, ku, kl, nl) holds rows
// nl (bytes 0, 2) and 16 + nl (bytes 1, 3) of the tile.  With no real row, the zero pass of
// the slice's block (one 16-byte store when none of the 4 dwords of a group has one); with
// one real row, that row's owner (its two scale bytes and the two zeros); with two, each
// owner its two bytes.  Every byte is written once.
#pragma once

#include "quant.h"
#include "sort_tiny.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

constexpr int kScaleZeroBlocksMax = 128;
constexpr int kScaleZeroStores = 4;  // 16-byte stores per thread of a z block (grid size)

struct ScalesPlan {
  uint8_t* out;  // sorted_scales, 16-byte aligned
  int tpb;       // tokens per ranking block
  int out_rows;  // ceil(max_rows / BM) * BM
  int z_blocks;
};

template <int E>
struct TinyScalesSmem {
  TinySmem<E> t;
  int pair_row[kTinyThreads];  // the block's pairs: (row << 1) | (partner row is real), or -1
  uint32_t real[kTinyThreads / 32];           // real rows of a slice chunk, a word per tile
  alignas(16) uint8_t scales[kTinyThreads];   // the block's tokens' scale bytes [t][D / 32]
};

// The quantiser's scale byte of a block (D tagged with kFp8Dim for MXFP8).
template <int D>
__device__ __forceinline__ uint32_t block_scale_byte(uint32_t amax16) {
  if constexpr ((D & quant_detail::kFp8Dim) != 0) {
    return quant_detail::fp8_scale_byte(amax16);
  } else {
    return quant_detail::mx_scale_byte(amax16);
  }
}

template <int E, int K, int D>
__device__ __forceinline__ void tiny_scales_block(const AiterAuxSortArgs& a,
                                                  const AiterAuxQuantArgs& q, const ScalesPlan& sp,
                                                  TinyScalesSmem<E>& sm, int g, int num_g,
                                                  bool x_al16) {
  constexpr int kDim = D & (quant_detail::kFp8Dim - 1);
  constexpr int kCols = kDim / 32;   // scale bytes of a token
  constexpr int kRowWords = kDim / 64;  // dwords holding a row's bytes
  constexpr int kCK1 = kDim / 256;
  constexpr int kGroups = kDim / 16;  // 16-byte groups of a 32-row tile (D bytes)
  const int tid = thread_idx();
  const int m = static_cast<int>(a.num_tokens);
  const int t0 = g * sp.tpb;
  const int nt = m - t0 < sp.tpb ? (m - t0 > 0 ? m - t0 : 0) : sp.tpb;
  // 1. this thread's 32-element block of x, loaded before the ranking's ids
  uint32_t w[16];
  const bool has_blk = tid < nt * kCols;
  if (has_blk) {
    const uint16_t* px = q.x + static_cast<int64_t>(t0) * kDim + static_cast<int64_t>(tid) * 32;
#pragma unroll
    for (int u = 0; u < 4; ++u) load_bf16x8(px + 8 * u, x_al16, &w[4 * u]);
  }
  const TinyPair p = tiny_rank<E, K>(a, sm.t, g);
  const int lg = log2_block_m(a.block_m);
  // 2. the scale bytes, and the rows of the block's pairs
  if (has_blk) {
    uint32_t mx = w[0] & 0x7FFF7FFFu;
#pragma unroll
    for (int i = 1; i < 16; ++i) mx = pk_max_u16(mx, w[i] & 0x7FFF7FFFu);
    const uint32_t amax16 = (mx & 0xFFFFu) > (mx >> 16) ? (mx & 0xFFFFu) : (mx >> 16);
    sm.scales[tid] = static_cast<uint8_t>(block_scale_byte<D>(amax16));
  }
  const int pb = t0 * K;
  if (p.j >= pb && p.j < pb + nt * K) {
    int v = -1;
    if (p.key < E) {
      const int partner = p.row ^ 16;  // the other row of the row's dwords
      const bool real = partner < p.rows && tiny_real_row<E>(sm.t, partner, lg);
      v = (p.row << 1) | (real ? 1 : 0);
    }
    sm.pair_row[p.j - pb] = v;
  }
  tiny_write_rows<E, K>(a, sm.t, p, g, num_g);
  block_sync();
  // 3. the sorted-scale bytes of the block's real rows, a (pair, dword) per step
  for (int i = tid; i < nt * K * kRowWords; i += kTinyThreads) {
    const int pl = i / kRowWords;
    const int v = sm.pair_row[pl];
    if (v < 0) continue;
    const int dq = i - pl * kRowWords;  // ku * 4 + kl
    const int ku = dq >> 2;
    const int kl = dq & 3;
    const uint8_t* srow = sm.scales + (pl / K) * kCols;
    const uint32_t s0 = srow[8 * ku + kl];
    const uint32_t s1 = srow[8 * ku + 4 + kl];
    const int r = v >> 1;
    const int ia = (r >> 4) & 1;
    const int64_t dw = (static_cast<int64_t>(r >> 5) * kCK1 + ku) * 64 + kl * 16 + (r & 15);
    uint8_t* o = sp.out + dw * 4;
    if (v & 1) {
      o[ia] = static_cast<uint8_t>(s0);
      o[2 + ia] = static_cast<uint8_t>(s1);
    } else {
      *reinterpret_cast<uint32_t*>(o) = (s0 << (8 * ia)) | (s1 << (16 + 8 * ia));
    }
  }
  // 4. the zeros of the slice's tiles below zrow (kTinyThreads-row chunks g, g + num_g, ...)
  const int zrow = (p.rows + 31) & ~31;
  for (int base = g * kTinyThreads; base < zrow; base += num_g * kTinyThreads) {
    const int r = base + tid;
    const lane_mask_t bal = warp_ballot(r < p.rows && tiny_real_row<E>(sm.t, r, lg));
    if (lane_id() == 0) {
#pragma unroll
      for (int h = 0; h < kWarpSize / 32; ++h)
        sm.real[warp_id() * (kWarpSize / 32) + h] = static_cast<uint32_t>(bal >> (32 * h));
    }
    block_sync();
    const int rows = zrow - base < kTinyThreads ? zrow - base : kTinyThreads;
    uint8_t* tb = sp.out + static_cast<int64_t>(base / 32) * kDim;
    for (int i = tid; i < (rows / 32) * kGroups; i += kTinyThreads) {
      const int tl = i / kGroups;
      const int c = i - tl * kGroups;
      const uint32_t mk = sm.real[tl];
      const uint32_t any = ((mk >> (4 * (c & 3))) | (mk >> (16 + 4 * (c & 3)))) & 0xFu;
      uint8_t* o = tb + static_cast<int64_t>(tl) * kDim + c * 16;
      if (any == 0) {
        *reinterpret_cast<uint4*>(o) = make_uint4(0u, 0u, 0u, 0u);
      } else {
#pragma unroll
        for (int d = 0; d < 4; ++d)
          if (((any >> d) & 1u) == 0) reinterpret_cast<uint32_t*>(o)[d] = 0u;
      }
    }
    block_sync();
  }
}

// Zeros of the tiles [zrow, out_rows): num_valid_ids[0] from a histogram of the ids (one
// pair per thread, counters in sm.off), then 16-byte stores, grid-stride over the z blocks.
template <int E, int K, int kDim>
__device__ __forceinline__ void scales_zero_block(const AiterAuxSortArgs& a, const ScalesPlan& sp,
                                                  TinySmem<E>& sm, int b) {
  const int tid = thread_idx();
  if (tid < E) sm.off[tid] = 0;
  int key;
  load_keys<E, 1>(a, tid, 0, static_cast<int>(a.num_tokens) * K, &key);
  block_sync();
  if (key < E) atomic_add_shared_u32(reinterpret_cast<uint32_t*>(&sm.off[key]), 1u);
  block_sync();
  const int lg = log2_block_m(a.block_m);
  const int padded = tid < E ? ((sm.off[tid] + a.block_m - 1) >> lg) << lg : 0;
  int rows = 0;
  block_exclusive_scan<kTinyThreads>(padded, sm.warp_tot, &rows);
  const int zrow = (rows + 31) & ~31;
  const int64_t end = static_cast<int64_t>(sp.out_rows / 32) * (kDim / 16);
  uint4* o = reinterpret_cast<uint4*>(sp.out);
  for (int64_t i = static_cast<int64_t>(zrow / 32) * (kDim / 16) +
                   static_cast<int64_t>(b) * kTinyThreads + thread_idx();
       i < end; i += static_cast<int64_t>(sp.z_blocks) * kTinyThreads)
    o[i] = make_uint4(0u, 0u, 0u, 0u);
}

template <int E, int K, int D>
__global__ AITER_AUX_SORT_BOUNDS(kTinyThreads, D) void sort_tiny_scales_kernel(
    AiterAuxSortArgs a, AiterAuxQuantArgs q, ScalesPlan sp, int num_g, int quant_blocks,
    int zero_blocks, bool x_al16, bool q_al4) {
  __shared__ TinyScalesSmem<E> sm;
  int b = block_idx();
  if (b < num_g) {
    tiny_scales_block<E, K, D>(a, q, sp, sm, b, num_g, x_al16);
    return;
  }
  b -= num_g;
  if (b < sp.z_blocks) {
    scales_zero_block<E, K, (D & (quant_detail::kFp8Dim - 1))>(a, sp, sm.t, b);
    return;
  }
  aux_block<D, kTinyThreads>(b - sp.z_blocks, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// The one-launch plan when it applies (n <= kTinyFullPathPairs, sorted_scales 16-byte
// aligned, the tokens' scale rows fit the ranking blocks); else false.
template <int E, int K, int D>
inline bool plan_tiny_scales(const AiterAuxSortArgs& a, uint8_t* out, ScalesPlan* sp, int* num_g) {
  constexpr int kDim = D & (quant_detail::kFp8Dim - 1);
  constexpr int kTokensMax = kTinyThreads / (kDim / 32);  // per ranking block (scales[])
  const int64_t n = a.num_tokens * K;
  if (kTokensMax < 1 || n > kTinyFullPathPairs || !is_aligned(out, 16)) return false;
  const int m = static_cast<int>(a.num_tokens);
  const int64_t cap = sort_capacity(a.num_tokens, K, E, a.block_m);
  const int g0 = static_cast<int>(clamp_i64(ceil_div_i64(cap, kTinyRowsPerBlock), 1, kTinyMaxBlocks));
  const int need = (m + kTokensMax - 1) / kTokensMax;
  const int ng = g0 > need ? g0 : need;
  if (ng > kTinyMaxBlocks) return false;
  const int64_t bm = a.block_m;
  const int64_t tile_m = bm > 32 ? bm : 32;
  const int64_t out_rows = ceil_div_i64(a.max_rows, tile_m) * tile_m;
  // the z blocks: sized for the whole output (at decode most of it lies past the valid rows)
  const int64_t z16 = out_rows / 32 * (kDim / 16);
  sp->out = out;
  sp->tpb = (m + ng - 1) / ng;
  sp->out_rows = static_cast<int>(out_rows);
  sp->z_blocks = static_cast<int>(
      clamp_i64(ceil_div_i64(z16, int64_t(kTinyThreads) * kScaleZeroStores), 1, kScaleZeroBlocksMax));
  *num_g = ng;
  return true;
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
