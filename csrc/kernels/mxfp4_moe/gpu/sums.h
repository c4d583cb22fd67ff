// moe_sum on the GPU; docs/ops.md "moe_sum" is the spec (aiter_aux/reference/sums.py).
//
// output[t] = round(fp32(acc) * factor), acc = +0.0 then acc + fp32(input[t, k]) for
// k = 0..topk-1 in order (f32_add_rn: each add rounded, never contracted), skipping the slots
// that topk_ids / expert_map mark non-local; round = sum_codec (RNE, canonical NaN).  One
// instance serves every shape and dtype: model_dim and topk are run-time values, the dtype
// selects one of the kernels below.
//
// Two kernels, each one thread per (token, V consecutive columns) unit with the
// scatter's memory traffic per output element (topk rows read once, the output written
// once) minus its indirection (a slot's row is input[t, k], no reverse_sorted / weight
// load): sum_kernel loads a unit's slots itself, kKB at a time, grid-stride; at decode sizes
// sum_split_kernel spreads a unit's slots over kKP threads and sums them from shared memory.
// launch_sum picks the shape (measured by tests/sum_sweep.cu).  model_dim not a multiple of
// the vector: 8-byte or one-element units (same order, same bits).  A skipped slot issues no
// load.
#pragma once

#include "../sum_codec.h"
#include "scatter_small.h"

namespace aiter_aux {
namespace gpu {
namespace sum_detail {

using scatter_detail::kThreads;

// Bytes per element of an AiterAuxDType.
template <int kDT>
__host__ __device__ constexpr int elem_bytes() {
  return kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
}

// Slot (t, k) is summed: no topk_ids, or its id >= 0 and (with expert_map) < the map's
// length and mapped to >= 0.
__device__ __forceinline__ bool slot_kept(const AiterAuxSumArgs& a, int64_t t, int64_t k) {
  if (a.topk_ids == nullptr) return true;
  const int32_t id = a.topk_ids[t * a.topk + k];
  if (id < 0) return false;
  if (a.expert_map == nullptr) return true;
  return id < a.num_global_experts && a.expert_map[id] >= 0;
}

// V elements (kB = V * elem bytes: 16, 8, 4 or 2) as kB / 4 words (1 word for kB = 2);
// `al`: the kB-byte access is aligned.
template <int kB>
__device__ __forceinline__ void load_vec(const void* p, bool al, uint32_t* w) {
  const uint16_t* h = static_cast<const uint16_t*>(p);
  if constexpr (kB == 16) {
    load_bf16x8(h, al, w);
  } else if constexpr (kB == 8) {
    scatter_detail::load_bf16xv<4>(h, al, w);
  } else if constexpr (kB == 4) {
    scatter_detail::load_bf16xv<2>(h, al, w);
  } else {
    w[0] = h[0];
  }
}

template <int kB>
__device__ __forceinline__ void store_vec(void* p, bool al, const uint32_t* w) {
  uint16_t* h = static_cast<uint16_t*>(p);
  if constexpr (kB == 16) {
    store_bf16x8(h, al, w);
  } else if constexpr (kB == 8) {
    scatter_detail::store_bf16xv<4>(h, al, w);
  } else if constexpr (kB == 4) {
    scatter_detail::store_bf16xv<2>(h, al, w);
  } else {
    h[0] = static_cast<uint16_t>(w[0]);
  }
}

// Element j of a vector of kDT as fp32 (exact).
template <int kDT>
__device__ __forceinline__ float elem_f32(const uint32_t* w, int j) {
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
    return as_f32(w[j]);
  } else {
    const uint32_t x = w[j / 2];
    if constexpr (kDT == AITER_AUX_DTYPE_BF16)
      return as_f32((j % 2) ? (x & 0xFFFF0000u) : (x << 16));
    return (j % 2) ? f16_half_to_f32<true>(x) : f16_half_to_f32<false>(x);
  }
}

// kDT: the dtype; V: elements per thread (V divides model_dim); kT: threads per block;
// kKB: slots whose loads are issued together.
template <int kDT, int V, int kT, int kKB>
__global__ __launch_bounds__(kT) void sum_kernel(AiterAuxSumArgs a, int num_blocks, bool in_al,
                                                 bool out_al) {
  const PdlScope pdl;
  constexpr int kB = V * elem_bytes<kDT>();
  constexpr int kWords = kB < 4 ? 1 : kB / 4;
  const int64_t D = a.model_dim, K = a.topk;
  const int64_t per_row = D / V;
  const int64_t units = a.num_tokens * per_row;
  const int64_t stride = static_cast<int64_t>(num_blocks) * kT;
  const char* in = static_cast<const char*>(a.input);
  char* out = static_cast<char*>(a.output);
  constexpr int64_t kE = elem_bytes<kDT>();
  int64_t u = static_cast<int64_t>(block_idx()) * kT + thread_idx();
  if (u >= units) return;
  // (t, column unit) of u, advanced without a division per step
  int64_t t = u / per_row, cu = u - t * per_row;
  const int64_t dt = stride / per_row, dc = stride - dt * per_row;
  for (; u < units; u += stride) {
    const int64_t col = cu * V;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    const char* row = in + ((t * K) * D + col) * kE;
#pragma unroll 1
    for (int64_t k0 = 0; k0 < K; k0 += kKB) {
      bool ok[kKB];
      uint32_t raw[kKB][kWords];
#pragma unroll
      for (int i = 0; i < kKB; ++i) ok[i] = k0 + i < K && slot_kept(a, t, k0 + i);
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (ok[i]) {
          load_vec<kB>(row + (k0 + i) * D * kE, in_al, raw[i]);
        } else {
#pragma unroll
          for (int w = 0; w < kWords; ++w) raw[i][w] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < kKB; ++i) {
        if (!ok[i]) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = f32_add_rn(acc[j], elem_f32<kDT>(raw[i], j));
      }
    }
    scatter_detail::scale_sum<V>(acc, a.routed_scaling_factor);
    uint32_t w[kWords];
    if constexpr (kDT == AITER_AUX_DTYPE_F32) {
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = sum_codec::f32_bits_to_out(as_u32(acc[j]), kDT);
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        w[j] = sum_codec::f32_bits_to_out(as_u32(acc[2 * j]), kDT);
        if (2 * j + 1 < V) w[j] |= sum_codec::f32_bits_to_out(as_u32(acc[2 * j + 1]), kDT) << 16;
      }
    }
    store_vec<kB>(out + (t * D + col) * kE, out_al, w);
    t += dt;
    cu += dc;
    if (cu >= per_row) {
      cu -= per_row;
      ++t;
    }
  }
}

// The split shape of small M: each thread loads one 16-byte vector of one slot, the block's
// kKP slot lanes x (kT / kKP) column units staged in shared memory, then the first lane of
// each unit sums its slots in order (the same adds in the same order as sum_kernel).  Spreads
// a token's topk rows over kKP times more threads and blocks than sum_kernel, so that a
// decode-sized call's loads come from many SMs in one round trip.  topk <= kKP; model_dim a
// multiple of the 16-byte vector.
template <int kDT, int kKP, int kT>
__global__ __launch_bounds__(kT) void sum_split_kernel(AiterAuxSumArgs a, int col_blocks,
                                                       bool in_al, bool out_al) {
  const PdlScope pdl;
  constexpr int kE = elem_bytes<kDT>();
  constexpr int V = 16 / kE;
  constexpr int kC = kT / kKP;  // column units per block
  __shared__ uint32_t stage[kKP][kC][4];
  __shared__ bool kept[kKP][kC];
  const int64_t D = a.model_dim, K = a.topk, per_row = D / V;
  const int64_t t = block_idx() / col_blocks;
  const int c = thread_idx() % kC, k = thread_idx() / kC;
  const int64_t cu = static_cast<int64_t>(block_idx() % col_blocks) * kC + c;
  const bool live = cu < per_row;
  const char* in = static_cast<const char*>(a.input);
  const bool ok = live && k < K && slot_kept(a, t, k);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (ok) load_vec<16>(in + ((t * K + k) * D + cu * V) * kE, in_al, w);
#pragma unroll
  for (int i = 0; i < 4; ++i) stage[k][c][i] = w[i];
  kept[k][c] = ok;
  block_sync();
  if (k != 0 || !live) return;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < kKP; ++i) {
    if (i >= K) break;
    if (!kept[i][c]) continue;
    uint32_t r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) r[q] = stage[i][c][q];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = f32_add_rn(acc[j], elem_f32<kDT>(r, j));
  }
  scatter_detail::scale_sum<V>(acc, a.routed_scaling_factor);
  uint32_t o[4];
  if constexpr (kDT == AITER_AUX_DTYPE_F32) {
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = sum_codec::f32_bits_to_out(as_u32(acc[j]), kDT);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      o[j] = sum_codec::f32_bits_to_out(as_u32(acc[2 * j]), kDT) |
             (sum_codec::f32_bits_to_out(as_u32(acc[2 * j + 1]), kDT) << 16);
  }
  store_vec<16>(static_cast<char*>(a.output) + (t * D + cu * V) * kE, out_al, o);
}

template <int kDT, int kKP, int kT>
inline int launch_sum_split(const AiterAuxSumArgs& a, void* stream) {
  constexpr int kC = kT / kKP;
  const int64_t per_row = a.model_dim / (16 / elem_bytes<kDT>());
  const int col_blocks = static_cast<int>(ceil_div_i64(per_row, kC));
  const bool in_al = is_aligned(a.input, 16), out_al = is_aligned(a.output, 16);
  AITER_AUX_LAUNCH((sum_split_kernel<kDT, kKP, kT>), dim3(a.num_tokens * col_blocks), dim3(kT),
                   static_cast<hipStream_t>(stream))(a, col_blocks, in_al, out_al);
  return check_launch("moe_sum");
}

template <int kDT, int V, int kT, int kKB>
inline int launch_sum_shape(const AiterAuxSumArgs& a, void* stream, int max_blocks) {
  constexpr int kB = V * elem_bytes<kDT>();
  const int64_t units = a.num_tokens * (a.model_dim / V);
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kT), 1, max_blocks));
  // model_dim % V == 0: every row is aligned like the base pointer
  const bool in_al = is_aligned(a.input, kB), out_al = is_aligned(a.output, kB);
  AITER_AUX_LAUNCH((sum_kernel<kDT, V, kT, kKB>), dim3(blocks), dim3(kT),
                   static_cast<hipStream_t>(stream))(a, blocks, in_al, out_al);
  return check_launch("moe_sum");
}

// Inputs up to this many bytes take the split shape (sum_split_kernel); topk 9..16 up to
// kSplitWideMaxBytes.
constexpr int64_t kSplitMaxBytes = int64_t(1) << 20;
constexpr int64_t kSplitWideMaxBytes = int64_t(2) << 20;
// topk 5..8 with inputs in [kMidMinBytes, kMidMaxBytes]: 256 threads with 4 slots in flight.
constexpr int64_t kMidMinBytes = int64_t(6) << 20, kMidMaxBytes = int64_t(17) << 20;
// topk 9..16 from this many tokens: 256 threads with 8 slots in flight over at most
// kWideCapBlocks blocks (grid-stride); with topk_ids (slots skipped) 256 threads with 4.
constexpr int64_t kWideMinTokens = 2048;
constexpr int kWideCapBlocks = 8192;
constexpr int64_t kSkipMinTokens = 128;  // from here topk_ids' 256 x 4

// The launch shape of (M, topk, model_dim), from tests/sum_sweep.cu on the H200 (bf16, the
// four (topk, model_dim) of the benchmark's sum rows, M = 1 .. 16384, PDL on): the split
// shape up to kSplitMaxBytes of input (M <= 8 at (8, 7168), <= 32 at (8, 2048): 5-25 %
// faster than one thread per unit there, which loads all topk rows of its columns from one
// SM), above it 16-byte loads, 256 threads with 4 slots in flight for topk <= 4 and for
// topk <= 8 between kMidMinBytes and kMidMaxBytes of input (M = 64 at (8, 7168), 128-256 at
// (8, 4096), 256-512 at (8, 2048): 2-7 % faster there), else 128 threads with 8 (within 7 %
// of the sweep's best shape from M = 16 on); topk 9..16 above the split: 128 threads with
// 16, so that a thread's slots load in one round trip (8 then the rest took two), and from
// kWideMinTokens 256 threads with 8 over at most kWideCapBlocks blocks.  The last: the H200
// bench (bench_aux, the default shapes) with this shape and with 128 x 16, topk 9 / 11 / 16:
// moe_sum 86-103 % of the copy bandwidth at M = 2048-65536 against 82-103 % (topk 9: 99
// against 83 % at M = 4096), with topk_ids and an expert_map 75-102 % against 58-84 %; at
// M = 1024 the 128 x 16 shape is ahead (topk 9: 79 against 60 %, with a map 56 against 40).
// With topk_ids, where slots may be skipped, topk 9..16 take 256 threads with 4 in flight from
// kSkipMinTokens (the H100 sweep, topk 9, model_dim 7168, half the slots local: 1.10-1.66x as
// fast as 128 x 16 or 256 x 8 from M = 128, within 1-4 % of them without skipped slots; the
// H100 bench, moe_sum_ep at topk 9 / 11 / 16: 1.02-1.38x from M = 128, but 0.86-0.96x at
// M = 32-64 for topk 11 and 16), and the split shape reaches 2 MiB for topk 9..16 (M = 16 at
// (9, 7168): 1.10x as fast, 1.58x with an expert map; the bench: 1.14-1.21x, ep 1.70-2.02x).
template <int kDT>
inline int launch_sum(const AiterAuxSumArgs& a, void* stream) {
  constexpr int kE = elem_bytes<kDT>();
  constexpr int kV = 16 / kE;
  const int64_t K = a.topk;
  if (a.model_dim % kV == 0) {
    const int64_t bytes = a.num_tokens * K * a.model_dim * kE;
    if (K <= 8 && bytes <= kSplitMaxBytes) {
      if (K <= 4) return launch_sum_split<kDT, 4, 128>(a, stream);
      return launch_sum_split<kDT, 8, 128>(a, stream);
    }
    if (K > 8) {
      const bool wide = a.num_tokens >= kWideMinTokens;
      if (K <= 16 && bytes <= kSplitWideMaxBytes) return launch_sum_split<kDT, 16, 256>(a, stream);
      if (a.topk_ids != nullptr && a.num_tokens >= kSkipMinTokens)
        return launch_sum_shape<kDT, kV, 256, 4>(a, stream, wide ? kWideCapBlocks : 65535);
      if (wide) return launch_sum_shape<kDT, kV, 256, 8>(a, stream, kWideCapBlocks);
      return launch_sum_shape<kDT, kV, 128, 16>(a, stream, 65535);
    }
    if (K <= 4 || (K <= 8 && bytes >= kMidMinBytes && bytes <= kMidMaxBytes))
      return launch_sum_shape<kDT, kV, 256, 4>(a, stream, 65535);
    return launch_sum_shape<kDT, kV, 128, 8>(a, stream, 65535);
  }
  if (a.model_dim % (8 / kE) == 0) return launch_sum_shape<kDT, 8 / kE, 128, 16>(a, stream, 65535);
  return launch_sum_shape<kDT, 1, kThreads, 8>(a, stream, 65535);
}

}  // namespace sum_detail

// moe_sum: one instance for every shape and dtype.
inline int moe_sum(const AiterAuxSumArgs& a, void* stream) {
  const char* op = "moe_sum";
  if (a.num_tokens < 0 || a.model_dim < 0)
    return fail_invalid("%s: negative num_tokens / model_dim", op);
  if (a.topk < 1) return fail_invalid("%s: topk %lld < 1", op, static_cast<long long>(a.topk));
  if (a.dtype < AITER_AUX_DTYPE_F32 || a.dtype > AITER_AUX_DTYPE_BF16)
    return fail_invalid("%s: unknown dtype code %d", op, a.dtype);
  if (a.num_tokens == 0 || a.model_dim == 0) return AITER_AUX_OK;
  if (a.input == nullptr || a.output == nullptr) return fail_invalid("%s: null tensor pointer", op);
  if (a.expert_map != nullptr && a.topk_ids == nullptr)
    return fail_invalid("%s: expert_map without topk_ids", op);
  switch (a.dtype) {
    case AITER_AUX_DTYPE_F32:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_F32>(a, stream);
    case AITER_AUX_DTYPE_F16:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_F16>(a, stream);
    default:
      return sum_detail::launch_sum<AITER_AUX_DTYPE_BF16>(a, stream);
  }
}

}  // namespace gpu
}  // namespace aiter_aux
