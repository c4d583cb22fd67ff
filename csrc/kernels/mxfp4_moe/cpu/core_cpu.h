// CPU kernels of moe_sort, mxfp4_quant, moe_sort_quant, moe_sort_scales and the
// scatter-reduces, and the sort and quant helpers mxfp8_cpu.h shares (docs/ops.md is the
// spec; every output byte must equal aiter_aux/reference).  Generic: every shape parameter
// (num_experts, topk, model_dim) is read from the args at run time, so each kernel is compiled
// once per module, in the generated kernels TU of this header (templates/cpu_kernels.j2):
//
//   #include "cpu/core_cpu.h"
//   extern "C" int aiter_aux_cpu_moe_sort(const void* args, void*) {
//     return aiter_aux::cpu::moe_sort(*static_cast<const AiterAuxSortArgs*>(args));
//   }
//
// An instance TU of the CPU backend includes no kernel header: it names its key and calls
// the kernel of its op (templates/instance.j2).
//
// Built with -std=c++17 -O3 -fopenmp -fno-fast-math -ffp-contract=off.  Without
// -fopenmp the kernels run serially and give the same bytes: every parallel
// split is by fixed chunks, independent of the thread count.
//
// Every kernel first checks the run-time fields of its args and returns
// AITER_AUX_ERR_INVALID_ARGUMENT (after aiter_aux_set_error) before writing anything.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../aiter_aux_limits.h"
#include "../mxfp4_moe_aux_abi.h"
#include "../sort_checks.h"
#include "cpu_common.h"
#include "mxfp4_codec.h"

namespace aiter_aux {
namespace cpu {

namespace detail {

// ------------------------------------------------------------------ moe_sort

// The local expert of topk id `id` as unsigned (>= E, e.g. 2^32 - 1, when not local): the
// id itself, or expert_map[id] for ids in [0, num_global_experts) with a map.
inline uint32_t local_expert(const AiterAuxSortArgs& a, int32_t id) {
  const uint32_t g = static_cast<uint32_t>(id);
  if (a.expert_map == nullptr) return g;
  return g < static_cast<uint64_t>(a.num_global_experts) ? static_cast<uint32_t>(a.expert_map[g])
                                                         : 0xFFFFFFFFu;
}

// zero_buf := zero_init (bit copy) or +0.0.
inline void init_zero_buf(const AiterAuxSortArgs& a) {
  if (a.zero_init != nullptr && a.zero_numel > 0)
    std::memcpy(a.zero_buf, a.zero_init, static_cast<size_t>(a.zero_numel) * sizeof(uint16_t));
  else
    zero_u16(a.zero_buf, a.zero_numel);
}

inline int check_sort(const AiterAuxSortArgs& a, const char* op) {
  if (a.num_experts < 1 || a.num_experts > AITER_AUX_MAX_NUM_EXPERTS)
    return invalid_arg("%s: num_experts=%d not in [1, %d]", op, a.num_experts,
                       AITER_AUX_MAX_NUM_EXPERTS);
  if (a.topk < 1 || a.topk > AITER_AUX_MAX_TOPK)
    return invalid_arg("%s: topk=%d not in [1, %d]", op, a.topk, AITER_AUX_MAX_TOPK);
  const int rc = check_sort_rows(a.block_m, a.num_tokens, a.max_rows, op, invalid_arg);
  if (rc != AITER_AUX_OK) return rc;
  if (a.zero_numel < 0) return invalid_arg("%s: zero_numel=%lld < 0", op, (long long)a.zero_numel);
  if (a.zero_buf == nullptr && a.zero_numel != 0)
    return invalid_arg("%s: zero_buf is NULL but zero_numel=%lld", op, (long long)a.zero_numel);
  if (a.num_valid_ids == nullptr) return invalid_arg("%s: num_valid_ids is NULL", op);
  if (a.expert_map == nullptr ? a.num_global_experts != 0 : a.num_global_experts < 0)
    return invalid_arg("%s: expert_map / num_global_experts=%lld disagree", op,
                       (long long)a.num_global_experts);
  if (a.num_tokens > 0 &&
      (a.topk_ids == nullptr || a.topk_weights == nullptr || a.sorted_token_ids == nullptr ||
       a.sorted_weights == nullptr || a.m_indices == nullptr || a.sorted_expert_ids == nullptr ||
       a.reverse_sorted == nullptr))
    return invalid_arg("%s: NULL input/output pointer", op);
  return AITER_AUX_OK;
}

// Counting sort by expert; within an expert, pairs in ascending (t, k).
// Tokens are split into fixed chunks (independent of the thread count): a
// per-chunk histogram, a serial exclusive scan over (expert, chunk) and a
// per-chunk scatter keep the order deterministic.
inline int sort_impl(const AiterAuxSortArgs& a, const char* op) {
  const int E = a.num_experts;
  const int topk = a.topk;
  const int64_t M = a.num_tokens;
  const int64_t bm = a.block_m;
  if (M == 0) {
    a.num_valid_ids[0] = 0;
    a.num_valid_ids[1] = 0;
    init_zero_buf(a);
    return AITER_AUX_OK;
  }
  const int32_t* __restrict ids = a.topk_ids;

  // ~64K pairs per chunk (a serial pass over that costs well under a
  // millisecond, less than waking threads on a busy machine), at most 64.
  const int64_t want_tok = (int64_t(65536) + topk - 1) / topk;
  int64_t nc = ceil_div(M, want_tok);
  if (nc > 64) nc = 64;
  const int64_t tpc = ceil_div(M, nc);
  nc = ceil_div(M, tpc);

  // hist[c * E + e]: pairs of chunk c for expert e; later, the first row of
  // those pairs.
  std::vector<int64_t> hist(static_cast<size_t>(nc * E), 0);
  int64_t* __restrict h = hist.data();

#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    int64_t* __restrict hc = h + c * E;
    const int64_t t1 = (c + 1) * tpc < M ? (c + 1) * tpc : M;
    for (int64_t i = c * tpc * topk; i < t1 * topk; ++i) {
      const uint32_t e = local_expert(a, ids[i]);
      if (e < static_cast<uint32_t>(E)) ++hc[e];
    }
  }

  std::vector<int64_t> cnt(E), start(E);
  int64_t total = 0;
  for (int e = 0; e < E; ++e) {
    int64_t run = total;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t n = h[c * E + e];
      h[c * E + e] = run;
      run += n;
    }
    start[e] = total;
    cnt[e] = run - total;
    if (cnt[e]) total += round_up(cnt[e], bm);  // no division for an empty expert
  }
  if (total > a.max_rows)
    return invalid_arg("%s: %lld sorted rows needed but max_rows=%lld", op, (long long)total,
                       (long long)a.max_rows);

  const float* __restrict wts = a.topk_weights;
  int32_t* __restrict sti = a.sorted_token_ids;
  float* __restrict sw = a.sorted_weights;
  int32_t* __restrict mi = a.m_indices;
  int32_t* __restrict rev = a.reverse_sorted;

#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    int64_t* __restrict pos = h + c * E;
    const int64_t t0 = c * tpc;
    const int64_t t1 = (c + 1) * tpc < M ? (c + 1) * tpc : M;
    for (int64_t t = t0; t < t1; ++t) {
      for (int k = 0; k < topk; ++k) {
        const int64_t i = t * topk + k;
        const uint32_t e = local_expert(a, ids[i]);
        if (e < static_cast<uint32_t>(E)) {
          const int64_t p = pos[e]++;
          sti[p] =
              static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(k) << 24));
          std::memcpy(sw + p, wts + i, sizeof(float));  // bit copy
          mi[p] = static_cast<int32_t>(t);
          rev[i] = static_cast<int32_t>(p);
        } else {
          rev[i] = -1;
        }
      }
    }
  }

  // Padding rows and the expert of each block.
  int32_t* __restrict seid = a.sorted_expert_ids;
  const int32_t pad_tok = static_cast<int32_t>(M);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int e = 0; e < E; ++e) {
    if (cnt[e] == 0) continue;
    const int64_t b = start[e] + cnt[e];
    const int64_t end = start[e] + round_up(cnt[e], bm);
    for (int64_t p = b; p < end; ++p) {
      sti[p] = pad_tok;
      sw[p] = 0.0f;
      mi[p] = pad_tok;
    }
    for (int64_t blk = start[e] / bm; blk < end / bm; ++blk) seid[blk] = e;
  }

  a.num_valid_ids[0] = static_cast<int32_t>(total);
  a.num_valid_ids[1] = static_cast<int32_t>(M);
  init_zero_buf(a);
  return AITER_AUX_OK;
}

// --------------------------------------------------------------- mxfp4_quant

inline int check_quant(const AiterAuxQuantArgs& a, const char* op) {
  if (a.model_dim < 32 || a.model_dim % 32 != 0)
    return invalid_arg("%s: model_dim=%d is no positive multiple of 32", op, a.model_dim);
  if (a.num_tokens < 0) return invalid_arg("%s: num_tokens=%lld < 0", op, (long long)a.num_tokens);
  if (a.num_tokens > 0 && (a.x == nullptr || a.a_q == nullptr || a.a_scale == nullptr))
    return invalid_arg("%s: NULL input/output pointer", op);
  return AITER_AUX_OK;
}

// The rows of a quant op (mxfp4_quant, mxfp8_quant and the fused sorts' quant), in tasks of
// ~64K elements: block(x, q) writes the kQBytes codes of the 32 bf16 at x to q and returns
// their e8m0 scale (MXFP4: 16 bytes of e2m1 pairs, MXFP8: 32 e4m3 bytes).
template <int kQBytes, typename Block>
inline void quant_rows(const AiterAuxQuantArgs& a, Block block) {
  const int64_t model_dim = a.model_dim;
  const int blocks = static_cast<int>(model_dim / 32);
  const int64_t M = a.num_tokens;
  const uint16_t* __restrict x = a.x;
  uint8_t* __restrict q = a.a_q;
  uint8_t* __restrict sc = a.a_scale;
  const int64_t rows_per_task = model_dim >= 65536 ? 1 : 65536 / model_dim;
  const int64_t ntask = ceil_div(M, rows_per_task);
#pragma omp parallel for schedule(static) if (ntask > 1)
  for (int64_t task = 0; task < ntask; ++task) {
    const int64_t r1 = (task + 1) * rows_per_task < M ? (task + 1) * rows_per_task : M;
    for (int64_t r = task * rows_per_task; r < r1; ++r) {
      const uint16_t* xr = x + r * model_dim;
      uint8_t* qr = q + r * (int64_t{blocks} * kQBytes);
      uint8_t* sr = sc + r * blocks;
      for (int b = 0; b < blocks; ++b) sr[b] = block(xr + 32 * b, qr + kQBytes * b);
    }
  }
}

inline void quant_impl(const AiterAuxQuantArgs& a) {
  quant_rows<16>(a, [](const uint16_t* x, uint8_t* q) { return codec::quant_block32(x, q); });
}

// ----------------------------------------------------------- moe_sort_scales

inline int sort_scales_impl(const AiterAuxSortScalesArgs& a) {
  const int cols = a.model_dim / 32;  // scale bytes per row
  const int ck1 = a.model_dim / 256;
  const int64_t M = a.num_tokens;
  const int64_t BM = a.block_m > 32 ? a.block_m : 32;
  const int64_t max_rows = a.max_rows;
  const int64_t out_rows = ceil_div(max_rows, BM) * BM;
  int64_t nv = a.num_valid_ids[0];
  if (nv < 0) nv = 0;
  const int64_t lim = nv < max_rows ? nv : max_rows;  // rows below lim are read
  const int32_t* __restrict sti = a.sorted_token_ids;
  const uint8_t* __restrict as = a.a_scale;
  uint8_t* __restrict out = a.sorted_scales;

  // Unit u = c * C_M1 + mi covers rows [32u, 32u + 32) and, in the output,
  // the contiguous 64 * C_K1 dwords starting at dword 64 * C_K1 * u.
  const std::vector<uint8_t> zeros(static_cast<size_t>(cols), 0);  // source of padding rows
  const uint8_t* zero_row = zeros.data();
  const int64_t nunits = out_rows / 32;
  const int64_t unit_bytes = int64_t(256) * ck1;
#pragma omp parallel for schedule(static) if (nunits * unit_bytes >= 65536)
  for (int64_t u = 0; u < nunits; ++u) {
    uint8_t* __restrict o = out + u * unit_bytes;
    const int64_t r0 = 32 * u;
    if (r0 >= lim) {
      std::memset(o, 0, unit_bytes);
      continue;
    }
    const uint8_t* src[32];
    for (int i = 0; i < 32; ++i) {
      const int64_t row = r0 + i;
      src[i] = zero_row;
      if (row < lim) {
        const int64_t tok = static_cast<uint32_t>(sti[row]) & 0xFFFFFFu;
        if (tok < M) src[i] = as + tok * cols;
      }
    }
    // dword (((ku * 4 + kl) * 16 + nl) within the unit; byte 2*ik + ia holds
    // a_scale[token(r0 + ia*16 + nl), 8*ku + 4*ik + kl].
    for (int ku = 0; ku < ck1; ++ku) {
      for (int kl = 0; kl < 4; ++kl) {
        const int col0 = 8 * ku + kl;
        const int col1 = col0 + 4;
        uint8_t* od = o + ((ku * 4 + kl) * 16) * 4;
        for (int nl = 0; nl < 16; ++nl) {
          od[4 * nl + 0] = src[nl][col0];
          od[4 * nl + 1] = src[16 + nl][col0];
          od[4 * nl + 2] = src[nl][col1];
          od[4 * nl + 3] = src[16 + nl][col1];
        }
      }
    }
  }
  return AITER_AUX_OK;
}

// --------------------------------------------------------- moe_scatter_reduce

inline int check_scatter(const AiterAuxScatterArgs& a, const char* op, bool quantized) {
  if (a.model_dim < 1 || (quantized && a.model_dim % 32 != 0))
    return invalid_arg("%s: model_dim=%d is no positive%s", op, a.model_dim,
                       quantized ? " multiple of 32" : " size");
  if (a.topk < 1 || a.topk > AITER_AUX_MAX_TOPK)
    return invalid_arg("%s: topk=%d not in [1, %d]", op, a.topk, AITER_AUX_MAX_TOPK);
  if (a.num_tokens < 0) return invalid_arg("%s: num_tokens=%lld < 0", op, (long long)a.num_tokens);
  if (a.num_rows < 0) return invalid_arg("%s: num_rows=%lld < 0", op, (long long)a.num_rows);
  if (a.num_tokens == 0) return AITER_AUX_OK;
  if (a.reverse_sorted == nullptr || a.out == nullptr)
    return invalid_arg("%s: NULL input/output pointer", op);
  if (a.num_rows > 0) {
    const bool missing = quantized ? (a.expert_out_q == nullptr || a.expert_out_scale == nullptr)
                                   : a.expert_out == nullptr;
    if (missing || a.sorted_weights == nullptr) return invalid_arg("%s: NULL input pointer", op);
  }
  // Every referenced row must exist (cheap: M * topk ints).
  const int32_t* rev = a.reverse_sorted;
  const int64_t n = a.num_tokens * a.topk;
  const int64_t rows = a.num_rows;
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (rev[i] >= rows) {
      bad = i;
      break;
    }
  }
  if (bad >= 0)
    return invalid_arg("%s: reverse_sorted[%lld]=%d >= rows of expert_out (%lld)", op,
                       (long long)bad, rev[bad], (long long)rows);
  return AITER_AUX_OK;
}

// out[t] = bf16_rne(sum_k fp32(row(p_k)) * w[p_k]), k ascending, skipping p < 0;
// each product and each sum rounded to fp32 (compiled with -ffp-contract=off;
// the statements below keep the product and the sum as separate operations).
// accum(p, w, d0, nd, acc) adds fp32(row p, columns [d0, d0 + nd)) * w to acc.
constexpr int kScatterTile = 1024;  // columns per accumulation tile

// The compiler must assume *p was read and changed here: values stored before
// are materialised in memory and reloaded after (no FMA across it).
inline void compiler_barrier(void* p) {
  __asm__ __volatile__("" : : "r"(p) : "memory");
}

template <class RowAccum>
void scatter_impl(const AiterAuxScatterArgs& a, RowAccum accum) {
  const int model_dim = a.model_dim;
  const int topk = a.topk;
  const int tile = model_dim < kScatterTile ? model_dim : kScatterTile;
  const int tiles = (model_dim + tile - 1) / tile;
  const int64_t M = a.num_tokens;
  const int32_t* __restrict rev = a.reverse_sorted;
  const float* __restrict sw = a.sorted_weights;
  uint16_t* __restrict out = a.out;
  const float scale = a.routed_scaling_factor;
  const bool par = M > 1 && M * int64_t(model_dim) * topk >= 32768;
#pragma omp parallel if (par)
  {
    FpEnvGuard fpenv;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M; ++t) {
      int64_t ps[AITER_AUX_MAX_TOPK];
      float ws[AITER_AUX_MAX_TOPK];
      int n = 0;
      for (int k = 0; k < topk; ++k) {
        const int32_t p = rev[t * topk + k];
        if (p >= 0) {
          ps[n] = p;
          ws[n] = sw[p];
          ++n;
        }
      }
      uint16_t* __restrict o = out + t * model_dim;
      for (int ti = 0; ti < tiles; ++ti) {
        const int d0 = ti * tile;
        const int nd = model_dim - d0 < tile ? model_dim - d0 : tile;
        float acc[kScatterTile];
        for (int d = 0; d < nd; ++d) acc[d] = 0.0f;
        for (int j = 0; j < n; ++j) accum(ps[j], ws[j], d0, nd, acc);
        if (scale != 1.0f)  // acc * 1.0f == acc: 1.0 keeps the plain sum's bytes
          for (int d = 0; d < nd; ++d) acc[d] = acc[d] * scale;
        for (int d = 0; d < nd; ++d) o[d0 + d] = codec::f32_to_bf16_rne(acc[d]);
      }
    }
  }
}

}  // namespace detail

// =================================================================== kernels

inline int moe_sort(const AiterAuxSortArgs& a) {
  int rc = detail::check_sort(a, "moe_sort");
  if (rc != AITER_AUX_OK) return rc;
  return detail::sort_impl(a, "moe_sort");
}

inline int mxfp4_quant(const AiterAuxQuantArgs& a) {
  int rc = detail::check_quant(a, "mxfp4_quant");
  if (rc != AITER_AUX_OK) return rc;
  detail::quant_impl(a);
  return AITER_AUX_OK;
}

namespace detail {
// The fused sort + quant of either format: every check first (the sort checks its capacity
// before writing anything, so on failure nothing has been written), then both, then (when
// a.sorted_scales is given) moe_sort_scales on their outputs.
template <class QuantImpl>
int sort_quant(const AiterAuxSortQuantArgs& a, const char* op, QuantImpl quant) {
  int rc = check_sort(a.sort, op);
  if (rc != AITER_AUX_OK) return rc;
  rc = check_quant(a.quant, op);
  if (rc != AITER_AUX_OK) return rc;
  if (a.sort.num_tokens != a.quant.num_tokens)
    return invalid_arg("%s: num_tokens of sort (%lld) and quant (%lld) differ", op,
                       (long long)a.sort.num_tokens, (long long)a.quant.num_tokens);
  if (a.sorted_scales != nullptr && a.quant.model_dim % 256 != 0)
    return invalid_arg("%s: sorted_scales needs model_dim %% 256 == 0, got %d", op,
                       a.quant.model_dim);
  rc = sort_impl(a.sort, op);
  if (rc != AITER_AUX_OK) return rc;
  quant(a.quant);
  if (a.sorted_scales != nullptr) return sort_scales_impl(aiter_aux_sort_scales_args(&a));
  return AITER_AUX_OK;
}
}  // namespace detail

inline int moe_sort_quant(const AiterAuxSortQuantArgs& a) {
  return detail::sort_quant(a, "moe_sort_quant", detail::quant_impl);
}

inline int moe_sort_scales(const AiterAuxSortScalesArgs& a) {
  const char* op = "moe_sort_scales";
  if (a.model_dim < 256 || a.model_dim % 256 != 0)
    return detail::invalid_arg("%s: model_dim=%d is no positive multiple of 256", op, a.model_dim);
  const int rc = check_sort_rows(a.block_m, a.num_tokens, a.max_rows, op, detail::invalid_arg);
  if (rc != AITER_AUX_OK) return rc;
  if (a.num_valid_ids == nullptr) return detail::invalid_arg("%s: num_valid_ids is NULL", op);
  if (a.max_rows > 0 && (a.sorted_token_ids == nullptr || a.sorted_scales == nullptr))
    return detail::invalid_arg("%s: NULL input/output pointer", op);
  if (a.num_tokens > 0 && a.a_scale == nullptr)
    return detail::invalid_arg("%s: a_scale is NULL", op);
  return detail::sort_scales_impl(a);
}

inline int moe_scatter_reduce(const AiterAuxScatterArgs& a) {
  int rc = detail::check_scatter(a, "moe_scatter_reduce", false);
  if (rc != AITER_AUX_OK) return rc;
  const uint16_t* __restrict eo = a.expert_out;
  const int64_t model_dim = a.model_dim;
  detail::scatter_impl(a,
                       [eo, model_dim](int64_t p, float w, int d0, int nd, float* __restrict acc) {
                         const uint16_t* __restrict r = eo + p * model_dim + d0;
                         // Products and sums in separate loops through memory, with a compiler
                         // barrier between them: even without -ffp-contract=off they cannot be
                         // fused into FMAs.
                         float prod[detail::kScatterTile];
                         for (int d = 0; d < nd; ++d) prod[d] = codec::bf16_to_f32(r[d]) * w;
                         detail::compiler_barrier(prod);
                         for (int d = 0; d < nd; ++d) acc[d] = acc[d] + prod[d];
                       });
  return AITER_AUX_OK;
}

inline int moe_scatter_reduce_q(const AiterAuxScatterArgs& a) {
  int rc = detail::check_scatter(a, "moe_scatter_reduce_q", true);
  if (rc != AITER_AUX_OK) return rc;
  const uint8_t* __restrict eq = a.expert_out_q;
  const uint8_t* __restrict es = a.expert_out_scale;
  const int64_t model_dim = a.model_dim;
  detail::scatter_impl(
      a, [eq, es, model_dim](int64_t p, float w, int d0, int nd, float* __restrict acc) {
        // d0 and nd are multiples of 32
        const uint8_t* __restrict q = eq + p * (model_dim / 2) + d0 / 2;
        const uint8_t* __restrict s = es + p * (model_dim / 32) + d0 / 32;
        float prod[detail::kScatterTile];
        for (int b = 0; b < nd / 32; ++b) {
          const float scale = codec::e8m0_to_f32(s[b]);
          float v[32];
          for (int j = 0; j < 16; ++j)
            std::memcpy(v + 2 * j, codec::kE2m1Pairs.v[q[16 * b + j]], 2 * sizeof(float));
          float* __restrict pb = prod + 32 * b;
          for (int j = 0; j < 32; ++j) {
            const float dec = v[j] * scale;  // e2m1 * 2^(s-127), fp32
            pb[j] = dec * w;
          }
        }
        // Sums in a separate loop (see moe_scatter_reduce).
        detail::compiler_barrier(prod);
        for (int d = 0; d < nd; ++d) acc[d] = acc[d] + prod[d];
      });
  return AITER_AUX_OK;
}

}  // namespace cpu
}  // namespace aiter_aux
