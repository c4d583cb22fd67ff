// CPU kernels of moe_route_sort_quant[_fp8]: moe_route, then moe_sort_quant[_fp8] of its
// outputs.  They call the two ops' generic kernels, which the module compiles in their own
// kernels TUs (route_cpu.h's, core_cpu.h's and mxfp8_cpu.h's), so this header compiles
// nothing of them again.
#pragma once

#include "../mxfp4_moe_aux_abi.h"

extern "C" {
int aiter_aux_cpu_moe_route(const void* args, void* stream);
int aiter_aux_cpu_moe_sort_quant(const void* args, void* stream);
int aiter_aux_cpu_moe_sort_quant_fp8(const void* args, void* stream);
}

namespace aiter_aux {
namespace cpu {

inline int moe_route_sort_quant(const AiterAuxRouteSortQuantArgs& a) {
  const int rc = aiter_aux_cpu_moe_route(&a.route, nullptr);
  return rc != AITER_AUX_OK ? rc : aiter_aux_cpu_moe_sort_quant(&a.sort_quant, nullptr);
}

inline int moe_route_sort_quant_fp8(const AiterAuxRouteSortQuantArgs& a) {
  const int rc = aiter_aux_cpu_moe_route(&a.route, nullptr);
  return rc != AITER_AUX_OK ? rc : aiter_aux_cpu_moe_sort_quant_fp8(&a.sort_quant, nullptr);
}

}  // namespace cpu
}  // namespace aiter_aux
