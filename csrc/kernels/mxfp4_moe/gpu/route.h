// moe_route on the GPU; docs/ops.md "moe_route" is the spec (aiter_aux/reference/route.py).
//
// Below kWideMaxRows rows and up to kWideMaxE experts a block takes each row (route_wide.h);
// otherwise one warp per token row, kRows rows per block.  Lane l owns the columns i = l + c *
// kWarpSize (c < kC) and keeps their scores and choice keys in registers; the arithmetic is
// route_math.h's, in the reference's order:
//   * softmax: the row's NaN-ignoring max (a warp max of order keys), e_i = exp_f32(x_i - m),
//     the 64 partial sums p_j (j = i mod 64: lane l holds 64 / kWarpSize of them, each in
//     column order), then the halving tree: the levels h >= kWarpSize inside the lane (a
//     32-lane warp: p_l + p_{l+32}), the others by xor shuffles kWarpSize / 2 .. 1
//     (a + b == b + a, so every lane ends with the tree's sum); score_i = e_i / s;
//   * the choice keys: order_key(score + bias), ties to the lower id (pack_key's order);
//   * groups: a group's score depends on the values of its two largest choice keys only, so
//     32-bit keys suffice.  A group of one column of every lane (E / G == kWarpSize) is
//     scored with warp maxima in registers; otherwise the keys go to shared memory and lane g
//     scans group g.  A group is kept when fewer than topk_group groups have a larger packed
//     key (more groups than lanes: topk_group warp arg-max rounds), and the other groups'
//     experts get key 0;
//   * selection, in route_math's packed order (value key, then the lower id):
//     - M < kMergeMaxRows and <= kMergeMaxCols columns per lane: each lane sorts its packed
//       keys, the warp merges the sorted lists over xor partners keeping the best 8 (or 16),
//       and lane k takes output k's id and its score (from shared memory);
//     - otherwise topk rounds; each takes the warp's largest value key (the lowest id among
//       the lanes holding it), the winning lane records its id and score in shared memory and
//       takes its next best key (below kThroughputRows rows a lane keeps its next best ready,
//       branch-free; from there only the winner looks, the fewest instructions);
//     the weights' sum runs in output order; lane k writes output k.
// One instance serves every shape, dtype and option: E, topk and the groups are run-time
// values; the dtype, E's size class (<= 128, <= 256, <= 512 or <= AITER_AUX_MAX_ROUTE_EXPERTS
// columns) and whether there are groups pick the kernel.
#pragma once

#include "route_common.h"
#include "route_wide.h"

namespace aiter_aux {
namespace gpu {
namespace route_detail {

constexpr uint32_t kKept = 0xFFFFFFFFu;    // a kept group's mark (no group's key)
constexpr int kRows = 4;                   // token rows (warps) per block
constexpr int64_t kThroughputRows = 4096;  // from here the selection's fewest steps
constexpr int64_t kMergeMaxRows = 1024;    // below: the merge selection (decode sizes)
constexpr int kMergeMaxCols = 8;           // the merge selection up to 8 columns per lane

// The warp's largest packed key (43 bits: route_math::pack_key), in every lane.
__device__ __forceinline__ uint64_t warp_max_packed(uint64_t v) {
  constexpr uint32_t kIdMask = (1u << rm::kIndexBits) - 1u;
  const uint32_t key = static_cast<uint32_t>(v >> rm::kIndexBits);
  const uint32_t kmax = warp_max_u32(key);
  const uint32_t idb = warp_max_u32(key == kmax ? static_cast<uint32_t>(v) & kIdMask : 0u);
  return (static_cast<uint64_t>(kmax) << rm::kIndexBits) | idb;
}

// This lane's best column other than `skip`: the largest kk[c], ties to the lower c (the lower
// expert id); up to four independent chains.  Returns its key (0: none), its column in *col.
template <int kC>
__device__ __forceinline__ uint32_t lane_best(const uint32_t (&kk)[kC], int skip, int* col) {
  constexpr int kA = kC < 4 ? kC : 4;
  uint32_t k[kA];
  int i[kA];
#pragma unroll
  for (int c = 0; c < kA; ++c) k[c] = c == skip ? 0u : kk[c], i[c] = c;
#pragma unroll
  for (int c = kA; c < kC; ++c) {
    const uint32_t v = c == skip ? 0u : kk[c];
    const bool up = v > k[c % kA];  // strict: the lower c stays
    k[c % kA] = up ? v : k[c % kA];
    i[c % kA] = up ? c : i[c % kA];
  }
#pragma unroll
  for (int h = kA / 2; h > 0; h /= 2)
#pragma unroll
    for (int c = 0; c < h; ++c) {
      const bool up = k[c + h] > k[c] || (k[c + h] == k[c] && i[c + h] < i[c]);
      k[c] = up ? k[c + h] : k[c];
      i[c] = up ? i[c + h] : i[c];
    }
  *col = i[0];
  return k[0];
}

// v[col] (an unrolled select: no local memory).
template <int kC>
__device__ __forceinline__ float at_col(const float (&v)[kC], int col) {
  float r = v[0];
#pragma unroll
  for (int c = 1; c < kC; ++c) r = c == col ? v[c] : r;
  return r;
}

// ---- the merge selection of decode sizes: every lane sorts its columns' packed keys
// (route_math::pack_key: value key, then the lower id), keeps its best kL, and the warp merges
// the lists pairwise over xor partners (each merge keeps the best kL of two sorted lists: a
// bitonic half-cleaner cascade), so that every lane ends with the warp's best kL in order.

// v sorted descending (a bitonic sorting network; kN a power of two).
template <int kN>
__device__ __forceinline__ void sort_desc(uint64_t (&v)[kN]) {
#pragma unroll
  for (int k = 2; k <= kN; k *= 2)
#pragma unroll
    for (int j = k / 2; j > 0; j /= 2)
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const int l = i ^ j;
        if (l > i) {
          const uint64_t x = v[i], y = v[l];
          const bool swap = (i & k) == 0 ? x < y : x > y;
          v[i] = swap ? y : x;
          v[l] = swap ? x : y;
        }
      }
}

// a = the best kL of a and b, sorted descending (a and b sorted descending).
template <int kL>
__device__ __forceinline__ void merge_best(uint64_t (&a)[kL], const uint64_t (&b)[kL]) {
#pragma unroll
  for (int j = 0; j < kL; ++j) a[j] = a[j] > b[kL - 1 - j] ? a[j] : b[kL - 1 - j];  // bitonic
#pragma unroll
  for (int j = kL / 2; j > 0; j /= 2)
#pragma unroll
    for (int i = 0; i < kL; ++i)
      if ((i & j) == 0) {
        const uint64_t x = a[i], y = a[i + j];
        a[i] = x > y ? x : y;
        a[i + j] = x > y ? y : x;
      }
}

// The warp's best kL packed keys, in order, in every lane (kk: this lane's value keys).
template <int kC, int kL>
__device__ __forceinline__ void warp_best(const uint32_t (&kk)[kC], uint64_t (&best)[kL]) {
  constexpr int kN = kC > kL ? kC : kL;  // powers of two
  const int lane = lane_id();
  uint64_t v[kN];
#pragma unroll
  for (int c = 0; c < kN; ++c) v[c] = c < kC ? rm::pack_key(kk[c], lane + c * kWarpSize) : 0u;
  sort_desc<kN>(v);
#pragma unroll
  for (int j = 0; j < kL; ++j) best[j] = v[j];
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    uint64_t o[kL];
#pragma unroll
    for (int j = 0; j < kL; ++j) {
      const uint32_t lo = shfl_xor_u32(static_cast<uint32_t>(best[j]), off);
      const uint32_t hi = shfl_xor_u32(static_cast<uint32_t>(best[j] >> 32), off);
      o[j] = (static_cast<uint64_t>(hi) << 32) | lo;
    }
    merge_best<kL>(best, o);
  }
}

// Lane r < K records output r of the warp's best list: its id and the id's score (sc_row:
// the row's scores in shared memory).
template <int kL>
__device__ __forceinline__ void record_best(const uint64_t (&best)[kL], int K, const float* sc_row,
                                            float* ws, int32_t* wi) {
  const int lane = lane_id();
  uint64_t mine = 0;
#pragma unroll
  for (int j = 0; j < kL; ++j) mine = j == lane ? best[j] : mine;
  if (lane < K) {
    const int32_t id = rm::key_id(mine);
    ws[lane] = sc_row[id];
    wi[lane] = id;
  }
}

// The groups: the experts of the groups not kept get key 0 (never selected: topk is at
// most the kept experts).  ck, gk: this warp's shared arrays of E and G words.
template <int kC>
__device__ __forceinline__ void keep_groups(uint32_t (&kk)[kC], uint32_t* ck, uint32_t* gk,
                                            bool bias, int E, int G, int S, int topk_group) {
  const int lane = lane_id();
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int i = lane + c * kWarpSize;
    if (i < E) ck[i] = kk[c] - 1u;  // the value key
  }
  warp_sync();
  for (int g = lane; g < G; g += kWarpSize) gk[g] = group_key_scan(ck, g, S, bias);
  warp_sync();
  if (G <= kWarpSize) {
    // kept: fewer than topk_group groups have a larger packed key
    bool kept = false;
    if (lane < G) {
      const uint64_t mine = rm::pack_key(gk[lane], lane);
      int above = 0;
      for (int h = 0; h < G; ++h) above += rm::pack_key(gk[h], h) > mine ? 1 : 0;
      kept = above < topk_group;
    }
    warp_sync();
    if (kept) gk[lane] = kKept;
  } else {
    // topk_group rounds of the largest packed group key not taken
    for (int r = 0; r < topk_group; ++r) {
      uint64_t best = 0;
      for (int g = lane; g < G; g += kWarpSize) {
        const uint32_t k = gk[g];
        const uint64_t p = k != kKept ? rm::pack_key(k, g) : 0;
        best = p > best ? p : best;
      }
      const int g = rm::key_id(warp_max_packed(best));
      warp_sync();
      if (lane == g % kWarpSize) gk[g] = kKept;
      warp_sync();
    }
  }
  warp_sync();
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int i = lane + c * kWarpSize;
    if (i < E && gk[i / S] != kKept) kk[c] = 0;
  }
}

// The groups when each is one column of the warp (E / num_expert_group == kWarpSize: group g
// is column g of every lane): the group keys by group_key_warp, in registers of every lane,
// kept as in keep_groups.
template <int kC>
__device__ __forceinline__ void keep_groups_lanes(uint32_t (&kk)[kC], bool bias, int G,
                                                  int topk_group) {
  uint32_t gk[kC];
  // every column, no branch: the kC chains of warp collectives overlap (the columns from G on
  // hold no group and are not counted below)
#pragma unroll
  for (int c = 0; c < kC; ++c) gk[c] = group_key_warp(kk[c] - 1u, bias);  // the value keys
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    int above = 0;
#pragma unroll
    for (int h = 0; h < kC; ++h)
      above += h < G && (gk[h] > gk[c] || (gk[h] == gk[c] && h < c)) ? 1 : 0;
    if (c < G && above >= topk_group) kk[c] = 0;
  }
}

// kC: columns per lane (E <= kC * kWarpSize); kGrouped: num_expert_group > 0 (a kernel of its
// own: the other one needs no shared arrays for the groups).
template <int kDT, int kC, bool kGrouped>
__global__ __launch_bounds__(kRows* kWarpSize) void route_kernel(AiterAuxRouteArgs a) {
  const PdlScope pdl;
  ROUTE_MARK(0);
  constexpr int kMaxE = kC * kWarpSize;
  constexpr int kGroupWords = kGrouped ? kMaxE : 1;
  // ck_all: the groups' value keys, then (merge selection) the row's scores; a word when
  // neither is used (no shared memory taken from the other kernels' occupancy)
  constexpr int kRowWords = kGrouped || kC <= kMergeMaxCols ? kMaxE : 1;
  __shared__ uint32_t ck_all[kRows][kRowWords];
  __shared__ uint32_t gk_all[kRows][kGroupWords];
  __shared__ float ws_all[kRows][AITER_AUX_MAX_ROUTE_TOPK];
  __shared__ int32_t wi_all[kRows][AITER_AUX_MAX_ROUTE_TOPK];
  float* ws = ws_all[warp_id()];
  int32_t* wi = wi_all[warp_id()];
  const int lane = lane_id();
  // E <= 1024, topk <= 16, G <= E: 32-bit indices (fewer scalar registers than int64)
  const int E = static_cast<int>(a.num_experts), K = static_cast<int>(a.topk);
  const float* bias = a.correction_bias;
  constexpr int64_t kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  // one row per warp (a loop over rows would keep more scalar registers live)
  const int64_t t = static_cast<int64_t>(block_idx()) * kRows + warp_id();
  if (t >= a.num_tokens) return;  // the whole warp
  const void* row = static_cast<const char*>(a.router_logits) + t * E * kE;
  // ---- scores (the bias loaded beside the logits: one round trip)
  float sc[kC], bi[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int i = lane + c * kWarpSize;
    sc[c] = i < E ? load_logit<kDT>(row, i) : 0.0f;
    bi[c] = bias && i < E ? bias[i] : 0.0f;
  }
  ROUTE_MARK(1);
  if (a.scoring == AITER_AUX_SCORING_SOFTMAX) {
    float m = -__builtin_inff();
#pragma unroll
    for (int c = 0; c < kC; ++c)  // NaN never wins; no column: sc is 0, left out
      m = lane + c * kWarpSize < E && sc[c] > m ? sc[c] : m;
    m = rm::order_value(warp_max_u32(rm::order_key(m)));  // -inf: key 0x7FFFFF
    ROUTE_MARK(2);
    float p[kCols];
#pragma unroll
    for (int q = 0; q < kCols; ++q) p[q] = 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) {  // branch-free: the columns' exps run side by side
      sc[c] = rm::exp_f32(rm::rt_sub(sc[c], m));
      // no column adds +0 (p is never -0: it starts at +0 and adds e >= 0 or a NaN)
      p[c % kCols] = rm::rt_add(p[c % kCols], lane + c * kWarpSize < E ? sc[c] : 0.0f);
    }
    ROUTE_MARK(3);
    const float s = softmax_den(p);  // p[q] is p_{l + q * kWarpSize}
    ROUTE_MARK(4);
    float den[kC];
#pragma unroll
    for (int c = 0; c < kC; ++c) den[c] = s;
    div_cols<kC>(sc, den);
  } else if (a.scoring == AITER_AUX_SCORING_SIGMOID) {
    float den[kC];
#pragma unroll
    for (int c = 0; c < kC; ++c) sc[c] = rm::sigmoid_parts(sc[c], &den[c]);
    div_cols<kC>(sc, den);
  }
  ROUTE_MARK(5);
  // ---- the choice keys: order_key + 1 (0: no column, or not selectable)
  uint32_t kk[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int i = lane + c * kWarpSize;
    const uint32_t k = rm::order_key(bias ? rm::rt_add(sc[c], bi[c]) : sc[c]) + 1u;
    kk[c] = i < E ? k : 0u;
  }
  ROUTE_MARK(6);
  if constexpr (kGrouped) {
    const int G = a.num_expert_group, S = E / G;
    if (kC <= 8 && S == kWarpSize)
      keep_groups_lanes<kC>(kk, bias != nullptr, G, a.topk_group);
    else
      keep_groups<kC>(kk, ck_all[warp_id()], gk_all[warp_id()], bias != nullptr, E, G, S,
                      a.topk_group);
  }
  ROUTE_MARK(7);
  // ---- selection: round r's winner is output r; (key, id) is route_math::pack_key's order.
  // The lane holding the largest value key wins; when several hold it (a tie, warp-uniform),
  // a second maximum picks the lowest id.  The winner records its id and score for output r.
  constexpr uint32_t kIdTop = (1u << rm::kIndexBits) - 1u;
  bool selected = false;
  if constexpr (kC <= kMergeMaxCols) {
    if (a.num_tokens < kMergeMaxRows) {
      // decode sizes: the merge selection (a row's topk in one pass of log2(warp) merges)
      float* sc_row = reinterpret_cast<float*>(ck_all[warp_id()]);
      warp_sync();  // keep_groups' last reads of ck_all
#pragma unroll
      for (int c = 0; c < kC; ++c) sc_row[lane + c * kWarpSize] = sc[c];
      warp_sync();
      if (K <= 8) {
        uint64_t best[8];
        warp_best<kC, 8>(kk, best);
        record_best<8>(best, K, sc_row, ws, wi);
      } else {
        uint64_t best[16];
        warp_best<kC, 16>(kk, best);
        record_best<16>(best, K, sc_row, ws, wi);
      }
      selected = true;
    }
  }
  if (!selected) {
    int c1;
    uint32_t b1 = lane_best<kC>(kk, -1, &c1);
    if (a.num_tokens >= kThroughputRows) {
      // many rows: the SMs are full, so the fewest instructions: only a winning lane looks for
      // its next column
      for (int r = 0; r < K; ++r) {
        const uint32_t kmax = warp_max_u32(b1);
        const uint32_t id = static_cast<uint32_t>(lane + c1 * kWarpSize);
        const uint32_t idb = warp_max_u32(b1 == kmax ? kIdTop - id : 0u);
        if (kIdTop - idb == id) {
          ws[r] = at_col<kC>(sc, c1);
          wi[r] = static_cast<int32_t>(id);
#pragma unroll
          for (int c = 0; c < kC; ++c) kk[c] = c == c1 ? 0u : kk[c];
          b1 = lane_best<kC>(kk, -1, &c1);
        }
      }
    } else {
      // few rows: the shortest chain per round.  Each lane keeps its best column (b1, c1, s1)
      // and its next one (b2, c2, s2): a winning lane moves to its next at once; the one after
      // that is found while the next round's warp maximum runs.  Branch-free.
      int c2;
      uint32_t b2;
      float s1 = at_col<kC>(sc, c1), s2;
      for (int r = 0; r < K; ++r) {
        const uint32_t kmax = warp_max_u32(b1);
        b2 = lane_best<kC>(kk, c1, &c2);  // beside the warp maximum
        s2 = at_col<kC>(sc, c2);
        const uint32_t id = static_cast<uint32_t>(lane + c1 * kWarpSize);
        bool win = b1 == kmax;
        const lane_mask_t tops = warp_ballot(win);
        if ((tops & (tops - 1)) != 0) {  // a tie of value keys
          const uint32_t idb = win ? kIdTop - id : 0u;
          const uint32_t imax = warp_max_u32(idb);  // every lane
          win = win && idb == imax;
        }
        if (win) {
          ws[r] = s1;
          wi[r] = static_cast<int32_t>(id);
        }
#pragma unroll
        for (int c = 0; c < kC; ++c) kk[c] = win && c == c1 ? 0u : kk[c];
        b1 = win ? b2 : b1;
        c1 = win ? c2 : c1;
        s1 = win ? s2 : s1;
      }
    }
  }
  ROUTE_MARK(8);
  warp_sync();  // every lane reads every round's weight and id
  write_row(a, t, K, ws, wi);
  ROUTE_MARK(9);
}

// kMaxE: the columns of the kernel (>= E).  One row per warp: M < 2^24 rows fit the grid.
template <int kDT, int kMaxE>
inline int launch_route_narrow(const AiterAuxRouteArgs& a, void* stream) {
  constexpr int kC = kMaxE / kWarpSize;
  static_assert(kC >= 1 && kC * kWarpSize == kMaxE, "whole columns per lane");
  const int blocks = static_cast<int>(ceil_div_i64(a.num_tokens, kRows));
  const hipStream_t st = static_cast<hipStream_t>(stream);
  if (a.num_expert_group > 1)  // one group (topk_group 1) keeps every expert
    AITER_AUX_LAUNCH((route_kernel<kDT, kC, true>), dim3(blocks), dim3(kRows * kWarpSize), st)(a);
  else
    AITER_AUX_LAUNCH((route_kernel<kDT, kC, false>), dim3(blocks), dim3(kRows * kWarpSize), st)(a);
  return check_launch("moe_route");
}

// Size class kMaxE: a block per row (route_wide.h) at decode sizes, else a warp per row.
template <int kDT, int kMaxE>
inline int launch_route_shape(const AiterAuxRouteArgs& a, void* stream) {
  if constexpr (kMaxE <= kWideMaxE)
    if (a.num_tokens < kWideMaxRows) return launch_route_wide<kDT, kMaxE>(a, stream);
  return launch_route_narrow<kDT, kMaxE>(a, stream);
}

template <int kDT>
inline int launch_route(const AiterAuxRouteArgs& a, void* stream) {
  if (a.num_experts <= 128) return launch_route_shape<kDT, 128>(a, stream);
  if (a.num_experts <= 256) return launch_route_shape<kDT, 256>(a, stream);
  if (a.num_experts <= 512) return launch_route_shape<kDT, 512>(a, stream);
  return launch_route_shape<kDT, AITER_AUX_MAX_ROUTE_EXPERTS>(a, stream);
}

// moe_route's checks of its args (op: the caller's name).
inline int check_route_args(const AiterAuxRouteArgs& a, const char* op) {
  const int64_t E = a.num_experts, G = a.num_expert_group, KG = a.topk_group;
  if (a.num_tokens < 0) return fail_invalid("%s: negative num_tokens", op);
  if (E < 1 || E > AITER_AUX_MAX_ROUTE_EXPERTS)
    return fail_invalid("%s: num_experts %lld out of range", op, static_cast<long long>(E));
  if (a.topk < 1 || a.topk > AITER_AUX_MAX_ROUTE_TOPK || a.topk > E)
    return fail_invalid("%s: topk %lld out of range", op, static_cast<long long>(a.topk));
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return fail_invalid("%s: unknown dtype code %d", op, a.dtype);
  if (a.scoring < AITER_AUX_SCORING_SOFTMAX || a.scoring > AITER_AUX_SCORING_NONE)
    return fail_invalid("%s: unknown scoring code %d", op, a.scoring);
  if (G < 0 || KG < 0 || (G == 0) != (KG == 0) || KG > G ||
      (G > 0 && (E % G != 0 || a.topk > KG * (E / G))))
    return fail_invalid("%s: bad groups (num_expert_group %lld, topk_group %lld)", op,
                        static_cast<long long>(G), static_cast<long long>(KG));
  if (a.num_tokens > 0 &&
      (a.router_logits == nullptr || a.topk_weights == nullptr || a.topk_ids == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  return AITER_AUX_OK;
}

}  // namespace route_detail

// moe_route: one instance for every shape, dtype and option.
inline int moe_route(const AiterAuxRouteArgs& a, void* stream) {
  const int rc = route_detail::check_route_args(a, "moe_route");
  if (rc != AITER_AUX_OK || a.num_tokens == 0) return rc;
  switch (a.dtype) {
    case AITER_AUX_DTYPE_F32:
      return route_detail::launch_route<AITER_AUX_DTYPE_F32>(a, stream);
    case AITER_AUX_DTYPE_F16:
      return route_detail::launch_route<AITER_AUX_DTYPE_F16>(a, stream);
    default:
      return route_detail::launch_route<AITER_AUX_DTYPE_BF16>(a, stream);
  }
}

}  // namespace gpu
}  // namespace aiter_aux
