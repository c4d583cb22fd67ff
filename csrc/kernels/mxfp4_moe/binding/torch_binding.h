// What the generated binding (templates/binding.j2) calls besides the checks of checks.h:
// the instance lookup, the launch on torch's current stream and the helpers of the
// generated argument code.  The per-op functions themselves are generated from the op
// table (codegen/ops.py): checks (in the reference's order: inputs, rules, output
// buffers, overlap, then CPU-only data checks), instance lookup, allocation, args struct,
// launch.  No kernel runs and no byte is written before every check has passed.
#pragma once

#include <algorithm>
#include <atomic>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../mxfp4_moe_aux_abi.h"
#include "checks.h"

namespace aiter_aux {
namespace binding {
// Internal linkage for everything: a process may load a CPU and a CUDA module, and the
// static locals of inline functions would otherwise be one (STB_GNU_UNIQUE) object shared
// by both, e.g. find_instance's cache handing the CUDA binding a CPU kernel.
namespace {

// One op's names, for messages (generated from the op table in binding.j2).
struct OpInfo {
  int32_t op;
  const char* name;
  int32_t num_params;
  const char* params[AITER_AUX_MAX_PARAMS];
  const char* letters[AITER_AUX_MAX_PARAMS];
};
const OpInfo& op_info(int32_t op);  // defined by the generated binding TU

[[noreturn]] inline void unsupported(const OpInfo& info, const int32_t* values) {
  std::string key = info.name;
  for (int i = 0; i < info.num_params; ++i) key += cat("_", info.letters[i], values[i]);
  fail("UnsupportedShapeError",
       cat("no instance '", key, "' (fix: call the op through aiter_aux with JIT on): ",
           "this module was loaded without its on-demand loader"));
}

// The instance of `op` for `values` (its compile-time parameters): the module's own table
// (the prebuilt set), then the instances registered at run time; on a miss the resolver
// (aiter_aux/jit/ondemand.py) builds and registers it, or says why not.  The last hit per op
// is remembered, so a steady call sequence costs one comparison.
inline const AiterAuxInstance& find_instance(int32_t op, const int32_t* values) {
  static std::atomic<const AiterAuxInstance*> last[16];
  const OpInfo& info = op_info(op);
  auto match = [&](const AiterAuxInstance* inst) {
    if (!inst || inst->op != op) return false;
    for (int i = 0; i < info.num_params; ++i)
      if (inst->params[i] != values[i]) return false;
    return true;
  };
  std::atomic<const AiterAuxInstance*>& slot = last[op & 15];
  const AiterAuxInstance* hit = slot.load(std::memory_order_relaxed);
  if (match(hit)) return *hit;
  for (int i = 0, n = aiter_aux_num_instances(); i < n; ++i) {
    const AiterAuxInstance* inst = aiter_aux_instance(i);
    if (match(inst)) {
      slot.store(inst, std::memory_order_relaxed);
      return *inst;
    }
  }
  hit = aiter_aux_find_registered(op, values, info.num_params);
  if (!hit) {
    char error[2048] = "";
    const AiterAuxResolver resolve = aiter_aux_resolver();
    if (resolve && resolve(op, values, info.num_params, error, sizeof(error)) == 0)
      hit = aiter_aux_find_registered(op, values, info.num_params);
    if (!hit && error[0]) throw std::runtime_error(error);  // "<ErrorType>: <message>"
  }
  if (!hit) unsupported(info, values);
  slot.store(hit, std::memory_order_relaxed);
  return *hit;
}

#if defined(AITER_AUX_GPU)
// Makes `index` the current device for the scope when it is not (multi-GPU callers).
struct DeviceGuard {
  CUDAGuardHandle guard = nullptr;
  explicit DeviceGuard(int32_t index) {
    int32_t current = -1;
    shim(aoti_torch_get_current_device_index(&current), "get_current_device_index");
    if (current != index) shim(aoti_torch_create_cuda_guard(index, &guard), "create_cuda_guard");
  }
  ~DeviceGuard() {
    if (guard) aoti_torch_delete_cuda_guard(guard);
  }
};
#endif

// Calls the instance on the current stream of `on`'s device.
inline void launch(const AiterAuxInstance& inst, const void* args, const Meta& on) {
  void* stream = nullptr;
#if defined(AITER_AUX_GPU)
  DeviceGuard guard(on.device_index);
  shim(aoti_torch_get_current_cuda_stream(on.device_index, &stream), "get_current_cuda_stream");
#else
  (void)on;
#endif
  aiter_aux_count_kernel_call();
  const int status = inst.fn(args, stream);
  if (status != AITER_AUX_OK) fail("RuntimeError", cat(inst.key, ": ", aiter_aux_last_error()));
}

template <class T>
T* ptr(const Meta& t) {  // NULL for an empty tensor, as the kernels expect
  return t.numel == 0 ? nullptr : static_cast<T*>(t.data());
}
template <class T>
T* ptr(const Meta* t) {
  return t ? ptr<T>(*t) : nullptr;
}

// ------------------------------------------------------------ for the generated code
// An optional tensor's metadata (nullopt: not given) and a pointer to it (nullptr: none).
inline std::optional<Meta> optional_meta(const std::optional<Tensor>& t, const char* name) {
  return t ? std::optional<Meta>(std::in_place, *t, name) : std::nullopt;
}
inline const Meta* opt_ptr(const std::optional<Meta>& m) { return m ? &*m : nullptr; }
inline int64_t opt_numel(const std::optional<Meta>& m) { return m ? m->numel : 0; }

// An int64_t that converts to the integer type of the struct field it initialises (a
// brace initialiser would refuse the narrowing; the checks have bounded every value).
struct I {
  int64_t v;
  template <class T, class = std::enable_if_t<std::is_integral_v<T>>>
  constexpr operator T() const {
    return static_cast<T>(v);
  }
};

// The expert_map of a sort: a map of 0 entries is "every pair non-local", not "no map".
const int32_t kNoExpert = -1;
inline const int32_t* expert_map_ptr(const std::optional<Meta>& map) {
  if (!map) return nullptr;
  return map->numel ? ptr<const int32_t>(*map) : &kNoExpert;
}

// validation.tensors.rows_in_range, where reading reverse_sorted is free (the CPU); the
// GPU binding does not read it (checking would synchronise).
inline void rows_in_range(const Meta& rev, int64_t rows) {
  if (rev.device_type != aoti_torch_device_type_cpu() || rev.numel == 0) return;
  const int32_t* p = ptr<const int32_t>(rev);
  const int32_t hi = *std::max_element(p, p + rev.numel);
  if (hi >= rows)
    fail("ValueError", cat("reverse_sorted holds row index ", hi, ", but expert_out has only ",
                           rows, " rows (every p must be < rows)"));
}

}  // namespace
}  // namespace binding
}  // namespace aiter_aux
