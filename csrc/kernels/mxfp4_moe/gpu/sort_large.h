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
// reverse entries (no other block touches that range).
template <int E, int K, QuantFormat F, int D, class A = AiterAuxSortArgs>
__global__ __launch_bounds__(kSortThreads) void sort_place_kernel(A a, AiterAuxQuantArgs q, int cq,
                                                                  int cr, int num_chunks,
                                                                  int quant_blocks, bool x_al16,
                                                                  bool q_al4) {
  const PdlScope pdl;
  constexpr int kPer = place_per<E>();
  __shared__ PlaceSmem<E> sm;
  const int b = block_idx();
  if (b >= num_chunks) {
    aux_block<F, D, kSortThreads, kFusedQuantTiles<F>>(b - num_chunks, a, q, quant_blocks, 0,
                                                       x_al16, q_al4);
    return;
  }
  const int tid = thread_idx();
  const int warp = warp_id();
  const int cb = chunk_begin(b, cq, cr);
  const int ce = chunk_begin(b + 1, cq, cr);

  const int32_t* home = a.reverse_sorted + cb;
  int pre[kPer];
  int tot[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    pre[i] = e < E ? home[e] : 0;
    tot[i] = e < E ? home[E + e] : 0;
  }
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
  fill_tail<K>(a, rows, b * kSortThreads + tid, num_chunks * kSortThreads);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
