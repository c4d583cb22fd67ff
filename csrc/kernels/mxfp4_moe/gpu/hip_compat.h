// Portability layer for the aux GPU kernels: the kernels are written once in
// HIP spelling; this header maps what they use onto CUDA when nvcc compiles
// (`__CUDACC__` and not `__HIP_PLATFORM_AMD__`), and wraps the few
// warp-level primitives whose spelling differs between the two.
//
// The `#else` branches of the device-only primitives below are the host pass
// of a HIP compile (parsed, never emitted or executed) or a device pass for a
// target other than AMDGCN, which the kernels do not support: they trap
// (aiter_aux_unreachable) rather than return a value that would be wrong.
//
// Rules kept by every kernel header of this directory:
//   * bf16 is raw uint16_t bits everywhere (no hip_bf16 / cuda_bf16 types);
//   * `__builtin_amdgcn_*` appear only inside `#if AITER_AUX_AMDGCN_DEVICE`
//     (or narrower, e.g. `__gfx950__`) branches;
//   * inline assembly and target intrinsics appear only in the portability
//     layer: this header, launch_traits.h and target_ops.h (the latter wraps
//     the instructions of the kernels' arithmetic in named functions);
//   * warp-wide code uses kWarpSize (64: CDNA wave64, 32: NVIDIA) and
//     lane_mask_t, never a literal 32/64;
//   * floating-point arithmetic whose rounding the spec fixes goes through
//     f32_mul_rn / f32_add_rn (never contracted into an FMA).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// Bit-exactness needs IEEE fp32 (round to nearest even, subnormals kept, no
// reassociation).  clang/gcc -ffast-math is caught here; nvcc's
// --use_fast_math / -ftz=true define no macro: never pass them.
#if defined(__FAST_MATH__)
#error "aiter_aux GPU kernels must not be compiled with -ffast-math"
#endif

#if defined(AITER_AUX_GPU_EMULATION)
// ------------------------------------------------------ host emulation ----
// Test-only: tests/emu.h (included first) runs the kernels on the CPU, one
// fiber per GPU thread, with the warp and block primitives below emulated.
#define AITER_AUX_GPU_EMU 1
#define AITER_AUX_AMDGCN_DEVICE 0
#define AITER_AUX_LAUNCH(kern, grid, block, stream) \
  ::aiter_aux_emu::make_launch((kern), (grid), (block), (stream))
#define AITER_AUX_LAUNCH_SERIAL(kern, grid, block, stream) \
  ::aiter_aux_emu::make_launch((kern), (grid), (block), (stream))

#elif defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__)
// ---------------------------------------------------------------- CUDA ----
#define AITER_AUX_GPU_CUDA 1
#include <cuda_runtime.h>

typedef cudaStream_t hipStream_t;
typedef cudaError_t hipError_t;
#ifndef hipSuccess
#define hipSuccess cudaSuccess
#endif
#ifndef hipGetLastError
#define hipGetLastError cudaGetLastError
#endif
#ifndef hipGetErrorString
#define hipGetErrorString cudaGetErrorString
#endif
#ifndef hipLaunchKernelGGL
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif
#define AITER_AUX_AMDGCN_DEVICE 0

#else
// ----------------------------------------------------------------- HIP ----
#define AITER_AUX_GPU_HIP 1
#include <hip/hip_runtime.h>

#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN__)
#define AITER_AUX_AMDGCN_DEVICE 1
#else
#define AITER_AUX_AMDGCN_DEVICE 0
#endif

// The kernels assume wave64 (CDNA: gfx90a, gfx942, gfx950).
#if defined(__AMDGCN_WAVEFRONT_SIZE) && (__AMDGCN_WAVEFRONT_SIZE != 64)
#error "aiter_aux GPU kernels require wave64 (CDNA) targets"
#endif
#if AITER_AUX_AMDGCN_DEVICE && (defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__))
#error "aiter_aux GPU kernels require wave64 (CDNA) targets"
#endif
#endif

// Kernel launch on a stream, no dynamic shared memory:
//   AITER_AUX_LAUNCH(kernel_ptr, grid, block, stream)(args...);
// CUDA: with programmatic dependent launch (PDL) when the run-time switch is on
// (../pdl_switch.h) and every target of the build is sm_90 or newer (launch_detail below);
// else, and on HIP, a plain launch.  AITER_AUX_LAUNCH_SERIAL: always a plain launch (the
// kernel's PDL points are then no-ops), for the later launches of a multi-launch op where
// PDL measured slower.
#if defined(AITER_AUX_GPU_CUDA)
#include <utility>

#include "../pdl_switch.h"

namespace aiter_aux {
namespace gpu {
namespace launch_detail {

// Whether every kernel of this translation unit is compiled with its PDL points
// (target_ops.h PdlScope: griddepcontrol, sm_90+ only): nvcc lists the
// targets it compiles in __CUDA_ARCH_LIST__ (host and device passes alike).  A kernel
// compiled without them must not be launched with the attribute: it could read its
// inputs before the upstream grid's writes are visible.
#if defined(__CUDA_ARCH_LIST__)
constexpr int kArchList[] = {__CUDA_ARCH_LIST__};
constexpr bool every_arch_has_pdl() {
  for (int a : kArchList)
    if (a < 900) return false;
  return true;
}
constexpr bool kPdlBuild = every_arch_has_pdl();
#else
constexpr bool kPdlBuild = false;
#endif

template <class... P>
struct Launch {
  void (*kern)(P...);
  dim3 grid, block;
  cudaStream_t stream;
  bool allow_pdl;
  // Errors are left for check_launch (cudaGetLastError), as a <<<>>> launch leaves them.
  template <class... A>
  void operator()(A&&... args) const {
    if (kPdlBuild && allow_pdl && ::aiter_aux::pdl_enabled()) {
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = grid;
      cfg.blockDim = block;
      cfg.dynamicSmemBytes = 0;
      cfg.stream = stream;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      (void)cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);
    } else {
      kern<<<grid, block, 0, stream>>>(std::forward<A>(args)...);
    }
  }
};

template <class... P>
Launch<P...> make_launch(void (*kern)(P...), dim3 grid, dim3 block, cudaStream_t stream,
                         bool allow_pdl = true) {
  return Launch<P...>{kern, grid, block, stream, allow_pdl};
}

}  // namespace launch_detail
}  // namespace gpu
}  // namespace aiter_aux

#define AITER_AUX_LAUNCH(kern, grid, block, stream) \
  ::aiter_aux::gpu::launch_detail::make_launch((kern), (grid), (block), (stream))
#define AITER_AUX_LAUNCH_SERIAL(kern, grid, block, stream) \
  ::aiter_aux::gpu::launch_detail::make_launch((kern), (grid), (block), (stream), false)
#endif

#ifndef AITER_AUX_LAUNCH
#define AITER_AUX_LAUNCH(kern, grid, block, stream) kern<<<(grid), (block), 0, (stream)>>>
#endif
#ifndef AITER_AUX_LAUNCH_SERIAL
#define AITER_AUX_LAUNCH_SERIAL(kern, grid, block, stream) \
  AITER_AUX_LAUNCH(kern, grid, block, stream)
#endif

// aiter_aux_unreachable(): a path that cannot be taken (an invariant the host
// launch guarantees, a target the kernels do not support) stops the kernel
// instead of returning a made-up value: __trap() on CUDA, __builtin_trap() on
// HIP (s_trap), abort() in the emulation and in host code.  Callable from
// host and device code; never returns.
[[noreturn]] __host__ __device__ __forceinline__ void aiter_aux_unreachable() {
#if defined(AITER_AUX_GPU_EMU)
  fprintf(stderr, "aiter_aux: unreachable path taken\n");
  abort();
#elif defined(AITER_AUX_GPU_CUDA)
#if defined(__CUDA_ARCH__)
  __trap();
  __builtin_unreachable();
#else
  abort();
#endif
#else
  __builtin_trap();
#endif
}

namespace aiter_aux {
namespace gpu {

#if defined(AITER_AUX_GPU_EMU)
constexpr int kWarpSize = AITER_AUX_EMU_WARP;
typedef ::aiter_aux_emu::lane_mask_t lane_mask_t;
#elif defined(AITER_AUX_GPU_CUDA)
constexpr int kWarpSize = 32;
typedef uint32_t lane_mask_t;
#else
constexpr int kWarpSize = 64;
typedef uint64_t lane_mask_t;
#endif
static_assert(sizeof(lane_mask_t) * 8 == kWarpSize, "lane mask width");

// ----------------------------------------------------------- indexing ----
__device__ __forceinline__ int thread_idx() {
#if defined(AITER_AUX_GPU_EMU)
  return ::aiter_aux_emu::thread_idx();
#elif defined(AITER_AUX_GPU_CUDA)
  return static_cast<int>(threadIdx.x);
#elif AITER_AUX_AMDGCN_DEVICE
  return static_cast<int>(__builtin_amdgcn_workitem_id_x());
#else
  aiter_aux_unreachable();  // host pass of a HIP compile (or a non-AMDGCN device pass)
#endif
}

__device__ __forceinline__ int block_idx() {
#if defined(AITER_AUX_GPU_EMU)
  return ::aiter_aux_emu::block_idx();
#elif defined(AITER_AUX_GPU_CUDA)
  return static_cast<int>(blockIdx.x);
#elif AITER_AUX_AMDGCN_DEVICE
  return static_cast<int>(__builtin_amdgcn_workgroup_id_x());
#else
  aiter_aux_unreachable();
#endif
}

// Blocks are 1-D and a multiple of kWarpSize, so the lane is the low bits.
__device__ __forceinline__ int lane_id() {
  return thread_idx() & (kWarpSize - 1);
}
__device__ __forceinline__ int warp_id() {
  return thread_idx() / kWarpSize;
}

__device__ __forceinline__ lane_mask_t lanemask_lt(int lane) {
  return (static_cast<lane_mask_t>(1) << lane) - 1;
}

// -------------------------------------------------------- warp primitives ----
// All of them must be reached by every lane of the warp (converged code).
__device__ __forceinline__ lane_mask_t warp_ballot(bool pred) {
#if defined(AITER_AUX_GPU_EMU)
  return static_cast<lane_mask_t>(::aiter_aux_emu::ballot(pred));
#elif defined(AITER_AUX_GPU_CUDA)
  return __ballot_sync(0xffffffffu, pred);
#elif AITER_AUX_AMDGCN_DEVICE
  return __builtin_amdgcn_ballot_w64(pred);
#else
  (void)pred;
  aiter_aux_unreachable();
#endif
}

__device__ __forceinline__ int popc(lane_mask_t m) {
#if defined(AITER_AUX_GPU_CUDA)
  return __popc(m);
#else
  return __builtin_popcountll(m);
#endif
}

// Orders shared-memory accesses of the lanes of one warp.
__device__ __forceinline__ void warp_sync() {
#if defined(AITER_AUX_GPU_EMU)
  ::aiter_aux_emu::warp_barrier();
#elif defined(AITER_AUX_GPU_CUDA)
  __syncwarp();
#elif AITER_AUX_AMDGCN_DEVICE
  // A wave executes in lock step and its LDS operations complete in order;
  // this keeps the compiler from moving memory operations across.
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  aiter_aux_unreachable();
#endif
}

// __syncthreads(): barrier plus workgroup-scope memory ordering.  On AMD it is
// spelled out (as ROCm's own __syncthreads does) so that the kernels do not
// depend on device-library functions of a particular HIP version.
__device__ __forceinline__ void block_sync() {
#if defined(AITER_AUX_GPU_EMU)
  ::aiter_aux_emu::block_barrier();
#elif defined(AITER_AUX_GPU_CUDA)
  __syncthreads();
#elif AITER_AUX_AMDGCN_DEVICE
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  aiter_aux_unreachable();
#endif
}

__device__ __forceinline__ uint32_t shfl_xor_u32(uint32_t v, int mask) {
#if defined(AITER_AUX_GPU_EMU)
  return static_cast<uint32_t>(::aiter_aux_emu::shfl(v, lane_id() ^ mask));
#elif defined(AITER_AUX_GPU_CUDA)
  return __shfl_xor_sync(0xffffffffu, v, mask);
#elif AITER_AUX_AMDGCN_DEVICE
  const int src = lane_id() ^ mask;
  return static_cast<uint32_t>(__builtin_amdgcn_ds_bpermute(src << 2, static_cast<int>(v)));
#else
  (void)v;
  (void)mask;
  aiter_aux_unreachable();
#endif
}

// Lane `lane - delta` (own value where that is negative).
__device__ __forceinline__ int shfl_up_i32(int v, int delta) {
#if defined(AITER_AUX_GPU_EMU)
  const int lane = lane_id();
  return static_cast<int>(static_cast<uint32_t>(
      ::aiter_aux_emu::shfl(static_cast<uint32_t>(v), lane >= delta ? lane - delta : lane)));
#elif defined(AITER_AUX_GPU_CUDA)
  return __shfl_up_sync(0xffffffffu, v, delta);
#elif AITER_AUX_AMDGCN_DEVICE
  const int lane = lane_id();
  const int src = lane >= delta ? lane - delta : lane;
  return __builtin_amdgcn_ds_bpermute(src << 2, v);
#else
  (void)v;
  (void)delta;
  aiter_aux_unreachable();
#endif
}

// Lane `src` (0 <= src < kWarpSize) of the warp.
__device__ __forceinline__ int shfl_idx_i32(int v, int src) {
#if defined(AITER_AUX_GPU_EMU)
  return static_cast<int>(::aiter_aux_emu::shfl(static_cast<uint32_t>(v), src));
#elif defined(AITER_AUX_GPU_CUDA)
  return __shfl_sync(0xffffffffu, v, src);
#elif AITER_AUX_AMDGCN_DEVICE
  return __builtin_amdgcn_ds_bpermute(src << 2, v);
#else
  (void)v;
  (void)src;
  aiter_aux_unreachable();
#endif
}

// Atomic add on a shared-memory word; returns the old value.  (The emulation
// switches fibers only at barriers and warp collectives, so a plain
// read-modify-write is atomic there.)
__device__ __forceinline__ uint32_t atomic_add_shared_u32(uint32_t* p, uint32_t v) {
#if defined(AITER_AUX_GPU_EMU)
  const uint32_t old = *p;
  *p = old + v;
  return old;
#elif defined(AITER_AUX_GPU_CUDA)
  return atomicAdd(p, v);
#elif AITER_AUX_AMDGCN_DEVICE
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
#else
  (void)p;
  (void)v;
  aiter_aux_unreachable();
#endif
}

// ------------------------------------------------------------ bit casts ----
__device__ __forceinline__ float as_f32(uint32_t u) {
#if defined(AITER_AUX_GPU_CUDA)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

__device__ __forceinline__ uint32_t as_u32(float f) {
#if defined(AITER_AUX_GPU_CUDA)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}

// Host-and-device bit casts (for the pure helpers that host tests can call).
__host__ __device__ __forceinline__ float as_f32_any(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}

__host__ __device__ __forceinline__ uint32_t as_u32_any(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
}

// ------------------------------------- fp32 arithmetic, never contracted ----
__device__ __forceinline__ float f32_mul_rn(float a, float b) {
#if defined(AITER_AUX_GPU_CUDA)
  return __fmul_rn(a, b);
#elif defined(AITER_AUX_GPU_EMU)
  return ::aiter_aux_emu::mul_rn(a, b);
#else
#pragma clang fp contract(off)
  float p = a * b;
#if AITER_AUX_AMDGCN_DEVICE
  // Opaque to the optimiser: the product cannot be fused into a later add
  // even where a build turns contraction on regardless of the pragma.
  __asm__("" : "+v"(p));
#endif
  return p;
#endif
}

__device__ __forceinline__ float f32_add_rn(float a, float b) {
#if defined(AITER_AUX_GPU_CUDA)
  return __fadd_rn(a, b);
#elif defined(AITER_AUX_GPU_EMU)
  return ::aiter_aux_emu::add_rn(a, b);
#else
#pragma clang fp contract(off)
  return a + b;
#endif
}

}  // namespace gpu
}  // namespace aiter_aux
