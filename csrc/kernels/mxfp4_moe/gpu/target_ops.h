// Target-specific instructions of the aux GPU kernels (part of the portability
// layer; included by common.h): every inline assembly statement and every
// target intrinsic the kernel headers use outside hip_compat.h and
// launch_traits.h is wrapped here in a small named function, with its target
// branches (CUDA sm_90, AMD gfx950 / other CDNA, the CPU emulation, the
// generic fallback).
//
// Four kinds:
//   * the programmatic-dependent-launch points of every kernel (PdlScope);
//   * warp_max_u32: the warp's largest value (REDUX on sm_80+, shuffles elsewhere);
//   * operations with a portable definition (byte_perm, bit_select,
//     pair_other, pk_max_u16, pk_addmax_s16, pk_fma_bf16, f16_half_to_f32):
//     the instruction where the target has it, the same function written out
//     elsewhere;
//   * conversions that exist on one target only (cvt_scalef32_pk_fp4_bf16x8,
//     cvt_rn_satfinite_e4m3x2_f32, cvt_rn_bf16x2_f32): defined under the
//     target's condition only; the kernel that calls one keeps the branch and
//     the argument of why the instruction gives the spec's result there
//     (quant_codes.h quant8, quant_fp8.h, scatter.h pack_bf16x8).
#pragma once

#include "hip_compat.h"

namespace aiter_aux {
namespace gpu {

// ------------------------------------- programmatic dependent launch ----
// The PDL points of a kernel (sm_90+: griddepcontrol; no-ops on other targets; the
// emulation records them for its self-test).  The launch side is AITER_AUX_LAUNCH
// (hip_compat.h).  Every kernel's first statement is
//     const PdlScope pdl;
// Its constructor waits (pdl_wait) until the upstream grids have completed and their
// writes are visible: nothing before it may touch global memory (reads of inputs, and
// writes to buffers an upstream kernel may still read).  Every thread waits, so this grid
// completes only after its upstream grids, and the next kernel's wait covers them too.
// Its destructor, when the thread returns (on every path, after its last global write),
// lets the dependent grid launch (pdl_launch_dependents): the dependent's blocks may then be
// scheduled while this grid finishes, and they wait in their own PdlScope.  Where the
// trigger sits changes only timing, never results (the dependent waits for this whole
// grid).  -DAITER_AUX_PDL_EARLY_TRIGGER=1 moves it to right after the wait, so that the
// dependents launch once every block of this grid has started (for measuring with the
// device tools of tests/).
#ifndef AITER_AUX_PDL_EARLY_TRIGGER
#define AITER_AUX_PDL_EARLY_TRIGGER 0
#endif
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define AITER_AUX_PDL_HW 1
#else
#define AITER_AUX_PDL_HW 0
#endif

__device__ __forceinline__ void pdl_wait() {
#if AITER_AUX_PDL_HW
  asm volatile("griddepcontrol.wait;" ::: "memory");
#elif defined(AITER_AUX_GPU_EMU)
  ::aiter_aux_emu::pdl_wait();
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if AITER_AUX_PDL_HW
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#elif defined(AITER_AUX_GPU_EMU)
  ::aiter_aux_emu::pdl_launch_dependents();
#endif
}

struct PdlScope {
  __device__ __forceinline__ PdlScope() {
    pdl_wait();
    if constexpr (AITER_AUX_PDL_EARLY_TRIGGER != 0) pdl_launch_dependents();
  }
  __device__ __forceinline__ ~PdlScope() {
    if constexpr (AITER_AUX_PDL_EARLY_TRIGGER == 0) pdl_launch_dependents();
  }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;
};

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

// --------------------------------------------------------- warp reduce ----
// The largest v of the warp's lanes, in every lane: one REDUX on sm_80+, an xor-shuffle
// butterfly elsewhere (max is exact, so both give the same value).
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  return __reduce_max_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    const uint32_t o = shfl_xor_u32(v, off);
    v = o > v ? o : v;
  }
  return v;
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

// ------------------------------ packed 16-bit operations (mxfp4 quant) ----
// The packed bf16x2 fast path of quant_codes.h (mx_pack8_pk) runs on sm_90 with
// the instructions and in the emulation with their models below.
#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define AITER_AUX_QUANT_PK_HW 1
#else
#define AITER_AUX_QUANT_PK_HW 0
#endif
#if AITER_AUX_QUANT_PK_HW || defined(AITER_AUX_GPU_EMU)
#define AITER_AUX_QUANT_PK 1
#else
#define AITER_AUX_QUANT_PK 0
#endif

// Per 16-bit half: max(a, b) unsigned.
__host__ __device__ __forceinline__ uint32_t pk_max_u16(uint32_t a, uint32_t b) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const uint32_t lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

#if AITER_AUX_QUANT_PK
// Per 16-bit half, signed: max(a + b, c) (one VIADDMNMX on sm_90).  The
// callers' sums never leave the int16 range.
__host__ __device__ __forceinline__ uint32_t pk_addmax_s16(uint32_t a, uint32_t b, uint32_t c) {
#if AITER_AUX_QUANT_PK_HW
  return __viaddmax_s16x2(a, b, c);
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const int32_t sum = static_cast<int16_t>(static_cast<uint16_t>((a >> h) + (b >> h)));
    const int32_t lim = static_cast<int16_t>(static_cast<uint16_t>(c >> h));
    d |= (static_cast<uint32_t>(sum > lim ? sum : lim) & 0xFFFFu) << h;
  }
  return d;
#endif
}

#if !AITER_AUX_QUANT_PK_HW
// bf16 bits of the real number hi + lo (|lo| <= half an ulp of the double hi,
// as TwoSum leaves it), rounded to nearest even; finite nonzero hi.
inline uint32_t emu_round_bf16(double hi, double lo) {
  uint32_t sign = 0;
  if (hi < 0) {
    hi = -hi;
    lo = -lo;
    sign = 0x8000u;
  }
  int e;
  (void)__builtin_frexp(hi, &e);               // hi = f * 2^e, f in [0.5, 1)
  const int qe = e - 8 > -133 ? e - 8 : -133;  // bf16 quantum at hi (normal or subnormal)
  const double t = __builtin_ldexp(hi, -qe);   // exact
  const double fl = __builtin_floor(t);
  const double fr = t - fl;  // exact
  // lo cannot carry hi across a rounding boundary unless hi lies on one
  bool up = fr > 0.5;
  if (fr == 0.5) up = lo > 0 || (lo == 0 && __builtin_fmod(fl, 2.0) != 0.0);
  const float v = static_cast<float>(__builtin_ldexp(fl + (up ? 1.0 : 0.0), qe));  // exact (or inf)
  return sign | (as_u32_any(v) >> 16);
}
#endif

// Per 16-bit half: bf16(a * b + c) with one rounding (fma.rn.bf16x2).  The
// emulation covers finite operands whose exact result is nonzero.
__host__ __device__ __forceinline__ uint32_t pk_fma_bf16(uint32_t a, uint32_t b, uint32_t c) {
#if AITER_AUX_QUANT_PK_HW
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const double x = as_f32_any(((a >> h) & 0xFFFFu) << 16);
    const double y = as_f32_any(((b >> h) & 0xFFFFu) << 16);
    const double z = as_f32_any(((c >> h) & 0xFFFFu) << 16);
    volatile double p = x * y;  // exact: 8-bit significands
    volatile double sum = p + z;
    volatile double bz = sum - p;
    const double err = (p - (sum - bz)) + (z - bz);  // TwoSum: sum + err == p + z
    d |= emu_round_bf16(sum, err) << h;
  }
  return d;
#endif
}
#endif  // AITER_AUX_QUANT_PK

// ---------------------------------------------- one-target conversions ----
#if AITER_AUX_AMDGCN_DEVICE && defined(__gfx950__)
// gfx950 v_cvt_scalef32_pk_fp4_bf16, four times: the 8 bf16 of w (w[j] =
// elements 2j | 2j+1 << 16) divided by 2^(e-127), e = the exponent field of
// scale, to e2m1; element i goes to nibble i.  Why that is the spec's code for
// the blocks quant8 (quant_codes.h) gives it: see there.
__device__ __forceinline__ uint32_t cvt_scalef32_pk_fp4_bf16x8(const uint32_t w[4], float scale) {
  typedef __bf16 bf16x2_t __attribute__((ext_vector_type(2)));
  uint32_t r = 0;
  r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[0]), scale, 0);
  r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[1]), scale, 1);
  r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[2]), scale, 2);
  r = __builtin_amdgcn_cvt_scalef32_pk_fp4_bf16(r, __builtin_bit_cast(bf16x2_t, w[3]), scale, 3);
  return r;
}
#endif

#if defined(AITER_AUX_GPU_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
#define AITER_AUX_FP8_CVT_HW 1
#else
#define AITER_AUX_FP8_CVT_HW 0
#endif

#if AITER_AUX_FP8_CVT_HW
// cvt.rn.satfinite.e4m3x2.f32 d, hi, lo: byte 0 of the result is E4M3(lo)
// (operand b), byte 1 E4M3(hi) (operand a), each rounded to nearest even and
// clamped to +-448.  Why that is the spec's result for the operands quant8_fp8
// (quant_fp8.h) gives it: see the top of quant_fp8.h.
__device__ __forceinline__ uint32_t cvt_rn_satfinite_e4m3x2_f32(float hi, float lo) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
#endif

#if defined(AITER_AUX_GPU_CUDA)
// cvt.rn.bf16x2.f32 d, hi, lo: low half bf16(lo), high half bf16(hi), IEEE
// round to nearest even, subnormals kept; a NaN operand gives some NaN (not
// necessarily 0x7FC0: scatter.h pack_bf16x8 routes NaN elsewhere).
__device__ __forceinline__ uint32_t cvt_rn_bf16x2_f32(float hi, float lo) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
#endif

// ------------------------------------------------------ fp16 -> fp32 ----
// fp16 halves of 32-bit word -> fp32 (exact).
__host__ __device__ __forceinline__ float f16_bits_to_f32_any(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31u) return as_f32_any(sign | 0x7F800000u | (m << 13));
  if (e != 0u) return as_f32_any(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0u) return as_f32_any(sign);
  int sh = 0;  // subnormal: normalise
  uint32_t mm = m;
  while ((mm & 0x400u) == 0u) {
    mm <<= 1;
    ++sh;
  }
  return as_f32_any(sign | (static_cast<uint32_t>(113 - sh) << 23) | ((mm & 0x3FFu) << 13));
}

// The fp16 in the low (kHigh false) or high half of h2 as fp32 (exact).
template <bool kHigh>
__device__ __forceinline__ float f16_half_to_f32(uint32_t h2) {
#if defined(AITER_AUX_GPU_CUDA)
  float r;
  if constexpr (kHigh) {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(r) : "r"(h2));
  } else {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(r) : "r"(h2));
  }
  return r;
#elif defined(AITER_AUX_GPU_EMU)
  return f16_bits_to_f32_any(kHigh ? h2 >> 16 : h2 & 0xFFFFu);
#else
  return static_cast<float>(
      __builtin_bit_cast(_Float16, static_cast<uint16_t>(kHigh ? h2 >> 16 : h2)));
#endif
}

}  // namespace gpu
}  // namespace aiter_aux
