// The aux GPU kernels of the MXFP4 MoE path: one header-only HIP source that
// compiles as HIP (hipcc / clang -x hip; gfx950, gfx942, gfx90a) and as CUDA
// (nvcc -x cu; sm_90) through hip_compat.h.  docs/ops.md is the bit-exact spec.
//
// Entry points (namespace aiter_aux::gpu), each returning an AiterAuxStatus and
// launching on `stream` (hipStream_t / cudaStream_t as void*).  None of them
// synchronises, allocates or reads device memory on the host, so all are
// CUDA/HIP-graph capturable:
//
//   template <int NumExperts, int TopK> int moe_sort(const AiterAuxSortArgs&, void*);
//   template <int ModelDim> int mxfp4_quant(const AiterAuxQuantArgs&, void*);
//   template <int NumExperts, int TopK, int ModelDim>
//       int moe_sort_quant(const AiterAuxSortQuantArgs&, void*);
//   template <int ModelDim> int mxfp8_quant(const AiterAuxQuantArgs&, void*);
//   template <int NumExperts, int TopK, int ModelDim>
//       int moe_sort_quant_fp8(const AiterAuxSortQuantArgs&, void*);
//   template <int ModelDim> int moe_sort_scales(const AiterAuxSortScalesArgs&, void*);
//   template <int ModelDim, int TopK> int moe_scatter_reduce(const AiterAuxScatterArgs&, void*);
//   template <int ModelDim, int TopK> int moe_scatter_reduce_q(const AiterAuxScatterArgs&, void*);
//   int moe_sum(const AiterAuxSumArgs&, void*);  (one instance: every shape and dtype)
//   template <int NumExperts> int moe_align_block_size_vllm(const AiterAuxAlignArgs&, void*);
//   template <int NumExperts> int moe_align_block_size_sglang(const AiterAuxAlignArgs&, void*);
//
// Run-time fields that must equal the instance's compile-time ones are checked
// first (AITER_AUX_ERR_INVALID_ARGUMENT + aiter_aux_set_error), then the
// launch error (AITER_AUX_ERR_LAUNCH).
#pragma once

#include "hip_compat.h"
#include "common.h"
#include "quant.h"
#include "sort.h"
#include "align.h"
#include "sort_scales.h"
#include "scatter.h"
#include "sums.h"
