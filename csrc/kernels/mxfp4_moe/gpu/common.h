// Shared pieces of the aux GPU kernels: status helpers (host), the QuantFormat tag, bf16
// rounding, vector loads/stores that fall back to scalar accesses when a
// pointer is not aligned, a zero-fill used by the sort launches, and a
// block-wide exclusive scan.
#pragma once

#include <stdarg.h>
#include <stdio.h>

#include "../aiter_aux_limits.h"
#include "../mxfp4_moe_aux_abi.h"
#include "hip_compat.h"
#include "launch_traits.h"
#include "target_ops.h"

extern "C" void aiter_aux_set_error(const char* msg);

namespace aiter_aux {
namespace gpu {

// ------------------------------------------------------------ host side ----
inline int fail_invalid(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  aiter_aux_set_error(buf);
  return AITER_AUX_ERR_INVALID_ARGUMENT;
}

// Checks the launch just made (never synchronises).
inline int check_launch(const char* what) {
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s: kernel launch failed: %s", what, hipGetErrorString(err));
    aiter_aux_set_error(buf);
    return AITER_AUX_ERR_LAUNCH;
  }
  return AITER_AUX_OK;
}

inline bool is_aligned(const void* p, size_t n) {
  return (reinterpret_cast<uintptr_t>(p) % n) == 0;
}

inline int64_t ceil_div_i64(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

inline bool valid_block_m(int bm) {
  return AITER_AUX_VALID_BLOCK_M(bm);
}

// Row p is the first row of a block of bm rows, for any bm >= 1 (the peers' formats: 8, 48,
// ...): a mask for a power of two, else a remainder.  bm is uniform over the launch, so the
// branch is too.  moe_sort's own format tests the mask alone (SortFormat::first_row): its
// block_m is a power of two, and the remainder costs the sort kernels SGPR spills on CDNA.
__host__ __device__ __forceinline__ bool block_first_row(int p, int bm) {
  return (bm & (bm - 1)) == 0 ? (p & (bm - 1)) == 0 : p % bm == 0;
}

// Capacity of the sorted buffers (docs/ops.md; the ABI header's one definition).
inline int64_t sort_capacity(int64_t m, int64_t topk, int64_t e, int64_t bm) {
  return aiter_aux_sort_capacity(m, topk, e, bm);
}

// The activation format of a fused quant (moe_sort_quant: Mxfp4, moe_sort_quant_fp8: Mxfp8;
// moe_sort: None).  A template parameter of the sort kernels, beside the model_dim D.
enum class QuantFormat { None, Mxfp4, Mxfp8 };

// ---------------------------------------------------------- device side ----
// fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (torch's conversion).
__host__ __device__ __forceinline__ uint32_t f32_bits_to_bf16_rne(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// The 16 bytes at p (16-byte aligned) as 4 little-endian words: one 128-bit load.
__device__ __forceinline__ void load_u32x4(const void* p, uint32_t w[4]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

// 8 consecutive bf16 (16 bytes) as 4 little-endian words.
__device__ __forceinline__ void load_bf16x8(const uint16_t* p, bool aligned16, uint32_t w[4]) {
  if (aligned16) {
    load_u32x4(p, w);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = static_cast<uint32_t>(p[2 * i]) | (static_cast<uint32_t>(p[2 * i + 1]) << 16);
    }
  }
}

__device__ __forceinline__ void store_bf16x8(uint16_t* p, bool aligned16, const uint32_t w[4]) {
  if (aligned16) {
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    *reinterpret_cast<uint4*>(p) = v;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[2 * i] = static_cast<uint16_t>(w[i] & 0xFFFFu);
      p[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
    }
  }
}

__device__ __forceinline__ uint32_t load_u8x4(const uint8_t* p, bool aligned4) {
  if (aligned4) return *reinterpret_cast<const uint32_t*>(p);
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ void store_u8x4(uint8_t* p, bool aligned4, uint32_t v) {
  if (aligned4) {
    *reinterpret_cast<uint32_t*>(p) = v;
  } else {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
    p[2] = static_cast<uint8_t>(v >> 16);
    p[3] = static_cast<uint8_t>(v >> 24);
  }
}

// Zeroes buf[0, n) with the threads `worker` of `num_workers` (any layout).
__device__ __forceinline__ void zero_fill_bf16(uint16_t* buf, int64_t n, int64_t worker,
                                               int64_t num_workers) {
  if (buf == nullptr || n <= 0) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(buf);
  int64_t head = (addr & 1u) ? n : static_cast<int64_t>(((16u - (addr & 15u)) & 15u) >> 1);
  if (head > n) head = n;
  const int64_t nvec = (n - head) >> 3;  // 16-byte stores after the head
  const int64_t tail_begin = head + (nvec << 3);
  for (int64_t i = worker; i < head; i += num_workers) buf[i] = 0;
  uint4* vbuf = reinterpret_cast<uint4*>(buf + head);
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t i = worker; i < nvec; i += num_workers) vbuf[i] = z;
  for (int64_t i = tail_begin + worker; i < n; i += num_workers) buf[i] = 0;
}

// buf[i] = init[i] (bit copy) for i < n, or zeros without init; 16-byte accesses where
// both pointers share their alignment.
__device__ __forceinline__ void init_fill_bf16(uint16_t* buf, const uint16_t* init, int64_t n,
                                               int64_t worker, int64_t num_workers) {
  if (init == nullptr) {
    zero_fill_bf16(buf, n, worker, num_workers);
    return;
  }
  if (buf == nullptr || n <= 0) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(buf);
  const bool same = ((addr ^ reinterpret_cast<uintptr_t>(init)) & 15u) == 0;
  int64_t head =
      (!same || (addr & 1u)) ? n : static_cast<int64_t>(((16u - (addr & 15u)) & 15u) >> 1);
  if (head > n) head = n;
  const int64_t nvec = (n - head) >> 3;
  const int64_t tail_begin = head + (nvec << 3);
  for (int64_t i = worker; i < head; i += num_workers) buf[i] = init[i];
  uint4* vbuf = reinterpret_cast<uint4*>(buf + head);
  const uint4* vinit = reinterpret_cast<const uint4*>(init + head);
  for (int64_t i = worker; i < nvec; i += num_workers) vbuf[i] = vinit[i];
  for (int64_t i = tail_begin + worker; i < n; i += num_workers) buf[i] = init[i];
}

// Block-wide exclusive scan of one int per thread.  kThreads = blockDim.x
// (multiple of kWarpSize, at most kWarpSize^2).  `warp_tot` is shared scratch of
// kThreads / kWarpSize ints.  Every thread of the block must call it; it
// contains block_sync() barriers and leaves warp_tot free for reuse on return.
template <int kThreads>
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_tot, int* total) {
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kThreads % kWarpSize == 0 && kWarps <= kWarpSize, "block scan shape");
  const int lane = lane_id();
  const int warp = warp_id();
  int x = v;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int y = shfl_up_i32(x, d);
    if (lane >= d) x += y;
  }
  if (lane == kWarpSize - 1) warp_tot[warp] = x;
  block_sync();
  if (warp == 0) {
    int t = lane < kWarps ? warp_tot[lane] : 0;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int y = shfl_up_i32(t, d);
      if (lane >= d) t += y;
    }
    if (lane < kWarps) warp_tot[lane] = t;  // inclusive over warps
  }
  block_sync();
  const int before = warp > 0 ? warp_tot[warp - 1] : 0;
  *total = warp_tot[kWarps - 1];
  block_sync();
  return before + x - v;
}

}  // namespace gpu
}  // namespace aiter_aux
