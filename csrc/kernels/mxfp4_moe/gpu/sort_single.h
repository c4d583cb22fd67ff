// moe_sort single-launch paths: lean and tiny (G redundant ranking blocks that
// each write a slice of the rows), and the quant / zero blocks (aux_block) of
// the fused launches.  Part of sort.h,
// which includes it after its constants; not a standalone header.
#pragma once

#include <type_traits>

#include "quant.h"
#include "sort_rank.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// Blocks after the sort blocks: quantisation (D > 0) then zero_buf.
template <int D, int kThreads = kSortThreads>
__device__ __forceinline__ void aux_block(int b, const AiterAuxSortArgs& a,
                                          const AiterAuxQuantArgs& q, int quant_blocks,
                                          int zero_blocks, bool x_al16, bool q_al4) {
  if constexpr (D > 0) {
    if (b < quant_blocks) {
      constexpr int kWarps = kThreads / kWarpSize;
      quant_detail::quant_tensor<D>(q, static_cast<int64_t>(b) * kWarps + warp_id(),
                                    static_cast<int64_t>(quant_blocks) * kWarps, x_al16, q_al4);
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

// ------------------------------------------------------------- lean path ----
// M*topk <= kLeanMaxPairs (decode): ONE launch of G identical sort blocks (+
// the quant / zero blocks).  Every sort block ranks all pairs (the ids are a
// few KB, read from L2) and then writes its share of the rows, so there is no
// inter-block dependency and the row writes are spread over G SMs:
//   1. pair j = i*kLeanThreads + tid (i < kLeanPer) has key e (E: not local);
//      lanes of equal key in a warp step (j / kWarpSize) form a run; the run's
//      leader adds (1 << 16 | run size) to cnt[e] (shared atomic) and gets the
//      run's slot among e's runs;
//   2. block scan over the experts of (pairs << 18 | padded size): segment
//      offsets off[e] and bucket starts cst[e]; blk2e[block] = expert;
//   3. leaders store (step, size) descriptors of their runs in e's bucket;
//   4. a run's first rank = sizes of e's runs with a smaller step (a lower j):
//      the rank of a pair among e's pairs in ascending j -- deterministic
//      whatever order the atomics took; (j, weight) go to bucket slot
//      cst[e] + rank;
//   5. rows r < num_valid_ids[0] of this block (r = g*T + tid, stride G*T):
//      blk2e -> e; a real row takes bucket slot cst[e] + r - off[e], a pad
//      row gets (M, 0, M); the first row of a block writes sorted_expert_ids;
//      reverse_sorted[j] = r.  Consecutive threads write consecutive rows.

template <int E>
struct LeanSmem {
  uint32_t cnt[E];                        // pairs of e | runs of e << 16
  int off[E];                             // first row of e's segment
  uint16_t cst[E];                        // first bucket slot of e
  uint16_t desc[kLeanMaxPairs];           // run descriptors: step << 8 | size
  uint16_t sj[kLeanMaxPairs];             // pair index j, by expert then j
  float sw[kLeanMaxPairs];                // its weight
  uint16_t blk2e[kLeanMaxPairs / 16 + E];  // expert of each block of rows
  int warp_tot[kLeanWarps];
};

template <int E>
__device__ __forceinline__ lane_mask_t match_any_key(int key) {
#if defined(AITER_AUX_GPU_CUDA)
  return __match_any_sync(0xffffffffu, key);
#else
  return match_key<E>(key);
#endif
}

template <int E, int K>
__device__ __forceinline__ void lean_sort_block(const AiterAuxSortArgs& a, LeanSmem<E>& sm, int g,
                                                int num_g) {
  static_assert(E <= kLeanThreads, "one expert per thread in the scan");
  const int tid = thread_idx();
  const int lane = lane_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int bm = a.block_m;
  const int lg = log2_block_m(bm);

  for (int e = tid; e < E; e += kLeanThreads) sm.cnt[e] = 0u;
  int key[kLeanPer];
  float wt[kLeanPer];
  load_keys<E, kLeanPer>(a, tid, kLeanThreads, n, key);
#pragma unroll
  for (int i = 0; i < kLeanPer; ++i) {
    const int j = i * kLeanThreads + tid;
    wt[i] = key[i] < E ? a.topk_weights[j] : 0.0f;
  }
  block_sync();

  // 1. runs
  const lane_mask_t lt = lanemask_lt(lane);
  int leader[kLeanPer], rank[kLeanPer], size[kLeanPer], slot[kLeanPer];
#pragma unroll
  for (int i = 0; i < kLeanPer; ++i) {
    leader[i] = 0;
    rank[i] = 0;
    size[i] = 0;
    slot[i] = 0;
    if (i * kLeanThreads < n) {  // block-uniform
      const lane_mask_t peers = match_any_key<E>(key[i]);
      leader[i] = lowest_lane(peers);
      rank[i] = popc(peers & lt);
      size[i] = popc(peers);
      if (key[i] < E && rank[i] == 0) {
        slot[i] = static_cast<int>(
            atomic_add_shared_u32(&sm.cnt[key[i]], (1u << 16) | static_cast<uint32_t>(size[i])) >> 16);
      }
    }
  }
  block_sync();

  // 2. segment offsets (pairs <= 4096 < 2^13, padded rows < 2^18)
  uint32_t c = 0, padded = 0;
  if (tid < E) {
    c = sm.cnt[tid] & 0xFFFFu;
    padded = ((c + bm - 1) >> lg) << lg;
  }
  int total = 0;
  const int ex = block_exclusive_scan<kLeanThreads>(static_cast<int>((c << 18) | padded),
                                                    sm.warp_tot, &total);
  const int rows = total & 0x3FFFF;
  if (tid < E) {
    const int off = ex & 0x3FFFF;
    sm.off[tid] = off;
    sm.cst[tid] = static_cast<uint16_t>(ex >> 18);
    for (int b = off >> lg; b < (off + static_cast<int>(padded)) >> lg; ++b)
      sm.blk2e[b] = static_cast<uint16_t>(tid);
  }
  if (g == 0 && tid == 0) {
    a.num_valid_ids[0] = rows;
    a.num_valid_ids[1] = static_cast<int32_t>(a.num_tokens);
  }
  block_sync();

  // 3. run descriptors
  const int warp = warp_id();
#pragma unroll
  for (int i = 0; i < kLeanPer; ++i) {
    if (key[i] < E && rank[i] == 0) {
      const int step = i * kLeanWarps + warp;  // = j / kWarpSize
      sm.desc[sm.cst[key[i]] + slot[i]] = static_cast<uint16_t>((step << 8) | size[i]);
    }
  }
  block_sync();

  // 4. ranks -> bucket
#pragma unroll
  for (int i = 0; i < kLeanPer; ++i) {
    if (i * kLeanThreads < n) {  // block-uniform
      const int k_ = key[i];
      int base = 0;
      if (k_ < E && rank[i] == 0) {
        const int step = i * kLeanWarps + warp;
        const int nr = static_cast<int>(sm.cnt[k_] >> 16);
        const int cs = sm.cst[k_];
        for (int r = 0; r < nr; ++r) {
          const int d = sm.desc[cs + r];
          if ((d >> 8) < step) base += d & 0xFF;
        }
      }
      base = shfl_idx_i32(base, leader[i]);
      const int j = i * kLeanThreads + tid;
      if (k_ < E) {
        const int sl = sm.cst[k_] + base + rank[i];
        sm.sj[sl] = static_cast<uint16_t>(j);
        sm.sw[sl] = wt[i];
      } else if (g == 0 && j < n) {
        a.reverse_sorted[j] = -1;
      }
    }
  }
  block_sync();

  // 5. rows
  const int m = static_cast<int>(a.num_tokens);
  for (int r = g * kLeanThreads + tid; r < rows; r += num_g * kLeanThreads) {
    const int b = r >> lg;
    const int e = sm.blk2e[b];
    const int local = r - sm.off[e];
    if (local < static_cast<int>(sm.cnt[e] & 0xFFFFu)) {
      const int sl = sm.cst[e] + local;
      const int j = sm.sj[sl];
      const int t = j / K;
      const int k = j - t * K;
      a.sorted_token_ids[r] =
          static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(k) << 24));
      a.sorted_weights[r] = sm.sw[sl];
      a.m_indices[r] = t;
      a.reverse_sorted[j] = r;
    } else {
      a.sorted_token_ids[r] = m;
      a.sorted_weights[r] = 0.0f;
      a.m_indices[r] = m;
    }
    if ((r & (bm - 1)) == 0) a.sorted_expert_ids[b] = e;
  }
}

// Tiny variant (M*topk <= kLeanThreads, decode): one pair per thread (j = tid,
// step = warp).  No atomics, no run descriptors: the leader of each run writes
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
  alignas(16) uint8_t wc[E][kLeanWarps];  // pairs of e in warp w (<= kWarpSize)
  int off[E];                             // first row of e's segment
  uint16_t cnt[E];                        // pairs of e
  uint16_t blk2e[kLeanThreads / 16 + E];
  int warp_tot[kLeanWarps];
};

template <int E, int K>
__device__ __forceinline__ void tiny_sort_block(const AiterAuxSortArgs& a, TinySmem<E>& sm, int g,
                                                int num_g) {
  static_assert(E <= kLeanThreads, "one expert per thread in the scan");
  const int tid = thread_idx();
  const int lane = lane_id();
  const int warp = warp_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int bm = a.block_m;
  const int lg = log2_block_m(bm);

  {  // zero wc
    uint4* z = reinterpret_cast<uint4*>(&sm.wc[0][0]);
    constexpr int kVec = E * kLeanWarps / 16;
    for (int i = tid; i < kVec; i += kLeanThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  const int j = tid;
  int key;
  load_keys<E, 1>(a, j, 0, n, &key);
  const float wt = key < E ? a.topk_weights[j] : 0.0f;
  block_sync();

  const lane_mask_t peers = match_key<E>(key);  // ballots: fixed cost, whatever the keys
  const int rank = popc(peers & lanemask_lt(lane));
  if (key < E && rank == 0) sm.wc[key][warp] = static_cast<uint8_t>(popc(peers));
  block_sync();

  uint32_t c = 0, padded = 0;
  if (tid < E) {
    c = static_cast<uint32_t>(byte_total_then_prefix(sm.wc[tid]));
    padded = ((c + bm - 1) >> lg) << lg;
  }
  int rows = 0;
  const int off = block_exclusive_scan<kLeanThreads>(static_cast<int>(padded), sm.warp_tot, &rows);
  if (tid < E) {
    sm.off[tid] = off;
    sm.cnt[tid] = static_cast<uint16_t>(c);
    for (int b = off >> lg; b < (off + static_cast<int>(padded)) >> lg; ++b)
      sm.blk2e[b] = static_cast<uint16_t>(tid);
  }
  if (g == 0 && tid == 0) {
    a.num_valid_ids[0] = rows;
    a.num_valid_ids[1] = static_cast<int32_t>(a.num_tokens);
  }
  block_sync();

  const int m = static_cast<int>(a.num_tokens);
  const int slice_stride = num_g * kLeanThreads;
  if (key < E) {
    const int r = sm.off[key] + byte_sum_before(sm.wc[key], sm.cnt[key], warp) + rank;
    if ((r / kLeanThreads) % num_g == g) {  // row r is in this block's slice
      const int t = j / K;
      const int k = j - t * K;
      a.sorted_token_ids[r] =
          static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(k) << 24));
      a.sorted_weights[r] = wt;
      a.m_indices[r] = t;
      a.reverse_sorted[j] = r;
    }
  } else if (g == 0 && j < n) {
    a.reverse_sorted[j] = -1;
  }

  for (int r = g * kLeanThreads + tid; r < rows; r += slice_stride) {
    const int b = r >> lg;
    const int e = sm.blk2e[b];
    if (r - sm.off[e] >= static_cast<int>(sm.cnt[e])) {  // pad row
      a.sorted_token_ids[r] = m;
      a.sorted_weights[r] = 0.0f;
      a.m_indices[r] = m;
    }
    if ((r & (bm - 1)) == 0) a.sorted_expert_ids[b] = e;
  }
}

// CUDA: with MXFP8 quant blocks (D tagged kFp8Dim) ptxas otherwise picks 32 registers for
// the lean kernel and spills; min 1 block keeps its choice free as for MXFP4 (0: no minimum,
// the MXFP4 kernels' bounds unchanged).  (HIP reads a second argument as waves per EU.)
#if defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_LEAN_BOUNDS(D) \
  __launch_bounds__(kLeanThreads, ((D) & quant_detail::kFp8Dim) != 0 ? 1 : 0)
#else
#define AITER_AUX_LEAN_BOUNDS(D) __launch_bounds__(kLeanThreads)
#endif

// Grid: num_g + quant_blocks + zero_blocks; the tiny (kTiny) or the lean sort blocks first.
template <int E, int K, int D, bool kTiny>
__global__ AITER_AUX_LEAN_BOUNDS(D) void sort_single_kernel(AiterAuxSortArgs a,
                                                                   AiterAuxQuantArgs q, int num_g,
                                                                   int quant_blocks,
                                                                   int zero_blocks, bool x_al16,
                                                                   bool q_al4) {
  __shared__ typename std::conditional<kTiny, TinySmem<E>, LeanSmem<E>>::type sm;
  const int b = block_idx();
  if (b < num_g) {
    if constexpr (kTiny) tiny_sort_block<E, K>(a, sm, b, num_g);
    else lean_sort_block<E, K>(a, sm, b, num_g);
    return;
  }
  aux_block<D, kLeanThreads>(b - num_g, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
