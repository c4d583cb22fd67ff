// moe_sort large path: the 3 launches count -> scan -> place over chunks of
// the pairs (sort.h's header comment describes them).  Part of sort.h, which
// includes it after its constants; not a standalone header.
#pragma once

#include "sort_rank.h"
#include "sort_tiny.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// ------------------------------------------------------------ large path ----
// 1. Grid: num_chunks + zero_blocks.  Block g < num_chunks writes its chunk's per-expert
// counts to reverse_sorted[chunk_begin(g) + e].
template <int E, int K, class A = AiterAuxSortArgs>
__global__ __launch_bounds__(kSortThreads) void sort_count_kernel(A a, int cq, int cr,
                                                                  int num_chunks, int zero_blocks) {
  const PdlScope pdl;
  __shared__ ChunkSmem<E> sm;
  const int b = block_idx();
  if (b >= num_chunks) {
    aux_block<QuantFormat::None, 0>(b - num_chunks, a, AiterAuxQuantArgs{}, 0, zero_blocks, false,
                                    false);
    return;
  }
  const int cb = chunk_begin(b, cq, cr);
  const int ce = chunk_begin(b + 1, cq, cr);
  zero_counters(&sm.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(cb, ce, warp_id(), &wb, &we);
  warp_count<E>(a, wb, we, &sm.wcnt[0][0], warp_id());
  block_sync();
  int32_t* row = a.reverse_sorted + cb;
  for (int e = thread_idx(); e < E; e += kSortThreads) {
    int c = 0;
#pragma unroll
    for (int w = 0; w < kSortWarps; ++w) c += sm.wcnt[w][e];
    row[e] = c;
  }
}

// 2. Grid: ceil(E / kScanWarps) blocks; one warp per expert e, no shared memory, no
// block_sync.  Lane L owns chunks g0 + L*kScanPer + u (u < kScanPer) of each tile of
// kWarpSize*kScanPer chunks (one tile up to 256 chunks): it loads their counts
// cnt[g][e] = reverse_sorted[chunk_begin(g) + e] all at once, a warp inclusive scan
// of the lane sums gives every chunk's exclusive prefix pre[g][e] (pairs of e in the
// chunks < g), written back in place; then T_e (pairs of e in all chunks) goes to
// reverse_sorted[chunk_begin(g) + E + e] for EVERY chunk g, so that each place block
// finds all totals in its own home (q >= 2E).  A warp only touches column e, so there
// is no dependency between warps or blocks.
template <int E>
__global__ __launch_bounds__(kScanThreads) void sort_scan_kernel(AiterAuxSortArgs a, int cq, int cr,
                                                                 int num_chunks) {
  const PdlScope pdl;
  const int e = block_idx() * kScanWarps + warp_id();
  if (e >= E) return;  // warp-uniform
  const int lane = lane_id();
  int32_t* table = a.reverse_sorted;
  int run = 0;  // pairs of e in the tiles before this one
  for (int g0 = 0; g0 < num_chunks; g0 += kWarpSize * kScanPer) {
    const int gl = g0 + lane * kScanPer;
    // Unconditional loads (past the end: chunk num_chunks - 1 again, then dropped), so
    // that all kScanPer are in flight at once without branches.
    int v[kScanPer];
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      const int g = gl + u < num_chunks ? gl + u : num_chunks - 1;
      const int c = table[chunk_begin(g, cq, cr) + e];
      v[u] = gl + u < num_chunks ? c : 0;
    }
    int sum = 0;
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) sum += v[u];
    int x = sum;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int y = shfl_up_i32(x, d);
      if (lane >= d) x += y;
    }
    const int tile_tot = shfl_idx_i32(x, kWarpSize - 1);
    int pre = run + x - sum;
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      if (gl + u < num_chunks) table[chunk_begin(gl + u, cq, cr) + e] = pre;
      pre += v[u];
    }
    run += tile_tot;
  }
  for (int g = lane; g < num_chunks; g += kWarpSize) table[chunk_begin(g, cq, cr) + E + e] = run;
}

template <int E>
struct PlaceSmem {
  ChunkSmem<E> c;
  int pad_end[E];  // off_e + T_e of the experts e = g + i*num_chunks (slot i)
};

// 3. Grid: num_chunks + quant_blocks (moe_sort_quant's, kFusedQuantTiles<F> tiles a step).
// Block g < num_chunks loads pre[g][e] and T_e (reverse_sorted[cb .. cb + 2E)) into
// registers (place_per experts per thread, e = tid*place_per + i) before pass 1 and hands
// them to chunk_offsets after it.  After the scan's block_sync nothing reads the home
// again, so the block overwrites its own pair range [cb, ce) of reverse_sorted with the
// reverse entries (no other block touches that range).  kStaged: the staged place (3').
template <int E, int K, class A>
__device__ __forceinline__ void place_direct(const A& a, int b, int num_chunks, int cb, int ce,
                                             const int* pre, const int* tot) {
  __shared__ PlaceSmem<E> sm;
  const int warp = warp_id();
  zero_counters(&sm.c.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(cb, ce, warp, &wb, &we);
  warp_count<E>(a, wb, we, &sm.c.wcnt[0][0], warp);
  block_sync();
  warp_bases<E>(sm.c.wcnt, nullptr);
  const int rows =
      chunk_offsets<E>(a, b, num_chunks, pre, tot, sm.c.base, sm.pad_end, sm.c.warp_tot);
  warp_place<E, K, true>(a, wb, we, sm.c.wcnt[warp], sm.c.base);
  chunk_pads<E, K>(a, b, num_chunks, sm.pad_end);
  fill_tail<K>(a, rows, b * kSortThreads + thread_idx(), num_chunks * kSortThreads);
}

// 3'. The staged place (SortChoice::staged_place): the same ranking, but a pair's slot in its
// chunk's row order (expert-major: slot = the pairs of the lower experts in the chunk + its
// rank among the chunk's pairs of its expert) goes to shared memory first, and the block then
// writes its rows slot by slot, so that a warp's stores cover a few runs of consecutive rows
// instead of up to 32 experts' rows.  wcnt's rows hold slot bases (the chunk-local expert base
// folded in); after the ranking the last warp's row holds each expert's end slot, where a slot
// finds its expert by a binary search.  Needs a chunk of at most staged_slots(E) pairs (the
// chooser's rule); the stage then holds the pad ends of the experts e % num_chunks == g.

template <int E>
struct StagedPlaceSmem {
  alignas(4) uint16_t wcnt[kSortWarps][E];     // per-warp counts, then slot bases
  int diff[E];                                 // row - slot of the chunk's pairs of expert e
  int warp_tot[kSortWarps];                    // block-scan scratch
  alignas(4) uint16_t stage[staged_slots(E)];  // slot -> pair - chunk start; then pad ends
};
static_assert(staged_slots(kMaxSortExperts) >= 2 * kMaxSortExperts,
              "the stage must hold the pad ends (ceil(E / num_chunks) ints)");

// The slot bases and row offsets of a staged place block, after its per-warp counts (and a
// block_sync): wcnt[w][e] becomes the first slot of warp w's pairs of e, diff[e] = off_e +
// pre[e] - (first slot of e), pend[i] = off_e + T_e for the experts e = tid * place_per + i
// with e % num_chunks == g (their pad rows), else -1.  Block 0 writes num_valid_ids.  Ends
// with a block_sync; returns the rows of all segments.
template <int E, class A>
__device__ __forceinline__ int staged_offsets(const A& a, int g, int num_chunks, const int* pre,
                                              const int* tot, StagedPlaceSmem<E>& sm, int* pend) {
  constexpr int kPer = place_per<E>();
  const int tid = thread_idx();
  const int bm = a.block_m;
  int cnt[kPer];
  int padded[kPer];
  int cnt_sum = 0;
  int pad_sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    int c = 0;
    if (e < E) {
#pragma unroll
      for (int w = 0; w < kSortWarps; ++w) c += sm.wcnt[w][e];
    }
    cnt[i] = c;
    cnt_sum += c;
    padded[i] = (tot[i] + bm - 1) / bm * bm;
    pad_sum += padded[i];
  }
  int staged = 0;
  int slot = block_exclusive_scan<kSortThreads>(cnt_sum, sm.warp_tot, &staged);
  int total = 0;
  int off = block_exclusive_scan<kSortThreads>(pad_sum, sm.warp_tot, &total);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    pend[i] = -1;
    if (e < E) {
      int run = slot;
#pragma unroll
      for (int w = 0; w < kSortWarps; ++w) {
        const int c = sm.wcnt[w][e];
        sm.wcnt[w][e] = static_cast<uint16_t>(run);
        run += c;
      }
      sm.diff[e] = off + pre[i] - slot;
      if (e % num_chunks == g) pend[i] = off + tot[i];
    }
    slot += cnt[i];
    off += padded[i];
  }
  if (g == 0 && tid == 0) write_num_valid(a, total);
  block_sync();
  return total;
}

// Pass 2 of the staged place: warp_place's ranking; a local pair's slot gets its offset in
// the chunk (j - cb), reverse_sorted[j] its row (diff + slot), a pair that is not local -1.
template <int E, class A>
__device__ __forceinline__ void warp_stage(const A& a, int cb, int wb, int we, uint16_t* my_slot,
                                           const int* diff, uint16_t* stage) {
  warp_walk<E>(
      a, wb, we, my_slot, [](int, const int*) {},
      [&](int, int j, int key, int slot) {
        if (key < E) {
          stage[slot] = static_cast<uint16_t>(j - cb);
          a.reverse_sorted[j] = SortFormat<A>::reverse(diff[key] + slot, j);
        } else {
          a.reverse_sorted[j] = -1;
        }
      });
}

// The rows of the staged slots [0, ends[E - 1]): slot i holds the pair cb + stage[i] of the
// expert e with ends[e - 1] <= i < ends[e] (ends: the last warp's slot row after pass 2), row
// diff[e] + i; the first row of a block also writes its sorted_expert_ids label.
template <int E, int K, class A>
__device__ __forceinline__ void staged_rows(const A& a, int cb, const uint16_t* ends,
                                            const int* diff, const uint16_t* stage) {
  constexpr int kTop = 1 << (bit_width(E) - 1);  // the largest power of two <= E
  const int staged = ends[E - 1];
  for (int i = thread_idx(); i < staged; i += kSortThreads) {
    int e = 0;  // the experts whose pairs end at or before slot i
#pragma unroll
    for (int step = kTop; step > 0; step >>= 1)
      if (e + step <= E && static_cast<int>(ends[e + step - 1]) <= i) e += step;
    const int r = diff[e] + i;
    const int j = cb + static_cast<int>(stage[i]);
    float w = 0.0f;
    if constexpr (SortFormat<A>::kNative) w = a.topk_weights[j];
    write_pair_fields<K>(a, r, j, w);
    if (SortFormat<A>::first_row(r, a.block_m))
      a.sorted_expert_ids[r / a.block_m] = SortFormat<A>::label(a, e);
  }
}

template <int E, int K, class A>
__device__ __forceinline__ void place_staged(const A& a, int b, int num_chunks, int cb, int ce,
                                             const int* pre, const int* tot) {
  constexpr int kPer = place_per<E>();
  __shared__ StagedPlaceSmem<E> sm;
  const int tid = thread_idx();
  const int warp = warp_id();
  zero_counters(&sm.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(cb, ce, warp, &wb, &we);
  warp_count<E>(a, wb, we, &sm.wcnt[0][0], warp);
  block_sync();
  int pend[kPer];
  const int rows = staged_offsets<E>(a, b, num_chunks, pre, tot, sm, pend);
  warp_stage<E>(a, cb, wb, we, sm.wcnt[warp], sm.diff, sm.stage);
  block_sync();
  staged_rows<E, K>(a, cb, sm.wcnt[kSortWarps - 1], sm.diff, sm.stage);
  block_sync();  // the stage is free: it takes the pad ends
  int* pad_end = reinterpret_cast<int*>(sm.stage);
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (pend[i] >= 0) pad_end[(tid * kPer + i) / num_chunks] = pend[i];
  block_sync();
  chunk_pads<E, K>(a, b, num_chunks, pad_end);
  fill_tail<K>(a, rows, b * kSortThreads + tid, num_chunks * kSortThreads);
}

// The place launch (3 and 3').
template <int E, int K, QuantFormat F, int D, class A = AiterAuxSortArgs, bool kStaged = false>
__global__ __launch_bounds__(kSortThreads) void sort_place_kernel(A a, AiterAuxQuantArgs q, int cq,
                                                                  int cr, int num_chunks,
                                                                  int quant_blocks, bool x_al16,
                                                                  bool q_al4) {
  const PdlScope pdl;
  constexpr int kPer = place_per<E>();
  const int b = block_idx();
  if (b >= num_chunks) {
    aux_block<F, D, kSortThreads, kFusedQuantTiles<F>>(b - num_chunks, a, q, quant_blocks, 0,
                                                       x_al16, q_al4);
    return;
  }
  const int cb = chunk_begin(b, cq, cr);
  const int ce = chunk_begin(b + 1, cq, cr);
  int pre[kPer];
  int tot[kPer];
  load_home<E, kPer>(a.reverse_sorted + cb, pre, tot);
  if constexpr (kStaged)
    place_staged<E, K>(a, b, num_chunks, cb, ce, pre, tot);
  else
    place_direct<E, K>(a, b, num_chunks, cb, ce, pre, tot);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
