// The backend-independent part of module_moe_mxfp4_aux: ABI version, the per-thread
// error message, the kernel-call counter, the PDL switch and the table of instances loaded
// on demand with its resolver.  Compiled once per build directory (no torch header).
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <string>

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

extern "C" void* aiter_aux_pdl_flag(void) {
  return &aiter_aux::g_pdl_enabled;
}

// ------------------------------------------------ instances registered at run time
namespace {
// Append-only: a slot is written once, under the mutex, before the count that publishes it.
struct Registered {
  std::string key;
  AiterAuxInstance inst;
};
Registered* g_registered[AITER_AUX_MAX_REGISTERED];
std::atomic<int> g_num_registered{0};
std::mutex g_register_mutex;
std::atomic<AiterAuxResolver> g_resolver{nullptr};

bool same(const AiterAuxInstance& inst, int32_t op, const int32_t* params, int32_t n) {
  if (inst.op != op) return false;
  for (int32_t i = 0; i < n; ++i)
    if (inst.params[i] != params[i]) return false;
  return true;
}
}  // namespace

extern "C" const AiterAuxInstance* aiter_aux_find_registered(int32_t op, const int32_t* params,
                                                             int32_t num_params) {
  const int n = g_num_registered.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (same(g_registered[i]->inst, op, params, num_params)) return &g_registered[i]->inst;
  return nullptr;
}

extern "C" int aiter_aux_register_instance(const char* key, int32_t op, const int32_t* params,
                                           AiterAuxFn fn) {
  std::lock_guard<std::mutex> hold(g_register_mutex);
  const int n = g_num_registered.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i)
    if (g_registered[i]->key == key) return 0;  // registered already
  if (n >= AITER_AUX_MAX_REGISTERED) return -1;
  Registered* r = new Registered{key, {}};
  r->inst.key = r->key.c_str();
  r->inst.op = op;
  for (int i = 0; i < AITER_AUX_MAX_PARAMS; ++i) r->inst.params[i] = params[i];
  r->inst.fn = fn;
  g_registered[n] = r;
  g_num_registered.store(n + 1, std::memory_order_release);
  return 0;
}

extern "C" int aiter_aux_num_registered(void) {
  return g_num_registered.load(std::memory_order_acquire);
}

extern "C" void aiter_aux_set_resolver(AiterAuxResolver resolver) {
  g_resolver.store(resolver, std::memory_order_release);
}

extern "C" AiterAuxResolver aiter_aux_resolver(void) {
  return g_resolver.load(std::memory_order_acquire);
}
