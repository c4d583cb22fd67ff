// CPU kernels of moe_align_block_size_vllm and moe_align_block_size_sglang: the sort of
// moe_sort in vLLM's and SGLang's output formats (docs/compat.md is the spec, every output
// byte equals aiter_aux/reference/compat.py).  The format (which bucket a pair's id falls
// into, how a block is labelled, what pads) is a template parameter; num_experts and
// block_size are read from the args at run time (one generic kernel per format, compiled
// once per module).  Self-contained: it includes no other op's kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "../align_checks.h"
#include "../mxfp4_moe_aux_abi.h"
#include "cpu_common.h"

namespace aiter_aux {
namespace cpu {

enum class AlignFormat { Vllm, Sglang };

namespace detail {

// The bucket of id `id` in [0, NB), or -1 (dropped).  vLLM: the expert (expert_map[id] with
// a map), NB = E; SGLang: id + 1, NB = E + 1 (bucket 0 holds the -1 ids).
template <AlignFormat F>
inline int64_t align_bucket(const AiterAuxAlignArgs& a, int64_t E, int32_t id) {
  if constexpr (F == AlignFormat::Sglang) {
    const int64_t b = int64_t(id) + 1;
    return b >= 0 && b <= E ? b : -1;
  } else {
    if (id < 0 || id >= E) return -1;
    if (a.expert_map == nullptr) return id;
    const int64_t e = id < a.num_global_experts ? a.expert_map[id] : -1;
    return e >= 0 && e < E ? e : -1;
  }
}

// Counting sort into block-padded bucket segments, ascending pair index inside a bucket.
template <AlignFormat F>
int align_impl(const AiterAuxAlignArgs& a) {
  const int64_t E = a.num_experts;
  const int NB = static_cast<int>(F == AlignFormat::Sglang ? E + 1 : E);
  const int64_t n = a.numel;
  const int64_t bs = a.block_size;
  const int32_t* __restrict ids = a.topk_ids;
  std::vector<int64_t> cnt(NB, 0), pos(NB);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = align_bucket<F>(a, E, ids[i]);
    if (b >= 0) ++cnt[b];
  }
  int64_t total = 0;
  for (int b = 0; b < NB; ++b) {
    pos[b] = total;
    if (cnt[b]) total += round_up(cnt[b], bs);  // no division for an empty bucket
  }
  // total <= capacity: at most min(n, NB) segments, each wasting < bs rows (check_align_args).
  const int32_t pad = static_cast<int32_t>(n);
  int32_t* __restrict sti = a.sorted_token_ids;
  for (int64_t r = 0; r < a.capacity; ++r) sti[r] = pad;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = align_bucket<F>(a, E, ids[i]);
    if (b >= 0) sti[pos[b]++] = static_cast<int32_t>(i);
    a.scatter_idx[i] = b >= 0 ? static_cast<int32_t>(i) : -1;
  }
  // Labels: vLLM e (block_expert_map[e] with labels), SGLang e - 1; past the used blocks
  // -1 (the labels' last entry with labels).
  const int32_t* lab = a.block_expert_map;
  int64_t blk = 0;
  for (int b = 0; b < NB; ++b) {
    if (!cnt[b]) continue;
    const int64_t nb = ceil_div(cnt[b], bs);
    int32_t label = F == AlignFormat::Sglang ? b - 1 : (lab != nullptr ? lab[b] : b);
    for (int64_t j = 0; j < nb; ++j) a.expert_ids[blk++] = label;
  }
  const int32_t tail = lab != nullptr ? lab[a.block_map_numel - 1] : -1;
  for (const int64_t nblk = ceil_div(a.capacity, bs); blk < nblk; ++blk) a.expert_ids[blk] = tail;
  a.num_tokens_post_pad[0] = static_cast<int32_t>(total);
  return AITER_AUX_OK;
}

}  // namespace detail

inline int moe_align_block_size_vllm(const AiterAuxAlignArgs& a) {
  const int rc = check_align_args(
      a, "moe_align_block_size_vllm", 0, AITER_AUX_MAX_NUM_EXPERTS,
      aiter_aux_vllm_align_capacity(a.numel, a.num_experts, a.block_size), detail::invalid_arg);
  if (rc != AITER_AUX_OK) return rc;
  return detail::align_impl<AlignFormat::Vllm>(a);
}

// num_experts + 1 buckets (bucket 0: id -1) must fit the limit.
inline int moe_align_block_size_sglang(const AiterAuxAlignArgs& a) {
  const int rc = check_align_args(
      a, "moe_align_block_size_sglang", 0, AITER_AUX_MAX_NUM_EXPERTS - 1,
      aiter_aux_sglang_align_capacity(a.numel, a.num_experts, a.block_size), detail::invalid_arg);
  if (rc != AITER_AUX_OK) return rc;
  return detail::align_impl<AlignFormat::Sglang>(a);
}

}  // namespace cpu
}  // namespace aiter_aux
