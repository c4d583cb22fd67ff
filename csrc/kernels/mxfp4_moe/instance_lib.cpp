// The link of an instance library: one instance TU built on demand into its own shared
// library (aiter_aux/jit/ondemand.py), loaded into a process that has module_moe_mxfp4_aux
// loaded already.  The kernels report errors and read the PDL switch through the module, and
// a CPU instance calls the module's generic kernel of its op: aiter_aux_link_module hands
// this library the module's error setter, PDL flag and CPU kernel table (NULL from a GPU
// module) before its instance is registered with the module (aiter_aux_register_instance).
// No torch header.
#include <atomic>

#include "mxfp4_moe_aux_abi.h"
#include "pdl_switch.h"

namespace {
void (*g_set_error)(const char*) = nullptr;
AiterAuxFn (*g_cpu_kernel)(int32_t) = nullptr;

int unlinked(const void*, void*) {
  if (g_set_error) g_set_error("instance library not linked to a CPU module");
  return AITER_AUX_ERR_INVALID_ARGUMENT;
}
}  // namespace

extern "C" void aiter_aux_set_error(const char* msg) {
  if (g_set_error) g_set_error(msg);
}

extern "C" int aiter_aux_abi_version(void) {
  return AITER_AUX_ABI_VERSION;
}

extern "C" AiterAuxFn aiter_aux_cpu_kernel(int32_t op) {
  return g_cpu_kernel ? g_cpu_kernel(op) : &unlinked;
}

extern "C" void aiter_aux_link_module(void (*set_error)(const char*), void* pdl_flag,
                                      AiterAuxFn (*cpu_kernel)(int32_t)) {
  g_set_error = set_error;
  aiter_aux::g_pdl_flag = static_cast<std::atomic<int>*>(pdl_flag);
  g_cpu_kernel = cpu_kernel;
}
