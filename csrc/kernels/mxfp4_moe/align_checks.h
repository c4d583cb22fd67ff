// The run-time checks of an align instance (moe_align_block_size_vllm / _sglang), shared by
// the CPU and GPU kernels: `instance_experts` = a GPU instance's num_experts (0 on the CPU,
// whose kernels take any num_experts in [1, max_experts]), `need` = the op's capacity rule,
// `fail` = the backend's printf-like error setter (it returns
// AITER_AUX_ERR_INVALID_ARGUMENT).  Nothing is written before they pass.
#pragma once

#include <stdint.h>

#include "aiter_aux_limits.h"
#include "mxfp4_moe_aux_abi.h"

namespace aiter_aux {

inline int check_align_args(const AiterAuxAlignArgs& a, const char* op, int32_t instance_experts,
                            int32_t max_experts, int64_t need, int (*fail)(const char*, ...)) {
  if (instance_experts > 0 && a.num_experts != instance_experts)
    return fail("%s: num_experts=%d but the instance is built for %d", op, a.num_experts,
                instance_experts);
  if (a.num_experts < 1 || a.num_experts > max_experts)
    return fail("%s: num_experts=%d not in [1, %d]", op, a.num_experts, max_experts);
  if (a.block_size < 1 || a.block_size > AITER_AUX_MAX_ALIGN_BLOCK_SIZE)
    return fail("%s: block_size=%d not in [1, %d]", op, a.block_size,
                AITER_AUX_MAX_ALIGN_BLOCK_SIZE);
  if (a.numel < 0 || a.numel >= AITER_AUX_MAX_NUM_TOKENS)
    return fail("%s: numel=%lld out of [0, %d)", op, (long long)a.numel, AITER_AUX_MAX_NUM_TOKENS);
  // rows stay int32 with 2^16 to spare for the kernels' index arithmetic past a range
  if (a.capacity < need || a.capacity > AITER_AUX_MAX_ROWS - 65536)
    return fail("%s: capacity=%lld must be >= %lld and <= 2^31 - 2^16 - 1", op,
                (long long)a.capacity, (long long)need);
  if (a.num_tokens_post_pad == nullptr) return fail("%s: num_tokens_post_pad is NULL", op);
  if ((a.capacity > 0 && (a.sorted_token_ids == nullptr || a.expert_ids == nullptr)) ||
      (a.numel > 0 && (a.topk_ids == nullptr || a.scatter_idx == nullptr)))
    return fail("%s: NULL input/output pointer", op);
  if (a.expert_map != nullptr && a.num_global_experts < 0)
    return fail("%s: num_global_experts=%lld < 0", op, (long long)a.num_global_experts);
  if (a.block_expert_map != nullptr && a.block_map_numel < 1)
    return fail("%s: block_expert_map of %lld entries", op, (long long)a.block_map_numel);
  return AITER_AUX_OK;
}

}  // namespace aiter_aux
