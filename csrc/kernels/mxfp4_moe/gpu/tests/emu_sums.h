// moe_sum (included by emu_selftest.cpp after the other cases): every dtype, every launch
// shape of sums.h, against a reference written from docs/ops.md "moe_sum" with the
// compiler's own conversions (_Float16 for float16), plus the conversions of ../../sum_codec.h
// against the compiler's over every float16 and many fp32 patterns.
#pragma once

namespace {

using aiter_aux::sum_codec::f16_to_f32_bits;
using aiter_aux::sum_codec::f32_bits_to_f16;

uint32_t ref_sum_out(float acc, int dt) {
  if (acc != acc) return dt == AITER_AUX_DTYPE_F32 ? 0x7FFFFFFFu : 0x7FFFu;
  if (dt == AITER_AUX_DTYPE_F32) return f2u(acc);
  if (dt == AITER_AUX_DTYPE_BF16) {
    const uint32_t u = f2u(acc);
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  }
  const _Float16 h = static_cast<_Float16>(acc);  // the compiler's RNE conversion
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}

float ref_sum_in(uint32_t bits, int dt) {
  if (dt == AITER_AUX_DTYPE_F32) return u2f(bits);
  if (dt == AITER_AUX_DTYPE_BF16) return u2f(bits << 16);
  _Float16 h;
  const uint16_t b = static_cast<uint16_t>(bits);
  memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

void test_sum_codec() {
  int bad = 0;
  for (uint32_t h = 0; h < 65536u; ++h) {
    const float want = ref_sum_in(h, AITER_AUX_DTYPE_F16);
    if (want == want ? f16_to_f32_bits(h) != f2u(want)
                     : (f16_to_f32_bits(h) & 0x7FFFFFFFu) <= 0x7F800000u)
      ++bad;
  }
  check(bad == 0, "moe_sum: float16 -> fp32 bits == the compiler's for every pattern");
  bad = 0;
  std::mt19937 rng(7);
  auto one = [&](uint32_t x) {
    if (f32_bits_to_f16(x) != ref_sum_out(u2f(x), AITER_AUX_DTYPE_F16)) ++bad;
  };
  // every fp32 exponent from below the float16 subnormals to Inf, ties and neighbours
  for (uint32_t e = 90; e <= 255; ++e) {
    for (uint32_t m : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FE000u, 0x7FF000u,
                       0x7FFFFFu, 0x400000u, 0x3FFFFFu})
      for (uint32_t s : {0u, 0x80000000u}) one(s | (e << 23) | m);
    for (int i = 0; i < 2000; ++i) one((rng() & 0x807FFFFFu) | (e << 23));
  }
  for (int i = 0; i < 200000; ++i) one(rng());
  check(bad == 0, "moe_sum: fp32 -> float16 RNE (NaN -> 0x7FFF) == the compiler's");
}

uint32_t rand_sum_bits(std::mt19937& rng, int dt) {
  const uint32_t r = rng() % 100;
  if (dt == AITER_AUX_DTYPE_F32) {
    if (r == 0) return 0x7F800000u | (rng() & 0x80000000u);  // +-Inf
    if (r == 1) return 0x7FC00000u | (rng() & 0x803FFFFFu);  // NaN, any payload
    if (r < 6) return rng() & 0x807FFFFFu;                   // subnormal
    return (rng() & 0x807FFFFFu) | ((115u + rng() % 20) << 23);
  }
  const bool h = dt == AITER_AUX_DTYPE_F16;
  if (r == 0) return (h ? 0x7C00u : 0x7F80u) | (rng() & 0x8000u);
  if (r == 1) return (h ? 0x7E00u : 0x7FC0u) | (rng() & (h ? 0x81FFu : 0x803Fu));
  if (r < 6) return rng() & (h ? 0x83FFu : 0x807Fu);
  if (h) return (rng() & 0x83FFu) | ((8u + rng() % 14) << 10);
  return (rng() & 0x807Fu) | ((115u + rng() % 20) << 7);
}

// mode: 0 every slot, 1 topk_ids (some < 0), 2 topk_ids + expert_map (gaps, ids past it),
// 3 topk_ids + an empty expert_map (nothing local).  kV > 0: that launch shape directly,
// with a grid of `blocks` (the grid-stride loop), else the op's choice.
// kV > 0: sum_kernel's shape (kV, kT, kKB); kV < 0: sum_split_kernel's (kKP = kKB, kT).
template <int kDT, int kV = 0, int kT = 0, int kKB = 0>
void run_sum_case(int64_t m, int64_t k, int64_t d, uint32_t seed, int mode, float scale,
                  bool misalign = false, int blocks = 65535) {
  std::mt19937 rng(seed);
  constexpr int kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  const size_t n_in = static_cast<size_t>(m * k * d), n_out = static_cast<size_t>(m * d);
  std::vector<uint32_t> in(n_in);
  for (auto& v : in) v = rand_sum_bits(rng, kDT);
  std::vector<int32_t> ids(static_cast<size_t>(m * k));
  for (auto& v : ids) {
    const uint32_t r = rng() % 8;
    v = r == 0 ? -1
               : (r == 1 ? 11 + static_cast<int32_t>(rng() % 5) : static_cast<int32_t>(rng() % 11));
  }
  const std::vector<int32_t> map = {0, -1, 3, 2, -7, 1, 0, 4, -1, 5, 6};  // 11 global ids
  // input and output at an element offset of 1 (misaligned) or 0 inside poisoned buffers
  const int off = misalign ? 1 : 0;
  std::vector<uint4> in_store((n_in + 8) * kE / 16 + 2), out_store((n_out + 8) * kE / 16 + 2);
  uint8_t* in_base = reinterpret_cast<uint8_t*>(in_store.data());
  uint8_t* out_base = reinterpret_cast<uint8_t*>(out_store.data());
  memset(out_base, 0x5A, out_store.size() * 16);
  for (size_t i = 0; i < n_in; ++i) memcpy(in_base + (i + off) * kE, &in[i], kE);
  AiterAuxSumArgs a = {};
  a.input = in_base + off * kE;
  a.num_tokens = m;
  a.model_dim = d;
  a.topk = k;
  a.dtype = kDT;
  a.routed_scaling_factor = scale;
  a.topk_ids = mode ? ids.data() : nullptr;
  static const int32_t kNone = -1;
  a.expert_map = mode == 2 ? map.data() : (mode == 3 ? &kNone : nullptr);
  a.num_global_experts = mode == 2 ? static_cast<int64_t>(map.size()) : 0;
  a.output = out_base + off * kE;
  aiter_aux_emu::reset_pdl();
  int rc;
  if constexpr (kV > 0)
    rc = sum_detail::launch_sum_shape<kDT, kV, kT, kKB>(a, nullptr, blocks);
  else if constexpr (kV < 0)
    rc = sum_detail::launch_sum_split<kDT, kKB, kT>(a, nullptr);
  else
    rc = moe_sum(a, nullptr);
  std::vector<uint8_t> want(n_out * kE);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = ids[t * k + j];
        if (mode && id < 0) continue;
        if (mode >= 2 && (id >= a.num_global_experts || map[id] < 0)) continue;
        volatile float s = acc + ref_sum_in(in[(t * k + j) * d + c], kDT);
        acc = s;
      }
      volatile float scaled = acc * scale;
      const uint32_t o = ref_sum_out(scaled, kDT);
      memcpy(&want[(t * d + c) * kE], &o, kE);
    }
  }
  const char* names[] = {"f32", "f16", "bf16"};
  const std::string tag =
      std::string("moe_sum ") + names[kDT] + " M=" + std::to_string(m) +
      " topk=" + std::to_string(k) + " D=" + std::to_string(d) + " mode " + std::to_string(mode) +
      (kV > 0 ? " shape " + std::to_string(kV) + "x" + std::to_string(kT) : "") +
      (kV < 0 ? " split " + std::to_string(kKB) + "x" + std::to_string(kT) : "") +
      (misalign ? " misaligned" : "");
  check(rc == AITER_AUX_OK, tag + ": status");
  if (m * d > 0) check_pdl(tag);
  check(memcmp(out_base + off * kE, want.data(), want.size()) == 0, tag + ": output bytes");
  bool guard = true;
  for (size_t i = 0; i < static_cast<size_t>(off * kE); ++i) guard = guard && out_base[i] == 0x5A;
  for (size_t i = (n_out + off) * kE; i < out_store.size() * 16; ++i)
    guard = guard && out_base[i] == 0x5A;
  check(guard, tag + ": no write outside output");
}

template <int kDT>
void test_sums_dtype() {
  constexpr int kE = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  constexpr int kS = 8 / kE, kL = 16 / kE;  // small / large vector widths
  // the op's choice: M = 0, 1, decode, D = 0, D not a multiple of any vector, topk 1, 16 + 1
  run_sum_case<kDT>(0, 3, 64, 1, 0, 1.0f);
  run_sum_case<kDT>(2, 3, 0, 2, 1, 1.0f);
  run_sum_case<kDT>(1, 9, 7168, 3, 0, 1.0f);
  run_sum_case<kDT>(1, 1, 7, 4, 2, 1.0f);
  run_sum_case<kDT>(3, 17, 100, 5, 2, 2.5f);
  run_sum_case<kDT>(5, 8, 4096, 6, 1, -0.75f, true);
  run_sum_case<kDT>(4, 9, 30, 7, 3, 1.0f);
  run_sum_case<kDT>(2, 16, 2560, 8, 2, 1.0f);
  // large M (> 1024 tokens): 16-byte vectors, or one element where D % vector != 0
  run_sum_case<kDT>(1100, 3, 16, 9, 2, 1.0f);
  run_sum_case<kDT>(1030, 2, 9, 10, 1, 2.5f, true);
  // topk 9..16 (the split shape up to 2 MiB): from 2048 tokens and past it, 256 threads with 8
  // slots in flight; with topk_ids (from 128 tokens) 256 threads with 4; at 2048 tokens within
  // 2 MiB, the split; between 1 and 2 MiB, the split (bf16) and 128 x 16 past it (float32)
  run_sum_case<kDT>(2049, 16, 4 * kL, 25, 0, 1.0f);
  run_sum_case<kDT>(2050, 16, 4 * kL, 24, 1, -0.75f, true);
  run_sum_case<kDT>(2048, 9, 4 * kL, 23, 2, 1.0f);
  run_sum_case<kDT>(300, 9, 8 * kL, 26, 2, 1.0f, true);
  run_sum_case<kDT>(15, 9, 4096, 27, 0, 2.5f);
  // every shape directly, with small grids (grid-stride loop), misaligned
  run_sum_case<kDT, kS, 128, 16>(9, 17, 64, 11, 2, 1.0f, false, 3);
  run_sum_case<kDT, kL, 256, 8>(7, 9, 96, 12, 1, 1.0f, true, 2);
  run_sum_case<kDT, 1, 256, 8>(5, 9, 33, 13, 2, 2.5f, false, 1);
  run_sum_case<kDT, kL, 256, 8>(3, 11, 7168, 14, 0, 1.0f, false, 5);
  run_sum_case<kDT, kL, 256, 4>(6, 11, 96, 28, 2, 1.0f, true, 2);
  run_sum_case<kDT, kL, 128, 16>(6, 9, 7168, 21, 2, 2.5f, false, 4);
  run_sum_case<kDT, kL, 128, 16>(3, 16, 3584, 22, 1, 1.0f, true, 2);
  // the split shapes: topk below, at and (16) up to the slot lanes, skipped slots, a partial
  // last column block, misaligned
  run_sum_case<kDT, -1, 128, 4>(3, 1, 3 * kL, 15, 2, 1.0f);
  run_sum_case<kDT, -1, 128, 4>(2, 4, 40 * kL, 16, 1, 2.5f, true);
  run_sum_case<kDT, -1, 128, 8>(4, 7, 17 * kL, 17, 2, 1.0f);
  run_sum_case<kDT, -1, 128, 8>(1, 8, 7168, 18, 0, -0.75f);
  run_sum_case<kDT, -1, 256, 16>(3, 16, 2560, 19, 3, 1.0f, true);
  run_sum_case<kDT, -1, 256, 16>(2, 11, 9 * kL, 20, 1, 1.0f);
}

void test_sums() {
  test_sum_codec();
  test_sums_dtype<AITER_AUX_DTYPE_F32>();
  test_sums_dtype<AITER_AUX_DTYPE_F16>();
  test_sums_dtype<AITER_AUX_DTYPE_BF16>();
}

}  // namespace
