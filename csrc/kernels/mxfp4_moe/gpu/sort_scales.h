// moe_sort_scales on the GPU; docs/ops.md is the spec.
//
// Output dword w = ((((c*C_M1 + mi)*C_K1 + ku)*4 + kl)*16 + nl) holds
// in byte 2*ik + ia the scale a_scale[token(row), 8*ku + 4*ik + kl] of row
// c*BM + (2*mi + ia)*16 + nl, or 0 for a row that is padding, at/after
// num_valid_ids[0] (read on the device) or at/after max_rows.  Every byte of
// the output is written.
//
// Work layout.  A 32-row tile (c, mi) is rows tile*32 + [0, 32) (tile =
// c*C_M1 + mi) and owns the kCK1*256 = D contiguous output bytes at tile*D.
// Each 32-lane sub-warp (a warp on NVIDIA, half a wave on CDNA) transposes
// one tile at a time through its own shared-memory buffer, without block
// barriers, over units = (tile, column slab of at most KuMax ku).  The grid
// has one sub-warp per unit, up to kMaxBlocks blocks; beyond that a grid-stride
// loop, with the token ids of a sub-warp's next unit loaded while the current
// one is processed.  KuMax = 32 (one slab per tile up to D = 8192) when there
// are enough tiles to fill the GPU, else KuMax = 8 (decode: ~4x the units, so
// the few tiles' stores are spread over more sub-warps); when a wide slab would
// be more than kMaxWideSlots slots (D >= 3584 with 16-byte slots), KuMax = 10
// at prefill and 8 at decode.
// Per unit:
//  1. Lane l holds token(tile*32 + l) (or -1 for a zero row).  The buffer has
//     32 rows of kPitch V-byte slots (kSlots = slab bytes / V used, kPitch odd).
//     Lane l loads slots s = 32*k + l, k < kPitch (row s / kPitch, slot
//     s % kPitch; the row's token from a shuffle): every load instruction reads
//     512 (V = 16) or 256 (V = 8) row-contiguous bytes of ~2 token rows, and
//     all kPitch loads of a lane are in flight together.  Then it stores them
//     to the slots: consecutive lanes, consecutive slots (conflict-free).
//  2. For each slot j, lane (e = l / 16, nl = l % 16) reads slot j of rows nl
//     and 16 + nl (odd pitch: conflict-free; the two halves read the same
//     addresses) and, for each ku of the slot, builds the dwords kl = e and
//     kl = e + 2 of (ku, nl) with byte permutes.  A store instruction of the
//     sub-warp writes (kl = 0/1 or 2/3, nl = 0..15): one contiguous 128-byte run.
// V = 16 when the rows are 16-byte aligned (D % 512 == 0, a_scale 16-aligned),
// else V = 8 (8-, 4-byte or byte loads by the alignment of a_scale).
#pragma once

#include "../sort_checks.h"
#include "common.h"

namespace aiter_aux {
namespace gpu {
namespace scales_detail {

constexpr int kThreads = 128;
constexpr int kSubWarps = kThreads / 32;  // tiles in flight per block
constexpr int kKuWide = 32;   // KuMax of the large-problem kernel: 256 bytes of a row per slab
constexpr int kKuNarrow = 8;  // KuMax when the tiles alone would not fill the GPU
// KuMax at prefill when a wide slab would have more than kMaxWideSlots slots:
// with 16-byte slots, 5 per slab, so step 1's 5 x 32 slot loads are 32 rows x 5
// with no idle lane (D = 7168: slabs of 10, 10, 8 ku)
constexpr int kKuMid = 10;
// Below two_blocks_per_sm() blocks of wide slabs (launch_traits.h; 264 on an H200): narrow slabs
constexpr int kMaxWideSlots = 6;  // above it, narrow slabs at every size
// Grid cap.  Below it, one unit per sub-warp: the hardware's block scheduler
// keeps the SMs evenly fed (a grid capped at 2048 blocks that looped was 5-8 %
// slower at D = 7168).  Past it (more than 2^22 units)
// the grid-stride loop; the emulator self-test builds with a small cap so that
// the loop runs there.
#ifndef AITER_AUX_SORT_SCALES_MAX_BLOCKS
#define AITER_AUX_SORT_SCALES_MAX_BLOCKS (1 << 20)
#endif
constexpr int kMaxBlocks = AITER_AUX_SORT_SCALES_MAX_BLOCKS;

template <int D, int V, int KuMax>
struct Layout {
  static_assert(V == 8 || V == 16, "slot size is 8 or 16 bytes");
  static constexpr int kCK1 = D / 256;
  static constexpr int kCols = D / 32;  // scale bytes of a token row
  static constexpr int kKuPerSlot = V / 8;
  static_assert(kCK1 % kKuPerSlot == 0, "16-byte slots need D % 512 == 0");
  static constexpr int kSlabs = (kCK1 + KuMax - 1) / KuMax;
  // ku per slab (the last one may have fewer), a whole number of slots
  static constexpr int kKuSlab =
      ((kCK1 + kSlabs - 1) / kSlabs + kKuPerSlot - 1) / kKuPerSlot * kKuPerSlot;
  static constexpr int kSlots = kKuSlab / kKuPerSlot;  // slots of a row in a full slab
  static constexpr int kPitch = kSlots | 1;            // odd row pitch in slots
  static constexpr int kWords = V / 4;
};

template <int V>
struct SlotVec;
template <>
struct SlotVec<16> {
  using T = uint4;
};
template <>
struct SlotVec<8> {
  using T = uint2;
};

template <int V>
__device__ __forceinline__ void load_slot(const uint8_t* p, bool al8, bool al4, uint32_t* w) {
  if constexpr (V == 16) {  // the caller checked 16-byte alignment
    load_u32x4(p, w);
  } else if (al8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    w[0] = load_u8x4(p, al4);
    w[1] = load_u8x4(p + 4, al4);
  }
}

template <int V>
__device__ __forceinline__ void store_slot(typename SlotVec<V>::T* s, const uint32_t* w) {
  if constexpr (V == 16) {
    *s = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    uint2 v;
    v.x = w[0];
    v.y = w[1];
    *s = v;
  }
}

template <int V>
__device__ __forceinline__ void read_slot(const typename SlotVec<V>::T* s, uint32_t* w) {
  const typename SlotVec<V>::T v = *s;
  w[0] = v.x;
  w[1] = v.y;
  if constexpr (V == 16) {
    w[2] = v.z;
    w[3] = v.w;
  }
}

// sorted_token_ids[row], or -1 past max_rows (its length).
__device__ __forceinline__ int32_t load_token_id(const AiterAuxSortScalesArgs& a, int64_t row) {
  return row < a.max_rows ? a.sorted_token_ids[row] : -1;
}

template <int D, int V, int KuMax>
__global__ __launch_bounds__(kThreads) void sort_scales_kernel(AiterAuxSortScalesArgs a,
                                                               int64_t total_tiles, int num_blocks,
                                                               bool in_al8, bool in_al4,
                                                               bool out_al4) {
  const PdlScope pdl;
  using L = Layout<D, V, KuMax>;
  using Slot = typename SlotVec<V>::T;
  __shared__ Slot smem[kSubWarps][32 * L::kPitch];
  Slot* buf = smem[thread_idx() / 32];
  const int lane = lane_id();
  const int sl = lane & 31;     // row of the tile this lane loads the token of
  const int sub0 = lane & ~31;  // first lane of this sub-warp
  const int nl = sl & 15;       // step 2: rows nl and 16 + nl
  const int e = sl >> 4;        // step 2: dwords kl = e and e + 2
  const int sh = 8 * e;
  const uint32_t m = static_cast<uint32_t>(a.num_tokens);
  const int64_t stride = static_cast<int64_t>(num_blocks) * kSubWarps;
  const int64_t total_units = total_tiles * L::kSlabs;  // unit = tile * kSlabs + slab
  // The warp's first sub-warp drives the loop (warp-uniform); on a 64-lane
  // wave the second one's unit may be past the end (then it only zero-passes).
  const int64_t warp_unit0 =
      static_cast<int64_t>(block_idx()) * kSubWarps + warp_id() * (kWarpSize / 32);
  int64_t unit = warp_unit0 + (lane >> 5);
  int32_t raw = load_token_id(a, unit / L::kSlabs * 32 + sl);  // issued with the num_valid_ids load
  int64_t lim = a.num_valid_ids[0];
  if (lim > a.max_rows) lim = a.max_rows;
  for (int64_t wu = warp_unit0; wu < total_units; wu += stride, unit += stride) {
    const bool unit_ok = unit < total_units;
    const int64_t tile = unit / L::kSlabs;
    const int slab = static_cast<int>(unit - tile * L::kSlabs);
    const uint32_t t24 = static_cast<uint32_t>(raw) & 0xFFFFFFu;
    const int tok = (tile * 32 + sl < lim && t24 < m) ? static_cast<int>(t24) : -1;
    raw =
        load_token_id(a, (unit + stride) / L::kSlabs * 32 + sl);  // next unit: in flight meanwhile
    uint8_t* dst_tile = a.sorted_scales + tile * D;
    {
      const int ku0 = slab * L::kKuSlab;
      const int slab_ku = L::kCK1 - ku0 < L::kKuSlab ? L::kCK1 - ku0 : L::kKuSlab;
      const int slots =
          L::kSlabs == 1 ? L::kSlots : slab_ku / L::kKuPerSlot;  // used slots of a row
      // 1. row-contiguous loads of the tile's rows into the buffer
      uint32_t w[L::kPitch][L::kWords];
#pragma unroll
      for (int k = 0; k < L::kPitch; ++k) {
        const int s = k * 32 + sl;
        const int r = s / L::kPitch;
        const int j = s - r * L::kPitch;
        const int t = shfl_idx_i32(tok, sub0 + r);
#pragma unroll
        for (int i = 0; i < L::kWords; ++i) w[k][i] = 0u;
        if (t >= 0 && j < slots)
          load_slot<V>(a.a_scale + static_cast<int64_t>(t) * L::kCols + ku0 * 8 + j * V, in_al8,
                       in_al4, w[k]);
      }
#pragma unroll
      for (int k = 0; k < L::kPitch; ++k) store_slot<V>(buf + k * 32 + sl, w[k]);
      warp_sync();
      // 2. column reads, byte transpose, 128-byte store runs
#pragma unroll
      for (int j = 0; j < L::kSlots; ++j) {
        if (j >= slots) break;  // warp-uniform
        uint32_t x[L::kWords], y[L::kWords];
        read_slot<V>(buf + nl * L::kPitch + j, x);         // row nl (ia 0)
        read_slot<V>(buf + (16 + nl) * L::kPitch + j, y);  // row 16 + nl (ia 1)
#pragma unroll
        for (int u = 0; u < L::kKuPerSlot; ++u) {
          // bytes e and e + 2 of the four words [ia0 ik0, ia1 ik0, ia0 ik1, ia1 ik1]
          const uint32_t lo = byte_perm(x[2 * u] >> sh, y[2 * u] >> sh, 0x6240u);
          const uint32_t hi = byte_perm(x[2 * u + 1] >> sh, y[2 * u + 1] >> sh, 0x6240u);
          const int ku = ku0 + j * L::kKuPerSlot + u;
          uint8_t* dst = dst_tile + ku * 256 + (e * 16 + nl) * 4;  // dword (kl = e, nl)
          if (unit_ok) {
            store_u8x4(dst, out_al4, byte_perm(lo, hi, 0x5410u));
            store_u8x4(dst + 128, out_al4, byte_perm(lo, hi, 0x7632u));  // kl = e + 2
          }
        }
      }
      warp_sync();  // the buffer is rewritten by the next unit
    }
  }
}

template <int D, int V, int KuMax>
void launch_sort_scales_ku(const AiterAuxSortScalesArgs& a, int64_t total_tiles, hipStream_t stream,
                           bool in_al8, bool in_al4, bool out_al4) {
  const int64_t units = total_tiles * Layout<D, V, KuMax>::kSlabs;
  const int blocks = static_cast<int>(clamp_i64(ceil_div_i64(units, kSubWarps), 1, kMaxBlocks));
  AITER_AUX_LAUNCH((sort_scales_kernel<D, V, KuMax>), dim3(blocks), dim3(kThreads), stream)(
      a, total_tiles, blocks, in_al8, in_al4, out_al4);
}

template <int D, int V>
void launch_sort_scales(const AiterAuxSortScalesArgs& a, int64_t total_tiles, hipStream_t stream,
                        bool in_al8, bool in_al4, bool out_al4) {
  constexpr bool kNarrowHelps = Layout<D, V, kKuNarrow>::kSlabs > Layout<D, V, kKuWide>::kSlabs;
  // Narrower slabs at every size when a wide slab has more than kMaxWideSlots
  // slots per row (kKuMid at prefill, kKuNarrow at decode), e.g. D = 7168 (14 slots,
  // 96 registers) and D = 3584 (7 slots: narrow measured 3 % faster at
  // M >= 16384 with the uncapped grid); D = 2560 (5 slots) keeps
  // wide slabs at prefill.
  constexpr bool kAlwaysNarrow = kNarrowHelps && Layout<D, V, kKuWide>::kSlots > kMaxWideSlots;
  const bool small =
      ceil_div_i64(total_tiles * Layout<D, V, kKuWide>::kSlabs, kSubWarps) < two_blocks_per_sm();
  if constexpr (kAlwaysNarrow) {
    if (small)
      launch_sort_scales_ku<D, V, kKuNarrow>(a, total_tiles, stream, in_al8, in_al4, out_al4);
    else
      launch_sort_scales_ku<D, V, kKuMid>(a, total_tiles, stream, in_al8, in_al4, out_al4);
  } else if (kNarrowHelps && small) {
    launch_sort_scales_ku<D, V, kKuNarrow>(a, total_tiles, stream, in_al8, in_al4, out_al4);
  } else {
    launch_sort_scales_ku<D, V, kKuWide>(a, total_tiles, stream, in_al8, in_al4, out_al4);
  }
}

}  // namespace scales_detail

template <int ModelDim>
int moe_sort_scales(const AiterAuxSortScalesArgs& a, void* stream) {
  static_assert(ModelDim > 0 && ModelDim % 256 == 0,
                "model_dim must be a positive multiple of 256");
  using namespace scales_detail;
  const char* op = "moe_sort_scales";
  if (a.model_dim != ModelDim)
    return fail_invalid("%s: model_dim %d does not match the instance (%d)", op, a.model_dim,
                        ModelDim);
  const int rc = check_sort_rows(a.block_m, a.num_tokens, a.max_rows, op, fail_invalid);
  if (rc != AITER_AUX_OK) return rc;
  const int64_t bm = a.block_m > 32 ? a.block_m : 32;
  const int64_t out_rows = ceil_div_i64(a.max_rows, bm) * bm;
  if (out_rows == 0) return AITER_AUX_OK;
  if (a.sorted_scales == nullptr || a.sorted_token_ids == nullptr || a.num_valid_ids == nullptr ||
      (a.num_tokens > 0 && a.a_scale == nullptr))
    return fail_invalid("%s: null tensor pointer", op);
  // out_rows is a multiple of 32 (BM >= 32): whole 32-row tiles.
  const int64_t total_tiles = out_rows / 32;
  const auto s = static_cast<hipStream_t>(stream);
  const bool out_al4 = is_aligned(a.sorted_scales, 4);
  bool done = false;
  if constexpr (ModelDim % 512 == 0) {  // rows of D/32 bytes, a multiple of 16
    if (is_aligned(a.a_scale, 16)) {
      launch_sort_scales<ModelDim, 16>(a, total_tiles, s, true, true, out_al4);
      done = true;
    }
  }
  if (!done)
    launch_sort_scales<ModelDim, 8>(a, total_tiles, s, is_aligned(a.a_scale, 8),
                                    is_aligned(a.a_scale, 4), out_al4);
  return check_launch(op);
}

}  // namespace gpu
}  // namespace aiter_aux
