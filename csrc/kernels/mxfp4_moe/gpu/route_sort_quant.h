// moe_route_sort_quant[_fp8] on the GPU: moe_route's launch, then moe_sort_quant[_fp8]'s on
// its outputs (the second with PDL where it is on: its blocks start while the gate ends).
#pragma once

#include "route.h"
#include "sort.h"

namespace aiter_aux {
namespace gpu {

template <int NumExperts, int TopK, int ModelDim>
int moe_route_sort_quant(const AiterAuxRouteSortQuantArgs& a, void* stream) {
  const int rc = moe_route(a.route, stream);
  return rc != AITER_AUX_OK ? rc : moe_sort_quant<NumExperts, TopK, ModelDim>(a.sort_quant, stream);
}

template <int NumExperts, int TopK, int ModelDim>
int moe_route_sort_quant_fp8(const AiterAuxRouteSortQuantArgs& a, void* stream) {
  const int rc = moe_route(a.route, stream);
  return rc != AITER_AUX_OK ? rc
                            : moe_sort_quant_fp8<NumExperts, TopK, ModelDim>(a.sort_quant, stream);
}

}  // namespace gpu
}  // namespace aiter_aux
