// Target-specific instructions of the aux GPU kernels (part of the portability
// layer; included by common.h): every inline assembly statement and every
// target intrinsic the kernel headers use outside hip_compat.h and
// launch_traits.h is wrapped here in a small named function, with its target
// branches (CUDA sm_90, AMD gfx950 / other CDNA, the CPU emulation, the
// generic fallback).

#pragma once

#include "hip_compat.h"

namespace aiter_aux {
namespace gpu {

// ------------------------------------------------------ bit operations ----
// PTX prmt.b32 (default mode): byte n of the result is byte (sel_n & 7) of
// {b, a} (a = bytes 0-3), or, if sel_n & 8, that byte's top bit replicated.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t src = static_cast<uint64_t>(a) | (static_cast<uint64_t>(b) << 32);
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t nib = (sel >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (nib & 7u))) & 0xFFu;
    if (nib & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * n);
  }
  return d;
#endif
}

// Bitwise select: bits of b where m is set, of a elsewhere (one LOP3 on CUDA;
// written out because nvcc splits the mask-and-merge into two).
__host__ __device__ __forceinline__ uint32_t bit_select(uint32_t m, uint32_t a, uint32_t b) {
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(d) : "r"(m), "r"(b), "r"(a));
  return d;
#else
  return (a & ~m) | (b & m);
#endif
}

// ------------------------------------------------------- lane exchange ----
// The value of the other lane of the pair (lanes 2p, 2p+1).
__device__ __forceinline__ uint32_t pair_other(uint32_t v) {
#if AITER_AUX_AMDGCN_DEVICE
  // DPP quad_perm [1,0,3,2]: xor 1 inside a quad
  return static_cast<uint32_t>(
      __builtin_amdgcn_update_dpp(0, static_cast<int>(v), 0xB1, 0xF, 0xF, false));
#else
  return shfl_xor_u32(v, 1);
#endif
}

}  // namespace gpu
}  // namespace aiter_aux
