// The backend-independent part of module_moe_mxfp4_aux: ABI version, the per-thread
// error message, the kernel-call counter and the PDL switch.  Compiled once per build directory (no
// torch header).
#include <stdio.h>
#include <string.h>

#include <atomic>

#include "mxfp4_moe_aux_abi.h"
#include "pdl_switch.h"

namespace {
thread_local char g_last_error[512] = "";
}

extern "C" void aiter_aux_set_error(const char* msg) {
  snprintf(g_last_error, sizeof(g_last_error), "%s", msg ? msg : "");
}

extern "C" const char* aiter_aux_last_error(void) {
  return g_last_error;
}

extern "C" int aiter_aux_abi_version(void) {
  return AITER_AUX_ABI_VERSION;
}

namespace {
std::atomic<int64_t> g_kernel_calls{0};
}

extern "C" void aiter_aux_count_kernel_call(void) {
  g_kernel_calls.fetch_add(1, std::memory_order_relaxed);
}

extern "C" int64_t aiter_aux_kernel_calls(void) {
  return g_kernel_calls.load(std::memory_order_relaxed);
}

extern "C" void aiter_aux_set_pdl(int on) {
  aiter_aux::set_pdl_enabled(on != 0);
}

extern "C" int aiter_aux_pdl(void) {
  return aiter_aux::pdl_enabled() ? 1 : 0;
}
