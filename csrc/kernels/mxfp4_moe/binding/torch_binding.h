// The torch ops of module_moe_mxfp4_aux: validate, fill the C args struct, call the
// instance on torch's current stream.  Included by the generated binding TU
// (templates/binding.j2), which registers each function below under the schema the op
// table (codegen/instances.py OPS) gives it and static_asserts that its C++ type is the
// one that schema implies.  Nothing here changes when a shape is added.
//
// Order of the checks (the reference's, aiter_aux/validation): inputs, output buffers,
// overlap of written and read memory, (CPU) row indices, then the instance lookup.  No
// kernel runs and no byte is written before every check has passed.
#pragma once

#include <algorithm>
#include <atomic>
#include <optional>
#include <tuple>
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
  std::string key = info.name, with, names;
  for (int i = 0; i < info.num_params; ++i) {
    key += cat("_", info.letters[i], values[i]);
    with += cat(i ? ", " : "", info.params[i], "=", values[i]);
    names += cat(i ? ", " : "", info.params[i]);
  }
  std::vector<std::vector<int32_t>> have;
  for (int i = 0, n = aiter_aux_num_instances(); i < n; ++i) {
    const AiterAuxInstance* inst = aiter_aux_instance(i);
    if (inst->op == info.op)
      have.emplace_back(inst->params, inst->params + info.num_params);
  }
  std::sort(have.begin(), have.end());
  std::string supported;
  for (const auto& v : have) {
    supported += supported.empty() ? "(" : ", (";
    for (size_t i = 0; i < v.size(); ++i) supported += cat(i ? ", " : "", v[i]);
    supported += v.size() == 1 ? ",)" : ")";
  }
  fail("UnsupportedShapeError",
       cat("no instance '", key, "': the shape catalog has no shape with ", with,
           ". Supported (", names, "): ", supported,
           ". To add a model shape: `aiter-aux add-shape E,MODEL_DIM,INTER,TOPK` (or add the "
           "tuple to SHAPES in codegen/gen_instances.py and MXFP4_MOE_SUPPORTED_SHAPES in "
           "aiter_aux/ops/moe_mxfp4_aux.py), then `aiter-aux build`."));
}

// The instance of `op` for `values` (its compile-time parameters); the last hit per op is
// remembered, so a steady call sequence costs one comparison.
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
  unsupported(info, values);
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

// ------------------------------------------------------------------- moe_sort(_quant)
const int32_t kNoExpert = -1;  // the map of an empty expert_map tensor (num_global_experts 0)

struct SortSizes {
  int64_t m, k, max_rows, d;
};

// An optional tensor's metadata (nullopt: not given) and a pointer to it (nullptr: none).
inline std::optional<Meta> optional_meta(const std::optional<Tensor>& t, const char* name) {
  return t ? std::optional<Meta>(std::in_place, *t, name) : std::nullopt;
}
inline const Meta* opt_ptr(const std::optional<Meta>& m) { return m ? &*m : nullptr; }

// The sort's optional tensors (zero_buf, expert_map, zero_buf_init), read once.
struct SortOptions {
  std::optional<Meta> zb, map, init;
  SortOptions(const std::optional<Tensor>& zero_buf, const std::optional<Tensor>& expert_map,
              const std::optional<Tensor>& zero_buf_init) {
    if (zero_buf) zb.emplace(*zero_buf, "zero_buf");
    if (expert_map) map.emplace(*expert_map, "expert_map");
    if (zero_buf_init) init.emplace(*zero_buf_init, "zero_buf_init");
  }
  const Meta* z() const { return zb ? &*zb : nullptr; }
  const Meta* m() const { return map ? &*map : nullptr; }
  const Meta* i() const { return init ? &*init : nullptr; }
};

// validate_moe_sort / validate_moe_sort_quant (x may be null)
inline SortSizes check_sort_inputs(const Meta& ids, const Meta& w, const Meta* x,
                                   int64_t num_experts, int64_t block_m, const SortOptions& opt) {
  check_tensor(ids, kInt32(), 2, "[M, topk]");
  check_tensor(w, kFloat32(), 2, "[M, topk]");
  if (w.size(0) != ids.size(0) || w.size(1) != ids.size(1))
    fail("ValueError", cat("topk_weights must have the shape of topk_ids ", ids.shape(), ", got ",
                           w.shape()));
  int64_t d = 0;
  if (x) {
    check_tensor(*x, kBFloat16(), 2, "[M, model_dim]");
    d = x->size(1);
    check_model_dim(d, 32);
  }
  check_same_device({&ids, &w, x});
  check_zero_buf(opt.z(), ids);
  check_expert_map(opt.m(), ids);
  check_zero_buf_init(opt.i(), opt.z(), ids);
  const int64_t m = ids.size(0), k = ids.size(1);
  if (x && x->size(0) != m)
    fail("ValueError", cat("x must have M = topk_ids.shape[0] = ", m, " rows, got ", x->size(0)));
  return {m, k, sort_capacity(m, k, num_experts, block_m), d};
}

struct SortOut {
  Meta sti, sw, mi, sei, nv, rev;
  SortOut(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e,
          const Tensor& f)
      : sti(a, "sorted_token_ids"), sw(b, "sorted_weights"), mi(c, "m_indices"),
        sei(d, "sorted_expert_ids"), nv(e, "num_valid_ids"), rev(f, "reverse_sorted") {}
};

// validate_moe_sort_out
inline void check_sort_out(const SortOut& o, const SortSizes& s, int64_t block_m, const Meta& on) {
  check_buffer(o.sti, kInt32(), s.max_rows, on, 1);
  check_buffer(o.sw, kFloat32(), s.max_rows, on, 1);
  check_buffer(o.mi, kInt32(), s.max_rows, on, 1);
  check_buffer(o.sei, kInt32(), s.max_rows / block_m, on, 1);
  check_buffer(o.nv, kInt32(), 2, on, 1);
  check_buffer(o.rev, kInt32(), s.m * s.k, on, 1);
}

// validate_mxfp4_quant_out (fp8: mxfp8, a_q [M, model_dim])
inline void check_quant_out(const Meta& a_q, const Meta& a_scale, int64_t m, int64_t d,
                            const Meta& on, bool fp8 = false) {
  const int64_t cq = fp8 ? d : d / 2;
  check_buffer(a_q, kUInt8(), m * cq, on, 2, cq);
  check_buffer(a_scale, kUInt8(), m * (d / 32), on, 2, d / 32);
}

// validate_moe_sort_scales_out: the buffer of moe_sort_scales_out for out_rows rows
inline void check_scales_out(const Meta& out, int64_t out_rows, int64_t d, const Meta& on) {
  check_buffer(out, kUInt8(), out_rows * (d / 32), on, 2, d / 32);
}

// check_sorted_scales: the optional sorted_scales of moe_sort_quant[_fp8] (either form),
// checked after the inputs (check_sort_inputs, i.e. validate_moe_sort_quant's last check)
inline void check_sorted_scales(const Meta* ss, const SortSizes& s, int64_t block_m,
                                const Meta& on) {
  if (!ss) return;
  check_scales_out(*ss, sort_scales_rows(s.max_rows, block_m), s.d, on);
  if (s.d % 256 != 0)
    fail("ValueError", cat("sorted_scales needs model_dim a multiple of 256 (the layout of "
                           "moe_sort_scales), got model_dim = ", s.d));
}

inline AiterAuxSortArgs sort_args(const Meta& ids, const Meta& w, const SortSizes& s,
                                  int64_t num_experts, int64_t block_m, const SortOut& o,
                                  const SortOptions& opt) {
  const Meta *zb = opt.z(), *map = opt.m();
  return AiterAuxSortArgs{ptr<const int32_t>(ids), ptr<const float>(w), s.m,
                          int32_t(num_experts), int32_t(s.k), int32_t(block_m), 0, s.max_rows,
                          ptr<int32_t>(o.sti), ptr<float>(o.sw), ptr<int32_t>(o.mi),
                          ptr<int32_t>(o.sei), ptr<int32_t>(o.nv), ptr<int32_t>(o.rev),
                          ptr<uint16_t>(zb), zb ? zb->numel : 0,
                          // a map of 0 entries is "every pair non-local", not "no map"
                          map ? (map->numel ? ptr<const int32_t>(map) : &kNoExpert) : nullptr,
                          map ? map->numel : 0, ptr<const uint16_t>(opt.i())};
}

inline AiterAuxQuantArgs quant_args(const Meta& x, int64_t m, int64_t d, const Meta& a_q,
                                    const Meta& a_scale) {
  return AiterAuxQuantArgs{ptr<const uint16_t>(x), m, int32_t(d), 0, ptr<uint8_t>(a_q),
                           ptr<uint8_t>(a_scale)};
}

inline void moe_sort_out(const Tensor& topk_ids, const Tensor& topk_weights, int64_t num_experts,
                         int64_t block_m, const Tensor& sorted_token_ids,
                         const Tensor& sorted_weights, const Tensor& m_indices,
                         const Tensor& sorted_expert_ids, const Tensor& num_valid_ids,
                         const Tensor& reverse_sorted, const std::optional<Tensor>& zero_buf,
                         const std::optional<Tensor>& expert_map,
                         const std::optional<Tensor>& zero_buf_init) {
  const Meta ids(topk_ids, "topk_ids"), w(topk_weights, "topk_weights");
  const SortOptions opt(zero_buf, expert_map, zero_buf_init);
  const SortSizes s = check_sort_inputs(ids, w, nullptr, num_experts, block_m, opt);
  const SortOut o(sorted_token_ids, sorted_weights, m_indices, sorted_expert_ids, num_valid_ids,
                  reverse_sorted);
  check_sort_out(o, s, block_m, ids);
  check_no_overlap({&o.sti, &o.sw, &o.mi, &o.sei, &o.nv, &o.rev, opt.z()},
                   {&ids, &w, opt.m(), opt.i()});
  const int32_t values[] = {int32_t(num_experts), int32_t(s.k)};
  const AiterAuxInstance& inst = find_instance(AITER_AUX_OP_MOE_SORT, values);
  const AiterAuxSortArgs args = sort_args(ids, w, s, num_experts, block_m, o, opt);
  launch(inst, &args, ids);
}

inline std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> alloc_sort(const Meta& on,
                                                                             const SortSizes& s,
                                                                             int64_t block_m) {
  return {empty(on, {s.max_rows}, kInt32()),           empty(on, {s.max_rows}, kFloat32()),
          empty(on, {s.max_rows}, kInt32()),           empty(on, {s.max_rows / block_m}, kInt32()),
          empty(on, {2}, kInt32()),                    empty(on, {s.m * s.k}, kInt32())};
}

inline std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> moe_sort(
    const Tensor& topk_ids, const Tensor& topk_weights, int64_t num_experts, int64_t block_m,
    const std::optional<Tensor>& zero_buf, const std::optional<Tensor>& expert_map,
    const std::optional<Tensor>& zero_buf_init) {
  const Meta ids(topk_ids, "topk_ids"), w(topk_weights, "topk_weights");
  const SortOptions opt(zero_buf, expert_map, zero_buf_init);
  const SortSizes s = check_sort_inputs(ids, w, nullptr, num_experts, block_m, opt);
  check_no_overlap({opt.z()}, {&ids, &w, opt.m(), opt.i()});
  const int32_t values[] = {int32_t(num_experts), int32_t(s.k)};
  const AiterAuxInstance& inst = find_instance(AITER_AUX_OP_MOE_SORT, values);
  auto out = alloc_sort(ids, s, block_m);
  const SortOut o(std::get<0>(out), std::get<1>(out), std::get<2>(out), std::get<3>(out),
                  std::get<4>(out), std::get<5>(out));
  const AiterAuxSortArgs args = sort_args(ids, w, s, num_experts, block_m, o, opt);
  launch(inst, &args, ids);
  return out;
}

template <int32_t Op>
void sort_quant_out_impl(const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& x_,
                         int64_t num_experts, int64_t block_m, const Tensor& sorted_token_ids,
                         const Tensor& sorted_weights, const Tensor& m_indices,
                         const Tensor& sorted_expert_ids, const Tensor& num_valid_ids,
                         const Tensor& reverse_sorted, const Tensor& a_q_, const Tensor& a_scale_,
                         const std::optional<Tensor>& zero_buf,
                         const std::optional<Tensor>& expert_map,
                         const std::optional<Tensor>& zero_buf_init,
                         const std::optional<Tensor>& sorted_scales) {
  constexpr bool kFp8 = Op == AITER_AUX_OP_MOE_SORT_QUANT_FP8;
  const Meta ids(topk_ids, "topk_ids"), w(topk_weights, "topk_weights"), x(x_, "x");
  const SortOptions opt(zero_buf, expert_map, zero_buf_init);
  const SortSizes s = check_sort_inputs(ids, w, &x, num_experts, block_m, opt);
  const std::optional<Meta> ss = optional_meta(sorted_scales, "sorted_scales");
  check_sorted_scales(opt_ptr(ss), s, block_m, ids);
  const SortOut o(sorted_token_ids, sorted_weights, m_indices, sorted_expert_ids, num_valid_ids,
                  reverse_sorted);
  check_sort_out(o, s, block_m, ids);
  const Meta a_q(a_q_, "a_q"), a_scale(a_scale_, "a_scale");
  check_quant_out(a_q, a_scale, s.m, s.d, x, kFp8);
  check_no_overlap(
      {&o.sti, &o.sw, &o.mi, &o.sei, &o.nv, &o.rev, &a_q, &a_scale, opt.z(), opt_ptr(ss)},
      {&ids, &w, &x, opt.m(), opt.i()});
  const int32_t values[] = {int32_t(num_experts), int32_t(s.k), int32_t(s.d)};
  const AiterAuxInstance& inst = find_instance(Op, values);
  const AiterAuxSortQuantArgs args{sort_args(ids, w, s, num_experts, block_m, o, opt),
                                   quant_args(x, s.m, s.d, a_q, a_scale),
                                   ptr<uint8_t>(opt_ptr(ss))};
  launch(inst, &args, x);
}

using SortQuantResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

template <int32_t Op>
SortQuantResult sort_quant_impl(const Tensor& topk_ids, const Tensor& topk_weights,
                                const Tensor& x_, int64_t num_experts, int64_t block_m,
                                const std::optional<Tensor>& zero_buf,
                                const std::optional<Tensor>& expert_map,
                                const std::optional<Tensor>& zero_buf_init,
                                const std::optional<Tensor>& sorted_scales) {
  constexpr bool kFp8 = Op == AITER_AUX_OP_MOE_SORT_QUANT_FP8;
  const Meta ids(topk_ids, "topk_ids"), w(topk_weights, "topk_weights"), x(x_, "x");
  const SortOptions opt(zero_buf, expert_map, zero_buf_init);
  const SortSizes s = check_sort_inputs(ids, w, &x, num_experts, block_m, opt);
  const std::optional<Meta> ss = optional_meta(sorted_scales, "sorted_scales");
  check_sorted_scales(opt_ptr(ss), s, block_m, ids);
  // check_moe_sort_quant_alloc_call: the caller's buffers against the inputs and each other
  check_no_overlap({opt.z(), opt_ptr(ss)}, {&ids, &w, &x, opt.m(), opt.i()});
  const int32_t values[] = {int32_t(num_experts), int32_t(s.k), int32_t(s.d)};
  const AiterAuxInstance& inst = find_instance(Op, values);
  auto so = alloc_sort(x, s, block_m);
  Tensor q = empty(x, {s.m, kFp8 ? s.d : s.d / 2}, kUInt8()),
         sc = empty(x, {s.m, s.d / 32}, kUInt8());
  const SortOut o(std::get<0>(so), std::get<1>(so), std::get<2>(so), std::get<3>(so),
                  std::get<4>(so), std::get<5>(so));
  const Meta a_q(q, "a_q"), a_scale(sc, "a_scale");
  const AiterAuxSortQuantArgs args{sort_args(ids, w, s, num_experts, block_m, o, opt),
                                   quant_args(x, s.m, s.d, a_q, a_scale),
                                   ptr<uint8_t>(opt_ptr(ss))};
  launch(inst, &args, x);
  return std::tuple_cat(so, std::make_tuple(q, sc));
}

#define AITER_AUX_SORT_QUANT_OPS(NAME, OP)                                                   \
  inline void NAME##_out(                                                                    \
      const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& x, int64_t num_experts, \
      int64_t block_m, const Tensor& sorted_token_ids, const Tensor& sorted_weights,           \
      const Tensor& m_indices, const Tensor& sorted_expert_ids, const Tensor& num_valid_ids,  \
      const Tensor& reverse_sorted, const Tensor& a_q, const Tensor& a_scale,                 \
      const std::optional<Tensor>& zero_buf, const std::optional<Tensor>& expert_map,        \
      const std::optional<Tensor>& zero_buf_init,                                            \
      const std::optional<Tensor>& sorted_scales) {                                          \
    sort_quant_out_impl<OP>(topk_ids, topk_weights, x, num_experts, block_m, sorted_token_ids, \
                            sorted_weights, m_indices, sorted_expert_ids, num_valid_ids,      \
                            reverse_sorted, a_q, a_scale, zero_buf, expert_map,               \
                            zero_buf_init, sorted_scales);                                    \
  }                                                                                          \
  inline SortQuantResult NAME(const Tensor& topk_ids, const Tensor& topk_weights,            \
                              const Tensor& x, int64_t num_experts, int64_t block_m,         \
                              const std::optional<Tensor>& zero_buf,                         \
                              const std::optional<Tensor>& expert_map,                       \
                              const std::optional<Tensor>& zero_buf_init,                    \
                              const std::optional<Tensor>& sorted_scales) {                  \
    return sort_quant_impl<OP>(topk_ids, topk_weights, x, num_experts, block_m, zero_buf,    \
                               expert_map, zero_buf_init, sorted_scales);                    \
  }
AITER_AUX_SORT_QUANT_OPS(moe_sort_quant, AITER_AUX_OP_MOE_SORT_QUANT)
AITER_AUX_SORT_QUANT_OPS(moe_sort_quant_fp8, AITER_AUX_OP_MOE_SORT_QUANT_FP8)
#undef AITER_AUX_SORT_QUANT_OPS

// --------------------------------------------------------------- mxfp4/mxfp8_quant
inline std::pair<int64_t, int64_t> check_quant_input(const Meta& x) {
  check_tensor(x, kBFloat16(), 2, "[M, model_dim]");
  check_model_dim(x.size(1), 32);
  return {x.size(0), x.size(1)};
}

template <int32_t Op>
void quant_out_impl(const Tensor& x_, const Tensor& a_q_, const Tensor& a_scale_) {
  const Meta x(x_, "x");
  const auto [m, d] = check_quant_input(x);
  const Meta a_q(a_q_, "a_q"), a_scale(a_scale_, "a_scale");
  check_quant_out(a_q, a_scale, m, d, x, Op == AITER_AUX_OP_MXFP8_QUANT);
  check_no_overlap({&a_q, &a_scale}, {&x});
  const int32_t values[] = {int32_t(d)};
  const AiterAuxInstance& inst = find_instance(Op, values);
  const AiterAuxQuantArgs args = quant_args(x, m, d, a_q, a_scale);
  launch(inst, &args, x);
}

template <int32_t Op>
std::tuple<Tensor, Tensor> quant_impl(const Tensor& x_) {
  const Meta x(x_, "x");
  const auto [m, d] = check_quant_input(x);
  const int32_t values[] = {int32_t(d)};
  const AiterAuxInstance& inst = find_instance(Op, values);
  const int64_t cq = Op == AITER_AUX_OP_MXFP8_QUANT ? d : d / 2;
  Tensor q = empty(x, {m, cq}, kUInt8()), sc = empty(x, {m, d / 32}, kUInt8());
  const Meta a_q(q, "a_q"), a_scale(sc, "a_scale");
  const AiterAuxQuantArgs args = quant_args(x, m, d, a_q, a_scale);
  launch(inst, &args, x);
  return {q, sc};
}

inline void mxfp4_quant_out(const Tensor& x, const Tensor& a_q, const Tensor& a_scale) {
  quant_out_impl<AITER_AUX_OP_MXFP4_QUANT>(x, a_q, a_scale);
}
inline std::tuple<Tensor, Tensor> mxfp4_quant(const Tensor& x) {
  return quant_impl<AITER_AUX_OP_MXFP4_QUANT>(x);
}
inline void mxfp8_quant_out(const Tensor& x, const Tensor& a_q, const Tensor& a_scale) {
  quant_out_impl<AITER_AUX_OP_MXFP8_QUANT>(x, a_q, a_scale);
}
inline std::tuple<Tensor, Tensor> mxfp8_quant(const Tensor& x) {
  return quant_impl<AITER_AUX_OP_MXFP8_QUANT>(x);
}

// ------------------------------------------------------------------- moe_sort_scales
struct ScalesSizes {
  int64_t m, d, max_rows, out_rows;
};

inline ScalesSizes check_scales_inputs(const Meta& a_scale, const Meta& sti, const Meta& nv,
                                       int64_t block_m) {
  check_tensor(a_scale, kUInt8(), 2, "[M, model_dim/32]");
  check_tensor(sti, kInt32(), 1, "[max_rows]");
  check_tensor(nv, kInt32(), 1, "[2]");
  if (nv.numel < 2) fail("ValueError", cat("num_valid_ids must have 2 elements, got ", nv.numel));
  check_same_device({&a_scale, &sti, &nv});
  const int64_t b = check_block_m(block_m);
  const int64_t m = a_scale.size(0), cols = a_scale.size(1);
  if (cols == 0 || cols % 8 != 0)
    fail("ValueError", cat("a_scale must have model_dim/32 columns with model_dim a positive "
                           "multiple of 256, got ",
                           cols, " columns (model_dim = ", cols * 32, ")"));
  const int64_t max_rows = sti.numel;
  if (max_rows % b != 0)
    fail("ValueError", cat("sorted_token_ids length (max_rows = ", max_rows,
                           ") must be a multiple of block_m = ", b));
  return {m, cols * 32, max_rows, sort_scales_rows(max_rows, b)};
}

inline void scales_launch(const Meta& a_scale, const Meta& sti, const Meta& nv, int64_t block_m,
                          const ScalesSizes& s, const Meta& out,
                          const AiterAuxInstance& inst) {
  const AiterAuxSortScalesArgs args{ptr<const uint8_t>(a_scale), s.m, int32_t(s.d),
                                    int32_t(block_m), ptr<const int32_t>(sti),
                                    ptr<const int32_t>(nv), s.max_rows, ptr<uint8_t>(out)};
  launch(inst, &args, a_scale);
}

inline void moe_sort_scales_out(const Tensor& a_scale_, const Tensor& sorted_token_ids,
                                const Tensor& num_valid_ids, int64_t block_m,
                                const Tensor& sorted_scales) {
  const Meta a_scale(a_scale_, "a_scale"), sti(sorted_token_ids, "sorted_token_ids"),
      nv(num_valid_ids, "num_valid_ids");
  const ScalesSizes s = check_scales_inputs(a_scale, sti, nv, block_m);
  const Meta out(sorted_scales, "sorted_scales");
  check_scales_out(out, s.out_rows, s.d, a_scale);
  check_no_overlap({&out}, {&a_scale, &sti, &nv});
  const int32_t values[] = {int32_t(s.d)};
  scales_launch(a_scale, sti, nv, block_m, s, out,
                find_instance(AITER_AUX_OP_MOE_SORT_SCALES, values));
}

inline Tensor moe_sort_scales(const Tensor& a_scale_, const Tensor& sorted_token_ids,
                              const Tensor& num_valid_ids, int64_t block_m) {
  const Meta a_scale(a_scale_, "a_scale"), sti(sorted_token_ids, "sorted_token_ids"),
      nv(num_valid_ids, "num_valid_ids");
  const ScalesSizes s = check_scales_inputs(a_scale, sti, nv, block_m);
  const int32_t values[] = {int32_t(s.d)};
  const AiterAuxInstance& inst = find_instance(AITER_AUX_OP_MOE_SORT_SCALES, values);
  Tensor t = empty(a_scale, {s.out_rows, s.d / 32}, kUInt8());
  scales_launch(a_scale, sti, nv, block_m, s, Meta(t, "sorted_scales"), inst);
  return t;
}

// ------------------------------------------------------------ moe_scatter_reduce(_q)
struct ScatterSizes {
  int64_t m, rows, d, k;
};

// _check_scatter_routing
inline int64_t check_scatter_routing(const Meta& rev, const Meta& sw, int64_t topk, int64_t rows) {
  check_tensor(rev, kInt32(), 1, "[M*topk]");
  check_tensor(sw, kFloat32(), 1, "[>= rows]");
  const int64_t k = check_topk(topk);
  if (rev.numel % k != 0)
    fail("ValueError", cat("reverse_sorted length (", rev.numel,
                           ") must be M*topk, a multiple of topk = ", k));
  if (sw.numel < rows)
    fail("ValueError", cat("sorted_weights must have >= rows of expert_out = ", rows,
                           " elements, got ", sw.numel));
  return rev.numel / k;
}

// validate_reverse_sorted_range, where reading it is free (CPU)
inline void check_rows_cpu(const Meta& rev, int64_t rows) {
  if (rev.device_type != aoti_torch_device_type_cpu() || rev.numel == 0) return;
  const int32_t* p = ptr<const int32_t>(rev);
  const int32_t hi = *std::max_element(p, p + rev.numel);
  if (hi >= rows)
    fail("ValueError", cat("reverse_sorted holds row index ", hi, ", but expert_out has only ",
                           rows, " rows (every p must be < rows)"));
}

inline void scatter_run(int32_t op, const Meta* eo, const Meta* q, const Meta* sc, const Meta& rev,
                        const Meta& sw, const ScatterSizes& s, const Meta& out, const Meta& on,
                        double routed_scaling_factor) {
  check_rows_cpu(rev, s.rows);
  const int32_t values[] = {int32_t(s.d), int32_t(s.k)};
  const AiterAuxInstance& inst = find_instance(op, values);
  const AiterAuxScatterArgs args{ptr<const uint16_t>(eo), ptr<const uint8_t>(q),
                                 ptr<const uint8_t>(sc), s.rows, ptr<const int32_t>(rev),
                                 ptr<const float>(sw), s.m, int32_t(s.d), int32_t(s.k),
                                 ptr<uint16_t>(out), float(routed_scaling_factor), 0};
  launch(inst, &args, on);
}

inline ScatterSizes check_scatter_inputs(const Meta& eo, const Meta& rev, const Meta& sw,
                                         int64_t topk) {
  check_tensor(eo, kBFloat16(), 2, "[rows, model_dim]");
  const int64_t rows = eo.size(0), d = eo.size(1);
  if (d == 0) fail("ValueError", "expert_out must have model_dim >= 1 columns, got 0");
  const int64_t m = check_scatter_routing(rev, sw, topk, rows);
  check_same_device({&eo, &rev, &sw});
  return {m, rows, d, topk};
}

inline void moe_scatter_reduce_out(const Tensor& expert_out, const Tensor& reverse_sorted,
                                   const Tensor& sorted_weights, int64_t topk, const Tensor& out_,
                                   double routed_scaling_factor) {
  const Meta eo(expert_out, "expert_out"), rev(reverse_sorted, "reverse_sorted"),
      sw(sorted_weights, "sorted_weights");
  const ScatterSizes s = check_scatter_inputs(eo, rev, sw, topk);
  const Meta out(out_, "out");
  check_buffer(out, kBFloat16(), s.m * s.d, eo, 2, s.d);
  check_no_overlap({&out}, {&eo, &rev, &sw});
  scatter_run(AITER_AUX_OP_MOE_SCATTER_REDUCE, &eo, nullptr, nullptr, rev, sw, s, out, eo,
              routed_scaling_factor);
}

inline Tensor moe_scatter_reduce(const Tensor& expert_out, const Tensor& reverse_sorted,
                                 const Tensor& sorted_weights, int64_t topk,
                                 double routed_scaling_factor) {
  const Meta eo(expert_out, "expert_out"), rev(reverse_sorted, "reverse_sorted"),
      sw(sorted_weights, "sorted_weights");
  const ScatterSizes s = check_scatter_inputs(eo, rev, sw, topk);
  Tensor t = empty(eo, {s.m, s.d}, kBFloat16());
  scatter_run(AITER_AUX_OP_MOE_SCATTER_REDUCE, &eo, nullptr, nullptr, rev, sw, s,
              Meta(t, "out"), eo, routed_scaling_factor);
  return t;
}

inline ScatterSizes check_scatter_q_inputs(const Meta& q, const Meta& sc, const Meta& rev,
                                           const Meta& sw, int64_t topk) {
  check_tensor(q, kUInt8(), 2, "[rows, model_dim/2]");
  check_tensor(sc, kUInt8(), 2, "[rows, model_dim/32]");
  const int64_t rows = sc.size(0), cs = sc.size(1);
  if (cs == 0) fail("ValueError", "expert_out_scale must have model_dim/32 >= 1 columns, got 0");
  if (q.size(0) != rows || q.size(1) != 16 * cs)
    fail("ValueError", cat("expert_out_q must have shape [rows, model_dim/2] = [", rows, ", ",
                           16 * cs, "] to match expert_out_scale ", sc.shape(), ", got ",
                           q.shape()));
  const int64_t m = check_scatter_routing(rev, sw, topk, rows);
  check_same_device({&q, &sc, &rev, &sw});
  return {m, rows, 32 * cs, topk};
}

inline void moe_scatter_reduce_q_out(const Tensor& expert_out_q, const Tensor& expert_out_scale,
                                     const Tensor& reverse_sorted, const Tensor& sorted_weights,
                                     int64_t topk, const Tensor& out_,
                                     double routed_scaling_factor) {
  const Meta q(expert_out_q, "expert_out_q"), sc(expert_out_scale, "expert_out_scale"),
      rev(reverse_sorted, "reverse_sorted"), sw(sorted_weights, "sorted_weights");
  const ScatterSizes s = check_scatter_q_inputs(q, sc, rev, sw, topk);
  const Meta out(out_, "out");
  check_buffer(out, kBFloat16(), s.m * s.d, q, 2, s.d);
  check_no_overlap({&out}, {&q, &sc, &rev, &sw});
  scatter_run(AITER_AUX_OP_MOE_SCATTER_REDUCE_Q, nullptr, &q, &sc, rev, sw, s, out, q,
              routed_scaling_factor);
}

inline Tensor moe_scatter_reduce_q(const Tensor& expert_out_q, const Tensor& expert_out_scale,
                                   const Tensor& reverse_sorted, const Tensor& sorted_weights,
                                   int64_t topk, double routed_scaling_factor) {
  const Meta q(expert_out_q, "expert_out_q"), sc(expert_out_scale, "expert_out_scale"),
      rev(reverse_sorted, "reverse_sorted"), sw(sorted_weights, "sorted_weights");
  const ScatterSizes s = check_scatter_q_inputs(q, sc, rev, sw, topk);
  Tensor t = empty(q, {s.m, s.d}, kBFloat16());
  scatter_run(AITER_AUX_OP_MOE_SCATTER_REDUCE_Q, nullptr, &q, &sc, rev, sw, s, Meta(t, "out"), q,
              routed_scaling_factor);
  return t;
}

}  // namespace
}  // namespace binding
}  // namespace aiter_aux
