// moe_sort single-launch paths without redundant ranking of all pairs: micro
// (one warp ranks the <= kWarpSize pairs) and mid (chunk blocks that count
// every pair but rank only their own chunk).  Part of sort.h, which includes it
// after its constants; not a standalone header.
#pragma once

#include "sort_rank.h"
#include "sort_tiny.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// ------------------------------------------------------------ micro path ----
// M*topk <= kWarpSize (decode at M = 1..3): ONE launch, one sort block of
// kMicroThreads (+ the quant / zero blocks), no barrier, no loop-carried
// dependency.  Every warp ranks all pairs, lane j holding pair j: its group of
// equal keys (match), its rank in the group (lower lanes), the group's size; a
// group's leader (lowest lane) stands for its expert's segment of
// round_up(size, block_m) rows.  The offset of a segment is the sum of the
// segments of smaller experts: every lane reads every lane's (key, padded size)
// by shuffles, all independent.  Warp 0 writes the real rows (row off + rank of
// lane j's pair), reverse_sorted, sorted_expert_ids and num_valid_ids; warp w
// writes pad row p (< block_m) of every segment for p % warps == w.
constexpr int kMicroThreads = 256;
constexpr int kMicroWarps = kMicroThreads / kWarpSize;

template <int E, int K, class A>
__device__ __forceinline__ void micro_sort_block(const A& a) {
  using Fmt = SortFormat<A>;
  const int lane = lane_id();
  const int warp = warp_id();
  const int n = static_cast<int>(a.num_tokens) * K;  // <= kWarpSize
  const int bm = a.block_m;
  const int m = Fmt::pad(a, K);

  int key;
  load_keys<E, 1>(a, lane, 0, n, &key);
  float wt = 0.0f;
  if constexpr (Fmt::kNative) wt = (warp == 0 && key < E) ? a.topk_weights[lane] : 0.0f;
  const lane_mask_t peers = match_key<E>(key);
  const int rank = popc(peers & lanemask_lt(lane));
  const bool lead = key < E && rank == 0;
  const int cnt = popc(peers);
  const int padded = lead ? (cnt + bm - 1) / bm * bm : 0;

  int off = 0;   // first row of this lane's expert's segment
  int rows = 0;  // all segments
#pragma unroll
  for (int i = 0; i < kWarpSize; ++i) {
    const int ki = shfl_idx_i32(key, i);
    const int pi = shfl_idx_i32(padded, i);
    off += ki < key ? pi : 0;
    rows += pi;
  }

  if (warp == 0) {
    if (key < E) {
      write_pair_row<K>(a, off + rank, lane, wt);
      if (lead) {
        for (int b = off / bm; b < (off + padded) / bm; ++b)
          a.sorted_expert_ids[b] = Fmt::label(a, key);
      }
    } else if (lane < n) {
      a.reverse_sorted[lane] = -1;
    }
    if (lane == 0) write_num_valid(a, rows);  // (ours: M, which is the pad id m)
  }
  if (lead) {
    for (int p = cnt + warp; p < padded; p += kMicroWarps) write_pad_row(a, off + p, m);
  }
  fill_tail<K>(a, rows, thread_idx(), kMicroThreads);
}

// Grid: 1 + quant_blocks + zero_blocks (blocks of kMicroThreads).
template <int E, int K, QuantFormat F, int D, class A = AiterAuxSortArgs>
__global__ AITER_AUX_SORT_BOUNDS(kMicroThreads) void sort_micro_kernel(A a, AiterAuxQuantArgs q,
                                                                       int quant_blocks,
                                                                       int zero_blocks, bool x_al16,
                                                                       bool q_al4) {
  const PdlScope pdl;
  const int b = block_idx();
  if (b == 0) {
    micro_sort_block<E, K>(a);
    return;
  }
  aux_block<F, D, kMicroThreads>(b - 1, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// -------------------------------------------------------------- mid path ----
// ONE launch of G chunk blocks (+ the quant / zero blocks).  Block g ranks and places the
// pairs of its chunk [cb, ce) exactly as a place block of the large path, but counts the
// pairs of the other chunks itself instead of reading counts made by earlier launches: it
// streams all n keys (from L2 after the first block) and adds 1 to pre[e] for a pair of
// expert e before its chunk, to rest[e] for one at or after cb (shared atomics; a warp
// step's kWarpSize consecutive pairs come from ~kWarpSize/topk + 1 tokens whose experts are
// distinct within a token, so an address repeats a few times at most).  T_e = pre[e] +
// rest[e].  No inter-block dependency, no scratch in global memory; every block reads the
// n ids once more than the large path's count block, which bounds the path to moderate n
// (the host's choice: choose_sort_path, sort_policy.h).
template <int E>
struct MidSmem {
  alignas(4) uint16_t wcnt[kSortWarps][E];  // the chunk's per-warp counts, then bases
  union {
    struct {
      uint32_t pre[E];   // pairs of e before the chunk
      uint32_t rest[E];  // pairs of e from the chunk on
    } cnt;
    struct {
      int base[E];     // first row of the chunk's pairs of e
      int pad_end[E];  // off_e + T_e of the experts e = g + i*num_chunks (slot i)
    } row;
  } u;
  int warp_tot[kSortWarps];
};

constexpr int kMidBatch = 8;  // keys of a thread loaded together in the count stream

template <int E, int K, class A>
__device__ __forceinline__ void mid_sort_block(const A& a, MidSmem<E>& sm, int g, int num_chunks,
                                               int cq, int cr) {
  constexpr int kPer = place_per<E>();
  const int tid = thread_idx();
  const int warp = warp_id();
  const int lane = lane_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int cb = chunk_begin(g, cq, cr);
  const int ce = chunk_begin(g + 1, cq, cr);
  // A chunk of <= kSortThreads pairs (the usual case) is ranked one pair per thread, its
  // key and weight loaded up front and kept in registers: one warp step, counters of the
  // rw warps that hold pairs only.  Longer chunks take the passes of sort_rank.h.
  const bool one = ce - cb <= kSortThreads;  // block-uniform
  const int rw = one ? (ce - cb + kWarpSize - 1) / kWarpSize : kSortWarps;
  const int j1 = cb + tid;
  int key1 = E;
  float wt1 = 0.0f;
  if (one) {
    load_keys<E, 1>(a, j1, 0, ce, &key1);
    if constexpr (SortFormat<A>::kNative) wt1 = key1 < E ? a.topk_weights[j1] : 0.0f;
  }

  zero_counters(&sm.wcnt[0][0], rw * E);
  for (int e = tid; e < E; e += kSortThreads) {
    sm.u.cnt.pre[e] = 0u;
    sm.u.cnt.rest[e] = 0u;
  }
  block_sync();
  for (int j0 = 0; j0 < n; j0 += kMidBatch * kSortThreads) {  // block-uniform
    int keys[kMidBatch];
    load_keys<E, kMidBatch>(a, j0 + tid, kSortThreads, n, keys);
#pragma unroll
    for (int s = 0; s < kMidBatch; ++s) {
      const int j = j0 + s * kSortThreads + tid;
      if (keys[s] < E) atomic_add_shared_u32((j < cb ? sm.u.cnt.pre : sm.u.cnt.rest) + keys[s], 1u);
    }
  }
  int wb = 0, we = 0, rank1 = 0;
  if (one) {
    if (warp < rw) {  // warp-uniform
      const lane_mask_t peers = match_key<E>(key1);
      rank1 = popc(peers & lanemask_lt(lane));
      if (key1 < E && rank1 == 0) sm.wcnt[warp][key1] = static_cast<uint16_t>(popc(peers));
    }
  } else {
    warp_range(cb, ce, warp, &wb, &we);
    warp_count<E>(a, wb, we, &sm.wcnt[0][0], warp);
  }
  block_sync();
  warp_bases<E>(sm.wcnt, nullptr, rw);
  int pre[kPer];
  int tot[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    pre[i] = e < E ? static_cast<int>(sm.u.cnt.pre[e]) : 0;
    tot[i] = e < E ? static_cast<int>(sm.u.cnt.pre[e] + sm.u.cnt.rest[e]) : 0;
  }
  const int rows =
      chunk_offsets<E>(a, g, num_chunks, pre, tot, sm.u.row.base, sm.u.row.pad_end, sm.warp_tot);
  if (one) {
    if (key1 < E) {
      const int p = sm.u.row.base[key1] + sm.wcnt[warp][key1] + rank1;
      write_pair_row<K>(a, p, j1, wt1);
      if (SortFormat<A>::first_row(p, a.block_m))
        a.sorted_expert_ids[p / a.block_m] = SortFormat<A>::label(a, key1);
    } else if (j1 < ce) {
      a.reverse_sorted[j1] = -1;
    }
  } else {
    warp_place<E, K, true>(a, wb, we, sm.wcnt[warp], sm.u.row.base);
  }
  chunk_pads<E, K>(a, g, num_chunks, sm.u.row.pad_end);
  fill_tail<K>(a, rows, g * kSortThreads + tid, num_chunks * kSortThreads);
}

// Grid: num_chunks + quant_blocks + zero_blocks (blocks of kSortThreads).  kWide (MXFP4, x
// of >= SortPolicy::wide_quant_elems elements): the quant blocks take two tiles a step,
// under the register bound of kFusedSortMinOccupancy; else one, unbounded.
template <int E, int K, QuantFormat F, int D, bool kWide, class A = AiterAuxSortArgs>
__global__ AITER_AUX_FUSED_BOUNDS(kSortThreads,
                                  kWide) void sort_mid_kernel(A a, AiterAuxQuantArgs q, int cq,
                                                              int cr, int num_chunks,
                                                              int quant_blocks, int zero_blocks,
                                                              bool x_al16, bool q_al4) {
  const PdlScope pdl;
  __shared__ MidSmem<E> sm;
  const int b = block_idx();
  if (b < num_chunks) {
    mid_sort_block<E, K>(a, sm, b, num_chunks, cq, cr);
    return;
  }
  aux_block<F, D, kSortThreads, kWide ? quant_detail::kStepTiles : 1>(
      b - num_chunks, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
