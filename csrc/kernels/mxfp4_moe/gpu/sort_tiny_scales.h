// moe_sort_quant[_fp8] with sorted_scales at decode (where choose_sort_path says so): the pair
// path's (n <= kPairMax) or the tiny path's one launch also writes moe_sort_scales' output
// (docs/ops.md), so a decode step's sort, quant and sorted scales are one launch, with no
// inter-block dependency.  Part of sort.h, which includes it after sort_tiny.h and
// sort_pairs.h; not a standalone header.
//
// The tiny kernel (the pair kernel is the same with pair blocks, below).
// Grid: num_g tiny sort blocks (tiny_sort_block, as the tiny path), then `parts` scale blocks
// per 256-column group ku (D / 256 groups; part p takes every parts-th set of 32 tiles), then
// z_blocks, then the quant / zero_buf blocks (aux_block).
//  * Scale block ku: each thread loads one 32-element block of x in the columns
//    [256 ku, 256 ku + 256) of every token before ranking every pair again (tiny_rank), and
//    turns it into the block's scale byte with the quantiser's own function (so it equals
//    a_scale's byte).  It lists the tokens of the pairs in row order (sorted_t) and then
//    writes, for every 32-row tile of its part below zrow = round_up(num_valid_ids[0], 32),
//    the tile's 256 bytes of column group ku: a 32-lane group per tile, lane l holding row
//    l's 8 bytes; lanes l and l ^ 16 swap theirs (the rows of a dword are nl and 16 + nl),
//    and each store instruction writes two whole 64-byte runs.  Pad rows and rows past
//    num_valid_ids[0] give zeros.
//  * The z blocks write the zeros of the tiles from zrow to out_rows.  Each finds zrow itself,
//    by a histogram of the ids (shared atomics) and the sum of the padded counts.
// Every byte is written once, by whole 32-byte sectors: a first version that stored each
// row's bytes (4-byte words shared with other rows: partial sectors) was 1.4-2.75x slower
// than the two launches it replaces.
#pragma once

#include "quant.h"
#include "sort_pairs.h"
#include "sort_tiny.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

struct ScalesPlan {
  uint8_t* out;  // sorted_scales, 16-byte aligned
  int out_rows;  // ceil(max_rows / BM) * BM
  int parts;     // scale blocks per column group, each a share of the tiles
  int z_blocks;
};

template <int E, int K>
struct TinyScalesSmem {
  TinySmem<E> t;
  uint16_t cstart[E];                           // each expert's first pair in expert-major order
  uint16_t sorted_t[kTinyThreads];              // the tokens of the pairs in that (row) order
  alignas(8) uint8_t sc[kTinyThreads / K * 8];  // scale bytes [token][8] of the column group
};

// The quantiser's scale byte of a block in format F.
template <QuantFormat F>
__device__ __forceinline__ uint32_t block_scale_byte(uint32_t amax16) {
  if constexpr (F == QuantFormat::Mxfp8) {
    return quant_detail::fp8_scale_byte(amax16);
  } else {
    return quant_detail::mx_scale_byte(amax16);
  }
}

// The scale byte of the 32-element block of x at p (16 words of bf16 pairs loaded).
template <QuantFormat F>
__device__ __forceinline__ uint8_t scale_of(const uint32_t w[16]) {
  uint32_t mx = w[0] & 0x7FFF7FFFu;
#pragma unroll
  for (int i = 1; i < 16; ++i) mx = pk_max_u16(mx, w[i] & 0x7FFF7FFFu);
  const uint32_t amax16 = (mx & 0xFFFFu) > (mx >> 16) ? (mx & 0xFFFFu) : (mx >> 16);
  return static_cast<uint8_t>(block_scale_byte<F>(amax16));
}

__device__ __forceinline__ void load_block32(const uint16_t* p, bool al16, uint32_t w[16]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) load_bf16x8(p + 8 * u, al16, &w[4 * u]);
}

// The tiles below zrow = round_up(rows, 32) of column group ku that part `part` of a scale
// block of kThreads threads writes, a 32-lane group per tile: token(r) is the token of row r <
// rows, or -1 for a pad row; sc[t * 8 ..] the group's 8 scale bytes of token t.
template <int D, int kThreads, class RowToken>
__device__ __forceinline__ void scale_tiles(const ScalesPlan& sp, const uint8_t* sc, int rows,
                                            int ku, int part, RowToken token) {
  constexpr int kCK1 = D / 256;
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kGroups = kThreads / 32;
  const int tiles = (rows + 31) >> 5;
  const int lane = lane_id();
  const int l = lane & 31;
  const int nl = l & 15;
#pragma unroll 1  // a runtime stride: no trip-count division (see fill_tail)
  for (int base = (part * kWarps + warp_id()) * (kWarpSize / 32); base < tiles;
       base += kGroups * sp.parts) {  // warp-uniform
    const int tile = base + (lane >> 5);
    const int r = tile * 32 + l;
    uint32_t lo = 0u, hi = 0u;  // this row's bytes: columns 8 ku + 0..3, 8 ku + 4..7
    if (r < rows) {
      const int t = token(r);
      if (t >= 0) {
        const uint2 v = *reinterpret_cast<const uint2*>(&sc[t * 8]);
        lo = v.x;
        hi = v.y;
      }
    }
    const uint32_t plo = static_cast<uint32_t>(shfl_idx_i32(static_cast<int>(lo), lane ^ 16));
    const uint32_t phi = static_cast<uint32_t>(shfl_idx_i32(static_cast<int>(hi), lane ^ 16));
    if (tile < tiles) {
      const bool top = l < 16;  // this row is nl (bytes 0, 2), else 16 + nl (bytes 1, 3)
      const uint32_t r0lo = top ? lo : plo, r0hi = top ? hi : phi;
      const uint32_t r1lo = top ? plo : lo, r1hi = top ? phi : hi;
      // dword (kl, nl) = [r0 col kl, r1 col kl, r0 col 4 + kl, r1 col 4 + kl]
      const uint32_t i01 = byte_perm(r0lo, r1lo, 0x5140u);  // kl 0, 1: r0[0] r1[0] r0[1] r1[1]
      const uint32_t i23 = byte_perm(r0lo, r1lo, 0x7362u);  // kl 2, 3
      const uint32_t h01 = byte_perm(r0hi, r1hi, 0x5140u);
      const uint32_t h23 = byte_perm(r0hi, r1hi, 0x7362u);
      const uint32_t a0 = top ? i01 : i23, a1 = top ? h01 : h23;  // lanes < 16: kl 0, 1
      uint32_t* o = reinterpret_cast<uint32_t*>(sp.out) +
                    (static_cast<int64_t>(tile) * kCK1 + ku) * 64 + (top ? 0 : 32) + nl;
      o[0] = byte_perm(a0, a1, 0x5410u);   // kl 0 (or 2): a0 low half, a1 low half
      o[16] = byte_perm(a0, a1, 0x7632u);  // kl 1 (or 3)
    }
  }
}

// The zeros of the tiles [round_up(rows, 32), out_rows): 16-byte stores of the threads of z
// block b (blocks of kThreads), grid-stride over the z blocks.
template <int D, int kThreads>
__device__ __forceinline__ void scales_zero_fill(const ScalesPlan& sp, int rows, int b) {
  const int zrow = (rows + 31) & ~31;
  const int64_t end = static_cast<int64_t>(sp.out_rows / 32) * (D / 16);
  uint4* o = reinterpret_cast<uint4*>(sp.out);
#pragma unroll 1
  for (int64_t i = static_cast<int64_t>(zrow / 32) * (D / 16) + static_cast<int64_t>(b) * kThreads +
                   thread_idx();
       i < end; i += static_cast<int64_t>(sp.z_blocks) * kThreads)
    o[i] = make_uint4(0u, 0u, 0u, 0u);
}

template <int E, int K, QuantFormat F, int D>
__device__ __forceinline__ void scale_group_block(const AiterAuxSortArgs& a,
                                                  const AiterAuxQuantArgs& q, const ScalesPlan& sp,
                                                  TinyScalesSmem<E, K>& sm, int ku, int part,
                                                  bool x_al16) {
  const int tid = thread_idx();
  const int m = static_cast<int>(a.num_tokens);
  // 1. item i = (token i / 8, block i % 8 of the group): one per thread before the ranking
  auto item_ptr = [&](int i) {
    return q.x + static_cast<int64_t>(i >> 3) * D + ku * 256 + (i & 7) * 32;
  };
  uint32_t w[16];
  const bool first = tid < m * 8;
  if (first) load_block32(item_ptr(tid), x_al16, w);
  const TinyPair p = tiny_rank<E, K>(a, sm.t, -1, sm.cstart);
  if (first) sm.sc[tid] = scale_of<F>(w);
  for (int i = tid + kTinyThreads; i < m * 8; i += kTinyThreads) {  // topk < 8 only
    load_block32(item_ptr(i), x_al16, w);
    sm.sc[i] = scale_of<F>(w);
  }
  // 2. the tokens of the real rows in row order
  if (p.key < E)
    sm.sorted_t[sm.cstart[p.key] + (tiny_row<E>(sm.t, p) - sm.t.off[p.key])] =
        static_cast<uint16_t>(p.j / K);
  block_sync();
  // 3. the tiles below zrow
  const int lg = p.lg;
  scale_tiles<D, kTinyThreads>(sp, sm.sc, p.rows, ku, part, [&](int r) {
    const int e = sm.t.blk2e[r >> lg];
    const int o = r - sm.t.off[e];
    return o < static_cast<int>(sm.t.cnt[e]) ? static_cast<int>(sm.sorted_t[sm.cstart[e] + o]) : -1;
  });
}

// Zeros of the tiles [zrow, out_rows): num_valid_ids[0] from a histogram of the ids (one
// pair per thread, counters in sm.off), then 16-byte stores, grid-stride over the z blocks.
template <int E, int K, int D>
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
  scales_zero_fill<D, kTinyThreads>(sp, rows, b);
}

template <int E, int K, QuantFormat F, int D>
__global__ AITER_AUX_SORT_BOUNDS(kTinyThreads) void sort_tiny_scales_kernel(
    AiterAuxSortArgs a, AiterAuxQuantArgs q, ScalesPlan sp, int num_g, int quant_blocks,
    int zero_blocks, bool x_al16, bool q_al4) {
  const PdlScope pdl;
  __shared__ TinyScalesSmem<E, K> sm;
  int b = block_idx();
  if (b < num_g) {
    tiny_sort_block<E, K>(a, sm.t, b, num_g);
    return;
  }
  b -= num_g;
  if (b < D / 256 * sp.parts) {
    scale_group_block<E, K, F, D>(a, q, sp, sm, b % (D / 256), b / (D / 256), x_al16);
    return;
  }
  b -= D / 256 * sp.parts;
  if (b < sp.z_blocks) {
    scales_zero_block<E, K, D>(a, sp, sm.t, b);
    return;
  }
  aux_block<F, D, kTinyThreads>(b - sp.z_blocks, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// ------------------------------------------------- the pair path's launch ----
// n <= kPairMax: pair sort blocks (pair_sort_block), then scale blocks that rank the pairs
// as a pair block does (warp 0, pair_tables) and take a row's token from its tables, then z
// blocks whose every warp ranks the pairs itself (pair_rank: the rows, no shared memory),
// then the quant / zero_buf blocks; blocks of kPairThreads.  No work grows with E but the
// zeros, which cover the output's capacity-sized rows.
struct PairScalesSmem {
  PairSmem p;
  alignas(8) uint8_t sc[kPairMax * 8];  // scale bytes [token][8] of the column group (M <= n)
};

template <int E, int K, QuantFormat F, int D>
__device__ __forceinline__ void pair_scale_block(const AiterAuxSortArgs& a,
                                                 const AiterAuxQuantArgs& q, const ScalesPlan& sp,
                                                 PairScalesSmem& sm, int ku, int part,
                                                 bool x_al16) {
  constexpr int kItems = kPairMax * 8 / kPairThreads;  // x blocks per thread at most
  static_assert(kItems * kPairThreads == kPairMax * 8, "items per thread");
  const int tid = thread_idx();
  const int m = static_cast<int>(a.num_tokens);
  const int n = m * K;
  const int lg = log2_block_m(a.block_m);
  // item i = (token i / 8, block i % 8 of the group), loaded before the ranking
  uint32_t w[kItems][16];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = tid + it * kPairThreads;
    if (i < m * 8)
      load_block32(q.x + static_cast<int64_t>(i >> 3) * D + ku * 256 + (i & 7) * 32, x_al16, w[it]);
  }
  if (warp_id() == 0) pair_tables<E, K, false>(a, sm.p, n, Pow2Blocks{lg});
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = tid + it * kPairThreads;
    if (i < m * 8) sm.sc[i] = scale_of<F>(w[it]);
  }
  block_sync();
  scale_tiles<D, kPairThreads>(sp, sm.sc, sm.p.rows, ku, part, [&](int r) {
    const PairBlock b = sm.p.blk[r >> lg];
    return r < b.real_end ? static_cast<int>(sm.p.pair[r - b.delta].sti & 0xFFFFFF) : -1;
  });
}

template <int E, int K, QuantFormat F, int D>
__global__ AITER_AUX_SORT_BOUNDS(kPairThreads) void sort_pairs_scales_kernel(
    AiterAuxSortArgs a, AiterAuxQuantArgs q, ScalesPlan sp, int num_g, int quant_blocks,
    int zero_blocks, bool x_al16, bool q_al4) {
  const PdlScope pdl;
  __shared__ PairScalesSmem sm;
  int b = block_idx();
  if (b < num_g) {
    pair_sort_block<E, K>(a, sm.p, b, num_g);
    return;
  }
  b -= num_g;
  if (b < D / 256 * sp.parts) {
    pair_scale_block<E, K, F, D>(a, q, sp, sm, b % (D / 256), b / (D / 256), x_al16);
    return;
  }
  b -= D / 256 * sp.parts;
  if (b < sp.z_blocks) {
    const int n = static_cast<int>(a.num_tokens) * K;
    scales_zero_fill<D, kPairThreads>(sp, pair_rank<E, K>(a, n, Pow2Blocks::of(a.block_m)).rows, b);
    return;
  }
  aux_block<F, D, kPairThreads>(b - sp.z_blocks, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// ------------------------------------------------------------------ host ----
// The one launch's layout for num_g sort blocks and other_blocks quant / zero_buf blocks of
// `threads` threads (sorted_scales `out` 16-byte aligned: the chooser's fused_scales).  The
// scale blocks' parts are capped to keep the grid within `sms` blocks (one tiny block of
// kTinyThreads per SM is resident, by its registers): a second wave would hold back the scale
// blocks, the longest part.
template <int D>
inline ScalesPlan plan_scales(const SortPolicy& p, const AiterAuxSortArgs& a, uint8_t* out,
                              int threads, int num_g, int other_blocks, int sms) {
  constexpr int kGroups = D / 256;
  const int64_t n = a.num_tokens * a.topk;
  const int64_t bm = a.block_m;
  const int64_t tile_m = bm > 32 ? bm : 32;
  const int64_t out_rows = ceil_div_i64(a.max_rows, tile_m) * tile_m;
  // the z blocks: sized for the whole output (at decode most of it lies past the valid rows)
  const int64_t z16 = out_rows / 32 * (D / 16);
  ScalesPlan sp;
  sp.out = out;
  sp.out_rows = static_cast<int>(out_rows);
  sp.z_blocks = static_cast<int>(clamp_i64(
      ceil_div_i64(z16, int64_t(threads) * p.scale_zero_stores), 1, p.scale_zero_blocks_max));
  const int64_t room = (sms - num_g - sp.z_blocks - other_blocks) / kGroups;
  const int64_t want = clamp_i64(ceil_div_i64(n, p.scale_tile_pairs), 1, p.scale_max_parts);
  sp.parts = static_cast<int>(clamp_i64(want < room ? want : room, 1, p.scale_max_parts));
  return sp;
}

// moe_sort_quant[_fp8] with sorted_scales in one launch (the chooser's fused_scales) of
// num_g sort blocks of the chosen path (tiny or pairs), the scale and z blocks and the quant
// / zero_buf blocks.
template <int E, int K, QuantFormat F, int D>
inline int launch_fused_scales(const SortPolicy& p, const SortChoice& c,
                               const AiterAuxSortQuantArgs& a, hipStream_t st, const char* op) {
  const int num_g = c.blocks;
  if (c.path == SortPath::Pairs) {
    const AuxGrid x = aux_grid<F, D>(p, a.sort, a.quant, kPairThreads, 1);
    const ScalesPlan sp = plan_scales<D>(p, a.sort, a.sorted_scales, kPairThreads, num_g,
                                         x.quant_blocks + x.zero_blocks, device_sm_count());
    AITER_AUX_LAUNCH(
        (sort_pairs_scales_kernel<E, K, F, D>),
        dim3(num_g + D / 256 * sp.parts + sp.z_blocks + x.quant_blocks + x.zero_blocks),
        dim3(kPairThreads),
        st)(a.sort, a.quant, sp, num_g, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
    return check_launch(op);
  }
  if constexpr (sizeof(TinyScalesSmem<E, K>) <= kStaticSmemBytes) {
    // the quant blocks take kQuantUnroll units per lane: fewer blocks, one wave
    const AuxGrid x = aux_grid<F, D>(p, a.sort, a.quant, kTinyThreads, quant_detail::kQuantUnroll);
    const ScalesPlan sp = plan_scales<D>(p, a.sort, a.sorted_scales, kTinyThreads, num_g,
                                         x.quant_blocks + x.zero_blocks, device_sm_count());
    AITER_AUX_LAUNCH(
        (sort_tiny_scales_kernel<E, K, F, D>),
        dim3(num_g + D / 256 * sp.parts + sp.z_blocks + x.quant_blocks + x.zero_blocks),
        dim3(kTinyThreads),
        st)(a.sort, a.quant, sp, num_g, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
    return check_launch(op);
  }
  return fail_invalid("%s: internal: no one-launch sorted scales for this instance", op);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
