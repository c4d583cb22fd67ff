// Shared helpers of the CPU kernels: error reporting, a guard for the x86
// floating-point environment, small integer helpers.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "../mxfp4_moe_aux_abi.h"

// Implemented by the module (lookup TU); keeps the message of the last failing
// call for aiter_aux_last_error().
extern "C" void aiter_aux_set_error(const char* msg);

namespace aiter_aux {
namespace cpu {
namespace detail {

// Formats the message into a thread-local buffer (so it outlives the call even
// if the setter keeps the pointer) and returns AITER_AUX_ERR_INVALID_ARGUMENT.
__attribute__((format(printf, 1, 2), noinline, cold)) inline int invalid_arg(const char* fmt, ...) {
  static thread_local char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  aiter_aux_set_error(buf);
  return AITER_AUX_ERR_INVALID_ARGUMENT;
}

constexpr int64_t kMaxTokens = int64_t(1) << 24;
constexpr int64_t kInt32Max = 2147483647;

inline bool valid_block_m(int32_t bm) {
  return bm == 16 || bm == 32 || bm == 64 || bm == 128;
}

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
inline int64_t ceil_div(int64_t x, int64_t m) {
  return (x + m - 1) / m;
}

// The scatter kernels do fp32 arithmetic whose results must not depend on the
// caller's floating-point environment: subnormal operands and results must be
// kept (the spec does not flush).  A process may run with FTZ/DAZ set (e.g.
// torch.set_flush_denormal(True), or a library linked with -ffast-math), so
// each thread clears them for the duration of a kernel and restores them.
// (Rounding mode is assumed to be the default round-to-nearest-even.)
struct FpEnvGuard {
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
  unsigned int saved;
  FpEnvGuard() : saved(__builtin_ia32_stmxcsr()) {
    // bit 15: FTZ, bit 6: DAZ, bits 13-14: rounding control (-> nearest)
    const unsigned int want = saved & ~((1u << 15) | (1u << 6) | (3u << 13));
    if (want != saved) __builtin_ia32_ldmxcsr(want);
  }
  ~FpEnvGuard() {
    if (__builtin_ia32_stmxcsr() != saved) __builtin_ia32_ldmxcsr(saved);
  }
#else
  FpEnvGuard() {}
#endif
  FpEnvGuard(const FpEnvGuard&) = delete;
  FpEnvGuard& operator=(const FpEnvGuard&) = delete;
};

// Zero `n` uint16 elements, split across threads when large.
inline void zero_u16(uint16_t* p, int64_t n) {
  if (p == nullptr || n <= 0) return;
  const int64_t kChunk = int64_t(1) << 18;  // elements per task (512 KiB)
  const int64_t nchunks = ceil_div(n, kChunk);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * kChunk;
    const int64_t e = b + kChunk < n ? b + kChunk : n;
    std::memset(p + b, 0, static_cast<size_t>(e - b) * sizeof(uint16_t));
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace aiter_aux
