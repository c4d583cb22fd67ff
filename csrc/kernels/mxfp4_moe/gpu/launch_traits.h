// Per-target launch traits of the aux GPU kernels (part of the portability
// layer; included by common.h).
//
// Grid sizes that were tuned as "so many blocks per SM of an H200" are derived
// from the SM / CU count of the device the launch goes to: device_sm_count()
// queries it once per device (cudaDevAttrMultiProcessorCount /
// hipDeviceAttributeMultiprocessorCount) and caches it; every later call is a
// current-device lookup plus one relaxed atomic load.  On an H200 (132 SMs)
// every grid is the one the constants used to give (2 x 132 = 264).
//
// kDefaultSmCount is the fallback when the query fails (and the value of the
// CPU emulation, which has no runtime):
//   CUDA            132   sm_90: H100 SXM / H200
//   HIP, gfx942     304   MI300X (device pass only; see below)
//   HIP, gfx950     256   MI355X
//   HIP host pass   256   the host pass of a HIP compile does not know the
//                         offload target (one binary may hold several), so it
//                         takes the smaller CDNA part: a fallback grid that is
//                         a little small rather than one that oversubscribes
//   emulation       132   as sm_90, so that the self-test's cases take the
//                         same launch paths (decode / prefill sort_scales
//                         kernels) as on the H200
// -DAITER_AUX_DEFAULT_SM_COUNT=N overrides it.
//
// device_target() names the tuning target of the current device (sm_90, gfx942, gfx950, the
// emulation), by which sort_policy.h picks the sort's SortPolicy.
//
// Occupancy targets (__launch_bounds__ second argument) are register-budget
// choices, so they are per target too.  CUDA reads the argument as the
// minimum resident blocks per SM; HIP (clang) reads it as the minimum waves
// per EU (SIMD), which is a different quantity: the CUDA figures must not be
// passed through.  The values are below.
#pragma once

#include <string.h>

#include <atomic>

#include "hip_compat.h"

#ifndef AITER_AUX_DEFAULT_SM_COUNT
#if defined(AITER_AUX_GPU_EMU)
#define AITER_AUX_DEFAULT_SM_COUNT 132
#elif defined(AITER_AUX_GPU_CUDA)
#define AITER_AUX_DEFAULT_SM_COUNT 132
#elif defined(__gfx942__)
#define AITER_AUX_DEFAULT_SM_COUNT 304
#else  // gfx950, and the host pass of a HIP compile
#define AITER_AUX_DEFAULT_SM_COUNT 256
#endif
#endif

namespace aiter_aux {
namespace gpu {

constexpr int kDefaultSmCount = AITER_AUX_DEFAULT_SM_COUNT;
static_assert(kDefaultSmCount > 0, "AITER_AUX_DEFAULT_SM_COUNT must be positive");

namespace traits_detail {

constexpr int kMaxDevices = 128;

// One slot per device id: 0 = not queried yet, else the SM / CU count.
inline std::atomic<int>* sm_count_cache() {
  static std::atomic<int> cache[kMaxDevices] = {};
  return cache;
}

#if !defined(AITER_AUX_GPU_EMU)
inline int current_device() {
#if defined(AITER_AUX_GPU_CUDA)
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error for check_launch to report
    return -1;
  }
#else
  int dev = -1;
  if (hipGetDevice(&dev) != hipSuccess) {
    (void)hipGetLastError();
    return -1;
  }
#endif
  return dev;
}

inline int query_sm_count(int dev) {
  int n = 0;
#if defined(AITER_AUX_GPU_CUDA)
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
#else
  if (hipDeviceGetAttribute(&n, hipDeviceAttributeMultiprocessorCount, dev) != hipSuccess) {
    (void)hipGetLastError();
    n = 0;
  }
#endif
  return n > 0 ? n : kDefaultSmCount;
}
#endif

#if defined(AITER_AUX_GPU_HIP)
// One slot per device id: 0 = not queried yet, else 1 + the GpuTarget.
inline std::atomic<int>* target_cache() {
  static std::atomic<int> cache[kMaxDevices] = {};
  return cache;
}
#endif

}  // namespace traits_detail

// SM (CUDA) / CU (HIP) count of the current device; kDefaultSmCount where it
// cannot be queried (and in the emulation).  Thread-safe: concurrent first
// calls may both query, and store the same value.
inline int device_sm_count() {
#if defined(AITER_AUX_GPU_EMU)
  return kDefaultSmCount;
#else
  const int dev = traits_detail::current_device();
  if (dev < 0 || dev >= traits_detail::kMaxDevices) return kDefaultSmCount;
  std::atomic<int>& slot = traits_detail::sm_count_cache()[dev];
  int n = slot.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = traits_detail::query_sm_count(dev);
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
#endif
}

// The tuning target of the current device (sort_policy.h picks its SortPolicy by it): sm_90
// for every CUDA build; on HIP gfx950, or gfx942 for every other CDNA device (gfx942,
// gfx90a), from the device's gcnArchName, queried once per device and cached; the emulation
// is a target of its own.
enum class GpuTarget { Sm90, Gfx942, Gfx950, Emulation };

inline GpuTarget device_target() {
#if defined(AITER_AUX_GPU_EMU)
  return GpuTarget::Emulation;
#elif defined(AITER_AUX_GPU_CUDA)
  return GpuTarget::Sm90;
#else
  const int dev = traits_detail::current_device();
  if (dev < 0 || dev >= traits_detail::kMaxDevices) return GpuTarget::Gfx942;
  std::atomic<int>& slot = traits_detail::target_cache()[dev];
  int t = slot.load(std::memory_order_relaxed);
  if (t <= 0) {
    hipDeviceProp_t prop;
    GpuTarget g = GpuTarget::Gfx942;
    if (hipGetDeviceProperties(&prop, dev) != hipSuccess) {
      (void)hipGetLastError();
    } else if (strncmp(prop.gcnArchName, "gfx950", 6) == 0) {
      g = GpuTarget::Gfx950;
    }
    t = 1 + static_cast<int>(g);
    slot.store(t, std::memory_order_relaxed);
  }
  return static_cast<GpuTarget>(t - 1);
#endif
}

// Grids tuned as "2 blocks per SM" (sort_scales' decode threshold, the quant
// kernels' small-tensor grid): 264 on an H200.
inline int two_blocks_per_sm() {
  return 2 * device_sm_count();
}

// ------------------------------------------------- occupancy targets ----
// moe_scatter_reduce_q's kernel (64-thread blocks = 1 warp on CDNA, 2 on
// NVIDIA), by the pairs of one load batch (scatter.h):
//   sm_90: min blocks per SM.  14 (72 registers) when a batch holds at most 3
//     pairs, else 12 (80 registers; at 72 those spill).  Tuned on the H200
//     (docs/perf.md, section "Gaps").  The 64-bit-index variant (only for
//     more than 2^31 units, M > 9.5M tokens at D = 7168) spilled 20 bytes at 72
//     registers (topk 9): 12 there.
//   gfx942 / gfx950: min waves per SIMD = 4.  Both have 512 VGPRs (ArchVGPR +
//     AccVGPR) per SIMD lane, so 4 waves leave up to 128 registers a wave: the
//     kernel needs 82-88 unconstrained, so nothing spills.  More would not
//     pay on gfx942: the kernel's 4 KB shared-memory table per block limits a
//     CU (64 KB LDS) to 16 blocks = 4 waves per SIMD anyway.  gfx950 (160 KB
//     LDS) could hold 5 waves by registers; 4 is the conservative choice
//     until it is measured.  (The CUDA values, read as waves per EU, asked
//     for 12-14 > the hardware's 8: the compiler warned and ignored them.)
template <int kBatchPairs, bool kWideIndex>
__host__ __device__ constexpr int scatter_q_min_occupancy() {
#if defined(AITER_AUX_GPU_CUDA)
  return kBatchPairs <= 3 && !kWideIndex ? 14 : 12;
#else
  return 4;
#endif
}

// mxfp4_quant / mxfp8_quant kernels (256 threads): sm_90 at least 6 blocks
// per SM (<= 40 registers; 47 unconstrained, no spills either way); no
// target on CDNA (0: the compiler's own choice).
constexpr int kQuantMinOccupancy =
#if defined(AITER_AUX_GPU_CUDA)
    6;
#else
    0;
#endif

// The mid path's kernel with moe_sort_quant's wide MXFP4 quant blocks (kSortThreads = 512
// on sm_90, two tiles per step): at least 3 blocks per SM, i.e. the quant kernel's 1536
// threads and <= 40 registers (55 unconstrained; at 40, 4 bytes of spill at D = 4096 and
// 8192, as mxfp4_quant at 6 blocks).  None on CDNA.
constexpr int kFusedSortMinOccupancy =
#if defined(AITER_AUX_GPU_CUDA)
    3;
#else
    0;
#endif

}  // namespace gpu
}  // namespace aiter_aux
