// moe_sort and moe_sort_quant on the GPU; docs/ops.md is the spec.
//
// Ranking (the mid and large paths).  The pairs (t, k) are the flat indices j = t*topk + k.
// A chunk of pairs is split into kSortWarps contiguous warp ranges; a warp walks
// its range kWarpSize pairs at a time in ascending j.  The key of a pair is its
// expert, or the sentinel E for a pair that is not local / past the end.  Pass 1
// (warp_count, sort_rank.h) counts, per warp, the pairs of each expert: uint16
// counters in shared memory, one row per warp, one shared atomic add per local pair
// on the 32-bit word that holds its counter (a count does not depend on the order).
// An exclusive scan over the warps turns the counts into per-warp bases.  Pass 2
// (warp_place) walks the same pairs again: lanes holding the same key find each
// other with a ballot per key bit ("match"), the lowest lane of a group is its
// leader, and the rank of a pair among its expert's pairs of the chunk is
// base[warp][e] + (pairs of e in the earlier steps of this warp) + (lower lanes of
// its group) -- ascending j, with no atomics, hence deterministic.
//
// Paths by n = M*topk (the choice: choose_sort_path and the SortPolicy of sort_policy.h):
//   pairs  (sort_pairs.h): n <= 64: one warp ranks the pairs by ballots, no O(E) work;
//   micro  (sort_mid.h): one warp ranks everything, no barrier;
//   tiny   (sort_tiny.h): G redundant ranking blocks that each write a slice of the rows;
//   mid    (sort_mid.h): chunk blocks that each count all pairs and rank their own chunk;
//   large  the rest (below).
// All are one launch except large.  moe_sort_quant with sorted_scales: one launch of the pair
// or tiny path with scale blocks (sort_tiny_scales.h) where the chooser says so, else the
// path's launches and then moe_sort_scales'.
//
// Large path: three launches, no allocation, no inter-block dependency inside a
// launch.  The pairs are split evenly into G = num_chunks chunks of q >= 2E pairs
// (one per SM, see large_chunks); chunk g's "home" is reverse_sorted[cb(g) ..
// cb(g) + 2E), the start of its own pair range (overwritten by the reverse entries
// in the last launch):
//   1. count : block g < G writes its chunk's per-expert counts cnt[g][e] to
//              home(g)[e]; the remaining blocks zero zero_buf (or copy zero_init);
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
//              measured 2-16 % faster than beside the count launch.  Where a chunk fits
//              its stage (staged_slots), the staged place kernel
//              (SortChoice::staged_place) ranks the same way but stages each pair's slot
//              in the chunk's row order in shared memory first, then writes the rows
//              slot by slot, so that a warp's stores cover runs of consecutive rows
//              (sort_large.h); else the direct kernel writes each pair's row fields.
// A place block reads only its own home and writes reverse_sorted only inside its
// own chunk (after a block_sync that follows its home loads).
#pragma once

#include "../sort_checks.h"
#include "common.h"
#include "quant.h"
#include "sort_scales.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// Kernel shapes (compile time; the tuning values are the SortPolicy's, sort_policy.h).
constexpr int kSortWarps = 16;
constexpr int kSortThreads = kSortWarps * kWarpSize;  // 1024 on CDNA, 512 on NVIDIA
constexpr int kMaxChunk = 32768;   // large path: chunks of < 2 kMaxChunk pairs (uint16 counters)
constexpr int kScanThreads = 256;  // large-path scan: one warp per expert
constexpr int kScanWarps = kScanThreads / kWarpSize;
constexpr int kBatch = 8;           // warp steps whose topk_ids are loaded together
constexpr int kTinyThreads = 1024;  // tiny path: one pair per thread
constexpr int kPairMax = 64;        // pair path: pairs at most (its tables' size)
constexpr int kPairThreads = 256;   // pair path: threads of a block, which writes
constexpr int kPairRowIters = 4;    // this many rows per thread:
constexpr int kPairRowsPerBlock = kPairThreads * kPairRowIters;
constexpr int kTinyWarps = kTinyThreads / kWarpSize;
constexpr int64_t kMidMaxChunkPairs = 65535;  // mid path: uint16 per-warp counters
// The catalog admits E <= kMaxSortExperts (codegen/limits.py NUM_EXPERTS).
constexpr int kMaxSortExperts = AITER_AUX_MAX_NUM_EXPERTS;
// Static shared memory of one block is at most 48 KiB on every target (below).
constexpr size_t kStaticSmemBytes = 48 * 1024;
// Slots of the large path's staged place (sort_large.h StagedPlaceSmem): what the 48 KiB
// leave beside its per-warp uint16 counters, its int per expert and the block-scan scratch.
__host__ __device__ constexpr int staged_slots(int e) {
  return static_cast<int>(
             (kStaticSmemBytes - (2 * kSortWarps + 4) * static_cast<size_t>(e) - 4 * kSortWarps) /
             2) &
         ~1;
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux

#include "sort_policy.h"
#include "sort_format.h"
#include "sort_rank.h"
#include "sort_tiny.h"
#include "sort_pairs.h"
#include "sort_tiny_scales.h"
#include "sort_large.h"
#include "sort_mid.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// ------------------------------------------------------- shared-memory bound ----
// Static shared memory of one block is at most 48 KiB on every target (CUDA's static
// limit; AMD's LDS has 64 KiB).  Each sort path's struct grows with E (the large path's
// PlaceSmem is 40 E + 64 bytes with 16 warps; StagedPlaceSmem fills the 48 KiB by design);
// the catalog admits E <= kMaxSortExperts (codegen/limits.py NUM_EXPERTS), so the largest E
// is checked here, in every TU that includes this header, and each instance's own E in
// launch_sort.  add-shape relies on
// this bound instead of computing the sizes in Python.

template <int E>
constexpr size_t sort_smem_bytes() {
  constexpr size_t a = sizeof(ChunkSmem<E>) > sizeof(StagedPlaceSmem<E>)
                           ? sizeof(ChunkSmem<E>)
                           : sizeof(StagedPlaceSmem<E>);
  constexpr size_t b = sizeof(PlaceSmem<E>);
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
    return fail_invalid("%s: num_experts %d does not match the instance (%d)", op, a.num_experts,
                        E);
  if (a.topk != K)
    return fail_invalid("%s: topk %d does not match the instance (%d)", op, a.topk, K);
  const int rc = check_sort_rows(a.block_m, a.num_tokens, a.max_rows, op, fail_invalid);
  if (rc != AITER_AUX_OK) return rc;
  const int64_t cap = sort_capacity(a.num_tokens, K, E, a.block_m);
  // Rows and pair indices are int32 on the device (with some headroom for
  // index arithmetic past the end of a range).
  if (a.max_rows < cap || a.max_rows % a.block_m != 0 || a.max_rows > INT32_MAX - 65536)
    return fail_invalid(
        "%s: max_rows %lld must be a multiple of block_m, >= %lld and < 2^31 - 2^16", op,
        (long long)a.max_rows, (long long)cap);
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

// The chooser's input for a call of the instance <E, K, F, D>; fused_scales: sorted_scales
// asked for and 16-byte aligned.
template <int E, int K, QuantFormat F, int D>
inline SortProblem sort_problem(const AiterAuxSortArgs& a, bool fused_scales) {
  // the tiny one-launch kernel's shared memory fits every E of the catalog with topk >= 2
  constexpr bool kTinyFits = sizeof(TinyScalesSmem<E, K>) <= kStaticSmemBytes;
  return {a.num_tokens, K, E, a.block_m, a.expert_map != nullptr, F, D, fused_scales, kTinyFits};
}

// One launch per path; each returns check_launch's status.
// num_g (>= 1) sort blocks of `kernel` (sort_pairs_kernel, sort_tiny_kernel: the same
// parameters), `threads` threads each, then its quant and zero blocks.
template <QuantFormat F, int D, class A, class Kernel>
inline int launch_grouped(Kernel kernel, int threads, const A& a, const AiterAuxQuantArgs& q,
                          hipStream_t st, int num_g, const char* op) {
  const AuxGrid x = aux_grid<F, D>(host_sort_policy(), a, q, threads, 1);
  AITER_AUX_LAUNCH(kernel, dim3(num_g + x.quant_blocks + x.zero_blocks), dim3(threads), st)(
      a, q, num_g, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// n <= kPairMax pairs in num_g (>= 1) pair blocks (pair_blocks).
// A: the args type, which picks the output format (sort_format.h).  A peer's block size
// outside moe_sort's takes the kernel of divisions (AnyBlocks; pair_rows_fit holds).
template <int E, int K, QuantFormat F, int D, class A>
inline int launch_pairs(const A& a, const AiterAuxQuantArgs& q, hipStream_t st, int num_g,
                        const char* op) {
  if constexpr (!SortFormat<A>::kNative) {
    if (!valid_block_m(a.block_m))
      return launch_grouped<F, D>(sort_pairs_kernel<E, K, F, D, A, AnyBlocks>, kPairThreads, a, q,
                                  st, num_g, op);
  }
  return launch_grouped<F, D>(sort_pairs_kernel<E, K, F, D, A>, kPairThreads, a, q, st, num_g, op);
}

template <int E, int K, QuantFormat F, int D, class A>
inline int launch_micro(const A& a, const AiterAuxQuantArgs& q, hipStream_t st, const char* op) {
  const AuxGrid x = aux_grid<F, D>(host_sort_policy(), a, q, kMicroThreads, 1);
  AITER_AUX_LAUNCH((sort_micro_kernel<E, K, F, D, A>), dim3(1 + x.quant_blocks + x.zero_blocks),
                   dim3(kMicroThreads), st)(a, q, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// n <= kTinyThreads pairs in num_g (>= 1) sort blocks.
template <int E, int K, QuantFormat F, int D, class A>
inline int launch_tiny(const A& a, const AiterAuxQuantArgs& q, hipStream_t st, int num_g,
                       const char* op) {
  return launch_grouped<F, D>(sort_tiny_kernel<E, K, F, D, A>, kTinyThreads, a, q, st, num_g, op);
}

// n pairs in num_chunks (>= 1) chunks of at most 65535 pairs each (uint16 counters); wide:
// the MXFP4 quant blocks take two tiles a step (SortChoice::wide_quant).
template <int E, int K, QuantFormat F, int D, class A>
inline int launch_mid(const A& a, const AiterAuxQuantArgs& q, hipStream_t st, int num_chunks,
                      bool wide, const char* op) {
  const AuxGrid x =
      aux_grid<F, D>(host_sort_policy(), a, q, kSortThreads, quant_detail::kQuantUnroll);
  const int64_t n = a.num_tokens * K;
  const int cq = static_cast<int>(n / num_chunks);
  const int cr = static_cast<int>(n % num_chunks);
  const dim3 grid(num_chunks + x.quant_blocks + x.zero_blocks);
  if constexpr (F == QuantFormat::Mxfp4) {
    if (wide) {
      AITER_AUX_LAUNCH((sort_mid_kernel<E, K, F, D, true, A>), grid, dim3(kSortThreads), st)(
          a, q, cq, cr, num_chunks, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
      return check_launch(op);
    }
  }
  AITER_AUX_LAUNCH((sort_mid_kernel<E, K, F, D, false, A>), grid, dim3(kSortThreads), st)(
      a, q, cq, cr, num_chunks, x.quant_blocks, x.zero_blocks, x.x_al16, x.q_al4);
  return check_launch(op);
}

// n pairs in num_chunks chunks (large_chunks): every chunk needs >= 2E pairs and at most 65535.
// staged: the staged place kernel (SortChoice::staged_place; large_stage_fits holds).
template <int E, int K, QuantFormat F, int D, class A>
inline int launch_large(const A& a, const AiterAuxQuantArgs& q, hipStream_t st, int num_chunks,
                        bool staged, const char* op) {
  // zero_buf's blocks beside the count launch, the quant blocks beside the place launch
  const AuxGrid x =
      aux_grid<F, D>(host_sort_policy(), a, q, kSortThreads, quant_detail::kQuantUnroll);
  const int64_t n = a.num_tokens * K;
  // large_chunks gives num_chunks in [ceil(n / kMaxChunk), n / 2E] (n >= 2E) chunks of q or
  // q + 1 pairs: q >= 2E, so a chunk's count row and the E totals fit in its own pair range;
  // q + 1 <= kMaxChunk < 65536 keeps the uint16 counters exact.
  const int64_t cq = num_chunks > 0 ? n / num_chunks : 0;
  const int64_t cr = num_chunks > 0 ? n % num_chunks : 0;
  if (num_chunks < 1 || cq < 2 * E || cq + (cr != 0) > 65535 ||
      (staged && cq + (cr != 0) > staged_slots(E)))  // the host never asks for this
    return fail_invalid("%s: internal: bad large-path chunks (%lld pairs, %d chunks)", op,
                        (long long)n, num_chunks);
  const int nc = num_chunks;
  const int q32 = static_cast<int>(cq);
  const int r32 = static_cast<int>(cr);

  AITER_AUX_LAUNCH((sort_count_kernel<E, K, A>), dim3(nc + x.zero_blocks), dim3(kSortThreads), st)(
      a, q32, r32, nc, x.zero_blocks);
  int rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  // The scan and place launches follow without PDL: with it the large path measured up to
  // 1.4x slower at E = 896 (M = 16384-65536 on the H200), and its launch latency is hidden
  // by tens of microseconds of work anyway.
  AITER_AUX_LAUNCH_SERIAL((sort_scan_kernel<E>), dim3((E + kScanWarps - 1) / kScanWarps),
                          dim3(kScanThreads),
                          st)(static_cast<const AiterAuxSortArgs&>(a), q32, r32, nc);
  rc = check_launch(op);
  if (rc != AITER_AUX_OK) return rc;
  if (staged) {
    AITER_AUX_LAUNCH_SERIAL((sort_place_kernel<E, K, F, D, A, true>), dim3(nc + x.quant_blocks),
                            dim3(kSortThreads),
                            st)(a, q, q32, r32, nc, x.quant_blocks, x.x_al16, x.q_al4);
  } else {
    AITER_AUX_LAUNCH_SERIAL((sort_place_kernel<E, K, F, D, A>), dim3(nc + x.quant_blocks),
                            dim3(kSortThreads),
                            st)(a, q, q32, r32, nc, x.quant_blocks, x.x_al16, x.q_al4);
  }
  return check_launch(op);
}

// The launches of a choice without fused scales.
template <int E, int K, QuantFormat F, int D, class A>
inline int launch_choice(const SortChoice& c, const A& a, const AiterAuxQuantArgs& q,
                         hipStream_t st, const char* op) {
  switch (c.path) {
    case SortPath::Pairs:
      return launch_pairs<E, K, F, D>(a, q, st, c.blocks, op);
    case SortPath::Micro:
      return launch_micro<E, K, F, D>(a, q, st, op);
    case SortPath::Tiny:
      return launch_tiny<E, K, F, D>(a, q, st, c.blocks, op);
    case SortPath::Mid:
      return launch_mid<E, K, F, D>(a, q, st, c.blocks, c.wide_quant, op);
    case SortPath::Large:
      return launch_large<E, K, F, D>(a, q, st, c.blocks, c.staged_place, op);
  }
  return fail_invalid("%s: internal: unknown sort path", op);
}

// moe_sort (F None) and moe_sort_quant[_fp8] without sorted_scales: q quantised by the same
// launches.
template <int E, int K, QuantFormat F, int D>
inline int launch_sort(const AiterAuxSortArgs& a, const AiterAuxQuantArgs& q, void* stream,
                       const char* op) {
  static_assert(E >= 1 && E <= kMaxSortExperts,
                "num_experts out of [1, AITER_AUX_MAX_NUM_EXPERTS]");
  static_assert(K >= 1 && K <= AITER_AUX_MAX_TOPK, "topk out of [1, AITER_AUX_MAX_TOPK]");
  static_assert(sort_smem_bytes<E>() <= kStaticSmemBytes, "sort shared memory exceeds 48 KiB");
  const SortChoice c =
      choose_sort_path(host_sort_policy(), sort_problem<E, K, F, D>(a, false), device_sm_count);
  return launch_choice<E, K, F, D>(c, a, q, static_cast<hipStream_t>(stream), op);
}

}  // namespace sort_detail

template <int NumExperts, int TopK>
int moe_sort(const AiterAuxSortArgs& a, void* stream) {
  const int rc = sort_detail::check_sort_args<NumExperts, TopK>(a, "moe_sort");
  if (rc != AITER_AUX_OK) return rc;
  AiterAuxQuantArgs none = {};
  return sort_detail::launch_sort<NumExperts, TopK, QuantFormat::None, 0>(a, none, stream,
                                                                          "moe_sort");
}

namespace sort_detail {

// moe_sort_quant[_fp8] after the argument checks.  With sorted_scales: one launch where the
// chooser says so (sort_tiny_scales.h), else the sort's launches and then moe_sort_scales'.
template <int E, int K, QuantFormat F, int D>
inline int launch_sort_quant(const AiterAuxSortQuantArgs& a, void* stream, const char* op) {
  int rc = check_sort_args<E, K>(a.sort, op);
  if (rc != AITER_AUX_OK) return rc;
  rc = quant_detail::check_quant_args<D>(a.quant, op);
  if (rc != AITER_AUX_OK) return rc;
  if (a.quant.num_tokens != a.sort.num_tokens)
    return fail_invalid("%s: x has %lld rows, topk_ids %lld", op, (long long)a.quant.num_tokens,
                        (long long)a.sort.num_tokens);
  if (a.sorted_scales == nullptr) return launch_sort<E, K, F, D>(a.sort, a.quant, stream, op);
  if constexpr (D % 256 != 0) {
    return fail_invalid("%s: sorted_scales needs model_dim %% 256 == 0 (the instance has %d)", op,
                        D);
  } else {
    const SortPolicy p = host_sort_policy();
    const SortChoice c = choose_sort_path(
        p, sort_problem<E, K, F, D>(a.sort, is_aligned(a.sorted_scales, 16)), device_sm_count);
    hipStream_t st = static_cast<hipStream_t>(stream);
    if (c.fused_scales) return launch_fused_scales<E, K, F, D>(p, c, a, st, op);
    rc = launch_choice<E, K, F, D>(c, a.sort, a.quant, st, op);
    if (rc != AITER_AUX_OK) return rc;
    return moe_sort_scales<D>(aiter_aux_sort_scales_args(&a), stream);
  }
}

}  // namespace sort_detail

template <int NumExperts, int TopK, int ModelDim>
int moe_sort_quant(const AiterAuxSortQuantArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 32 == 0, "model_dim must be a positive multiple of 32");
  return sort_detail::launch_sort_quant<NumExperts, TopK, QuantFormat::Mxfp4, ModelDim>(
      a, stream, "moe_sort_quant");
}

// The same with MXFP8 quant blocks (quant_fp8.h), in the same single launch.
template <int NumExperts, int TopK, int ModelDim>
int moe_sort_quant_fp8(const AiterAuxSortQuantArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 32 == 0, "model_dim must be a positive multiple of 32");
  return sort_detail::launch_sort_quant<NumExperts, TopK, QuantFormat::Mxfp8, ModelDim>(
      a, stream, "moe_sort_quant_fp8");
}

}  // namespace gpu
}  // namespace aiter_aux
