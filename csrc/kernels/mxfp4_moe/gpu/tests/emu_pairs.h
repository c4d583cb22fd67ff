// The pair path (sort_pairs.h, n = M*topk <= 64) in the emulated self-test (included by
// emu_selftest.cpp after emu_scales.h): every n from 1 to 64, every block_m, topk 1..16,
// E from 1 to 1024, expert maps with gaps and with no local expert, ids out of range, one
// expert taking every pair, zero_buf / zero_buf_init, more blocks than the rows need, the
// fused MXFP4 / MXFP8 quant and the one-launch sorted scales, against ref_sort /
// ref_quant[_fp8] / ref_sorted_scales.  Every output starts poisoned (prefilled), so the
// comparisons also check the untouched rows past num_valid_ids[0].
#pragma once

namespace {

namespace sd = aiter_aux::gpu::sort_detail;

// Global ids and a map for expert parallelism.  map_mode 1: G = 2E + 3 global ids, the even
// ones below 2E local in reverse order (so the local order is not the global one), the odd
// ones -1, the last one E + 1 (a caller error, not local); ids from [-2, G + 2).  map_mode 2:
// no id is local (the map all -1, or the id out of [0, G)).
struct EpRouting {
  std::vector<int32_t> ids;    // as passed: global
  std::vector<int32_t> local;  // the local expert of each pair, -1 when not local
  std::vector<int32_t> map;
};

EpRouting ep_routing(int m, int k, int e, std::mt19937& rng, int map_mode) {
  EpRouting r;
  const int g = 2 * e + 3;
  r.map.assign(g, -1);
  if (map_mode == 1) {
    for (int i = 0; i < 2 * e; i += 2) r.map[i] = e - 1 - i / 2;
    r.map[g - 1] = e + 1;
  }
  r.ids.resize(static_cast<size_t>(m) * k);
  r.local.resize(r.ids.size());
  for (size_t j = 0; j < r.ids.size(); ++j) {
    const int id = static_cast<int>(rng() % (g + 4)) - 2;
    r.ids[j] = id;
    const int l = id >= 0 && id < g ? r.map[id] : -1;
    r.local[j] = l >= 0 && l < e ? l : -1;
  }
  return r;
}

// A case's routing: map_mode 0, make_ids of `mode` (the ids are the local ids, no map); else
// ep_routing of map_mode.
inline EpRouting case_routing(int m, int k, int e, std::mt19937& rng, int mode, int map_mode) {
  if (map_mode != 0) return ep_routing(m, k, e, rng, map_mode);
  EpRouting ep;
  ep.ids = make_ids(m, k, e, rng, mode);
  ep.local = ep.ids;
  return ep;
}

// Forced pair launch with num_g blocks (the chooser's, and two more than needed), against
// ref_sort; map_mode 0: plain ids of make_ids' mode; zero_mode 1: zero_buf, 2: zero_buf_init.
template <int E, int K>
void run_pairs_case(int m, int bm, int mode, uint32_t seed, int map_mode, int zero_mode) {
  std::mt19937 rng(seed);
  const EpRouting ep = case_routing(m, K, E, rng, mode, map_mode);
  const auto w = make_weights(ep.ids.size(), rng);
  const int64_t max_rows = sort_capacity(m, K, E, bm) + (seed % 2 ? bm : 0);
  SortBufs want = prefilled(max_rows, bm, ep.ids.size());
  ref_sort(ep.local, w, m, K, E, bm, want);
  const std::string tag = "pairs<" + std::to_string(E) + "," + std::to_string(K) +
                          "> M=" + std::to_string(m) + " bm=" + std::to_string(bm) +
                          " mode=" + std::to_string(mode) + " map=" + std::to_string(map_mode) +
                          " zero=" + std::to_string(zero_mode);
  const AiterAuxQuantArgs none = {};
  constexpr QuantFormat kNone = QuantFormat::None;
  for (int extra : {0, 2}) {
    SortBufs got = prefilled(max_rows, bm, ep.ids.size());
    AiterAuxSortArgs a = sort_args(ep.ids, w, m, K, E, bm, max_rows, got);
    if (map_mode != 0) {
      a.expert_map = ep.map.data();
      a.num_global_experts = static_cast<int64_t>(ep.map.size());
    }
    std::vector<uint16_t> zb(static_cast<size_t>(m) * 45 + 21, 0xBEEF), init(zb.size());
    for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<uint16_t>(rng());
    if (zero_mode != 0) {
      a.zero_buf = zb.data() + 1;
      a.zero_numel = static_cast<int64_t>(zb.size()) - 2;
      if (zero_mode == 2) a.zero_init = init.data() + 1;
    }
    const sd::SortChoice c = sd::choose_sort_path(
        sd::host_sort_policy(), sd::sort_problem<E, K, kNone, 0>(a, false), device_sm_count);
    check(c.path == sd::SortPath::Pairs, tag + ": the chooser takes the pair path");
    const int ng = c.blocks + extra;
    const int rc = sd::launch_pairs<E, K, kNone, 0>(a, none, nullptr, ng, "t");
    const std::string t2 = tag + " G=" + std::to_string(ng);
    check(rc == AITER_AUX_OK, t2 + ": status " + g_last_error);
    compare_sort(got, want, t2);
    if (zero_mode != 0) {
      bool ok = zb.front() == 0xBEEF && zb.back() == 0xBEEF;
      for (size_t i = 1; i + 1 < zb.size(); ++i) ok = ok && zb[i] == (zero_mode == 2 ? init[i] : 0);
      check(ok, t2 + ": zero_buf");
    }
  }
}

// moe_sort_quant[_fp8] through the chooser (the pair path at n <= 64), optionally with an
// expert map, zero_buf_init and sorted_scales (the one-launch pair kernel), against the
// references.
template <int E, int K, int D, bool kFp8>
void run_pairs_fused_case(int m, int bm, int mode, uint32_t seed, int map_mode, bool scales,
                          bool init_zero) {
  std::mt19937 rng(seed);
  const EpRouting ep = case_routing(m, K, E, rng, mode, map_mode);
  const auto w = make_weights(ep.ids.size(), rng);
  const auto xs = make_x(m, D, rng);
  const int64_t max_rows = sort_capacity(m, K, E, bm) + (seed % 3 == 0 ? bm : 0);
  SortBufs got = prefilled(max_rows, bm, ep.ids.size());
  SortBufs want = prefilled(max_rows, bm, ep.ids.size());
  const int qcols = kFp8 ? D : D / 2;
  std::vector<uint8_t> q(static_cast<size_t>(m) * qcols + 16, 0xAB);
  std::vector<uint8_t> s(static_cast<size_t>(m) * D / 32 + 16, 0xCD);
  std::vector<uint8_t> wq(static_cast<size_t>(m) * qcols), ws(static_cast<size_t>(m) * D / 32);
  std::vector<uint16_t> zb(static_cast<size_t>(m) * 64 + 8, 0x1234), init(zb.size());
  for (auto& v : init) v = static_cast<uint16_t>(rng());
  AiterAuxSortQuantArgs a = sort_quant_args(ep.ids, w, m, K, E, bm, max_rows, got, zb, xs, D, q, s);
  if (map_mode != 0) {
    a.sort.expert_map = ep.map.data();
    a.sort.num_global_experts = static_cast<int64_t>(ep.map.size());
  }
  if (init_zero) a.sort.zero_init = init.data();
  const int BM = bm > 32 ? bm : 32;
  const int64_t out_rows = (max_rows + BM - 1) / BM * BM;
  const size_t out_bytes = static_cast<size_t>(out_rows) * (D / 32);
  const size_t guard = 2 * (D / 32);
  std::vector<uint4> store((out_bytes + guard) / 16 + 2);
  uint8_t* ss = reinterpret_cast<uint8_t*>(store.data());
  memset(ss, 0xEE, store.size() * 16);
  if (scales) a.sorted_scales = ss;
  const sd::SortChoice c = sd::choose_sort_path(
      sd::host_sort_policy(),
      sd::sort_problem<E, K, kFp8 ? QuantFormat::Mxfp8 : QuantFormat::Mxfp4, D>(a.sort, scales),
      device_sm_count);
  const int rc =
      kFp8 ? moe_sort_quant_fp8<E, K, D>(a, nullptr) : moe_sort_quant<E, K, D>(a, nullptr);
  ref_sort(ep.local, w, m, K, E, bm, want);
  if (kFp8) {
    ref_quant_fp8(xs.data(), m, D, wq, ws);
  } else {
    ref_quant(xs.data(), m, D, wq, ws);
  }
  const std::string tag = std::string(kFp8 ? "pairs fp8<" : "pairs quant<") + std::to_string(E) +
                          "," + std::to_string(K) + "," + std::to_string(D) +
                          "> M=" + std::to_string(m) + " bm=" + std::to_string(bm) +
                          " mode=" + std::to_string(mode) + " map=" + std::to_string(map_mode) +
                          (scales ? " scales" : "") + (init_zero ? " init" : "");
  check(c.path == sd::SortPath::Pairs && c.fused_scales == scales,
        tag + ": the chooser takes the pair path");
  check(rc == AITER_AUX_OK, tag + ": status " + g_last_error);
  compare_sort(got, want, tag);
  std::string where;
  check(same_bytes(std::vector<uint8_t>(q.begin(), q.begin() + wq.size()), wq, &where),
        tag + ": a_q " + where);
  check(same_bytes(std::vector<uint8_t>(s.begin(), s.begin() + ws.size()), ws, &where),
        tag + ": a_scale " + where);
  check(q[wq.size()] == 0xAB && s[ws.size()] == 0xCD, tag + ": no write past a_q / a_scale");
  bool z = true;
  for (size_t i = 0; i < zb.size(); ++i) z = z && zb[i] == (init_zero ? init[i] : 0);
  check(z, tag + ": zero_buf");
  if (scales) {
    std::vector<uint8_t> wss(out_bytes, 0x77);
    ref_sorted_scales(ws.data(), m, D, bm, want.sti, want.nv[0], max_rows, wss);
    check(same_bytes(std::vector<uint8_t>(ss, ss + out_bytes), wss, &where),
          tag + ": sorted_scales " + where);
    bool kept = true;
    for (size_t i = 0; i < guard; ++i) kept = kept && ss[out_bytes + i] == 0xEE;
    check(kept, tag + ": no write past sorted_scales' rows");
  }
}

// Every n of one (E, topk) shape: M = 1 .. 64 / topk, the variants cycling.
template <int E, int K>
void pairs_all_m(uint32_t seed) {
  static const int kBm[4] = {16, 32, 64, 128};
  for (int m = 1; m * K <= sd::kPairMax; ++m) {
    const int i = m + K;
    run_pairs_case<E, K>(m, kBm[i % 4], i % 5, seed + m, (i / 5) % 3 == 1 ? 1 : 0, i % 3);
  }
}

// M = 1 and the largest M of a shape (n = 64 where topk divides 64).
template <int E, int K>
void pairs_ends(uint32_t seed) {
  run_pairs_case<E, K>(1, 32, 0, seed, 0, 1);
  run_pairs_case<E, K>(sd::kPairMax / K, 16 << (seed % 4), seed % 5, seed + 1, seed % 3, 2);
}

template <int... Ks>
void pairs_topk_sweep(uint32_t seed) {
  (pairs_ends<257, Ks>(seed + 7 * Ks), ...);
}

void test_pairs() {
  // the chooser: every n <= 64 takes the pair path, whatever E, with an expert map or a fused
  // quant, and with sorted_scales (also at topk 1, whose tiny one-launch kernel does not fit)
  {
    const sd::SortPolicy p = sd::host_sort_policy();
    bool ok = true;
    for (int e : {1, 2, 257, 896, 1024})
      for (int n = 0; n <= 65; ++n) {
        const int k = n % 2 == 0 && n > 0 ? 2 : 1;
        sd::SortProblem s = {n / k, k, e, 32, n % 3 == 0, QuantFormat::None, 0, false, true};
        const sd::SortChoice c = sd::choose_sort_path(p, s, device_sm_count);
        ok = ok && (n <= 64 ? c.path == sd::SortPath::Pairs : c.path == sd::SortPath::Tiny);
        s.quant = QuantFormat::Mxfp8;
        s.model_dim = 512;
        s.fused_scales = true;
        s.tiny_scales_fit = k > 1;
        const sd::SortChoice f = sd::choose_sort_path(p, s, device_sm_count);
        ok = ok && (n <= 64 ? f.path == sd::SortPath::Pairs && f.fused_scales
                            : f.path == sd::SortPath::Tiny && f.fused_scales == (k > 1));
      }
    check(ok, "choose_sort_path: pairs for n <= 64, tiny above");
  }
  // sm_90's fused rule where model_dim >= 300 topk (132 SMs): mid below 393216 pairs, the
  // staged large path from there where a chunk fits the stage (6112 slots at E = 1024), mid
  // where it does not; moe_sort alone takes large past mid_base
  {
    const sd::SortPolicy p = sd::sm90_sort_policy();
    auto pick = [&](int64_t m, int k, int e, int d, QuantFormat q) {
      const sd::SortProblem s = {m, k, e, 32, false, q, d, false, false};
      return sd::choose_sort_path(p, s, [] { return 132; });
    };
    const auto mx4 = QuantFormat::Mxfp4;
    const sd::SortChoice a = pick(32768, 8, 256, 7168, mx4);    // 262144 pairs
    const sd::SortChoice b = pick(49152, 8, 256, 7168, mx4);    // 393216
    const sd::SortChoice c = pick(65536, 9, 257, 7168, mx4);    // 589824
    const sd::SortChoice d = pick(131072, 8, 1024, 7168, mx4);  // 7944 a chunk > 6112
    const sd::SortChoice e = pick(32768, 8, 256, 0, QuantFormat::None);
    const sd::SortChoice f = pick(16384, 11, 513, 2560, mx4);  // model_dim < 300 topk
    check(a.path == sd::SortPath::Mid && b.path == sd::SortPath::Large && b.staged_place &&
              c.path == sd::SortPath::Large && c.staged_place && d.path == sd::SortPath::Mid &&
              e.path == sd::SortPath::Large && e.staged_place && f.path == sd::SortPath::Large,
          "choose_sort_path (sm_90): fused mid below 393216 pairs, staged large above");
  }
  // every n = 1..64 (topk 1), then topk 2 and 3
  pairs_all_m<257, 1>(400);
  pairs_all_m<257, 2>(500);
  pairs_all_m<257, 3>(540);
  // topk 1..16 at both ends
  pairs_topk_sweep<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>(600);
  // other E: 1 and 2 (every pair to one or two experts), 896, 1024; every block_m
  for (int bm : {16, 32, 64, 128}) {
    run_pairs_case<1, 1>(64, bm, 0, 700 + bm, 0, 0);
    run_pairs_case<1, 16>(4, bm, 0, 701 + bm, bm == 64 ? 1 : 0, 1);
    run_pairs_case<2, 3>(21, bm, 0, 702 + bm, 0, 2);
    run_pairs_case<2, 8>(8, bm, 1, 703 + bm, bm == 32 ? 1 : 0, 0);
    run_pairs_case<896, 16>(4, bm, bm % 5, 704 + bm, 0, 1);
    run_pairs_case<896, 1>(64, bm, 0, 705 + bm, 1, 0);
    run_pairs_case<1024, 8>(8, bm, 0, 706 + bm, 0, 2);
    run_pairs_case<1024, 3>(bm / 8, bm, 2, 707 + bm, 1, 1);
  }
  // one expert takes all 64 pairs (4 blocks at block_m 16); 64 experts of one pair at
  // block_m 128 (8192 rows: 8 blocks); nothing local (plain and through a map); E + 1 ids
  run_pairs_case<257, 16>(4, 16, 3, 720, 0, 0);
  run_pairs_case<257, 1>(64, 16, 3, 721, 0, 1);
  run_pairs_case<1024, 1>(64, 128, 0, 722, 0, 0);
  run_pairs_case<1024, 16>(4, 128, 4, 723, 0, 2);
  run_pairs_case<385, 9>(7, 64, 0, 724, 2, 1);
  run_pairs_case<385, 9>(1, 32, 4, 725, 0, 0);
  // the fused quant (MXFP4, MXFP8) and the one-launch sorted scales at decode
  for (int bm : {16, 32, 64, 128}) {
    run_pairs_fused_case<257, 9, 7168, false>(1, bm, 0, 730 + bm, 0, true, bm == 32);
    run_pairs_fused_case<257, 9, 512, true>(7, bm, bm % 5, 731 + bm, bm == 64 ? 1 : 0, true, false);
  }
  run_pairs_fused_case<257, 9, 7168, false>(4, 32, 0, 740, 0, false, false);
  run_pairs_fused_case<257, 9, 7168, true>(4, 32, 0, 741, 1, false, true);
  run_pairs_fused_case<896, 16, 3584, false>(4, 32, 0, 742, 0, true, false);
  run_pairs_fused_case<896, 16, 3584, true>(2, 16, 3, 743, 0, true, true);
  run_pairs_fused_case<1024, 8, 256, false>(8, 128, 0, 744, 1, true, false);
  run_pairs_fused_case<513, 11, 2560, true>(5, 64, 4, 745, 2, true, false);
  run_pairs_fused_case<8, 1, 512, false>(64, 16, 1, 746, 0, true, false);  // topk 1, 64 tokens
  run_pairs_fused_case<8, 1, 512, true>(40, 32, 0, 747, 1, true, true);
  run_pairs_fused_case<2, 2, 256, false>(32, 16, 0, 748, 0, true, false);
}

}  // namespace
