// Argument checks of the torch binding, through torch's stable C ABI (shim) only.
//
// Each function is the C++ twin of a helper of aiter_aux/validation/tensors.py with the
// same message; the generated binding calls them in the order of the generated Python
// validators (both from codegen/ops.py), so the compiled ops and the reference reject an
// input the same way.  An error leaves as std::runtime_error whose what() is
// "<PythonType>: <message>" (ValueError, TypeError, UnsupportedShapeError, RuntimeError);
// aiter_aux/ops/_library.py translate() turns the prefix back into that exception type.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "../mxfp4_moe_aux_abi.h"
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace aiter_aux {
namespace binding {
// Internal linkage for everything: a process may load a CPU and a CUDA module, and the
// static locals of inline functions would otherwise be one (STB_GNU_UNIQUE) object shared
// by both, e.g. find_instance's cache handing the CUDA binding a CPU kernel.
namespace {

using torch::stable::Tensor;

// Message text from strings and integers.  No iostream: its locale machinery is shared
// with the process's libstdc++ in ways a module built by another compiler may not match
// (an ostream << int crashed in the module on the H200: g++ 13 module, torch 2.11).
inline void append(std::string& s, const char* v) {
  s += v;
}
inline void append(std::string& s, const std::string& v) {
  s += v;
}
template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
void append(std::string& s, I v) {
  s += std::to_string(v);
}

inline void append(std::string& s, double v) {  // as Python's f"{v:g}"
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  s += b;
}

// The shortest digits that read back as v, as Python's repr of a float in exponent form
// (|v| >= 1e16, inf, nan: the values check_finite reports).
inline std::string shortest(double v) {
  char b[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(b, sizeof b, "%.*g", p, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

template <class... A>
std::string cat(const A&... a) {
  std::string s;
  (append(s, a), ...);
  return s;
}

[[noreturn]] inline void fail(const char* type, const std::string& msg) {
  throw std::runtime_error(std::string(type) + ": " + msg);
}

// A float argument must be a finite float32 (the kernels' type): the twin of
// aiter_aux.validation.validate_scale.
inline void check_finite(double v, const char* name) {
  if (std::fabs(v) <= std::numeric_limits<float>::max()) return;  // NaN fails too
  fail("ValueError", cat(name, " must be a finite float32 number (|x| <= ",
                         shortest(std::numeric_limits<float>::max()), "), got ", shortest(v)));
}

inline void shim(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) fail("RuntimeError", cat("torch C shim call failed: ", what));
}

// Python's str(torch.<dtype>) of a c10::ScalarType code (the shim's dtype int).
inline const char* dtype_name(int32_t d) {
  static const char* const kNames[] = {"uint8",
                                       "int8",
                                       "int16",
                                       "int32",
                                       "int64",
                                       "float16",
                                       "float32",
                                       "float64",
                                       "complex32",
                                       "complex64",
                                       "complex128",
                                       "bool",
                                       "qint8",
                                       "quint8",
                                       "qint32",
                                       "bfloat16",
                                       "quint4x2",
                                       "quint2x4",
                                       "bits1x8",
                                       "bits2x4",
                                       "bits4x2",
                                       "bits8",
                                       "bits16",
                                       "float8_e5m2",
                                       "float8_e4m3fn",
                                       "float8_e5m2fnuz",
                                       "float8_e4m3fnuz",
                                       "uint16",
                                       "uint32",
                                       "uint64",
                                       "uint1",
                                       "uint2",
                                       "uint3",
                                       "uint4",
                                       "uint5",
                                       "uint6",
                                       "uint7",
                                       "int1",
                                       "int2",
                                       "int3",
                                       "int4",
                                       "int5",
                                       "int6",
                                       "int7",
                                       "float8_e8m0fnu",
                                       "float4_e2m1fn_x2"};
  constexpr int32_t n = sizeof(kNames) / sizeof(kNames[0]);
  return (d >= 0 && d < n) ? kNames[d] : "unknown";
}

// The dtypes the ops take, as shim codes: one dtype, or (kFloats) any of three.
struct DType {
  int32_t code;
  const char* name;            // without "torch."
  int32_t also[2] = {-1, -1};  // further accepted codes (-1: none)
  bool accepts(int32_t c) const { return c == code || c == also[0] || c == also[1]; }
};
inline DType kInt32() {
  return {aoti_torch_dtype_int32(), "int32"};
}
inline DType kFloat32() {
  return {aoti_torch_dtype_float32(), "float32"};
}
inline DType kBFloat16() {
  return {aoti_torch_dtype_bfloat16(), "bfloat16"};
}
inline DType kUInt8() {
  return {aoti_torch_dtype_uint8(), "uint8"};
}
// The op table's "float": float32, float16 or bfloat16 (the message lists all three).
inline DType kFloats() {
  return {aoti_torch_dtype_float32(),
          "float32, torch.float16 or torch.bfloat16",
          {aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16()}};
}

// One tensor's metadata, read once through the shim.
struct Meta {
  const char* name;
  AtenTensorHandle h;
  int32_t dtype, device_type, device_index;
  int64_t dim, numel;
  const int64_t* sizes;
  const int64_t* strides;

  Meta(const Tensor& t, const char* n) : name(n), h(t.get()) {
    shim(aoti_torch_get_dtype(h, &dtype), "get_dtype");
    shim(aoti_torch_get_dim(h, &dim), "get_dim");
    shim(aoti_torch_get_sizes(h, const_cast<int64_t**>(&sizes)), "get_sizes");
    shim(aoti_torch_get_strides(h, const_cast<int64_t**>(&strides)), "get_strides");
    shim(aoti_torch_get_device_type(h, &device_type), "get_device_type");
    shim(aoti_torch_get_device_index(h, &device_index), "get_device_index");
    numel = 1;
    for (int64_t i = 0; i < dim; ++i) numel *= sizes[i];
  }

  int64_t size(int64_t i) const { return sizes[i]; }
  void* data() const {
    void* p = nullptr;
    shim(aoti_torch_get_data_ptr(h, &p), "get_data_ptr");
    return p;
  }
  int64_t element_size() const {
    static const int32_t b1[] = {aoti_torch_dtype_uint8(), aoti_torch_dtype_int8(),
                                 aoti_torch_dtype_bool()};
    if (dtype == aoti_torch_dtype_bfloat16() || dtype == aoti_torch_dtype_float16() ||
        dtype == aoti_torch_dtype_int16() || dtype == aoti_torch_dtype_uint16())
      return 2;
    if (dtype == aoti_torch_dtype_int32() || dtype == aoti_torch_dtype_float32() ||
        dtype == aoti_torch_dtype_uint32())
      return 4;
    for (int32_t c : b1)
      if (dtype == c) return 1;
    return 8;
  }
  bool same_device(const Meta& o) const {
    return device_type == o.device_type && device_index == o.device_index;
  }
  std::string device() const {
    if (device_type == aoti_torch_device_type_cpu()) return "cpu";
    if (device_type == aoti_torch_device_type_cuda()) return cat("cuda:", device_index);
    return cat("device_type_", device_type, ":", device_index);
  }
  std::string shape() const {  // _shape_str
    std::string s = "[";
    for (int64_t i = 0; i < dim; ++i) s += cat(i ? ", " : "", sizes[i]);
    return s + "]";
  }
  std::string stride_tuple() const {  // Python's tuple repr
    std::string s = "(";
    for (int64_t i = 0; i < dim; ++i) s += cat(i ? ", " : "", strides[i]);
    return s + (dim == 1 ? ",)" : ")");
  }
  bool contiguous() const {
    bool c = false;
    shim(aoti_torch_is_contiguous(h, &c), "is_contiguous");
    return c;
  }
};

// validation.tensors.check_tensor
inline void check_tensor(const Meta& t, DType dtype, int64_t ndim = -1,
                         const char* layout = nullptr) {
  if (!dtype.accepts(t.dtype))
    fail("TypeError",
         cat(t.name, " must have dtype torch.", dtype.name, ", got torch.", dtype_name(t.dtype)));
  if (ndim >= 0 && t.dim != ndim)
    fail("ValueError", cat(t.name, " must be a ", ndim, "-D tensor", layout ? " " : "",
                           layout ? layout : "", ", got ", t.dim, "-D shape ", t.shape()));
  if (!t.contiguous())
    fail("ValueError", cat(t.name, " must be contiguous (shape ", t.shape(), ", strides ",
                           t.stride_tuple(), ")"));
}

// The op table's "=<tensor>": the dtype of that (checked) tensor.
inline DType same_dtype(const Meta& t) {
  return {t.dtype, dtype_name(t.dtype)};
}

// The kernels' AiterAuxDType of a tensor of the op table's "float" (checked before).
inline int32_t dtype_code(const Meta& t) {
  if (t.dtype == aoti_torch_dtype_float16()) return AITER_AUX_DTYPE_F16;
  if (t.dtype == aoti_torch_dtype_bfloat16()) return AITER_AUX_DTYPE_BF16;
  return AITER_AUX_DTYPE_F32;
}

// validation.tensors._same_device: every tensor on the device of the call's first tensor
inline void check_device(const Meta& t, const Meta& first) {
  if (!t.same_device(first))
    fail("ValueError", cat("all tensors must be on one device: ", t.name, " is on ", t.device(),
                           ", ", first.name, " is on ", first.device()));
}

// validation.tensors._check_shape: a tensor whose sizes another argument fixes
inline void check_shape(const Meta& t, std::initializer_list<int64_t> shape, const char* layout) {
  bool same = int64_t(shape.size()) == t.dim;
  int64_t i = 0;
  std::string want = "[";
  for (int64_t s : shape) {
    same = same && t.size(i) == s;
    want += cat(i++ ? ", " : "", s);
  }
  if (!same)
    fail("ValueError", cat(t.name, " must have shape ", layout, " = ", want, "], got ", t.shape()));
}

// validation.tensors._buffer: an output buffer (cols < 0: no column rule), on the device of
// the call's first tensor `on`
inline void check_buffer(const Meta& b, DType dtype, int64_t needed, const Meta& on, int64_t ndim,
                         int64_t cols = -1) {
  check_tensor(b, dtype, ndim);
  check_device(b, on);
  if (cols >= 0 && b.size(b.dim - 1) != cols)
    fail("ValueError", cat(b.name, " must have ", cols, " columns (shape [rows, ", cols,
                           "]), got shape ", b.shape()));
  if (b.numel < needed && cols > 0)
    fail("ValueError", cat("buffer too small: ", b.name, " needs >= ", needed, " elements, got ",
                           b.numel, " (>= ", (needed + cols - 1) / cols, " rows of ", cols, ")"));
  if (b.numel < needed)
    fail("ValueError",
         cat("buffer too small: ", b.name, " needs >= ", needed, " elements, got ", b.numel));
}

// validation.tensors.check_no_overlap: every written tensor (outputs, then written options) against
// every input and every earlier written tensor.
inline void check_no_overlap(std::initializer_list<const Meta*> written,
                             std::initializer_list<const Meta*> read) {
  auto overlap = [](const Meta* a, const Meta* b) {
    if (!a || !b || !a->same_device(*b) || a->numel == 0 || b->numel == 0) return false;
    auto pa = reinterpret_cast<uintptr_t>(a->data()), pb = reinterpret_cast<uintptr_t>(b->data());
    return pa < pb + uintptr_t(b->numel * b->element_size()) &&
           pb < pa + uintptr_t(a->numel * a->element_size());
  };
  auto raise = [](const Meta* a, const Meta* b) {
    fail("ValueError", cat(a->name, " overlaps ", b->name, " in memory: an output (or zero_buf)",
                           " must not share memory with an input or another output"));
  };
  int i = 0;
  for (const Meta* w : written) {
    for (const Meta* r : read)
      if (overlap(w, r)) raise(w, r);
    int j = 0;
    for (const Meta* w2 : written) {
      if (j++ >= i) break;
      if (overlap(w, w2)) raise(w, w2);
    }
    ++i;
  }
}

// validation.ints.sort_scales_rows: the rows out_rows = ceil(max_rows / BM) * BM,
// BM = max(32, block_m), that moe_sort_scales writes for a sort of capacity max_rows.
inline int64_t sort_scales_rows(int64_t max_rows, int64_t block_m) {
  const int64_t bm = block_m > 32 ? block_m : 32;
  return (max_rows + bm - 1) / bm * bm;
}

// A new contiguous tensor on the device of `like`.
inline Tensor empty(const Meta& like, std::initializer_list<int64_t> sizes, DType dtype) {
  int64_t sz[2] = {0, 0}, st[2] = {1, 1};
  int64_t n = 0;
  for (int64_t s : sizes) sz[n++] = s;
  if (n == 2) st[0] = sz[1];
  AtenTensorHandle h = nullptr;
  shim(aoti_torch_empty_strided(n, sz, st, dtype.code, like.device_type, like.device_index, &h),
       "empty_strided");
  return Tensor(h);
}

}  // namespace
}  // namespace binding
}  // namespace aiter_aux
