// moe_sort pair path (n = M*topk <= kPairMax, decode): the ranking touches only the pairs,
// never an array of E counters.  Part of sort.h, which includes it after its constants; not
// a standalone header.
//
// One warp ranks all pairs (pair_rank), lane l holding pairs l + s*kWarpSize (s <
// kPairPer: 2 on NVIDIA, 1 on CDNA), with ballots only: one per bit of the keys (the local
// expert, or E for a pair that is not local / past the end) gives every lane, for each of its
// pairs, the masks of the pairs with an equal key and with a smaller key (a top-down walk
// over the bits); the rank is the equal pairs before it (ascending j), the count all equal
// pairs, the place in expert-major order the smaller pairs plus the rank.  Each expert's
// first pair (its leader) stands for ceil(count / block_m) blocks of rows; a ballot per bit
// of that block count lets every lane add up the blocks of the smaller experts (masked
// popcounts), which is its segment's first row / block_m.  So the cost is bit_width(E) +
// 3 ballots per half (at most 11 + 3 for E <= 1024), whatever E and the routing.  The block
// arithmetic is a parameter (Pow2Blocks, AnyBlocks): shifts for moe_sort's block_m, divisions
// and 7 block-count ballots for any other block size of the peers' formats (8, 48, ...).
//
// A pair block (kPairThreads threads): warp 0 ranks and writes two small tables to shared
// memory: the pairs in expert-major order (sorted_token_ids and weight of each), and per block
// of rows (<= kPairMax of them: every block starts with a real row) its expert, the end of its
// segment's real rows and the offset from a real row to its pair's place; then, after one
// barrier, every thread writes whole rows: consecutive threads consecutive rows (coalesced),
// a real row from the pair table, a pad row (M, 0, M) otherwise.  Block g of G writes rows
// [g, g + 1) * kPairRowsPerBlock (G from a bound on the rows: min(capacity, n * block_m));
// block 0 also writes reverse_sorted (warp 0, from its registers), sorted_expert_ids (one
// thread per block of rows) and num_valid_ids.  Only rows below num_valid_ids[0] are
// written.  No global atomics, no scratch; the topk_ids and topk_weights loads are issued
// together.
#pragma once

#include "sort_rank.h"
#include "sort_tiny.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// kPairMax, kPairThreads, kPairRowIters, kPairRowsPerBlock: sort.h
constexpr int kPairPer = kPairMax / kWarpSize;  // pairs per lane of the ranking warp
static_assert(kPairMax % kWarpSize == 0 && kPairMax <= kPairThreads, "pair path shape");

// The blocks of rows of a pair launch (every block of rows holds a real pair, so there are at
// most n <= kPairMax of them).  kCountBits: the bits of an expert's ceil(count / block_m).
// Pow2Blocks: block_m = 2^lg >= 16 (moe_sort's; the peers' formats at those sizes): shifts
// and masks, at most kPairMax / 16 = 4 blocks an expert.
struct Pow2Blocks {
  static constexpr int kCountBits = 3;
  int lg;
  __device__ __forceinline__ static Pow2Blocks of(int block_m) { return {log2_block_m(block_m)}; }
  __device__ __forceinline__ int blocks(int count) const { return (count + (1 << lg) - 1) >> lg; }
  __device__ __forceinline__ int rows(int blocks) const { return blocks << lg; }
  __device__ __forceinline__ int block_of(int row) const { return row >> lg; }
  __device__ __forceinline__ bool first_row(int row) const { return (row & ((1 << lg) - 1)) == 0; }
};

// AnyBlocks: any block size >= 1 (the peers' formats: 8, 48, ...): divisions, up to kPairMax
// blocks an expert (block size 1).  The chooser bounds the rows (pair_rows_fit).
struct AnyBlocks {
  static constexpr int kCountBits = 7;
  int bm;
  __device__ __forceinline__ static AnyBlocks of(int block_m) { return {block_m}; }
  __device__ __forceinline__ int blocks(int count) const { return (count + bm - 1) / bm; }
  __device__ __forceinline__ int rows(int blocks) const { return blocks * bm; }
  __device__ __forceinline__ int block_of(int row) const { return row / bm; }
  __device__ __forceinline__ bool first_row(int row) const { return row % bm == 0; }
};
static_assert(kPairMax / 16 < (1 << Pow2Blocks::kCountBits) &&
                  kPairMax < (1 << AnyBlocks::kCountBits),
              "pair path block count bits");

// One warp's ranking of all pairs: lane l holds pairs j = l + s * kWarpSize.
struct PairRank {
  int key[kPairPer];   // local expert, or E (not local / past the end)
  float wt[kPairPer];  // weight (j < n)
  int row[kPairPer];   // row of the pair (key < E)
  int pos[kPairPer];   // place in expert-major order (key < E)
  int rank[kPairPer];  // among the pairs of its expert (ascending j)
  int cnt[kPairPer];   // pairs of its expert
  int rows;            // num_valid_ids[0]
};

// The masks of the lanes of one half whose key equals / is smaller than `key`, from that
// half's ballots bal[b] (bit b of each lane's key).  With t_b the lanes that agree with key
// on bit b, eq is the AND of every t_b, and lt the OR over the bits b set in key of the
// lanes that agree above b and have 0 at b.  The t_b and the suffix ANDs are independent
// per bit, so the chain is one AND per bit, not a select and two logic ops.
template <int kBits>
__device__ __forceinline__ void pair_masks(int key, const lane_mask_t* bal, lane_mask_t* eq,
                                           lane_mask_t* lt) {
  lane_mask_t above = ~lane_mask_t(0), l = 0;
#pragma unroll
  for (int b = kBits - 1; b >= 0; --b) {
    const lane_mask_t set = ((key >> b) & 1) != 0 ? ~lane_mask_t(0) : lane_mask_t(0);
    l |= above & set & ~bal[b];
    above &= ~(bal[b] ^ set);
  }
  *eq = above;
  *lt = l;
}

// pair_rank with H halves of the lanes' pairs holding pairs (compile time, so that the
// halves' ballots and masks are one straight block the compiler interleaves; a half h >= H
// is past n).
template <int E, int K, int H, class A, class G>
__device__ __forceinline__ PairRank pair_rank_halves(const A& a, int n, G geo) {
  constexpr int kBits = bit_width(E);  // keys in [0, E]
  PairRank r;
  const int lane = lane_id();
  const lane_mask_t before = lanemask_lt(lane);
#pragma unroll
  for (int s = 0; s < kPairPer; ++s) {  // independent of the ids: issued with them
    const int j = s * kWarpSize + lane;
    if constexpr (SortFormat<A>::kNative) {
      r.wt[s] = s < H && j < n ? a.topk_weights[j] : 0.0f;
    } else {
      (void)j;
      r.wt[s] = 0.0f;
    }
  }
  load_keys<E, H>(a, lane, kWarpSize, n, r.key);  // E past n
#pragma unroll
  for (int s = H; s < kPairPer; ++s) r.key[s] = E;

  lane_mask_t bal[H][kBits];
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int b = 0; b < kBits; ++b) bal[h][b] = warp_ballot(((r.key[h] >> b) & 1) != 0);
  }
  // eq / lt[s][h]: the pairs of half h with a key equal to / smaller than pair s's (a pair
  // past n has key E: never equal to or smaller than a real pair's)
  lane_mask_t eq[H][H], lt[H][H];
#pragma unroll
  for (int s = 0; s < H; ++s) {
#pragma unroll
    for (int h = 0; h < H; ++h) pair_masks<kBits>(r.key[s], bal[h], &eq[s][h], &lt[s][h]);
  }
  int nblk[H];
#pragma unroll
  for (int s = 0; s < kPairPer; ++s) {
    if (s >= H) {
      r.cnt[s] = r.rank[s] = r.pos[s] = r.row[s] = 0;
      continue;
    }
    int cnt = 0, rank = 0, below = 0;
#pragma unroll
    for (int h = 0; h < H; ++h) {
      cnt += popc(eq[s][h]);
      rank += h < s ? popc(eq[s][h]) : (h == s ? popc(eq[s][h] & before) : 0);
      below += popc(lt[s][h]);
    }
    r.cnt[s] = cnt;
    r.rank[s] = rank;
    r.pos[s] = below + rank;
    nblk[s] = r.key[s] < E && rank == 0 ? geo.blocks(cnt) : 0;
  }
  // blocks of the experts with a smaller key (per lane pair), and of all experts
  int blk_before[H] = {};
  int total = 0;
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int b = 0; b < G::kCountBits; ++b) {
      const lane_mask_t nb = warp_ballot(((nblk[h] >> b) & 1) != 0);
      total += popc(nb) << b;
#pragma unroll
      for (int s = 0; s < H; ++s) blk_before[s] += popc(nb & lt[s][h]) << b;
    }
  }
#pragma unroll
  for (int s = 0; s < H; ++s) r.row[s] = geo.rows(blk_before[s]) + r.rank[s];
  r.rows = geo.rows(total);
  return r;
}

// Ranks the n <= kPairMax pairs in the calling warp (every lane must call it; no shared
// memory, no barrier).  geo: the blocks of rows (Pow2Blocks, AnyBlocks).  One warp-uniform
// branch on the halves in use.
template <int E, int K, class A, class G>
__device__ __forceinline__ PairRank pair_rank(const A& a, int n, G geo) {
  if constexpr (kPairPer > 1) {
    if (n > kWarpSize) return pair_rank_halves<E, K, kPairPer>(a, n, geo);
  }
  return pair_rank_halves<E, K, 1>(a, n, geo);
}

// A real pair's row in expert-major order.
struct PairRow {
  int32_t sti;  // t | (k << 24) (SortFormat<A>::encode)
  float wt;
};

// Block b of the rows: its expert, the end of its segment's real rows, and row - place of
// every real row of the segment.
struct alignas(16) PairBlock {
  int expert;
  int real_end;
  int delta;
  int pad;
};

struct PairSmem {
  PairRow pair[kPairMax];
  PairBlock blk[kPairMax];
  int rows;
};

// Warp 0 of a block: ranks the pairs into sm (pair, blk, rows; the caller's barrier makes
// them visible); with kOutputs (block 0 of the sort) it also writes reverse_sorted and
// num_valid_ids.
template <int E, int K, int H, bool kOutputs, class A, class G>
__device__ __forceinline__ void pair_tables_halves(const A& a, PairSmem& sm, int n, G geo) {
  using Fmt = SortFormat<A>;
  const PairRank r = pair_rank_halves<E, K, H>(a, n, geo);
  const int lane = lane_id();
#pragma unroll
  for (int s = 0; s < H; ++s) {
    const int j = s * kWarpSize + lane;
    if (r.key[s] < E) {
      sm.pair[r.pos[s]] = {Fmt::encode(j, K), r.wt[s]};
      if (geo.first_row(r.row[s]))  // the first row of a block
        sm.blk[geo.block_of(r.row[s])] = {r.key[s], r.row[s] - r.rank[s] + r.cnt[s],
                                          r.row[s] - r.pos[s], 0};
      if (kOutputs) a.reverse_sorted[j] = Fmt::reverse(r.row[s], j);
    } else if (kOutputs && j < n) {
      a.reverse_sorted[j] = -1;
    }
  }
  if (lane == 0) {
    sm.rows = r.rows;
    if (kOutputs) write_num_valid(a, r.rows);
  }
}

// The dispatch on the halves in use is outside the whole table writer, so that each version
// is one straight block (a merge of the two rankings' results measured a register spill).
template <int E, int K, bool kOutputs, class A, class G>
__device__ __forceinline__ void pair_tables(const A& a, PairSmem& sm, int n, G geo) {
  if constexpr (kPairPer > 1) {
    if (n > kWarpSize) {
      pair_tables_halves<E, K, kPairPer, kOutputs>(a, sm, n, geo);
      return;
    }
  }
  pair_tables_halves<E, K, 1, kOutputs>(a, sm, n, geo);
}

// Pair block g of num_g: the ranking (warp 0), then rows [g, g + 1) * kPairRowsPerBlock; the
// peers' formats also the rows and blocks past the used ones (fill_tail), spread over the
// blocks.  G: the block arithmetic (Pow2Blocks, AnyBlocks).
template <int E, int K, class G = Pow2Blocks, class A>
__device__ __forceinline__ void pair_sort_block(const A& a, PairSmem& sm, int g, int num_g) {
  using Fmt = SortFormat<A>;
  const int n = static_cast<int>(a.num_tokens) * K;
  const int m = Fmt::pad(a, K);
  const G geo = G::of(a.block_m);
  const int tid = thread_idx();
  if (warp_id() == 0) {
    if (g == 0) {
      pair_tables<E, K, true>(a, sm, n, geo);
    } else {
      pair_tables<E, K, false>(a, sm, n, geo);
    }
  }
  block_sync();
  const int rows = sm.rows;
#pragma unroll
  for (int i = 0; i < kPairRowIters; ++i) {
    const int r = g * kPairRowsPerBlock + i * kPairThreads + tid;
    if (r < rows) {
      const PairBlock b = sm.blk[geo.block_of(r)];
      int32_t sti = m;
      float wt = 0.0f;
      if (r < b.real_end) {
        const PairRow p = sm.pair[r - b.delta];
        sti = p.sti;
        wt = p.wt;
      }
      a.sorted_token_ids[r] = sti;
      if constexpr (Fmt::kNative) {
        a.sorted_weights[r] = wt;
        a.m_indices[r] = sti & 0xFFFFFF;  // t, or M for a pad row (M < 2^24)
      } else {
        (void)wt;
      }
    }
  }
  if (g == 0 && tid < geo.block_of(rows))
    a.sorted_expert_ids[tid] = Fmt::label(a, sm.blk[tid].expert);
  if constexpr (Fmt::kFillTail) {
    fill_tail<K>(a, rows, g * kPairThreads + tid, num_g * kPairThreads);
  } else {
    (void)num_g;
  }
}

// Grid: num_g + quant_blocks + zero_blocks (blocks of kPairThreads).
template <int E, int K, QuantFormat F, int D, class A = AiterAuxSortArgs, class G = Pow2Blocks>
__global__ AITER_AUX_SORT_BOUNDS(kPairThreads) void sort_pairs_kernel(A a, AiterAuxQuantArgs q,
                                                                      int num_g, int quant_blocks,
                                                                      int zero_blocks, bool x_al16,
                                                                      bool q_al4) {
  const PdlScope pdl;
  __shared__ PairSmem sm;
  const int b = block_idx();
  if (b < num_g) {
    pair_sort_block<E, K, G>(a, sm, b, num_g);
    return;
  }
  aux_block<F, D, kPairThreads>(b - num_g, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
