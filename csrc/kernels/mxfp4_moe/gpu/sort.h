// moe_sort and moe_sort_quant on the GPU; docs/ops.md is the spec.
//
// Ranking (the mid and large paths).  The pairs (t, k) are the flat indices j = t*topk + k.
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
// Paths by n = M*topk (host: launch_sort):
//   micro  n <= kMicroPathPairs (sort_mid.h): one warp ranks everything, no barrier;
//   tiny   n <= kTinyPathPairs, kTinyFullPathPairs with an expert map
//          (sort_tiny.h):
//          G redundant ranking blocks that each write a slice of the rows;
//   mid    n <= kMidPathBase + kMidPathPerExpert * E, or wherever a fused quant is the
//          longer part (sort_mid.h): chunk blocks that each count all pairs and rank
//          their own chunk;
//   large  the rest (below).
// All are one launch except large.  The thresholds are measured (docs/perf.md, section
// "The GPU sort's paths").
// moe_sort_quant with sorted_scales: one launch up to kTinyFullPathPairs
// (sort_tiny_scales.h), else the path's launches and then moe_sort_scales'.
//
// Large path: three launches, no allocation, no inter-block dependency inside a
// launch.  The pairs are split evenly into G = num_chunks chunks of q >= 2E pairs
// (~1.2 per SM, see launch_large); chunk g's "home" is reverse_sorted[cb(g) ..
// cb(g) + 2E), the start of its own pair range (overwritten by the reverse entries
// in the last launch):
//   1. count : block g < G writes its chunk's per-expert counts cnt[g][e] to
//              home(g)[e]; the remaining blocks zero zero_buf;
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
//              round_up(T_e, block_m)) of the experts e % G == g; the remaining
//              blocks quantise x (moe_sort_quant): beside the longest launch, which
//              measured 2-16 % faster than beside the count launch (docs/perf.md, "Gaps").
// A place block reads only its own home and writes reverse_sorted only inside its
// own chunk (after a block_sync that follows its home loads).
#pragma once

#include "common.h"
#include "quant.h"
#include "sort_scales.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

constexpr int kSortWarps = 16;
constexpr int kSortThreads = kSortWarps * kWarpSize;  // 1024 on CDNA, 512 on NVIDIA
constexpr int kMinChunk = 1024;  // pairs per block, large path (times ceil(2E / 1024))
constexpr int kMaxChunk = 32768;                      // chunks of < 2 kMaxChunk pairs
// Large path: ~1.2 chunks per SM for count and place (tuned on the H200: 160 for 132 SMs).
inline int64_t large_target_chunks(int sms) { return int64_t(sms) * 40 / 33; }
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

// Path thresholds in pairs n = M*topk, measured on the H200 (docs/perf.md, section
// "The GPU sort's paths").
constexpr int kMicroPathPairs = 16;  // micro path up to here (one warp ranks all)
constexpr int kTinyThreads = 1024;   // tiny path: one pair per thread ...
constexpr int kTinyWarps = kTinyThreads / kWarpSize;
constexpr int kTinyPathPairs = 512;  // ... up to here (the mid path is faster above, with a
                                     // fused quant too: docs/perf.md, "The GPU sort's paths"), and
constexpr int kTinyFullPathPairs = kTinyThreads;  // up to here with an expert map (each mid
                                                  // block would map every id)
constexpr int kTinyRowsPerBlock = 2048;       // tiny path: G = ceil(capacity / this) ...
constexpr int kTinyMaxBlocks = 32;            // ... blocks at most
// Mid path up to kMidPathBase + kMidPathPerExpert * E pairs (the large path's 3 launches
// cost more with E), large above; with a fused quant also wherever the quant is the longer
// part (model_dim >= kMidFusedDimPerTopk * topk), up to kMidMaxChunkPairs per chunk.
constexpr int64_t kMidPathBase = 40960;
constexpr int64_t kMidPathPerExpert = 48;
constexpr int kMidFusedDimPerTopk = 300;
constexpr int kMidChunkPairs = 16;       // mid chunks: ~this many pairs, up to half the SMs,
constexpr int kMidLargeChunkPairs = 128;  // then ~this many, up to one per SM
constexpr int64_t kMidMaxChunkPairs = 65535;  // uint16 per-warp counters
// Fused MXFP4 quant blocks of the mid path take two tiles per step under a register bound
// (kFusedSortMinOccupancy) from this many elements of x on, one tile without it below
// (measured: docs/perf.md, section "Gaps").
constexpr int64_t kWideQuantElems = int64_t(1) << 24;
#if defined(AITER_AUX_GPU_EMU)
constexpr int kEmuSortChunksMax = 8;  // the self-test's CPU emulation: mid chunks at most
#endif

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux

#include "sort_rank.h"
#include "sort_tiny.h"
#include "sort_tiny_scales.h"
#include "sort_large.h"
#include "sort_mid.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// ------------------------------------------------------- shared-memory bound ----
// Static shared memory of one block is at most 48 KiB on every target (CUDA's static
// limit; AMD's LDS has 64 KiB).  Each sort path's struct grows with E (the large path's
// PlaceSmem is 44 E + 64 bytes with 16 warps); the catalog admits E <= kMaxSortExperts
// (codegen/instances.py MAX_EXPERTS), so the largest E is checked here, in every TU that
// includes this header, and each instance's own E in launch_sort.  add-shape relies on
// this bound instead of computing the sizes in Python.
constexpr int kMaxSortExperts = 1024;
constexpr size_t kStaticSmemBytes = 48 * 1024;

template <int E>
constexpr size_t sort_smem_bytes() {
  constexpr size_t a = sizeof(ChunkSmem<E>), b = sizeof(PlaceSmem<E>);
  constexpr size_t c = sizeof(MidSmem<E>), d = sizeof(TinySmem<E>);
  constexpr size_t ab = a > b ? a : b, cd = c > d ? c : d;
  return ab > cd ? ab : cd;
}
static_assert(sort_smem_bytes<kMaxSortExperts>() <= kStaticSmemBytes,
              "a sort path's shared memory exceeds 48 KiB at the catalog's largest expert count");

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
  if (a.expert_map == nullptr ? a.num_global_experts != 0 : a.num_global_experts < 0)
    return fail_invalid("%s: expert_map / num_global_experts %lld disagree", op,
                        (long long)a.num_global_experts);
  return AITER_AUX_OK;
}

// The quant / zero blocks that ride in a sort launch (aux_block), for blocks of `threads`
// threads that each take `units_per_thread` 8-element units of x.
struct AuxGrid {
  int quant_blocks = 0;
  int zero_blocks = 0;
  bool x_al16 = false;
  bool q_al4 = false;
};

template <int D>
inline AuxGrid aux_grid(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, int threads,
                        int units_per_thread) {
  // D: model_dim of the fused quant (0: none), tagged with kFp8Dim for MXFP8
  constexpr int kDim = D & (quant_detail::kFp8Dim - 1);
  AuxGrid g;
  if (a.zero_buf != nullptr && a.zero_numel > 0) {
    g.zero_blocks = static_cast<int>(
        clamp_i64(ceil_div_i64(a.zero_numel, int64_t(threads) * 8 * 2), 1, kZeroBlocksMax));
  }
  if (D > 0 && q.num_tokens > 0) {
    const int64_t units = q.num_tokens * static_cast<int64_t>(kDim / 8);
    g.quant_blocks = static_cast<int>(clamp_i64(
        ceil_div_i64(units, int64_t(threads) * units_per_thread), 1, kQuantBlocksMax));
    g.x_al16 = is_aligned(q.x, 16);
    g.q_al4 = is_aligned(q.a_q, 4);
  }
  return g;
}

// One launch per path; each returns check_launch's status.
template <int E, int K, int D>
inline int launch_micro(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, hipStream_t st,
                        const char* op) {
  const AuxGrid x = aux_grid<D>(a, q, kMicroThreads, 1);
  AITER_AUX_LAUNCH((sort_micro_kernel<E, K, D>), dim3(1 + x.quant_blocks + x.zero_blocks),
                   dim3(kMicroThreads), st)(a, q, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// n <= kTinyThreads pairs.
template <int E, int K, int D>
inline int launch_tiny(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, hipStream_t st,
                       const char* op) {
  const AuxGrid x = aux_grid<D>(a, q, kTinyThreads, 1);
  const int64_t cap = sort_capacity(a.num_tokens, K, E, a.block_m);
  const int ng =
      static_cast<int>(clamp_i64(ceil_div_i64(cap, kTinyRowsPerBlock), 1, kTinyMaxBlocks));
  AITER_AUX_LAUNCH((sort_tiny_kernel<E, K, D>), dim3(ng + x.quant_blocks + x.zero_blocks),
                   dim3(kTinyThreads), st)(a, q, ng, x.quant_blocks, x.zero_blocks, x.x_al16,
                                           x.q_al4);
  return check_launch(op);
}

// n pairs in num_chunks (>= 1) chunks of at most 65535 pairs each (uint16 counters).
template <int E, int K, int D>
inline int launch_mid(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, hipStream_t st,
                      int num_chunks, const char* op) {
  const AuxGrid x = aux_grid<D>(a, q, kSortThreads, quant_detail::kQuantUnroll);
  const int64_t n = a.num_tokens * K;
  const int cq = static_cast<int>(n / num_chunks);
  const int cr = static_cast<int>(n % num_chunks);
  const dim3 grid(num_chunks + x.quant_blocks + x.zero_blocks);
  if constexpr (D > 0 && (D & quant_detail::kFp8Dim) == 0) {
    if (q.num_tokens * int64_t(D) >= kWideQuantElems) {
      AITER_AUX_LAUNCH((sort_mid_kernel<E, K, D, true>), grid, dim3(kSortThreads), st)(
          a, q, cq, cr, num_chunks, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
      return check_launch(op);
    }
  }
  AITER_AUX_LAUNCH((sort_mid_kernel<E, K, D, false>), grid, dim3(kSortThreads), st)(
      a, q, cq, cr, num_chunks, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// The large path's chunk granule: >= 2E pairs (a chunk's count row and the E totals).
template <int E>
constexpr int64_t large_unit() {
  return ((2 * E + kMinChunk - 1) / kMinChunk) * kMinChunk;
}

// Chunks of the mid path for n pairs: ~kMidChunkPairs each up to half the SMs (`sms`), then
// ~kMidLargeChunkPairs each up to one per SM (half of them beside a fused quant of n <=
// kMidPathBase pairs, which leaves the quant blocks more room); more only where a chunk
// would exceed kMidMaxChunkPairs.  Each block counts all n pairs, so past a few dozen
// blocks more of them cost more than their smaller chunks save (docs/perf.md, section
// "The GPU sort's paths").
inline int mid_chunks(int64_t n, int sms, bool fused) {
  const int64_t half = (sms + 1) / 2;
  const int64_t cap = fused && n <= kMidPathBase ? half : sms;
  const int64_t fine = ceil_div_i64(n, kMidChunkPairs);
  const int64_t small = fine < half ? fine : half;
  const int64_t large = ceil_div_i64(n, kMidLargeChunkPairs);
  const int64_t g = clamp_i64(small > large ? small : large, 1, cap > 1 ? cap : 1);
  const int64_t least = ceil_div_i64(n, kMidMaxChunkPairs);
  return static_cast<int>(g > least ? g : least);
}

// Whether the mid path takes n pairs (else the large path, which needs n >= large_unit).
template <int E, int K, int D>
inline bool use_mid_path(int64_t n, int sms) {
  constexpr int kDim = D & (quant_detail::kFp8Dim - 1);
  if (n < large_unit<E>() || n <= kMidPathBase + kMidPathPerExpert * E) return true;
  return kDim >= kMidFusedDimPerTopk * K && ceil_div_i64(n, sms) <= kMidMaxChunkPairs;
}

template <int E, int K, int D>
inline int launch_large(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, hipStream_t st,
                        int sms, const char* op) {
  constexpr int64_t kUnit = large_unit<E>();
  // zero_buf's blocks beside the count launch, the quant blocks beside the place launch
  const AuxGrid x = aux_grid<D>(a, q, kSortThreads, quant_detail::kQuantUnroll);
  const int64_t n = a.num_tokens * K;
  // num_chunks = max(1, n / chunk) chunks of q or q + 1 pairs (n >= kUnit here):
  // q >= min(chunk, n) >= kUnit >= 2E, so a chunk's count row and the E totals fit in its
  // own pair range; q + 1 <= 65535 (n < (num_chunks + 1) chunk, chunk <= 32768) keeps the
  // uint16 counters exact.
  const int64_t target = large_target_chunks(sms);
  const int64_t chunk =
      clamp_i64(ceil_div_i64(ceil_div_i64(n, target), kUnit) * kUnit, kUnit, kMaxChunk);
  const int64_t num_chunks = n / chunk > 1 ? n / chunk : 1;
  const int64_t cq = n / num_chunks;
  const int64_t cr = n % num_chunks;
  if (n < kUnit || cq < 2 * E || cq + (cr != 0) > 65535)  // the host never asks for this
    return fail_invalid("%s: internal: bad large-path chunks (%lld pairs, %lld chunks)", op,
                        (long long)n, (long long)num_chunks);
  const int nc = static_cast<int>(num_chunks);
  const int q32 = static_cast<int>(cq);
  const int r32 = static_cast<int>(cr);

  AITER_AUX_LAUNCH((sort_count_kernel<E, K>), dim3(nc + x.zero_blocks), dim3(kSortThreads),
                   st)(a, q32, r32, nc, x.zero_blocks);
  int rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  AITER_AUX_LAUNCH((sort_scan_kernel<E>), dim3((E + kScanWarps - 1) / kScanWarps),
                   dim3(kScanThreads), st)(a, q32, r32, nc);
  rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  AITER_AUX_LAUNCH((sort_place_kernel<E, K, D>), dim3(nc + x.quant_blocks), dim3(kSortThreads),
                   st)(a, q, q32, r32, nc, x.quant_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// D == 0: moe_sort; D > 0: moe_sort_quant (q quantised by the same launches).
template <int E, int K, int D>
inline int launch_sort(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, void* stream,
                       const char* op) {
  static_assert(E >= 1 && E <= 1024, "num_experts must be in [1, 1024]");
  static_assert(K >= 1 && K <= 255, "topk must be in [1, 255]");
  static_assert(sort_smem_bytes<E>() <= kStaticSmemBytes, "sort shared memory exceeds 48 KiB");
  hipStream_t st = static_cast<hipStream_t>(stream);
  const int64_t n = a.num_tokens * K;
  static_assert(kMicroPathPairs <= kWarpSize && kTinyPathPairs <= kTinyFullPathPairs &&
                    kTinyFullPathPairs <= kTinyThreads,
                "path limits");
  if (n <= kMicroPathPairs) return launch_micro<E, K, D>(a, q, st, op);
  const int tiny_max = a.expert_map != nullptr ? kTinyFullPathPairs : kTinyPathPairs;
  if (n <= tiny_max) return launch_tiny<E, K, D>(a, q, st, op);
  const int sms = device_sm_count();
#if defined(AITER_AUX_GPU_EMU)
  const int mid_sms = sms < kEmuSortChunksMax ? sms : kEmuSortChunksMax;
#else
  const int mid_sms = sms;
#endif
  if (use_mid_path<E, K, D>(n, mid_sms))
    return launch_mid<E, K, D>(a, q, st, mid_chunks(n, mid_sms, D > 0), op);
  return launch_large<E, K, D>(a, q, st, sms, op);
}

}  // namespace sort_detail

template <int NumExperts, int TopK>
int moe_sort(const AiterAuxSortArgs& a, void* stream) {
  const int rc = sort_detail::check_sort_args<NumExperts, TopK>(a, "moe_sort");
  if (rc != AITER_AUX_OK) return rc;
  AiterAuxQuantArgs none = {};
  return sort_detail::launch_sort<NumExperts, TopK, 0>(a, none, stream, "moe_sort");
}

namespace sort_detail {

// moe_sort_quant[_fp8] after the argument checks; D tagged with kFp8Dim for MXFP8.  With
// sorted_scales: one launch at decode (sort_tiny_scales.h), else the sort's launches and
// then moe_sort_scales'.
template <int E, int K, int D>
inline int launch_sort_quant(const AiterAuxSortQuantArgs& a, void* stream, const char* op) {
  constexpr int kDim = D & (quant_detail::kFp8Dim - 1);
  int rc = check_sort_args<E, K>(a.sort, op);
  if (rc != AITER_AUX_OK) return rc;
  rc = quant_detail::check_quant_args<kDim>(a.quant, op);
  if (rc != AITER_AUX_OK) return rc;
  if (a.quant.num_tokens != a.sort.num_tokens)
    return fail_invalid("%s: x has %lld rows, topk_ids %lld", op, (long long)a.quant.num_tokens,
                        (long long)a.sort.num_tokens);
  if (a.sorted_scales == nullptr) return launch_sort<E, K, D>(a.sort, a.quant, stream, op);
  if constexpr (kDim % 256 != 0) {
    return fail_invalid("%s: sorted_scales needs model_dim %% 256 == 0 (the instance has %d)", op,
                        kDim);
  } else {
    // one launch where its shared memory fits (every E of the catalog with topk >= 2)
    if constexpr (sizeof(TinyScalesSmem<E, K>) <= kStaticSmemBytes) {
      ScalesPlan sp;
      int ng = 0;
      // the quant blocks take kQuantUnroll units per lane: fewer blocks, one wave
      const AuxGrid x = aux_grid<D>(a.sort, a.quant, kTinyThreads, quant_detail::kQuantUnroll);
      if (plan_tiny_scales<E, K, D>(a.sort, a.sorted_scales, x.quant_blocks + x.zero_blocks,
                                    device_sm_count(), &sp, &ng)) {
        AITER_AUX_LAUNCH((sort_tiny_scales_kernel<E, K, D>),
                         dim3(ng + kDim / 256 * sp.parts + sp.z_blocks + x.quant_blocks + x.zero_blocks),
                         dim3(kTinyThreads), static_cast<hipStream_t>(stream))(
            a.sort, a.quant, sp, ng, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
        return check_launch(op);
      }
    }
    rc = launch_sort<E, K, D>(a.sort, a.quant, stream, op);
    if (rc != AITER_AUX_OK) return rc;
    return moe_sort_scales<kDim>(aiter_aux_sort_scales_args(&a), stream);
  }
}

}  // namespace sort_detail

template <int NumExperts, int TopK, int ModelDim>
int moe_sort_quant(const AiterAuxSortQuantArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 32 == 0, "model_dim must be a positive multiple of 32");
  return sort_detail::launch_sort_quant<NumExperts, TopK, ModelDim>(a, stream, "moe_sort_quant");
}

// The same with MXFP8 quant blocks (quant_fp8.h), in the same single launch.
template <int NumExperts, int TopK, int ModelDim>
int moe_sort_quant_fp8(const AiterAuxSortQuantArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 32 == 0 && ModelDim < quant_detail::kFp8Dim,
                "model_dim must be a positive multiple of 32 below 2^24");
  return sort_detail::launch_sort_quant<NumExperts, TopK, ModelDim | quant_detail::kFp8Dim>(
      a, stream, "moe_sort_quant_fp8");
}

}  // namespace gpu
}  // namespace aiter_aux
