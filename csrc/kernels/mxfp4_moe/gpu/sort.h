// moe_sort and moe_sort_quant on the GPU; docs/ops.md is the spec.
//
// Ranking (both paths).  The pairs (t, k) are the flat indices j = t*topk + k.
// A chunk of pairs is split into kSortWarps contiguous warp ranges; a warp walks
// its range kWarpSize pairs at a time in ascending j.  Lanes holding the same
// key (expert, or the sentinel E for a pair that is not local / past the end)
// find each other with a ballot per key bit ("match"); the lowest lane of a
// group is its leader.  Pass 1 counts, per warp, the pairs of each expert
// (uint16 counters in shared memory, one row per warp, written by leaders
// only).  An exclusive scan over the warps turns the counts into per-warp
// bases.  Pass 2 walks the same pairs again: the rank of a pair among its
// expert's pairs of the chunk is base[warp][e] + (pairs of e in the earlier
// steps of this warp) + (lower lanes of its group) -- ascending j, with no
// atomics, hence deterministic.
//
// Paths by M*topk: <= kLeanThreads (1024): tiny; <= kLeanMaxPairs (4096):
// lean (both one launch of G redundant ranking blocks that each write a slice
// of the rows, see "lean path" below); <= kSmallSortMaxPairs: small; else large.
//
// Small path (M*topk <= kSmallSortMaxPairs): ONE launch.  Block 0 is the
// whole sort (the chunk is all pairs; counts -> per-expert totals -> block scan
// of the padded sizes -> segment offsets; pads and sorted_expert_ids by one warp
// per expert; then pass 2 places the pairs).  The other blocks of the same
// launch quantise x (moe_sort_quant) and zero zero_buf.
//
// Large path: three launches, no allocation, no inter-block dependency inside a
// launch.  The pairs are split evenly into G = num_chunks chunks of q >= 2E pairs
// (~160 chunks, see launch_sort); chunk g's "home" is reverse_sorted[cb(g) ..
// cb(g) + 2E), the start of its own pair range (overwritten by the reverse entries
// in the last launch):
//   1. count : block g < G writes its chunk's per-expert counts cnt[g][e] to
//              home(g)[e]; the remaining blocks quantise x (moe_sort_quant) and
//              zero zero_buf;
//   2. scan  : one warp per expert e (kScanWarps per block): loads cnt[g][e] of
//              all chunks at once (a few per lane), warp scan over g, writes the
//              exclusive prefix pre[g][e] back to home(g)[e] and the total T_e to
//              home(g)[E + e] of EVERY chunk g;
//   3. place : block g loads home(g)[0 .. 2E) (its prefixes and all totals), ranks
//              its chunk as above, block-scans round_up(T_e, block_m) over e into
//              the segment offsets off_e (block 0 writes num_valid_ids), and writes
//              sorted_token_ids, sorted_weights, m_indices of its pairs at row
//              off_e + pre[g][e] + rank, reverse_sorted (-1 for pairs that are not
//              local) over its own pair range, sorted_expert_ids at the first row of
//              each block of rows, and the pad rows [off_e + T_e, off_e +
//              round_up(T_e, block_m)) of the experts e % G == g.
// A place block reads only its own home and writes reverse_sorted only inside its
// own chunk (after a block_sync that follows its home loads).
#pragma once

#include "common.h"
#include "quant.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

constexpr int kSortWarps = 16;
constexpr int kSortThreads = kSortWarps * kWarpSize;  // 1024 on CDNA, 512 on NVIDIA
constexpr int64_t kSmallSortMaxPairs = 8192;          // single-block path
constexpr int kMinChunk = 1024;  // pairs per block, large path (times ceil(2E / 1024))
constexpr int kMaxChunk = 32768;                      // chunks of < 2 kMaxChunk pairs
constexpr int kTargetChunks = 160;  // ~1 block per SM (132 on H200) for count and place
constexpr int kScanThreads = 256;  // large-path scan: one warp per expert
constexpr int kScanWarps = kScanThreads / kWarpSize;
// Chunks per lane per tile of the scan (256 chunks a tile); the emulator self-test also
// builds with a smaller value to run the multi-tile loop (> 256 chunks: > 8M pairs).
#ifndef AITER_AUX_SORT_SCAN_PER
#define AITER_AUX_SORT_SCAN_PER (256 / kWarpSize)
#endif
constexpr int kScanPer = AITER_AUX_SORT_SCAN_PER;
static_assert(kScanPer >= 1, "scan tile");
constexpr int kZeroBlocksMax = 256;
constexpr int kQuantBlocksMax = 1024;
constexpr int kBatch = 8;  // warp steps whose topk_ids are loaded together

__host__ __device__ constexpr int bit_width(int x) { return x == 0 ? 0 : 1 + bit_width(x >> 1); }

template <int E>
struct ChunkSmem {
  uint16_t wcnt[kSortWarps][E];  // per-warp counts, then per-warp bases
  int base[E];                   // first row of this chunk's pairs of expert e
  int tot[E];                    // pairs of expert e in the chunk
  int warp_tot[kSortWarps];      // block-scan scratch
};

// Lanes of the warp whose key equals this lane's key (keys in [0, E]).
template <int E>
__device__ __forceinline__ lane_mask_t match_key(int key) {
  constexpr int kBits = bit_width(E);
  lane_mask_t peers = ~static_cast<lane_mask_t>(0);
#pragma unroll
  for (int b = 0; b < kBits; ++b) {
    const bool bit = ((key >> b) & 1) != 0;
    const lane_mask_t bal = warp_ballot(bit);
    peers &= bit ? bal : ~bal;
  }
  return peers;
}

template <int E>
__device__ __forceinline__ int load_key(const int32_t* ids, int j, int end) {
  if (j >= end) return E;
  const int id = ids[j];
  return (id >= 0 && id < E) ? id : E;
}

// Contiguous range of warp `warp` inside the chunk [cb, ce).
__device__ __forceinline__ void warp_range(int cb, int ce, int warp, int* wb, int* we) {
  const int per = (ce - cb + kSortWarps - 1) / kSortWarps;
  const int64_t b = static_cast<int64_t>(cb) + static_cast<int64_t>(warp) * per;
  const int64_t e = b + per;
  *wb = static_cast<int>(b < ce ? b : ce);
  *we = static_cast<int>(e < ce ? e : ce);
}

__device__ __forceinline__ void zero_counters(uint16_t* wcnt, int n) {
  for (int i = thread_idx(); i < n; i += kSortThreads) wcnt[i] = 0;
}

// Pass 1: my_cnt[e] += pairs of expert e in [wb, we).  Warp-uniform loops; the
// keys of kBatch steps are loaded up front so that their latencies overlap.
template <int E>
__device__ __forceinline__ void warp_count(const int32_t* ids, int wb, int we, uint16_t* my_cnt) {
  const int lane = lane_id();
  const lane_mask_t lt = lanemask_lt(lane);
  for (int j0 = wb; j0 < we; j0 += kBatch * kWarpSize) {
    int keys[kBatch];
#pragma unroll
    for (int s = 0; s < kBatch; ++s) keys[s] = load_key<E>(ids, j0 + s * kWarpSize + lane, we);
#pragma unroll
    for (int s = 0; s < kBatch; ++s) {
      if (j0 + s * kWarpSize >= we) break;  // warp-uniform
      const int key = keys[s];
      const lane_mask_t peers = match_key<E>(key);
      if (key < E && (peers & lt) == 0) {
        my_cnt[key] = static_cast<uint16_t>(my_cnt[key] + popc(peers));
      }
      warp_sync();
    }
  }
}

// After pass 1 (and a block_sync): per-warp counts -> per-warp exclusive
// bases; tot[e] = pairs of e in the chunk.
template <int E>
__device__ __forceinline__ void warp_bases(ChunkSmem<E>& sm) {
  for (int e = thread_idx(); e < E; e += kSortThreads) {
    int run = 0;
#pragma unroll
    for (int w = 0; w < kSortWarps; ++w) {
      const int c = sm.wcnt[w][e];
      sm.wcnt[w][e] = static_cast<uint16_t>(run);
      run += c;
    }
    sm.tot[e] = run;
  }
}

// Pass 2: places the pairs of [wb, we) and writes their reverse_sorted entries.
// base[e] = first row of the chunk's pairs of e; my_cnt = this warp's bases
// (advanced as the warp goes).  kExpertIds: a row p with p % block_m == 0 also
// writes sorted_expert_ids[p / block_m] (the first row of a block is always real).
template <int E, int K, bool kExpertIds>
__device__ __forceinline__ void warp_place(const AiterAuxSortArgs& a, int wb, int we,
                                           uint16_t* my_cnt, const int* base) {
  const int lane = lane_id();
  const lane_mask_t lt = lanemask_lt(lane);
  for (int j0 = wb; j0 < we; j0 += kBatch * kWarpSize) {
    int keys[kBatch];
    float wts[kBatch];
#pragma unroll
    for (int s = 0; s < kBatch; ++s) {
      const int j = j0 + s * kWarpSize + lane;
      keys[s] = load_key<E>(a.topk_ids, j, we);
      wts[s] = keys[s] < E ? a.topk_weights[j] : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < kBatch; ++s) {
      if (j0 + s * kWarpSize >= we) break;  // warp-uniform
      const int j = j0 + s * kWarpSize + lane;
      const int key = keys[s];
      const lane_mask_t peers = match_key<E>(key);
      const int rank = popc(peers & lt);
      const int before = key < E ? static_cast<int>(my_cnt[key]) : 0;
      warp_sync();  // every lane has read its counter before the leader updates it
      if (key < E && rank == 0) my_cnt[key] = static_cast<uint16_t>(before + popc(peers));
      warp_sync();
      if (j < we) {
        if (key < E) {
          const int p = base[key] + before + rank;
          const int t = j / K;
          const int k = j - t * K;
          a.sorted_token_ids[p] = static_cast<int32_t>(static_cast<uint32_t>(t) |
                                                       (static_cast<uint32_t>(k) << 24));
          a.sorted_weights[p] = wts[s];
          a.m_indices[p] = t;
          a.reverse_sorted[j] = p;
          if (kExpertIds && (p & (a.block_m - 1)) == 0) a.sorted_expert_ids[p / a.block_m] = key;
        } else {
          a.reverse_sorted[j] = -1;
        }
      }
    }
  }
}

// Pad rows and sorted_expert_ids of expert e (segment at row `off`, `cnt` real
// pairs), written by the lanes of one warp.
__device__ __forceinline__ void write_segment_tail(const AiterAuxSortArgs& a, int e, int off,
                                                   int cnt) {
  const int lane = lane_id();
  const int bm = a.block_m;
  const int padded = (cnt + bm - 1) / bm * bm;
  const int m = static_cast<int>(a.num_tokens);
  for (int r = cnt + lane; r < padded; r += kWarpSize) {
    const int p = off + r;
    a.sorted_token_ids[p] = m;
    a.sorted_weights[p] = 0.0f;
    a.m_indices[p] = m;
  }
  const int first_block = off / bm;
  for (int b = lane; b < padded / bm; b += kWarpSize) a.sorted_expert_ids[first_block + b] = e;
}

// ------------------------------------------------------------ small path ----
template <int E, int K>
__device__ __forceinline__ void small_sort_block(const AiterAuxSortArgs& a, ChunkSmem<E>& sm) {
  const int tid = thread_idx();
  const int warp = warp_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int bm = a.block_m;

  zero_counters(&sm.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(0, n, warp, &wb, &we);
  warp_count<E>(a.topk_ids, wb, we, sm.wcnt[warp]);
  block_sync();
  warp_bases<E>(sm);
  block_sync();

  // Segment offsets: exclusive scan of the padded sizes, kPer experts/thread.
  constexpr int kPer = (E + kSortThreads - 1) / kSortThreads;
  int padded[kPer];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    padded[i] = e < E ? (sm.tot[e] + bm - 1) / bm * bm : 0;
    sum += padded[i];
  }
  int total = 0;
  int off = block_exclusive_scan<kSortThreads>(sum, sm.warp_tot, &total);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    if (e < E) sm.base[e] = off;
    off += padded[i];
  }
  if (tid == 0) {
    a.num_valid_ids[0] = total;
    a.num_valid_ids[1] = static_cast<int32_t>(a.num_tokens);
  }
  block_sync();

  for (int e = warp; e < E; e += kSortWarps) write_segment_tail(a, e, sm.base[e], sm.tot[e]);
  warp_place<E, K, false>(a, wb, we, sm.wcnt[warp], sm.base);
}

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
    zero_fill_bf16(a.zero_buf, a.zero_numel, static_cast<int64_t>(b) * kThreads + thread_idx(),
                   static_cast<int64_t>(zero_blocks) * kThreads);
  }
}

// Grid: 1 + quant_blocks + zero_blocks.
template <int E, int K, int D>
__global__ __launch_bounds__(kSortThreads) void sort_small_kernel(AiterAuxSortArgs a,
                                                                  AiterAuxQuantArgs q,
                                                                  int quant_blocks,
                                                                  int zero_blocks, bool x_al16,
                                                                  bool q_al4) {
  __shared__ ChunkSmem<E> sm;
  const int b = block_idx();
  if (b == 0) {
    small_sort_block<E, K>(a, sm);
    return;
  }
  aux_block<D>(b - 1, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
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
constexpr int kLeanThreads = 1024;
constexpr int kLeanWarps = kLeanThreads / kWarpSize;
constexpr int kLeanMaxPairs = 4096;
constexpr int kLeanPer = kLeanMaxPairs / kLeanThreads;
constexpr int kLeanRowsPerBlock = 2048;  // host: G = ceil(capacity / this)
constexpr int kLeanMaxBlocks = 32;
static_assert(kLeanMaxPairs / kWarpSize <= 256, "run step must fit 8 bits");

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
  int lg = 4;
  while ((1 << lg) < bm) ++lg;

  for (int e = tid; e < E; e += kLeanThreads) sm.cnt[e] = 0u;
  int key[kLeanPer];
  float wt[kLeanPer];
#pragma unroll
  for (int i = 0; i < kLeanPer; ++i) {
    const int j = i * kLeanThreads + tid;
    key[i] = load_key<E>(a.topk_ids, j, n);
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
// wc[e][w' < warp] (two 16-byte reads and byte sums) plus its rank in the run.
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

// Sum of the bytes row[0, w) of a kLeanWarps-byte row (16-byte aligned).
__device__ __forceinline__ int byte_prefix(const uint8_t* row, int w) {
  static_assert(kLeanWarps % 16 == 0, "row of whole 16-byte vectors");
  int sum = 0;
#pragma unroll
  for (int v = 0; v < kLeanWarps / 16; ++v) {
    const uint4 x = reinterpret_cast<const uint4*>(row)[v];
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int lo = 16 * v + 4 * i;
      const uint32_t mask = w >= lo + 4 ? 0xFFFFFFFFu : (w <= lo ? 0u : (1u << (8 * (w - lo))) - 1u);
      const uint32_t x4 = xs[i] & mask;
      if constexpr (4 * kWarpSize <= 255) {
        sum += static_cast<int>((x4 * 0x01010101u) >> 24);  // 4 bytes <= 4*32: no carry out
      } else {  // 4 bytes of up to 64 can reach 256: sum byte pairs in 16-bit halves first
        const uint32_t h = (x4 & 0x00FF00FFu) + ((x4 >> 8) & 0x00FF00FFu);
        sum += static_cast<int>((h & 0xFFFFu) + (h >> 16));
      }
    }
  }
  return sum;
}

template <int E, int K>
__device__ __forceinline__ void tiny_sort_block(const AiterAuxSortArgs& a, TinySmem<E>& sm, int g,
                                                int num_g) {
  static_assert(E <= kLeanThreads, "one expert per thread in the scan");
  const int tid = thread_idx();
  const int lane = lane_id();
  const int warp = warp_id();
  const int n = static_cast<int>(a.num_tokens) * K;
  const int bm = a.block_m;
  int lg = 4;
  while ((1 << lg) < bm) ++lg;

  {  // zero wc
    uint4* z = reinterpret_cast<uint4*>(&sm.wc[0][0]);
    constexpr int kVec = E * kLeanWarps / 16;
    for (int i = tid; i < kVec; i += kLeanThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  const int j = tid;
  const int key = load_key<E>(a.topk_ids, j, n);
  const float wt = key < E ? a.topk_weights[j] : 0.0f;
  block_sync();

  const lane_mask_t peers = match_key<E>(key);  // ballots: fixed cost, whatever the keys
  const int rank = popc(peers & lanemask_lt(lane));
  if (key < E && rank == 0) sm.wc[key][warp] = static_cast<uint8_t>(popc(peers));
  block_sync();

  uint32_t c = 0, padded = 0;
  if (tid < E) {
    c = static_cast<uint32_t>(byte_prefix(sm.wc[tid], kLeanWarps));
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
    const int r = sm.off[key] + byte_prefix(sm.wc[key], warp) + rank;
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

template <int E, int K, int D>
__global__ __launch_bounds__(kLeanThreads) void sort_tiny_kernel(AiterAuxSortArgs a,
                                                                 AiterAuxQuantArgs q, int num_g,
                                                                 int quant_blocks,
                                                                 int zero_blocks, bool x_al16,
                                                                 bool q_al4) {
  __shared__ TinySmem<E> sm;
  const int b = block_idx();
  if (b < num_g) {
    tiny_sort_block<E, K>(a, sm, b, num_g);
    return;
  }
  aux_block<D, kLeanThreads>(b - num_g, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// Grid: num_g + quant_blocks + zero_blocks.
template <int E, int K, int D>
__global__ __launch_bounds__(kLeanThreads) void sort_lean_kernel(AiterAuxSortArgs a,
                                                                 AiterAuxQuantArgs q, int num_g,
                                                                 int quant_blocks,
                                                                 int zero_blocks, bool x_al16,
                                                                 bool q_al4) {
  __shared__ LeanSmem<E> sm;
  const int b = block_idx();
  if (b < num_g) {
    lean_sort_block<E, K>(a, sm, b, num_g);
    return;
  }
  aux_block<D, kLeanThreads>(b - num_g, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
}

// ------------------------------------------------------------ large path ----
// Chunk g of the num_chunks chunks is the pairs [chunk_begin(g), chunk_begin(g + 1)):
// N split evenly (q = N / num_chunks, r = N % num_chunks; the first r chunks have q + 1
// pairs).  The host picks num_chunks = N / chunk (chunk >= 2E), so every chunk has at least
// 2E pairs (room for its count row and the E totals) and at most 65535 (uint16 counters).
__device__ __forceinline__ int chunk_begin(int g, int q, int r) { return g * q + (g < r ? g : r); }

// 1. Grid: num_chunks + quant_blocks + zero_blocks.  Block g < num_chunks writes its
// chunk's per-expert counts to reverse_sorted[chunk_begin(g) + e].
template <int E, int K, int D>
__global__ __launch_bounds__(kSortThreads) void sort_count_kernel(AiterAuxSortArgs a,
                                                                  AiterAuxQuantArgs q, int cq,
                                                                  int cr, int num_chunks,
                                                                  int quant_blocks,
                                                                  int zero_blocks, bool x_al16,
                                                                  bool q_al4) {
  __shared__ ChunkSmem<E> sm;
  const int b = block_idx();
  if (b >= num_chunks) {
    aux_block<D>(b - num_chunks, a, q, quant_blocks, zero_blocks, x_al16, q_al4);
    return;
  }
  const int cb = chunk_begin(b, cq, cr);
  const int ce = chunk_begin(b + 1, cq, cr);
  zero_counters(&sm.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(cb, ce, warp_id(), &wb, &we);
  warp_count<E>(a.topk_ids, wb, we, sm.wcnt[warp_id()]);
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
__global__ __launch_bounds__(kScanThreads) void sort_scan_kernel(AiterAuxSortArgs a, int cq,
                                                                 int cr, int num_chunks) {
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

// 3. Grid: num_chunks.  Block g loads pre[g][e] and T_e (reverse_sorted[cb .. cb + 2E))
// into registers (kPlacePer experts per thread, e = tid*kPlacePer + i) before pass 1 and
// uses them after it: a block exclusive scan of round_up(T_e, block_m) gives the segment
// offsets off_e; base[e] = off_e + pre[g][e] is the first row of the chunk's pairs of e;
// block 0 writes num_valid_ids.  After the scan's block_sync nothing reads the home
// again, so the block overwrites its own pair range [cb, ce) of reverse_sorted with the
// reverse entries (no other block touches that range).  Real rows as in the small path;
// a row p with p % block_m == 0 is the first row of its block (pads are fewer than
// block_m and come last in a segment), so its writer also writes
// sorted_expert_ids[p / block_m].  Pad rows [off_e + T_e, off_e + round_up(T_e,
// block_m)) of the experts e % num_chunks == g, one warp per expert, at the end.
template <int E, int K>
__global__ __launch_bounds__(kSortThreads) void sort_place_kernel(AiterAuxSortArgs a, int cq,
                                                                  int cr, int num_chunks) {
  constexpr int kPlacePer = (E + kSortThreads - 1) / kSortThreads;
  __shared__ PlaceSmem<E> sm;
  const int b = block_idx();
  const int tid = thread_idx();
  const int warp = warp_id();
  const int cb = chunk_begin(b, cq, cr);
  const int ce = chunk_begin(b + 1, cq, cr);
  const int bm = a.block_m;

  const int32_t* home = a.reverse_sorted + cb;
  int pre[kPlacePer];
  int tot[kPlacePer];
#pragma unroll
  for (int i = 0; i < kPlacePer; ++i) {
    const int e = tid * kPlacePer + i;
    pre[i] = e < E ? home[e] : 0;
    tot[i] = e < E ? home[E + e] : 0;
  }
  zero_counters(&sm.c.wcnt[0][0], kSortWarps * E);
  block_sync();
  int wb, we;
  warp_range(cb, ce, warp, &wb, &we);
  warp_count<E>(a.topk_ids, wb, we, sm.c.wcnt[warp]);
  block_sync();
  warp_bases<E>(sm.c);

  int padded[kPlacePer];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kPlacePer; ++i) {
    padded[i] = (tot[i] + bm - 1) / bm * bm;
    sum += padded[i];
  }
  int total = 0;
  int off = block_exclusive_scan<kSortThreads>(sum, sm.c.warp_tot, &total);
#pragma unroll
  for (int i = 0; i < kPlacePer; ++i) {
    const int e = tid * kPlacePer + i;
    if (e < E) {
      sm.c.base[e] = off + pre[i];
      if (e % num_chunks == b) sm.pad_end[e / num_chunks] = off + tot[i];
    }
    off += padded[i];
  }
  if (b == 0 && tid == 0) {
    a.num_valid_ids[0] = total;
    a.num_valid_ids[1] = static_cast<int32_t>(a.num_tokens);
  }
  block_sync();
  warp_place<E, K, true>(a, wb, we, sm.c.wcnt[warp], sm.c.base);

  const int m = static_cast<int>(a.num_tokens);
  for (int i = warp; b + i * num_chunks < E; i += kSortWarps) {
    const int end = sm.pad_end[i];
    const int pend = (end + bm - 1) / bm * bm;
    for (int p = end + lane_id(); p < pend; p += kWarpSize) {
      a.sorted_token_ids[p] = m;
      a.sorted_weights[p] = 0.0f;
      a.m_indices[p] = m;
    }
  }
}

// --------------------------------------------------------------- host side ----
template <int E, int K>
inline int check_sort_args(const AiterAuxSortArgs& a, const char* op) {
  if (a.num_experts != E)
    return fail_invalid("%s: num_experts %d does not match the instance (%d)", op, a.num_experts, E);
  if (a.topk != K) return fail_invalid("%s: topk %d does not match the instance (%d)", op, a.topk, K);
  if (!valid_block_m(a.block_m))
    return fail_invalid("%s: block_m %d not in {16, 32, 64, 128}", op, a.block_m);
  if (a.num_tokens < 0 || a.num_tokens >= (int64_t(1) << 24))
    return fail_invalid("%s: num_tokens %lld out of [0, 2^24)", op, (long long)a.num_tokens);
  const int64_t cap = sort_capacity(a.num_tokens, K, E, a.block_m);
  // Rows and pair indices are int32 on the device (with some headroom for
  // index arithmetic past the end of a range).
  if (a.max_rows < cap || a.max_rows % a.block_m != 0 || a.max_rows > INT32_MAX - 65536)
    return fail_invalid("%s: max_rows %lld must be a multiple of block_m, >= %lld and < 2^31 - 2^16",
                        op, (long long)a.max_rows, (long long)cap);
  if (a.sorted_token_ids == nullptr || a.sorted_weights == nullptr || a.m_indices == nullptr ||
      a.sorted_expert_ids == nullptr || a.num_valid_ids == nullptr)
    return fail_invalid("%s: null output pointer", op);
  if (a.num_tokens > 0 &&
      (a.topk_ids == nullptr || a.topk_weights == nullptr || a.reverse_sorted == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  if (a.zero_buf != nullptr && a.zero_numel < 0)
    return fail_invalid("%s: zero_numel %lld < 0", op, (long long)a.zero_numel);
  return AITER_AUX_OK;
}

// D == 0: moe_sort; D > 0: moe_sort_quant (q quantised by the same launches).
template <int E, int K, int D>
inline int launch_sort(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, void* stream,
                       const char* op) {
  static_assert(E >= 1 && E <= 1024, "num_experts must be in [1, 1024]");
  static_assert(K >= 1 && K <= 255, "topk must be in [1, 255]");
  hipStream_t st = static_cast<hipStream_t>(stream);
  const int64_t n = a.num_tokens * K;

  int zero_blocks = 0;
  if (a.zero_buf != nullptr && a.zero_numel > 0) {
    zero_blocks = static_cast<int>(
        clamp_i64(ceil_div_i64(a.zero_numel, int64_t(kSortThreads) * 8 * 2), 1, kZeroBlocksMax));
  }
  int quant_blocks = 0;
  bool x_al16 = false, q_al4 = false;
  if (D > 0 && q.num_tokens > 0) {
    const int64_t units = q.num_tokens * static_cast<int64_t>(D / 8);
    quant_blocks = static_cast<int>(clamp_i64(
        ceil_div_i64(units, kSortThreads * quant_detail::kQuantUnroll), 1, kQuantBlocksMax));
    x_al16 = is_aligned(q.x, 16);
    q_al4 = is_aligned(q.a_q, 4);
  }

  if (n <= kLeanMaxPairs) {
    // quant / zero blocks of kLeanThreads threads
    int qb = 0, zb = 0;
    if (quant_blocks > 0) {
      const int64_t units = q.num_tokens * static_cast<int64_t>(D > 0 ? D / 8 : 1);
      qb = static_cast<int>(clamp_i64(ceil_div_i64(units, kLeanThreads), 1, kQuantBlocksMax));
    }
    if (zero_blocks > 0) {
      zb = static_cast<int>(
          clamp_i64(ceil_div_i64(a.zero_numel, int64_t(kLeanThreads) * 8 * 2), 1, kZeroBlocksMax));
    }
    const int64_t cap = sort_capacity(a.num_tokens, K, E, a.block_m);
    const int ng = static_cast<int>(clamp_i64(ceil_div_i64(cap, kLeanRowsPerBlock), 1, kLeanMaxBlocks));
    if (n <= kLeanThreads) {
      AITER_AUX_LAUNCH((sort_tiny_kernel<E, K, D>), dim3(ng + qb + zb), dim3(kLeanThreads), st)(
          a, q, ng, qb, zb, x_al16, q_al4);
    } else {
      AITER_AUX_LAUNCH((sort_lean_kernel<E, K, D>), dim3(ng + qb + zb), dim3(kLeanThreads), st)(
          a, q, ng, qb, zb, x_al16, q_al4);
    }
    return check_launch(op);
  }

  if (n <= kSmallSortMaxPairs) {
    const int grid = 1 + quant_blocks + zero_blocks;
    AITER_AUX_LAUNCH((sort_small_kernel<E, K, D>), dim3(grid), dim3(kSortThreads), st)(
        a, q, quant_blocks, zero_blocks, x_al16, q_al4);
    return check_launch(op);
  }

  // num_chunks = n / chunk (>= 4 here: chunk <= max(kUnit, n/160 + kUnit) and
  // n > kSmallSortMaxPairs >= 4 kUnit) chunks of q or q + 1 pairs:
  // q >= chunk >= 2E, so a chunk's count row and the E totals fit in its own pair range;
  // q + 1 <= 65535 (n < (num_chunks + 1) chunk, chunk <= 32768) keeps the uint16 counters
  // exact.
  constexpr int64_t kUnit = ((2 * E + kMinChunk - 1) / kMinChunk) * kMinChunk;
  const int64_t chunk = clamp_i64(ceil_div_i64(ceil_div_i64(n, kTargetChunks), kUnit) * kUnit,
                                  kUnit, kMaxChunk);
  const int64_t num_chunks = n / chunk > 1 ? n / chunk : 1;
  const int64_t cq = n / num_chunks;
  const int64_t cr = n % num_chunks;
  if (cq < 2 * E || cq + (cr != 0) > 65535)  // cannot happen
    return fail_invalid("%s: internal: bad large-path chunks (%lld pairs, %lld chunks)", op,
                        (long long)n, (long long)num_chunks);
  const int nc = static_cast<int>(num_chunks);
  const int q32 = static_cast<int>(cq);
  const int r32 = static_cast<int>(cr);

  AITER_AUX_LAUNCH((sort_count_kernel<E, K, D>), dim3(nc + quant_blocks + zero_blocks),
                   dim3(kSortThreads), st)(a, q, q32, r32, nc, quant_blocks, zero_blocks, x_al16,
                                           q_al4);
  int rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  AITER_AUX_LAUNCH((sort_scan_kernel<E>), dim3((E + kScanWarps - 1) / kScanWarps),
                   dim3(kScanThreads), st)(a, q32, r32, nc);
  rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  AITER_AUX_LAUNCH((sort_place_kernel<E, K>), dim3(nc), dim3(kSortThreads), st)(a, q32, r32, nc);
  return check_launch(op);
}

}  // namespace sort_detail

template <int NumExperts, int TopK>
int moe_sort(const AiterAuxSortArgs& a, void* stream) {
  const int rc = sort_detail::check_sort_args<NumExperts, TopK>(a, "moe_sort");
  if (rc != AITER_AUX_OK) return rc;
  AiterAuxQuantArgs none = {};
  return sort_detail::launch_sort<NumExperts, TopK, 0>(a, none, stream, "moe_sort");
}

template <int NumExperts, int TopK, int ModelDim>
int moe_sort_quant(const AiterAuxSortQuantArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 32 == 0, "model_dim must be a positive multiple of 32");
  int rc = sort_detail::check_sort_args<NumExperts, TopK>(a.sort, "moe_sort_quant");
  if (rc != AITER_AUX_OK) return rc;
  rc = quant_detail::check_quant_args<ModelDim>(a.quant, "moe_sort_quant");
  if (rc != AITER_AUX_OK) return rc;
  if (a.quant.num_tokens != a.sort.num_tokens)
    return fail_invalid("moe_sort_quant: x has %lld rows, topk_ids %lld",
                        (long long)a.quant.num_tokens, (long long)a.sort.num_tokens);
  return sort_detail::launch_sort<NumExperts, TopK, ModelDim>(a.sort, a.quant, stream,
                                                              "moe_sort_quant");
}

}  // namespace gpu
}  // namespace aiter_aux
