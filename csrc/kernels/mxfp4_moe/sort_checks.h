// The run-time checks of the arguments the sort family shares (moe_sort[_quant[_fp8]],
// moe_sort_scales), by the CPU and GPU kernels alike: block_m, num_tokens and the range of
// max_rows (each op checks its own rule on max_rows besides).  `fail` = the backend's
// printf-like error setter (it returns AITER_AUX_ERR_INVALID_ARGUMENT), as in align_checks.h.
// Nothing is written before they pass.
#pragma once

#include <stdint.h>

#include "aiter_aux_limits.h"
#include "mxfp4_moe_aux_abi.h"

namespace aiter_aux {

inline int check_sort_rows(int32_t block_m, int64_t num_tokens, int64_t max_rows, const char* op,
                           int (*fail)(const char*, ...)) {
  if (!AITER_AUX_VALID_BLOCK_M(block_m))
    return fail("%s: block_m=%d not in " AITER_AUX_BLOCK_M_SET, op, block_m);
  if (num_tokens < 0 || num_tokens >= AITER_AUX_MAX_NUM_TOKENS)
    return fail("%s: num_tokens=%lld out of [0, %d)", op, (long long)num_tokens,
                AITER_AUX_MAX_NUM_TOKENS);
  if (max_rows < 0 || max_rows > AITER_AUX_MAX_ROWS)
    return fail("%s: max_rows=%lld out of [0, 2^31)", op, (long long)max_rows);
  return AITER_AUX_OK;
}

}  // namespace aiter_aux
