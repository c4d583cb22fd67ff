// moe_sort ranking helpers shared by the sort paths: key match / load_keys,
// warp ranges, the per-warp counting (pass 1) and placing (pass 2) passes, the
// per-warp bases, the pad-row writer and the tiny path's byte-row sums.  Part
// of sort.h, which includes it after its constants (kSortWarps, kBatch, ...);
// not a standalone header.
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

__host__ __device__ constexpr int bit_width(int x) {
  return x == 0 ? 0 : 1 + bit_width(x >> 1);
}

// log2(block_m) for the valid block_m (16, 32, 64, 128): row -> block is r >> lg.
__device__ __forceinline__ int log2_block_m(int bm) {
  int lg = 4;
  while ((1 << lg) < bm) ++lg;
  return lg;
}

template <int E>
struct ChunkSmem {
  alignas(4) uint16_t wcnt[kSortWarps][E];  // per-warp counts, then bases (warp_count: 4-aligned)
  int base[E];                              // first row of this chunk's pairs of expert e
  int warp_tot[kSortWarps];                 // block-scan scratch
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

// keys[s] = the key of pair j0 + s * stride: its local expert, or E when it is not local (or
// at/past `end`).  With an expert map (expert parallelism) the ids are global and a pair's
// expert is expert_map[id].  SGLang's format (SortFormat<A>::kKeyOffset = 1): the key is
// id + 1 (E counts its buckets).  One warp-uniform branch per batch: without a map the loop is
// the plain one (the N id loads independent, their latencies overlapped); with one, the N
// map loads follow the N id loads.
template <int E, int N, class A>
__device__ __forceinline__ void load_keys(const A& a, int j0, int stride, int end, int* keys) {
  constexpr int kOff = SortFormat<A>::kKeyOffset;
  const int32_t* ids = a.topk_ids;
  if (a.expert_map == nullptr) {
#pragma unroll
    for (int s = 0; s < N; ++s) {
      const int j = j0 + s * stride;
      int id = j < end ? ids[j] : E;
      if constexpr (kOff != 0) id = static_cast<int>(static_cast<uint32_t>(id) + kOff);
      keys[s] = (id >= 0 && id < E) ? id : E;
    }
    return;
  }
  const int32_t* map = a.expert_map;
  const uint64_t num_global = static_cast<uint64_t>(a.num_global_experts);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const int j = j0 + s * stride;
    keys[s] = j < end ? ids[j] : -1;
  }
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const uint32_t g = static_cast<uint32_t>(keys[s]);
    const int e = g < num_global ? map[g] : -1;
    keys[s] = (e >= 0 && e < E) ? e : E;
  }
}

// Chunk g of the num_chunks chunks is the pairs [chunk_begin(g), chunk_begin(g + 1)):
// N split evenly (q = N / num_chunks, r = N % num_chunks; the first r chunks have q + 1
// pairs).  The host keeps every chunk at most 65535 pairs (uint16 counters); the large path's
// chunks also have at least 2E pairs (room for a count row and the E totals).
__device__ __forceinline__ int chunk_begin(int g, int q, int r) {
  return g * q + (g < r ? g : r);
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

// Row r of the sorted outputs holds pair j = t*K + k (weight w) (SortFormat<A>: the peers'
// row is the id j).
template <int K, class A>
__device__ __forceinline__ void write_pair_fields(const A& a, int r, int j, float w) {
  using Fmt = SortFormat<A>;
  if constexpr (Fmt::kNative) {
    const int t = j / K;
    const int k = j - t * K;
    a.sorted_token_ids[r] =
        static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(k) << 24));
    a.sorted_weights[r] = w;
    a.m_indices[r] = t;
  } else {
    a.sorted_token_ids[r] = Fmt::encode(j, K);
    (void)w;
  }
}

// Row r and reverse_sorted[j] = r (the peers' scatter_idx: j).
template <int K, class A>
__device__ __forceinline__ void write_pair_row(const A& a, int r, int j, float w) {
  write_pair_fields<K>(a, r, j, w);
  a.reverse_sorted[j] = SortFormat<A>::reverse(r, j);
}

// Pad row r: (M, 0, M), M = num_tokens (`m`: SortFormat<A>::pad, the peers' pad id only).
template <class A>
__device__ __forceinline__ void write_pad_row(const A& a, int r, int m) {
  a.sorted_token_ids[r] = m;
  if constexpr (SortFormat<A>::kNative) {
    a.sorted_weights[r] = 0.0f;
    a.m_indices[r] = m;
  }
}

// Pass 1: wcnt[row][e] += pairs of expert e in [wb, we), where wcnt is the block's
// kSortWarps x E uint16 counters (4-byte aligned) and row the calling warp's.  A count does
// not depend on the order: one shared atomic per pair on the 32-bit word that holds the
// counter (1 << 16 for the high half: no carry crosses the halves, a counter stays <= 65535;
// the other half may be another row's counter, also added atomically), no match.  The word
// is indexed from the shared array itself, so that the compiler keeps the shared-memory
// atomic.  Warp-uniform loop; the keys of kBatch steps are loaded up front so that their
// latencies overlap.  Ends with a warp_sync.
template <int E, class A>
__device__ __forceinline__ void warp_count(const A& a, int wb, int we, uint16_t* wcnt, int row) {
  uint32_t* words = reinterpret_cast<uint32_t*>(wcnt);
  const int lane = lane_id();
  for (int j0 = wb; j0 < we; j0 += kBatch * kWarpSize) {
    int keys[kBatch];
    load_keys<E, kBatch>(a, j0 + lane, kWarpSize, we, keys);  // E past we
#pragma unroll
    for (int s = 0; s < kBatch; ++s) {
      const int i = row * E + keys[s];
      if (keys[s] < E) atomic_add_shared_u32(words + (i >> 1), 1u << ((i & 1) * 16));
    }
  }
  warp_sync();
}

// After pass 1 (and a block_sync): per-warp counts -> per-warp exclusive
// bases over the first `rows` warps; tot[e] = pairs of e in the chunk (when tot is given).
template <int E>
__device__ __forceinline__ void warp_bases(uint16_t (*wcnt)[E], int* tot, int rows = kSortWarps) {
  for (int e = thread_idx(); e < E; e += kSortThreads) {
    int run = 0;
#pragma unroll
    for (int w = 0; w < kSortWarps; ++w) {
      if (w >= rows) break;
      const int c = wcnt[w][e];
      wcnt[w][e] = static_cast<uint16_t>(run);
      run += c;
    }
    if (tot != nullptr) tot[e] = run;
  }
}

// One step of pass 2 for the lane's key (E: none): returns the warp's count of the key's
// pairs before this step (my_cnt[key], which the lowest lane of the key's group then
// advances by the group's size) and sets *rank, the lane's rank in that group.
template <int E>
__device__ __forceinline__ int warp_rank_step(int key, uint16_t* my_cnt, lane_mask_t lt,
                                              int* rank) {
  const lane_mask_t peers = match_key<E>(key);
  *rank = popc(peers & lt);
  const int before = key < E ? static_cast<int>(my_cnt[key]) : 0;
  warp_sync();  // every lane has read its counter before the leader updates it
  if (key < E && *rank == 0) my_cnt[key] = static_cast<uint16_t>(before + popc(peers));
  warp_sync();
  return before;
}

// A large-path place block's prefixes pre[i] (pairs of expert e = tid * place_per + i in
// the chunks before it) and totals tot[i], from its home (before its pass 1 overwrites it).
template <int E, int kPer>
__device__ __forceinline__ void load_home(const int32_t* home, int* pre, int* tot) {
  const int tid = thread_idx();
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    pre[i] = e < E ? home[e] : 0;
    tot[i] = e < E ? home[E + e] : 0;
  }
}

// Pass 2's walk of the warp range [wb, we): kBatch steps of kWarpSize pairs at a time, their
// keys loaded together, then batch(j0 + lane, keys) (the step's other loads); each step ranks
// its keys (warp_rank_step on my_cnt) and calls pair(s, j, key, offset) for the lane's pair
// j < we, offset = its warp's earlier pairs of key + its rank in the step.
template <int E, class A, class Batch, class Pair>
__device__ __forceinline__ void warp_walk(const A& a, int wb, int we, uint16_t* my_cnt,
                                          Batch&& batch, Pair&& pair) {
  const int lane = lane_id();
  const lane_mask_t lt = lanemask_lt(lane);
  for (int j0 = wb; j0 < we; j0 += kBatch * kWarpSize) {
    int keys[kBatch];
    load_keys<E, kBatch>(a, j0 + lane, kWarpSize, we, keys);
    batch(j0 + lane, keys);
#pragma unroll
    for (int s = 0; s < kBatch; ++s) {
      if (j0 + s * kWarpSize >= we) break;  // warp-uniform
      const int j = j0 + s * kWarpSize + lane;
      int rank;
      const int before = warp_rank_step<E>(keys[s], my_cnt, lt, &rank);
      if (j < we) pair(s, j, keys[s], before + rank);
    }
  }
}

// Pass 2: places the pairs of [wb, we) and writes their reverse_sorted entries.
// base[e] = first row of the chunk's pairs of e; my_cnt = this warp's bases
// (advanced as the warp goes).  kExpertIds: a row p with p % block_m == 0 also
// writes sorted_expert_ids[p / block_m] (the first row of a block is always real).
template <int E, int K, bool kExpertIds, class A>
__device__ __forceinline__ void warp_place(const A& a, int wb, int we, uint16_t* my_cnt,
                                           const int* base) {
  float wts[kBatch];
  warp_walk<E>(
      a, wb, we, my_cnt,
      [&](int j0, const int* keys) {  // the batch's weights, loaded together
#pragma unroll
        for (int s = 0; s < kBatch; ++s) {
          const int j = j0 + s * kWarpSize;
          if constexpr (SortFormat<A>::kNative) {
            wts[s] = keys[s] < E ? a.topk_weights[j] : 0.0f;
          } else {
            (void)j;
            wts[s] = 0.0f;
          }
        }
      },
      [&](int s, int j, int key, int offset) {
        if (key < E) {
          const int p = base[key] + offset;
          write_pair_row<K>(a, p, j, wts[s]);
          if (kExpertIds && SortFormat<A>::first_row(p, a.block_m))
            a.sorted_expert_ids[p / a.block_m] = SortFormat<A>::label(a, key);
        } else {
          a.reverse_sorted[j] = -1;
        }
      });
}

// Experts per thread in the segment-offset scan of a kSortThreads block.
template <int E>
__host__ __device__ constexpr int place_per() {
  return (E + kSortThreads - 1) / kSortThreads;
}

// The segment offsets of a chunk block of the large and mid paths, after its per-warp
// counts (and a block_sync).  pre[i] / tot[i]: pairs of expert e = tid * place_per + i in
// the chunks before this one / in all chunks.  A block exclusive scan of round_up(T_e,
// block_m) gives the segment offsets off_e; base[e] = off_e + pre[e] is the first row of
// the chunk's pairs of e; pad_end[i] = off_e + T_e of the experts e = g + i * num_chunks;
// block 0 writes num_valid_ids.  Ends with a block_sync.  `base` and `pad_end` may alias
// shared memory that the caller read pre / tot from: the scan's barrier comes first.
// Returns the rows of all segments (num_valid_ids[0]).
template <int E, class A>
__device__ __forceinline__ int chunk_offsets(const A& a, int g, int num_chunks, const int* pre,
                                             const int* tot, int* base, int* pad_end,
                                             int* warp_tot) {
  constexpr int kPer = place_per<E>();
  const int tid = thread_idx();
  const int bm = a.block_m;
  int padded[kPer];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    padded[i] = (tot[i] + bm - 1) / bm * bm;
    sum += padded[i];
  }
  int total = 0;
  int off = block_exclusive_scan<kSortThreads>(sum, warp_tot, &total);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    if (e < E) {
      base[e] = off + pre[i];
      if (e % num_chunks == g) pad_end[e / num_chunks] = off + tot[i];
    }
    off += padded[i];
  }
  if (g == 0 && tid == 0) write_num_valid(a, total);
  block_sync();
  return total;
}

// Pad rows [off_e + T_e, off_e + round_up(T_e, block_m)) of the experts e % num_chunks == g
// (pad_end from chunk_offsets), one warp per expert.  (A pad row is never the first row of
// a block: sorted_expert_ids come with the real rows.)
template <int E, int K, class A>
__device__ __forceinline__ void chunk_pads(const A& a, int g, int num_chunks, const int* pad_end) {
  const int bm = a.block_m;
  const int m = SortFormat<A>::pad(a, K);
  for (int i = warp_id(); g + i * num_chunks < E; i += kSortWarps) {
    const int end = pad_end[i];
    const int pend = (end + bm - 1) / bm * bm;
    for (int p = end + lane_id(); p < pend; p += kWarpSize) write_pad_row(a, p, m);
  }
}

// Sum of the bytes row[0, w) of a kTinyWarps-byte row (16-byte aligned).
__device__ __forceinline__ int byte_prefix(const uint8_t* row, int w) {
  static_assert(kTinyWarps % 16 == 0, "row of whole 16-byte vectors");
  int sum = 0;
#pragma unroll
  for (int v = 0; v < kTinyWarps / 16; ++v) {
    const uint4 x = reinterpret_cast<const uint4*>(row)[v];
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int lo = 16 * v + 4 * i;
      const uint32_t mask =
          w >= lo + 4 ? 0xFFFFFFFFu : (w <= lo ? 0u : (1u << (8 * (w - lo))) - 1u);
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

// The total of a kTinyWarps-byte row; when it is 2..255, the row is
// rewritten in place as its exclusive prefix sums (byte w = the sum of bytes
// [0, w)), so that a pair's rank needs one byte read instead of byte_prefix.
// (With a total <= 255 no partial sum carries out of its byte: one multiply by
// 0x01010101 gives a word's inclusive byte prefixes.)
__host__ __device__ constexpr bool row_as_prefix(int total) {
  return total > 1 && total <= 255;
}

__device__ __forceinline__ int byte_total_then_prefix(uint8_t* row) {
  const int total = byte_prefix(row, kTinyWarps);
  if (row_as_prefix(total)) {  // (a lone pair's rank needs no row)
    uint32_t run = 0;
#pragma unroll
    for (int v = 0; v < kTinyWarps / 16; ++v) {
      uint4* p = reinterpret_cast<uint4*>(row) + v;
      const uint4 x = *p;
      uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t incl = xs[i] * 0x01010101u;
        xs[i] = incl - xs[i] + run * 0x01010101u;
        run += incl >> 24;
      }
      *p = make_uint4(xs[0], xs[1], xs[2], xs[3]);
    }
  }
  return total;
}

// Sum of bytes [0, w) of a row that byte_total_then_prefix returned `total` for.
__device__ __forceinline__ int byte_sum_before(const uint8_t* row, int total, int w) {
  if (total <= 1) return 0;                            // a lone pair (or none)
  return total <= 255 ? row[w] : byte_prefix(row, w);  // i.e. row_as_prefix(total)
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
