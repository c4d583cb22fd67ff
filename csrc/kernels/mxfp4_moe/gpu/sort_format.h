// The output formats of the sort kernels: ours (moe_sort), vLLM's and SGLang's
// (moe_align_block_size_vllm / _sglang, align.h; docs/compat.md).  The format is a
// compile-time parameter of every sort kernel, carried by the type of its args: the kernels
// take `A a` with A = AiterAuxSortArgs (ours) or AlignSortArgs<F> (a peer's), and every
// format-dependent step asks SortFormat<A>.  With A = AiterAuxSortArgs each step is the
// code of moe_sort as it was (the `if constexpr` branches of the peers drop out), so the
// native kernels compile to the same instructions.  Part of sort.h (included after its
// constants); not a standalone header.
//
//                      ours (Aiter)           vLLM                   SGLang
//   key of id          id in [0, E)           id in [0, E) (or       id + 1 in [0, E + 1):
//                      (expert_map[id])       expert_map[id])        E = buckets, bucket 0
//                                                                    the -1 ids
//   sorted id          t | k << 24            i = t * topk + k       i
//   padding id         M                      M * topk               M * topk
//   block label        e                      e (labels[e])          e - 1
//   other outputs      sorted_weights,        scatter_idx (in        scatter_idx
//                      m_indices, reverse     reverse_sorted): i
//                      row; num_valid_ids[1]  or -1
//   rows past total    not written            padding; blocks past the used ones: the tail
//                                             label (-1, or labels[last])
#pragma once

#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

enum class IdFormat { Aiter, Vllm, Sglang };

// The kernels' args of a peer's format: moe_sort's fields hold the peer's buffers
// (sorted_token_ids, sorted_expert_ids = expert_ids over ceil(max_rows / block_m) blocks,
// num_valid_ids = num_tokens_post_pad [1], reverse_sorted = scatter_idx, also the large
// path's scratch as in moe_sort; topk_weights, sorted_weights, m_indices, zero_buf: NULL,
// never touched), max_rows = the rows to write, plus the block labels.
template <IdFormat F>
struct AlignSortArgs : AiterAuxSortArgs {
  const int32_t* labels;  // vLLM: expert_ids of expert e's blocks = labels[e]; NULL: e
  int64_t labels_last;    // the blocks past the used ones: labels[labels_last] (-1 without)
};

// Ours: the code of moe_sort.
template <class A>
struct SortFormat {
  static_assert(sizeof(A) == sizeof(AiterAuxSortArgs), "AiterAuxSortArgs or AlignSortArgs<F>");
  static constexpr IdFormat kFormat = IdFormat::Aiter;
  static constexpr bool kNative = true;  // sorted_weights, m_indices, num_valid_ids[1]
  static constexpr int kKeyOffset = 0;   // key = id + this
  static constexpr bool kFillTail = false;
  __device__ __forceinline__ static int32_t encode(int j, int topk) {
    const int t = j / topk;
    const int k = j - t * topk;
    return static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(k) << 24));
  }
  __device__ __forceinline__ static int32_t pad(const A& a, int /*topk*/) {
    return static_cast<int32_t>(a.num_tokens);
  }
  __device__ __forceinline__ static int32_t reverse(int row, int /*j*/) { return row; }
  __device__ __forceinline__ static int32_t label(const A& /*a*/, int e) { return e; }
  __device__ __forceinline__ static int32_t tail_label(const A& /*a*/) { return -1; }
  // block_m of moe_sort is a power of two (16, 32, 64, 128)
  __device__ __forceinline__ static bool first_row(int p, int bm) { return (p & (bm - 1)) == 0; }
};

template <IdFormat F>
struct SortFormat<AlignSortArgs<F>> {
  using A = AlignSortArgs<F>;
  static constexpr IdFormat kFormat = F;
  static constexpr bool kNative = false;
  static constexpr int kKeyOffset = F == IdFormat::Sglang ? 1 : 0;
  static constexpr bool kFillTail = true;
  __device__ __forceinline__ static int32_t encode(int j, int /*topk*/) { return j; }
  __device__ __forceinline__ static int32_t pad(const A& a, int topk) {
    return static_cast<int32_t>(a.num_tokens * topk);
  }
  __device__ __forceinline__ static int32_t reverse(int /*row*/, int j) { return j; }
  __device__ __forceinline__ static int32_t label(const A& a, int e) {
    if constexpr (F == IdFormat::Sglang) {
      (void)a;
      return e - 1;
    } else {
      return a.labels != nullptr ? a.labels[e] : e;
    }
  }
  __device__ __forceinline__ static int32_t tail_label(const A& a) {
    return a.labels != nullptr ? a.labels[a.labels_last] : -1;
  }
  // the peers' block_size: any value in [1, 2^16]
  __device__ __forceinline__ static bool first_row(int p, int bm) { return block_first_row(p, bm); }
};

// num_valid_ids[0] = the rows of all segments; ours also [1] = M (the peers' is one int).
template <class A>
__device__ __forceinline__ void write_num_valid(const A& a, int rows) {
  a.num_valid_ids[0] = rows;
  if constexpr (SortFormat<A>::kNative) a.num_valid_ids[1] = static_cast<int32_t>(a.num_tokens);
}

// Rows [rows + start, max_rows) (step `stride`) get the padding id and blocks
// [rows / block_m + start, ceil(max_rows / block_m)) the tail label: the part of the peers'
// buffers past the used rows (nothing for ours).  rows: num_valid_ids[0].  The loops run
// once or twice per thread at decode, at the end of the launch: unrolled, each would start
// with an integer division for its trip count (the stride is a runtime value), which
// measured 0.05-0.4 us of the call (H100).
template <int K, class A>
__device__ __forceinline__ void fill_tail(const A& a, int rows, int start, int stride) {
  if constexpr (SortFormat<A>::kFillTail) {
    const int pad = SortFormat<A>::pad(a, K);
    const int cap = static_cast<int>(a.max_rows);
#pragma unroll 1
    for (int r = rows + start; r < cap; r += stride) a.sorted_token_ids[r] = pad;
    const int bm = a.block_m;
    int nblk, b0;
    if ((bm & (bm - 1)) == 0) {  // a uniform branch: shifts for a power of two
      const int lg = popc(static_cast<lane_mask_t>(bm - 1));
      nblk = (cap + bm - 1) >> lg;
      b0 = (rows >> lg) + start;
    } else {
      nblk = (cap + bm - 1) / bm;
      b0 = rows / bm + start;
    }
    if (b0 < nblk) {
      const int32_t tail = SortFormat<A>::tail_label(a);
#pragma unroll 1
      for (int b = b0; b < nblk; b += stride) a.sorted_expert_ids[b] = tail;
    }
  } else {
    (void)a;
    (void)rows;
    (void)start;
    (void)stride;
  }
}

}  // namespace sort_detail
}  // namespace gpu
}  // namespace aiter_aux
