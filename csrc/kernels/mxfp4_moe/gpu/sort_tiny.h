// moe_sort tiny path (G redundant ranking blocks that each write a slice of the
// rows) and the quant / zero blocks (aux_block) of the fused launches.  Part of
// sort.h, which includes it after its constants; not a standalone header.
#pragma once

#include "quant.h"
#include "sort_rank.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// Blocks after the sort blocks: quantisation of x in format F (model_dim D; kTiles tiles per
// step), then zero_buf.
template <QuantFormat F, int D, int kThreads = kSortThreads, int kTiles = 1>
__device__ __forceinline__ void aux_block(int b, const AiterAuxSortArgs& a,
                                          const AiterAuxQuantArgs& q, int quant_blocks,
                                          int zero_blocks, bool x_al16, bool q_al4) {
  if constexpr (F != QuantFormat::None) {
    if (b < quant_blocks) {
      constexpr int kWarps = kThreads / kWarpSize;
      quant_detail::quant_tensor<F, D, kTiles>(q, static_cast<int64_t>(b) * kWarps + warp_id(),
                                               static_cast<int64_t>(quant_blocks) * kWarps, x_al16,
                                               q_al4);
      return;
    }
  } else {
    (void)q;
    (void)x_al16;
    (void)q_al4;
  }
  b -= quant_blocks;
  if (b < zero_blocks) {
    init_fill_bf16(a.zero_buf, a.zero_init, a.zero_numel,
                   static_cast<int64_t>(b) * kThreads + thread_idx(),
                   static_cast<int64_t>(zero_blocks) * kThreads);
  }
}

// Host: the quant / zero blocks that ride in a sort launch (aux_block), for blocks of `threads`
// threads that each take `units_per_thread` 8-element units of x.
struct AuxGrid {
  int quant_blocks = 0;
  int zero_blocks = 0;
  bool x_al16 = false;
  bool q_al4 = false;
};

template <QuantFormat F, int D>
inline AuxGrid aux_grid(const SortPolicy& p, const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q,
                        int threads, int units_per_thread) {
  AuxGrid g;
  if (a.zero_buf != nullptr && a.zero_numel > 0) {
    g.zero_blocks = static_cast<int>(
        clamp_i64(ceil_div_i64(a.zero_numel, int64_t(threads) * 8 * 2), 1, p.zero_blocks_max));
  }
  if (F != QuantFormat::None && q.num_tokens > 0) {
    const int64_t units = q.num_tokens * static_cast<int64_t>(D / 8);
    g.quant_blocks = static_cast<int>(
        clamp_i64(ceil_div_i64(units, int64_t(threads) * units_per_thread), 1, p.quant_blocks_max));
    g.x_al16 = is_aligned(q.x, 16);
    g.q_al4 = is_aligned(q.a_q, 4);
  }
  return g;
}

// ------------------------------------------------------------- tiny path ----
// M*topk <= kTinyThreads (decode): ONE launch of G identical sort blocks (+ the
// quant / zero blocks).  Every sort block ranks all pairs (the ids are a few KB,
// read from L2) and then writes its share of the rows, so there is no
// inter-block dependency and the row writes are spread over G SMs.  One pair per
// thread (j = tid, step = warp).  No atomics, no run descriptors: the leader of each run writes
// its size into wc[e][warp] (uint8), and the rank of a pair is the sum of
// wc[e][w' < warp] plus its rank in the run.  Expert e's thread turns its row
// into those sums when e has 2..255 pairs (byte_total_then_prefix: then one
// byte read per pair; every expert of valid routing at M <= 255 qualifies; a
// lone pair's sum is 0), else each pair sums the bytes itself (byte_prefix:
// two 16-byte reads and byte sums).
// No bucket either: right after the scan barrier the thread of a real pair
// writes its row r = off[e] + rank (and reverse_sorted[j]) itself when r is in
// this block's slice of rows, while the row loop of the slice writes only the
// pad rows and sorted_expert_ids (6 block barriers, 3 of them in the scan).
template <int E>
struct TinySmem {
  alignas(16) uint8_t wc[E][kTinyWarps];  // pairs of e in warp w (<= kWarpSize)
  int off[E];                             // first row of e's segment
  uint16_t cnt[E];                        // pairs of e
  uint16_t blk2e[kTinyThreads / 16 + E];
  int warp_tot[kTinyWarps];
};

// This thread's pair after tiny_rank.
struct TinyPair {
  int j;     // the pair, = thread_idx()
  int key;   // its local expert, or E (not local / past the end)
  int rank;  // among the lanes of its warp with the same key
  float wt;  // its weight when key < E
  int rows;  // num_valid_ids[0]
  int n;     // M * topk
  int bm;    // block_m
  int lg;    // log2(block_m)
};

// The row of a local pair (key < E) after tiny_rank.
template <int E>
__device__ __forceinline__ int tiny_row(const TinySmem<E>& sm, const TinyPair& p) {
  return sm.off[p.key] + byte_sum_before(sm.wc[p.key], sm.cnt[p.key], warp_id()) + p.rank;
}

// Ranks every pair (one per thread) into sm (off, cnt, blk2e: the segments of every expert)
// and returns this thread's; block 0 (g == 0) writes num_valid_ids.  With cstart (not null)
// also each expert's first pair in expert-major order, from the same scan.  sm.off, cnt,
// blk2e and cstart are final (a barrier precedes the return); the rows need sm.wc (tiny_row).
template <int E, int K, class A>
__device__ __forceinline__ TinyPair tiny_rank(const A& a, TinySmem<E>& sm, int g,
                                              uint16_t* cstart = nullptr) {
  static_assert(E <= kTinyThreads, "one expert per thread in the scan");
  TinyPair p;
  const int tid = thread_idx();
  const int lane = lane_id();
  const int warp = warp_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int bm = a.block_m;
  const int lg = log2_block_m(bm);
  p.n = n;
  p.bm = bm;
  p.lg = lg;

  {  // zero wc
    uint4* z = reinterpret_cast<uint4*>(&sm.wc[0][0]);
    constexpr int kVec = E * kTinyWarps / 16;
    for (int i = tid; i < kVec; i += kTinyThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  p.j = tid;
  load_keys<E, 1>(a, p.j, 0, n, &p.key);
  if constexpr (SortFormat<A>::kNative) {
    p.wt = p.key < E ? a.topk_weights[p.j] : 0.0f;
  } else {
    p.wt = 0.0f;
  }
  block_sync();

  const lane_mask_t peers = match_key<E>(p.key);  // ballots: fixed cost, whatever the keys
  p.rank = popc(peers & lanemask_lt(lane));
  if (p.key < E && p.rank == 0) sm.wc[p.key][warp] = static_cast<uint8_t>(popc(peers));
  block_sync();

  uint32_t c = 0, padded = 0;
  if (tid < E) {
    c = static_cast<uint32_t>(byte_total_then_prefix(sm.wc[tid]));
    padded = ((c + bm - 1) >> lg) << lg;
  }
  // With cstart, one scan of (padded << 11) | c: padded sums < 2^17 (<= 1024 + 1024 * 127
  // rows), count sums <= kTinyThreads < 2^11.  (Without, the padded counts alone: the
  // packed scan measured +0.1 us on the tiny path.)
  static_assert(kTinyThreads < (1 << 11), "packed scan");
  const int sh = cstart != nullptr ? 11 : 0;
  int tot = 0;
  const int both = block_exclusive_scan<kTinyThreads>(
      static_cast<int>((padded << sh) | (cstart != nullptr ? c : 0u)), sm.warp_tot, &tot);
  p.rows = tot >> sh;
  const int off = both >> sh;
  if (tid < E) {
    sm.off[tid] = off;
    sm.cnt[tid] = static_cast<uint16_t>(c);
    if (cstart != nullptr) cstart[tid] = static_cast<uint16_t>(both & 0x7FF);
    for (int b = off >> lg; b < (off + static_cast<int>(padded)) >> lg; ++b)
      sm.blk2e[b] = static_cast<uint16_t>(tid);
  }
  if (g == 0 && tid == 0) write_num_valid(a, p.rows);
  block_sync();
  return p;
}

// Block g of num_g writes the rows of its slice (kTinyThreads-row chunks g, g + num_g,
// ...) and block 0 the reverse entries of the pairs that are not local; the peers' formats
// also the rows and blocks past the used ones (fill_tail), spread the same way.
template <int E, int K, class A>
__device__ __forceinline__ void tiny_write_rows(const A& a, const TinySmem<E>& sm,
                                                const TinyPair& p, int g, int num_g) {
  const int tid = thread_idx();
  const int n = p.n;
  const int lg = p.lg;
  const int m = SortFormat<A>::pad(a, K);
  const int slice_stride = num_g * kTinyThreads;
  if (p.key < E) {
    const int r = tiny_row<E>(sm, p);
    if ((r / kTinyThreads) % num_g == g) write_pair_row<K>(a, r, p.j, p.wt);  // in this slice
  } else if (g == 0 && p.j < n) {
    a.reverse_sorted[p.j] = -1;
  }

#pragma unroll 1  // (not unrolled: no trip-count division; see fill_tail)
  for (int r = g * kTinyThreads + tid; r < p.rows; r += slice_stride) {
    const int b = r >> lg;
    const int e = sm.blk2e[b];
    if (r - sm.off[e] >= static_cast<int>(sm.cnt[e])) write_pad_row(a, r, m);
    if ((r & (p.bm - 1)) == 0) a.sorted_expert_ids[b] = SortFormat<A>::label(a, e);
  }
  fill_tail<K>(a, p.rows, g * kTinyThreads + tid, slice_stride);
}

template <int E, int K, class A>
__device__ __forceinline__ void tiny_sort_block(const A& a, TinySmem<E>& sm, int g, int num_g) {
  const TinyPair p = tiny_rank<E, K>(a, sm, g);
  tiny_write_rows<E, K>(a, sm, p, g, num_g);
}

// The one-block-per-SM sort kernels (tiny, micro, pairs and the one-launch sorted scales).
// CUDA: a minimum of 1 block per SM, which leaves ptxas's register choice free: without it
// ptxas picked 32-40 registers for the tiny, micro and pair sort kernels and spilled (the
// pair kernel at E = 257, the others with MXFP8 quant blocks), and held the pair scales
// kernel to 64 (its scale blocks keep two x blocks in flight across the ranking).  (HIP
// reads a second argument as waves per EU.)
#if defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_SORT_BOUNDS(T) __launch_bounds__(T, 1)
#else
#define AITER_AUX_SORT_BOUNDS(T) __launch_bounds__(T)
#endif

// The mid path's kernel with wide MXFP4 quant blocks (W): the register bound of
// kFusedSortMinOccupancy (launch_traits.h); none otherwise.
#if defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_FUSED_BOUNDS(T, W) __launch_bounds__(T, (W) ? kFusedSortMinOccupancy : 0)
#else
#define AITER_AUX_FUSED_BOUNDS(T, W) __launch_bounds__(T)
#endif

// Tiles per step of the large path's fused quant blocks (the place launch): two for MXFP4
// (as mxfp4_quant), one for MXFP8, whose two-tile step measured slower there.
template <QuantFormat F>
constexpr int kFusedQuantTiles = F == QuantFormat::Mxfp8 ? 1 : quant_detail::kStepTiles;

// Grid: num_g + quant_blocks + zero_blocks; the tiny sort blocks first.
template <int E, int K, QuantFormat F, int D, class A = AiterAuxSortArgs>
__global__ AITER_AUX_SORT_BOUNDS(kTinyThreads) void sort_tiny_kernel(A a, AiterAuxQuantArgs q,
                                                                     int num_g, int quant_blocks,
                                                                     int zero_blocks, bool x_al16,
                                                                     bool q_al4) {
  const PdlScope pdl;
  __shared__ TinySmem<E> sm;
  const int b = block_idx();
  if (b < num_g) {
    tiny_sort_block<E, K>(a, sm, b, num_g);
    return;
  }
  aux_block<F, D, kTinyThreads>(b - num_g, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
