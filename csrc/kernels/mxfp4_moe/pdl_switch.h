// The run-time switch of programmatic dependent launch (PDL): one flag per process, set by
// aiter_aux_set_pdl (module_common.cpp; the loader sets it from AITER_AUX_PDL) and read once
// per kernel launch by the CUDA launches of gpu/hip_compat.h.  An inline variable, so that
// every translation unit that includes this header (the module's, and the hand-built device
// tools of gpu/tests/, which have no module_common.cpp) shares the one definition.
#pragma once

#include <atomic>

namespace aiter_aux {

inline std::atomic<int> g_pdl_enabled{0};
// The flag read at each launch: the module's own, or, in an instance library loaded on demand
// (instance_lib.cpp), the module's flag it was linked to.
inline std::atomic<int>* g_pdl_flag = &g_pdl_enabled;

inline bool pdl_enabled() {
  return g_pdl_flag->load(std::memory_order_relaxed) != 0;
}
inline void set_pdl_enabled(bool on) {
  g_pdl_flag->store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace aiter_aux
