// The sort's dispatch, as policy plus chooser: a SortPolicy per target holds every tuning
// value of the path choice and the grids, and choose_sort_path is the one place that picks a
// path (and its block count) for a call; every launcher of sort.h and sort_tiny_scales.h
// takes its choice.  Part of sort.h, which includes it after the kernels' shape constants;
// not a standalone header.
//
// Policies: sm_90 is tuned on the H200 (docs/perf.md); gfx942 and gfx950 are
// untuned: sm_90's values until measured on that hardware.  The CPU emulation has its own
// (fewer mid chunks, one scan chunk per lane) so that the self-test runs the multi-chunk and
// multi-tile loops on small inputs.  The host reads the policy of the current device
// (host_sort_policy: GpuTarget of launch_traits.h); device code reads the compiling
// target's at compile time (kDeviceSortPolicy: only scan_tile_chunks, a kernel shape).
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

struct SortPolicy {
  // Paths by n = M * topk pairs.
  int micro_pairs;              // micro path up to here (one warp ranks all pairs; 0: none), then
  int pairs_max;                // the pair path up to here (<= kPairMax), then
  int tiny_pairs;               // tiny path up to here, the mid path above ...
  int tiny_map_pairs;           // ... up to here with an expert map (each mid block would map every
                                // id), and the one-launch sorted scales
  int tiny_rows_per_block;      // tiny path: G = ceil(capacity / this) sort blocks ...
  int tiny_max_blocks;          // ... at most this many
  int64_t mid_base;             // mid path up to mid_base + mid_per_expert * E pairs (the large
  int64_t mid_per_expert;       // path's 3 launches cost more with E), large above; with a fused
  int mid_fused_dim_per_topk;   // quant also where model_dim >= this * topk (the quant is the
                                // longer part), up to kMidMaxChunkPairs pairs per chunk and ...
  int64_t mid_fused_max_pairs;  // ... below this many pairs (the large path's staged place
                                // hides inside the quant better above)
  int mid_chunk_pairs;          // mid chunks: ~this many pairs each up to half the SMs,
  int mid_large_chunk_pairs;    // then ~this many up to one per SM
  int mid_max_chunks;           // 0: the SM count bounds the mid chunks; else also this
  int64_t wide_quant_elems;     // fused MXFP4 quant of the mid path: two tiles a step under the
                                // register bound kFusedSortMinOccupancy from this many elements
  int large_chunks_per_sm;      // large path: chunks per SM (count and place launches)
  bool large_staged_place;      // large path: the staged place kernel where a chunk fits its
                                // stage (sort_large.h), else the direct one
  int scan_tile_chunks;         // large-path scan: chunks of a warp's tile (a multiple of the
                                // warp size; device code, compile time)
  int zero_blocks_max;          // zero_buf blocks of a sort launch, at most
  int quant_blocks_max;         // fused quant blocks of a sort launch, at most
  // The one-launch sorted scales (sort_tiny_scales.h).
  int scale_tile_pairs;       // scale blocks of a column group: one per this many pairs,
  int scale_max_parts;        // at most this many, and all blocks in one wave
  int scale_zero_blocks_max;  // z blocks, at most
  int scale_zero_stores;      // 16-byte stores per thread of a z block (sizes their grid)
};

// sm_90 (H200, 132 SMs): measured (docs/perf.md).
constexpr SortPolicy sm90_sort_policy() {
  SortPolicy p{};
  p.micro_pairs = 0;  // none: the pair path takes every n <= pairs_max
  p.pairs_max = kPairMax;
  p.tiny_pairs = 512;
  p.tiny_map_pairs = 1024;
  p.tiny_rows_per_block = 2048;
  p.tiny_max_blocks = 32;
  p.mid_base = 40960;
  p.mid_per_expert = 48;
  p.mid_fused_dim_per_topk = 300;
  // model_dim 7168, topk 8-9, fused MXFP4 (sort_sweep fused on an H200,
  // docs/bench/h200_sort_fused_crossover.csv): the mid path 3.6 % faster than the staged
  // large one at 262144 pairs, 1.4 % slower at 294912, 0.6-4.4 % slower at 393216-442368
  // (and 1.07-1.10x the quant against 1.03x at M = 65536 on an H100)
  p.mid_fused_max_pairs = 393216;
  p.mid_chunk_pairs = 16;
  p.mid_large_chunk_pairs = 128;
  p.mid_max_chunks = 0;
  p.wide_quant_elems = int64_t(1) << 24;
  p.large_chunks_per_sm = 1;  // one wave of place blocks (132 chunks)
  // the staged place kernel wherever a chunk fits its stage: the sort 1.6-1.9x as fast as with
  // the direct one at M = 65536 and 1.2-1.25x at 16384 (H100, sort_sweep large)
  p.large_staged_place = true;
  p.scan_tile_chunks = 256;
  p.zero_blocks_max = 256;
  // one step per warp up to here, as mxfp4_quant: with 1024 looping blocks beside the large
  // path's place blocks the launch measured 3-9 us slower at M = 65536 (the blocks that share
  // an SM with a place block finish last)
  p.quant_blocks_max = 8192;
  p.scale_tile_pairs = 128;
  p.scale_max_parts = 4;
  p.scale_zero_blocks_max = 128;
  p.scale_zero_stores = 4;
  return p;
}

// gfx942 (MI300X) and gfx950 (MI355X): untuned: sm_90's values until measured on that hardware.
constexpr SortPolicy gfx942_sort_policy() {
  return sm90_sort_policy();
}
constexpr SortPolicy gfx950_sort_policy() {
  return sm90_sort_policy();
}

// The CPU emulation of the self-test (tests/emu.h): sm_90's path rule, with at most 8 mid
// chunks and one scan chunk per lane, so that small inputs run the loops of both (the
// self-test forces the direct place kernel as well as the staged one).
constexpr SortPolicy emulation_sort_policy() {
  SortPolicy p = sm90_sort_policy();
  p.mid_max_chunks = 8;
  p.scan_tile_chunks = kWarpSize;
  return p;
}

// The limits the kernels rely on, for every policy of every build.
constexpr bool sort_policy_fits(const SortPolicy& p) {
  return p.micro_pairs <= kWarpSize && p.pairs_max <= kPairMax &&
         p.tiny_pairs <= p.tiny_map_pairs && p.tiny_map_pairs <= kTinyThreads &&
         p.tiny_rows_per_block > 0 && p.tiny_max_blocks > 0 && p.mid_chunk_pairs > 0 &&
         p.mid_large_chunk_pairs > 0 && p.mid_max_chunks >= 0 && 2 * kMaxSortExperts <= kMaxChunk &&
         p.large_chunks_per_sm > 0 && p.scan_tile_chunks >= kWarpSize &&
         p.scan_tile_chunks % kWarpSize == 0 && p.zero_blocks_max > 0 && p.quant_blocks_max > 0 &&
         p.scale_tile_pairs > 0 && p.scale_max_parts > 0 && p.scale_zero_blocks_max > 0 &&
         p.scale_zero_stores > 0;
}
static_assert(sort_policy_fits(sm90_sort_policy()) && sort_policy_fits(gfx942_sort_policy()) &&
                  sort_policy_fits(gfx950_sort_policy()) &&
                  sort_policy_fits(emulation_sort_policy()),
              "sort policy out of the kernels' limits");

// The compiling target's policy, for device code (the HIP host pass, which only launches,
// takes gfx942's).
#if defined(AITER_AUX_GPU_EMU)
constexpr SortPolicy kDeviceSortPolicy = emulation_sort_policy();
#elif defined(AITER_AUX_GPU_CUDA)
constexpr SortPolicy kDeviceSortPolicy = sm90_sort_policy();
#elif defined(__gfx950__)
constexpr SortPolicy kDeviceSortPolicy = gfx950_sort_policy();
#else
constexpr SortPolicy kDeviceSortPolicy = gfx942_sort_policy();
#endif

// Chunks per lane of a large-path scan tile.
constexpr int kScanPer = kDeviceSortPolicy.scan_tile_chunks / kWarpSize;

// The current device's policy, for the host's choice.
inline SortPolicy host_sort_policy() {
  switch (device_target()) {
    case GpuTarget::Emulation:
      return emulation_sort_policy();
    case GpuTarget::Gfx950:
      return gfx950_sort_policy();
    case GpuTarget::Gfx942:
      return gfx942_sort_policy();
    case GpuTarget::Sm90:
      break;
  }
  return sm90_sort_policy();
}

// ---------------------------------------------------------------- chooser ----
enum class SortPath { Micro, Pairs, Tiny, Mid, Large };

// What the choice depends on.
struct SortProblem {
  int64_t num_tokens;  // M
  int topk;
  int num_experts;  // E
  int block_m;
  bool expert_map;       // ids mapped through expert_map
  QuantFormat quant;     // the fused quant (None: moe_sort)
  int model_dim;         // of the fused quant (0 without)
  bool fused_scales;     // sorted_scales asked for, and a one-launch kernel can write them
                         // (16-byte aligned, model_dim % 256 == 0)
  bool tiny_scales_fit;  // the tiny one-launch kernel's shared memory fits (the pair one's
                         // always does)
};

struct SortChoice {
  SortPath path;
  int blocks;         // sort blocks: 1 (micro), G (pairs, tiny), the chunks (mid, large)
  bool wide_quant;    // mid path: the MXFP4 quant blocks take two tiles a step
  bool fused_scales;  // the pair or tiny launch also writes sorted_scales (sort_tiny_scales.h)
  bool staged_place;  // large path: the staged place kernel
};

// The large path's least chunk: 2E pairs (a chunk's count row and the E totals).
inline int64_t large_unit(int num_experts) {
  return 2 * int64_t(num_experts);
}

// Chunks of the mid path for n pairs: ~mid_chunk_pairs each up to half the SMs (`sms`), then
// ~mid_large_chunk_pairs each up to one per SM (half of them beside a fused quant of n <=
// mid_base pairs, which leaves the quant blocks more room); more only where a chunk would
// exceed kMidMaxChunkPairs.  Each block counts all n pairs, so past a few dozen blocks more
// of them cost more than their smaller chunks save.
inline int mid_chunks(const SortPolicy& p, int64_t n, int sms, bool fused) {
  const int64_t half = (sms + 1) / 2;
  const int64_t cap = fused && n <= p.mid_base ? half : sms;
  const int64_t fine = ceil_div_i64(n, p.mid_chunk_pairs);
  const int64_t small = fine < half ? fine : half;
  const int64_t large = ceil_div_i64(n, p.mid_large_chunk_pairs);
  const int64_t g = clamp_i64(small > large ? small : large, 1, cap > 1 ? cap : 1);
  const int64_t least = ceil_div_i64(n, kMidMaxChunkPairs);
  return static_cast<int>(g > least ? g : least);
}

// Chunks of the large path for n >= large_unit pairs: large_chunks_per_sm per SM, fewer where a
// chunk would hold < 2E pairs, more where one would exceed kMaxChunk pairs (launch_large
// checks the result).  The chunks are n split evenly (chunk_begin), not rounded to a granule:
// a count that leaves some SMs a second place block measured up to 30 % slower.
inline int large_chunks(const SortPolicy& p, int64_t n, int num_experts, int sms) {
  const int64_t fit = n / large_unit(num_experts);
  const int64_t least = ceil_div_i64(n, kMaxChunk);
  const int64_t want = int64_t(sms) * p.large_chunks_per_sm;
  const int64_t num_chunks = clamp_i64(want, least > 1 ? least : 1, fit > 1 ? fit : 1);
  return static_cast<int>(num_chunks < INT32_MAX ? num_chunks : INT32_MAX);
}

// The staged place kernel takes chunks of at most staged_slots(E) pairs (sort_large.h).
inline bool large_stage_fits(int64_t n, int num_chunks, int num_experts) {
  return num_chunks > 0 && ceil_div_i64(n, num_chunks) <= staged_slots(num_experts);
}

// The tiny path's sort blocks: one per tiny_rows_per_block rows of the capacity, capped.
inline int tiny_blocks(const SortPolicy& p, const SortProblem& s) {
  const int64_t cap = sort_capacity(s.num_tokens, s.topk, s.num_experts, s.block_m);
  return static_cast<int>(
      clamp_i64(ceil_div_i64(cap, p.tiny_rows_per_block), 1, p.tiny_max_blocks));
}

// The pair path's blocks: one per kPairRowsPerBlock rows of a bound on the rows (every block
// of rows holds a real pair: at most n blocks).
inline int pair_blocks(const SortProblem& s) {
  const int64_t n = s.num_tokens * s.topk;
  const int64_t cap = sort_capacity(s.num_tokens, s.topk, s.num_experts, s.block_m);
  const int64_t bound = n * s.block_m < cap ? n * s.block_m : cap;
  return static_cast<int>(clamp_i64(ceil_div_i64(bound, kPairRowsPerBlock), 1, kPairMax));
}

// The pair path with a block size outside moe_sort's (AnyBlocks): its pair_blocks blocks of
// kPairRowsPerBlock rows cover every row (pair_blocks caps the blocks at kPairMax).
inline bool pair_rows_fit(const SortProblem& s) {
  const int64_t n = s.num_tokens * s.topk;
  const int64_t cap = sort_capacity(s.num_tokens, s.topk, s.num_experts, s.block_m);
  const int64_t bound = n * s.block_m < cap ? n * s.block_m : cap;
  return bound <= int64_t(kPairMax) * kPairRowsPerBlock;
}

// The path of a call.  sms(): the SM count, asked only where the choice needs it (mid and
// large).
template <class SmCount>
inline SortChoice choose_sort_path(const SortPolicy& p, const SortProblem& s, SmCount sms) {
  const int64_t n = s.num_tokens * s.topk;
  // The tiny path computes blocks as shifts by log2(block_m) with block_m a power of two
  // >= 16: any other block size (the peers' formats) takes micro, the pair path's kernel of
  // divisions (AnyBlocks), mid or large, whose block arithmetic is general.
  if (!valid_block_m(s.block_m)) {
    if (n <= kWarpSize) return {SortPath::Micro, 1, false, false, false};
    if (n <= p.pairs_max && pair_rows_fit(s))
      return {SortPath::Pairs, pair_blocks(s), false, false, false};
  } else {
    if (s.fused_scales && n <= p.pairs_max)
      return {SortPath::Pairs, pair_blocks(s), false, true, false};
    if (s.fused_scales && s.tiny_scales_fit && n <= p.tiny_map_pairs)
      return {SortPath::Tiny, tiny_blocks(p, s), false, true, false};
    if (p.micro_pairs > 0 && n <= p.micro_pairs) return {SortPath::Micro, 1, false, false, false};
    if (n <= p.pairs_max) return {SortPath::Pairs, pair_blocks(s), false, false, false};
    if (n <= (s.expert_map ? p.tiny_map_pairs : p.tiny_pairs))
      return {SortPath::Tiny, tiny_blocks(p, s), false, false, false};
  }
  const int sm = sms();
  const int mid_sms = p.mid_max_chunks > 0 && sm > p.mid_max_chunks ? p.mid_max_chunks : sm;
  const bool few =
      n < large_unit(s.num_experts) || n <= p.mid_base + p.mid_per_expert * s.num_experts;
  // the large path's grid, asked only where it may run
  const int chunks = few ? 0 : large_chunks(p, n, s.num_experts, sm);
  const bool staged = !few && p.large_staged_place && large_stage_fits(n, chunks, s.num_experts);
  const bool mid = few || (s.model_dim >= p.mid_fused_dim_per_topk * s.topk &&
                           ceil_div_i64(n, mid_sms) <= kMidMaxChunkPairs &&
                           (n < p.mid_fused_max_pairs || !staged));
  if (mid) {
    const bool wide =
        s.quant == QuantFormat::Mxfp4 && s.num_tokens * int64_t(s.model_dim) >= p.wide_quant_elems;
    return {SortPath::Mid, mid_chunks(p, n, mid_sms, s.quant != QuantFormat::None), wide, false,
            false};
  }
  return {SortPath::Large, chunks, false, false, staged};
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
