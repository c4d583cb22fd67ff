// moe_align_block_size_vllm and moe_align_block_size_sglang on the GPU: moe_sort's kernels,
// instantiated for the peers' output formats (sort_format.h), so that the ids, the padding,
// the buckets and the block labels come out of the sort itself, with no second pass.  The
// path choice and the launches are moe_sort's (choose_sort_path, launch_choice) for n =
// numel pairs with topk 1: the peers' formats need only the flat pair index.  Any block_size
// in [1, 2^16] (the peers take any): the block sizes of moe_sort (16, 32, 64, 128) take every
// path as moe_sort does; any other size takes the paths whose block arithmetic is general
// (micro, the pair path's kernel of divisions, mid, large: choose_sort_path), never the tiny
// path, which is specialised for a power of two >= 16.  docs/compat.md is the spec.
#pragma once

#include "../align_checks.h"
#include "sort.h"

namespace aiter_aux {
namespace gpu {
namespace sort_detail {

// The sort kernels' args of an align call with nb buckets (the kernels' E).
template <IdFormat F>
inline AlignSortArgs<F> align_sort_args(const AiterAuxAlignArgs& a, int nb) {
  AlignSortArgs<F> k{};
  k.topk_ids = a.topk_ids;
  k.num_tokens = a.numel;  // topk 1: the pairs are the flat indices
  k.num_experts = nb;
  k.topk = 1;
  k.block_m = a.block_size;
  k.max_rows = a.capacity;
  k.sorted_token_ids = a.sorted_token_ids;
  k.sorted_expert_ids = a.expert_ids;
  k.num_valid_ids = a.num_tokens_post_pad;
  k.reverse_sorted = a.scatter_idx;  // scatter_idx, and the large path's scratch
  k.expert_map = a.expert_map;
  k.num_global_experts = a.expert_map != nullptr ? a.num_global_experts : 0;
  k.labels = a.block_expert_map;
  k.labels_last = a.block_expert_map != nullptr ? a.block_map_numel - 1 : -1;
  return k;
}

// NB buckets: the kernels' E.
template <int NB, IdFormat F>
inline int launch_align(const AiterAuxAlignArgs& a, void* stream, const char* op) {
  static_assert(NB >= 1 && NB <= kMaxSortExperts,
                "buckets must be in [1, AITER_AUX_MAX_NUM_EXPERTS]");
  static_assert(sort_smem_bytes<NB>() <= kStaticSmemBytes, "sort shared memory exceeds 48 KiB");
  const AlignSortArgs<F> k = align_sort_args<F>(a, NB);
  const SortProblem p{a.numel,           1, NB,    a.block_size, a.expert_map != nullptr,
                      QuantFormat::None, 0, false, false};
  const SortChoice c = choose_sort_path(host_sort_policy(), p, device_sm_count);
  const AiterAuxQuantArgs none = {};
  return launch_choice<NB, 1, QuantFormat::None, 0>(c, k, none, static_cast<hipStream_t>(stream),
                                                    op);
}

}  // namespace sort_detail

template <int NumExperts>
int moe_align_block_size_vllm(const AiterAuxAlignArgs& a, void* stream) {
  constexpr const char* op = "moe_align_block_size_vllm";
  const int rc = check_align_args(a, op, NumExperts, AITER_AUX_MAX_NUM_EXPERTS,
                                  aiter_aux_vllm_align_capacity(a.numel, NumExperts, a.block_size),
                                  fail_invalid);
  if (rc != AITER_AUX_OK) return rc;
  return sort_detail::launch_align<NumExperts, sort_detail::IdFormat::Vllm>(a, stream, op);
}

// NumExperts routed experts: NumExperts + 1 buckets (bucket 0: the -1 ids).
template <int NumExperts>
int moe_align_block_size_sglang(const AiterAuxAlignArgs& a, void* stream) {
  constexpr const char* op = "moe_align_block_size_sglang";
  if constexpr (NumExperts + 1 > sort_detail::kMaxSortExperts) {
    (void)a;
    (void)stream;
    return fail_invalid("%s: num_experts + 1 = %d buckets exceed %d", op, NumExperts + 1,
                        sort_detail::kMaxSortExperts);
  } else {
    const int rc = check_align_args(
        a, op, NumExperts, AITER_AUX_MAX_NUM_EXPERTS - 1,
        aiter_aux_sglang_align_capacity(a.numel, NumExperts, a.block_size), fail_invalid);
    if (rc != AITER_AUX_OK) return rc;
    return sort_detail::launch_align<NumExperts + 1, sort_detail::IdFormat::Sglang>(a, stream, op);
  }
}

}  // namespace gpu
}  // namespace aiter_aux
