// moe_route (included by emu_selftest.cpp after the other cases): both launch shapes of
// route.h in every size class, every dtype, softmax and sigmoid, groups, bias, renormalize,
// NaN / +-Inf / ties / all-equal rows, against the CPU kernel (../../cpu/route_cpu.h), which
// op_tests/test_route.py checks byte for byte against the torch reference.
#pragma once

#include "cpu/route_cpu.h"

namespace {

struct RouteCase {
  int64_t m, e, k, groups, topk_group;
  int scoring, renormalize;
  bool bias;
  float scale;
};

// Logit bits of `dt`: normal values, and (special) rows of ties, NaN, +-Inf, all equal.
uint32_t route_logit_bits(std::mt19937& rng, int dt, int64_t t, int64_t i) {
  const int kind = static_cast<int>(t % 7);
  float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 97.0f;
  if (kind == 1) v = static_cast<float>(static_cast<int>(rng() % 5));  // many ties
  if (kind == 2) v = 0.5f;                                             // all equal
  if (kind == 3 && i == 3) v = u2f(0x7FC00000u);                       // a NaN
  if (kind == 4 && i % 5 == 1) v = u2f(0xFF800000u);                   // -Inf
  if (kind == 5 && i == 2) v = u2f(0x7F800000u);                       // +Inf
  if (kind == 6) v = u2f(0xFF800000u);                                 // all -Inf
  const uint32_t u = f2u(v);
  if (dt == AITER_AUX_DTYPE_F32) return u;
  if (dt == AITER_AUX_DTYPE_BF16) return u >> 16;  // these values are exact in bf16 or NaN/Inf
  return aiter_aux::sum_codec::f32_bits_to_f16(u);
}

// kMaxE > 0: that size class, through launch_route_shape (kPath 0), the warp-per-row kernel
// (kPath 1) or the block-per-row kernel (kPath 2).
template <int kDT, int kMaxE = 0, int kPath = 0>
void run_route_case(const RouteCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  constexpr int kB = kDT == AITER_AUX_DTYPE_F32 ? 4 : 2;
  std::vector<uint8_t> logits(static_cast<size_t>(c.m * c.e) * kB + 4);
  for (int64_t t = 0; t < c.m; ++t)
    for (int64_t i = 0; i < c.e; ++i) {
      const uint32_t b = route_logit_bits(rng, kDT, t, i);
      memcpy(&logits[static_cast<size_t>(t * c.e + i) * kB], &b, kB);
    }
  std::vector<float> bias(static_cast<size_t>(c.e));
  for (auto& b : bias) b = static_cast<float>(static_cast<int>(rng() % 201) - 100) / 64.0f;
  const size_t n = static_cast<size_t>(c.m * c.k);
  std::vector<float> w(n + 8, u2f(0x5A5A5A5Au)), w_ref(n + 8, u2f(0x5A5A5A5Au));
  std::vector<int32_t> ids(n + 8, 0x5A5A5A5A), ids_ref(n + 8, 0x5A5A5A5A);
  AiterAuxRouteArgs a = {};
  a.router_logits = logits.data();
  a.num_tokens = c.m;
  a.num_experts = c.e;
  a.topk = c.k;
  a.dtype = kDT;
  a.scoring = c.scoring;
  a.renormalize = c.renormalize;
  a.num_expert_group = static_cast<int32_t>(c.groups);
  a.topk_group = static_cast<int32_t>(c.topk_group);
  a.routed_scaling_factor = c.scale;
  a.correction_bias = c.bias ? bias.data() : nullptr;
  AiterAuxRouteArgs r = a;
  a.topk_weights = w.data();
  a.topk_ids = ids.data();
  r.topk_weights = w_ref.data();
  r.topk_ids = ids_ref.data();
  // token_expert_indices on the odd M (the others leave it NULL)
  std::vector<int32_t> tei(n + 8, 0x5A5A5A5A), tei_ref(n + 8, 0x5A5A5A5A);
  if (c.m % 2 == 1) {
    a.token_expert_indices = tei.data();
    r.token_expert_indices = tei_ref.data();
  }
  aiter_aux_emu::reset_pdl();
  int rc;
  if constexpr (kMaxE > 0 && kPath == 1)
    rc = c.m > 0 ? route_detail::launch_route_narrow<kDT, kMaxE>(a, nullptr) : AITER_AUX_OK;
  else if constexpr (kMaxE > 0 && kPath == 2)
    rc = c.m > 0 ? route_detail::launch_route_wide<kDT, kMaxE>(a, nullptr) : AITER_AUX_OK;
  else if constexpr (kMaxE > 0)
    rc = route_detail::launch_route_shape<kDT, kMaxE>(a, nullptr);
  else
    rc = moe_route(a, nullptr);
  const int rc_ref = aiter_aux::cpu::moe_route(r);
  const char* names[] = {"f32", "f16", "bf16"};
  const std::string tag = std::string("moe_route ") + names[kDT] + " M=" + std::to_string(c.m) +
                          " E=" + std::to_string(c.e) + " topk=" + std::to_string(c.k) +
                          " G=" + std::to_string(c.groups) + "/" + std::to_string(c.topk_group) +
                          (c.scoring == 0   ? " softmax"
                           : c.scoring == 1 ? " sigmoid"
                                            : " none") +
                          (c.bias ? " bias" : "") + (c.renormalize ? " renorm" : "") +
                          (kMaxE > 0 ? " shape " + std::to_string(kMaxE) : "") +
                          (kPath == 1   ? " warp/row"
                           : kPath == 2 ? " block/row"
                                        : "");
  check(rc == AITER_AUX_OK && rc_ref == AITER_AUX_OK, tag + ": status");
  if (c.m > 0) check_pdl(tag);
  std::string where;
  check(same_bytes(w, w_ref, &where), tag + ": topk_weights == the CPU kernel's " + where);
  check(same_bytes(ids, ids_ref, &where), tag + ": topk_ids == the CPU kernel's " + where);
  check(same_bytes(tei, tei_ref, &where),
        tag + ": token_expert_indices == the CPU kernel's " + where);
  bool rows_ok = true;  // k * M + t where written, the poison past M * topk or without it
  for (size_t i = 0; i < tei.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / c.k, k = static_cast<int64_t>(i) % c.k;
    const bool written = c.m % 2 == 1 && i < n;
    rows_ok = rows_ok && tei[i] == (written ? static_cast<int32_t>(k * c.m + t) : 0x5A5A5A5A);
  }
  check(rows_ok, tag + ": token_expert_indices = k * M + t on the first M rows only");
}

template <int kDT>
void test_route_dtype() {
  const RouteCase cases[] = {
      {0, 8, 2, 0, 0, 0, 1, false, 1.0f},    {1, 8, 2, 0, 0, 0, 1, false, 1.0f},
      {14, 1, 1, 0, 0, 1, 1, false, 1.0f},   {14, 128, 8, 0, 0, 0, 1, false, 1.0f},
      {21, 256, 8, 8, 4, 1, 1, true, 2.5f},  {9, 256, 8, 8, 4, 0, 0, false, 1.0f},
      {7, 160, 6, 8, 3, 0, 1, true, 1.0f},   {8, 64, 16, 64, 16, 1, 1, true, -0.5f},
      {7, 1024, 16, 0, 0, 0, 1, true, 1.0f}, {5, 1024, 16, 16, 2, 1, 0, true, 2.0f},
      {7, 257, 9, 0, 0, 0, 1, false, 1.0f},  {7, 1000, 16, 1000, 16, 0, 1, false, 1.0f},
      {7, 256, 8, 8, 4, 2, 1, true, 2.5f},   {9, 64, 6, 0, 0, 2, 0, false, 1.0f},
      {6, 96, 5, 32, 4, 1, 1, false, 1.0f},  {7, 33, 2, 3, 1, 0, 1, true, 1.0f},
      {6, 384, 8, 1, 1, 1, 1, true, 2.827f}, {5, 512, 10, 16, 5, 1, 1, true, 1.0f},
      {6, 200, 12, 0, 0, 0, 1, false, 1.0f}, {5, 128, 16, 0, 0, 1, 1, true, 1.0f},
      {4, 256, 16, 8, 4, 1, 1, true, 2.5f},  {3, 96, 9, 0, 0, 0, 1, false, 1.0f},
  };
  uint32_t seed = 300;
  for (const RouteCase& c : cases) run_route_case<kDT>(c, seed++);
  // both kernels of every class on every case it takes (the dispatcher picks by M)
  for (const RouteCase& c : cases) {
    run_route_case<kDT, AITER_AUX_MAX_ROUTE_EXPERTS, 1>(c, seed);
    run_route_case<kDT, AITER_AUX_MAX_ROUTE_EXPERTS, 2>(c, seed++);
    if (c.e > 512) continue;
    run_route_case<kDT, 512, 1>(c, seed);
    run_route_case<kDT, 512, 2>(c, seed++);
    if (c.e > 256) continue;
    run_route_case<kDT, 256, 1>(c, seed);
    run_route_case<kDT, 256, 2>(c, seed++);
    if (c.e > 128) continue;
    run_route_case<kDT, 128, 1>(c, seed);
    run_route_case<kDT, 128, 2>(c, seed++);
  }
  // the dispatcher on both sides of kWideMaxRows
  run_route_case<kDT>({route_detail::kWideMaxRows - 1, 256, 8, 8, 4, 1, 1, true, 2.5f}, seed++);
  run_route_case<kDT>({route_detail::kWideMaxRows, 128, 8, 0, 0, 0, 1, false, 1.0f}, seed++);
  // each size class directly (with an E below the class, a last block part full)
  run_route_case<kDT, 256>({23, 200, 8, 8, 4, 1, 1, true, 1.0f}, seed++);
  run_route_case<kDT, 256>({9, 100, 8, 0, 0, 0, 1, false, 1.0f}, seed++);
  run_route_case<kDT, 128>({9, 100, 8, 4, 2, 1, 1, true, 1.0f}, seed++);
  run_route_case<kDT, 512>({9, 300, 8, 0, 0, 0, 1, false, 1.0f}, seed++);
  run_route_case<kDT, AITER_AUX_MAX_ROUTE_EXPERTS>({9, 600, 8, 0, 0, 0, 1, false, 1.0f}, seed++);
  run_route_case<kDT, AITER_AUX_MAX_ROUTE_EXPERTS>({3, 896, 16, 8, 4, 1, 1, true, 2.5f}, seed++);
  run_route_case<kDT>({route_detail::kWideMaxRows - 1, 896, 16, 0, 0, 0, 1, false, 1.0f}, seed++);
  run_route_case<kDT>({route_detail::kWideMaxRows, 384, 8, 0, 0, 1, 1, true, 1.0f}, seed++);
}

void test_route() {
  test_route_dtype<AITER_AUX_DTYPE_F32>();
  test_route_dtype<AITER_AUX_DTYPE_F16>();
  test_route_dtype<AITER_AUX_DTYPE_BF16>();
}

}  // namespace
