// moe_route at decode sizes: a block per token row, a thread per expert (E <= kMaxE <= 1024).
// The bytes are route.h's (docs/ops.md "moe_route", route_math.h's arithmetic); what changes
// is who does the work, so that a row's latency is a few short steps instead of one warp's
// long chain:
//   * softmax: the row's NaN-ignoring max (warp maxima of order keys, then the warps' in shared
//     memory); each thread its exp; the exps in shared memory, where every warp sums the 64
//     partial sums in column order and runs the halving tree itself (softmax_den);
//   * one division per thread;
//   * groups: a group of one 32-lane warp by warp maxima (group_key_warp); otherwise thread g
//     scans group g's keys in shared memory (group_key_scan); thread g < G marks group g kept
//     when fewer than topk_group groups have a larger packed group key;
//   * selection by ranks in pack_key's order (value key, then the lower id): a thread's rank
//     among its warp's keys keeps the warp's best kL (kL = 8 or 16, >= topk); each of those
//     counts the kept keys of every warp above its own, and rank r < topk is output r.  The
//     count is exact for the row's best topk: everything above one of them is in the row's
//     best topk too, hence in its own warp's best kL; a key outside the row's best topk has
//     the row's best topk above it, all kept, so its count is >= topk.  Above 8 warps that
//     count (every kept key against all kWarps * kL) would cost more than the rest of the
//     row: the warps' sorted lists are merged in pairs instead, log2(kWarps) rounds, a key's
//     rank in the merged list being its rank in its own plus the other list's keys above it;
//     each merge keeps its best kL (the row's best topk are among the best kL of any list
//     holding them, by the same argument).
#pragma once

#include "route_common.h"

// ROUTE_MARK(n): the phase points gpu/tests/route_phases.cu times (nothing in the package)
#ifndef ROUTE_MARK
#define ROUTE_MARK(n)
#endif

namespace aiter_aux {
namespace gpu {
namespace route_detail {

constexpr int kWideMaxE = AITER_AUX_MAX_ROUTE_EXPERTS;  // the block-per-row kernel's classes
constexpr int64_t kWideMaxRows = 256;                   // below: a block per row
constexpr int kWideCountWarps = 8;  // up to here the kept keys' count; above, pair merges
// A block of kWarps warps selects by pair merges (else by counting the kept keys).
template <int kWarps>
constexpr bool kWideMerges = kWarps > kWideCountWarps;

// The rank of `mine` among kN packed keys in shared memory (how many are larger).
template <int kN>
__device__ __forceinline__ int rank_packed(const uint64_t* keys, uint64_t mine) {
  int r = 0;
#pragma unroll
  for (int s = 0; s < kN; ++s) r += keys[s] > mine ? 1 : 0;
  return r;
}

// The block's best kL packed keys, in order: kept holds kLists sorted lists of kL keys (each
// warp's best), merged in pairs, log2(kLists) rounds, through `spare` (kLists / 2 * kL keys).
// Returns the buffer whose first kL keys are the result (kept or spare).
template <int kLists, int kL>
__device__ __forceinline__ const uint64_t* merge_lists(uint64_t* kept, uint64_t* spare) {
  static_assert((kLists & (kLists - 1)) == 0, "a power of two of lists");
  const int i = thread_idx();
  uint64_t* from = kept;
  uint64_t* to = spare;
#pragma unroll
  for (int n = kLists; n > 1; n /= 2) {
    if (i < n * kL) {
      const int list = i / kL, p = i % kL;
      const uint64_t mine = from[i];
      const int r = p + rank_packed<kL>(from + (list ^ 1) * kL, mine);
      if (r < kL) to[(list / 2) * kL + r] = mine;
    }
    block_sync();
    uint64_t* t = from;
    from = to;
    to = t;
  }
  return from;
}

// The block's selection: thread i holds expert i's choice key kk (0: not selectable) and score
// sc; output r's score and id go to ws[r], wi[r].  pk: kMaxE keys, kept: kWarps * kL keys.
// ss: kMaxE scores by id, spare: kWarps / 2 * kL keys (both for the pair merges only).
template <int kMaxE, int kL>
__device__ __forceinline__ void select_wide(uint32_t kk, float sc, int K, uint64_t* pk,
                                            uint64_t* kept, uint64_t* spare, float* ss, float* ws,
                                            int32_t* wi) {
  constexpr int kWarps = kMaxE / kWarpSize;
  static_assert(kL <= kWarpSize, "a warp keeps at most its lanes");
  const int i = thread_idx(), w = warp_id();
  const uint64_t mine = rm::pack_key(kk, i);  // packed: no per-lane tie test in the loop
  pk[i] = mine;
  if constexpr (kWideMerges<kWarps>) ss[i] = sc;
  warp_sync();
  const int r = rank_packed<kWarpSize>(pk + w * kWarpSize, mine);  // in the warp
  if (r < kL) kept[w * kL + r] = mine;                             // the warp's best kL, in order
  block_sync();
  if constexpr (!kWideMerges<kWarps>) {
    if (r < kL) {
      const int g = rank_packed<kWarps * kL>(kept, mine);
      if (g < K) {
        ws[g] = sc;
        wi[g] = i;
      }
    }
  } else {
    const uint64_t* best = merge_lists<kWarps, kL>(kept, spare);
    if (i < K) {
      const int32_t id = rm::key_id(best[i]);
      ws[i] = ss[id];
      wi[i] = id;
    }
  }
}

// The shared memory of a block's row (kThreads >= E threads).
template <int kThreads>
struct WideSmem {
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMaxK = AITER_AUX_MAX_ROUTE_TOPK;
  float es[kThreads];             // softmax: the exps
  uint32_t ks[kThreads];          // the groups' value keys
  uint64_t pk[kThreads];          // the packed choice keys
  uint32_t wm[kWarps];            // softmax: the warps' maxima
  uint32_t gks[kThreads];         // the group keys
  uint64_t kept[kWarps * kMaxK];  // each warp's best kL packed keys
  // pair merges only: their second buffer and the scores by id
  uint64_t spare[kWideMerges<kWarps> ? kWarps / 2 * kMaxK : 1];
  float ss[kWideMerges<kWarps> ? kThreads : 1];
  float ws[kMaxK];    // output r's score
  int32_t wi[kMaxK];  // output r's id
};

// One row's gate by the whole block: thread i holds expert i's logit x (0 past E) and bias
// bi; on return (after a barrier) sm.ws / sm.wi hold the row's outputs in order, for
// write_row.  kGrouped: num_expert_group > 1.
template <int kThreads, bool kGrouped>
__device__ __forceinline__ void wide_row(const AiterAuxRouteArgs& a, float x, float bi,
                                         WideSmem<kThreads>& sm) {
  constexpr int kWarps = WideSmem<kThreads>::kWarps;
  constexpr int kMaxK = WideSmem<kThreads>::kMaxK;
  static_assert(kWarps >= 1 && kWarps * kWarpSize == kThreads, "whole warps");
  static_assert(kThreads % rm::kSumLanes == 0, "whole partial-sum columns");
  const int i = thread_idx(), lane = lane_id(), w = warp_id();
  const int E = static_cast<int>(a.num_experts), K = static_cast<int>(a.topk);
  const bool bias = a.correction_bias != nullptr;
  float sc = x;
  ROUTE_MARK(1);
  if (a.scoring == AITER_AUX_SCORING_SOFTMAX) {
    const float mi = i < E && sc > -__builtin_inff() ? sc : -__builtin_inff();  // NaN: never
    const uint32_t mw = warp_max_u32(rm::order_key(mi));
    if (lane == 0) sm.wm[w] = mw;
    block_sync();
    uint32_t mk = sm.wm[0];
#pragma unroll
    for (int j = 1; j < kWarps; ++j) mk = sm.wm[j] > mk ? sm.wm[j] : mk;
    ROUTE_MARK(2);
    sc = rm::exp_f32(rm::rt_sub(sc, rm::order_value(mk)));
    sm.es[i] = sc;
    block_sync();
    ROUTE_MARK(3);
    float p[kCols];  // p_j, j = lane + q * kWarpSize: the columns j, j + 64, ... in order
#pragma unroll
    for (int q = 0; q < kCols; ++q) {
      p[q] = 0.0f;
#pragma unroll
      for (int u = 0; u < kThreads / rm::kSumLanes; ++u) {
        const int c = lane + q * kWarpSize + u * rm::kSumLanes;
        if (c < E) p[q] = rm::rt_add(p[q], sm.es[c]);
      }
    }
    float v[1] = {sc};
    const float den[1] = {softmax_den(p)};
    ROUTE_MARK(4);
    div_cols<1>(v, den);
    sc = v[0];
  } else if (a.scoring == AITER_AUX_SCORING_SIGMOID) {
    float v[1], den[1];
    v[0] = rm::sigmoid_parts(sc, &den[0]);
    div_cols<1>(v, den);
    sc = v[0];
  }
  ROUTE_MARK(5);
  // the choice key: order_key + 1 (0: no expert, or not selectable)
  uint32_t kk = i < E ? rm::order_key(bias ? rm::rt_add(sc, bi) : sc) + 1u : 0u;
  ROUTE_MARK(6);
  if constexpr (kGrouped) {
    const int G = a.num_expert_group, S = E / G;
    // a group of one 32-lane warp by warp maxima; 64-lane waves scan (the ballots' 64-bit
    // masks spilled scalar registers in the gated pair kernels on gfx942)
    if (kWarpSize == 32 &&
        S == kWarpSize) {  // group w is warp w (the warps from G on hold no expert)
      const uint32_t gk = group_key_warp(kk - 1u, bias);
      if (lane == 0 && w < G) sm.gks[w] = gk;
    } else {
      if (i < E) sm.ks[i] = kk - 1u;
      block_sync();
      if (i < G) sm.gks[i] = group_key_scan(sm.ks, i, S, bias);
    }
    block_sync();
    if (i < G) {  // group i is kept when fewer than topk_group groups have a larger key
      const uint64_t mine = rm::pack_key(sm.gks[i], i);
      int above = 0;
#pragma unroll 1
      for (int h = 0; h < G; ++h) above += rm::pack_key(sm.gks[h], h) > mine ? 1 : 0;
      sm.ks[i] = above < a.topk_group ? 1u : 0u;  // (the scan's keys are read: a barrier ago)
    }
    block_sync();
    if (i < E && sm.ks[i / S] == 0u) kk = 0;
  }
  ROUTE_MARK(7);
  if (K <= 8)
    select_wide<kThreads, 8>(kk, sc, K, sm.pk, sm.kept, sm.spare, sm.ss, sm.ws, sm.wi);
  else
    select_wide<kThreads, kMaxK>(kk, sc, K, sm.pk, sm.kept, sm.spare, sm.ss, sm.ws, sm.wi);
  block_sync();
  ROUTE_MARK(8);
}

// kMaxE: the threads of the block (>= E); kGrouped: num_expert_group > 1.
template <int kDT, int kMaxE, bool kGrouped>
__global__ __launch_bounds__(kMaxE) void route_wide_kernel(AiterAuxRouteArgs a) {
  const PdlScope pdl;
  ROUTE_MARK(0);
  __shared__ WideSmem<kMaxE> sm;
  const int i = thread_idx();
  const int E = static_cast<int>(a.num_experts), K = static_cast<int>(a.topk);
  constexpr int64_t kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  const int64_t t = block_idx();
  const void* row = static_cast<const char*>(a.router_logits) + t * E * kE;
  const float x = i < E ? load_logit<kDT>(row, i) : 0.0f;
  const float bi = a.correction_bias && i < E ? a.correction_bias[i] : 0.0f;
  wide_row<kMaxE, kGrouped>(a, x, bi, sm);
  if (warp_id() == 0) write_row(a, t, K, sm.ws, sm.wi);
  ROUTE_MARK(9);
}

// A block per row: M blocks (M < kWideMaxRows).
template <int kDT, int kMaxE>
inline int launch_route_wide(const AiterAuxRouteArgs& a, void* stream) {
  static_assert(kMaxE <= kWideMaxE, "a thread per expert");
  const dim3 grid(static_cast<unsigned>(a.num_tokens));
  const hipStream_t st = static_cast<hipStream_t>(stream);
  if (a.num_expert_group > 1)  // one group (topk_group 1) keeps every expert
    AITER_AUX_LAUNCH((route_wide_kernel<kDT, kMaxE, true>), grid, dim3(kMaxE), st)(a);
  else
    AITER_AUX_LAUNCH((route_wide_kernel<kDT, kMaxE, false>), grid, dim3(kMaxE), st)(a);
  return check_launch("moe_route");
}

}  // namespace route_detail
}  // namespace gpu
}  // namespace aiter_aux
