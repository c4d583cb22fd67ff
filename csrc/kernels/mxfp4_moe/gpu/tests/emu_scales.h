// moe_sort_quant[_fp8] with sorted_scales (included by emu_selftest.cpp after emu_fp8.h):
// one call against ref_sort, the quant reference and ref_sorted_scales of its own outputs;
// the one-launch decode path (sort_tiny_scales.h) and the two-launch fallback.
#pragma once

namespace {

// out_off: the sorted_scales pointer's offset from a 16-byte aligned start (not a multiple
// of 16: the fallback); rows_extra: rows past ceil(max_rows / BM) * BM that must keep their
// poison.
template <int E, int K, int D, bool kFp8>
void run_sort_quant_scales_case(int m, int bm, int mode, uint32_t seed, int out_off = 0) {
  std::mt19937 rng(seed);
  const auto ids = make_ids(m, K, E, rng, mode);
  const auto w = make_weights(ids.size(), rng);
  const auto xs = make_x(m, D, rng);
  const int64_t max_rows = sort_capacity(m, K, E, bm) + (seed % 3 == 0 ? bm : 0);
  SortBufs got = prefilled(max_rows, bm, ids.size());
  SortBufs want = prefilled(max_rows, bm, ids.size());
  const int qcols = kFp8 ? D : D / 2;
  std::vector<uint8_t> q(static_cast<size_t>(m) * qcols, 0xAB),
      s(static_cast<size_t>(m) * D / 32, 0xCD);
  std::vector<uint8_t> wq(q.size()), ws(s.size());
  std::vector<uint16_t> zb(static_cast<size_t>(m) * 64 + 8, 0x1234);
  const int BM = bm > 32 ? bm : 32;
  const int64_t out_rows = (max_rows + BM - 1) / BM * BM;
  const size_t out_bytes = static_cast<size_t>(out_rows) * (D / 32);
  const size_t guard = 2 * (D / 32);  // two rows
  std::vector<uint4> store((out_bytes + guard + 64) / 16 + 1);
  uint8_t* base = reinterpret_cast<uint8_t*>(store.data());
  memset(base, 0xEE, store.size() * 16);
  uint8_t* ss = base + out_off;
  AiterAuxSortQuantArgs a = sort_quant_args(ids, w, m, K, E, bm, max_rows, got, zb, xs, D, q, s);
  a.sorted_scales = ss;
  aiter_aux_emu::reset_pdl();
  const int rc =
      kFp8 ? moe_sort_quant_fp8<E, K, D>(a, nullptr) : moe_sort_quant<E, K, D>(a, nullptr);
  ref_sort(ids, w, m, K, E, bm, want);
  if (kFp8) {
    ref_quant_fp8(xs.data(), m, D, wq, ws);
  } else {
    ref_quant(xs.data(), m, D, wq, ws);
  }
  std::vector<uint8_t> wss(out_bytes, 0x77);
  ref_sorted_scales(ws.data(), m, D, bm, want.sti, want.nv[0], max_rows, wss);
  const std::string tag = std::string(kFp8 ? "moe_sort_quant_fp8<" : "moe_sort_quant<") +
                          std::to_string(E) + "," + std::to_string(K) + "," + std::to_string(D) +
                          "> sorted_scales M=" + std::to_string(m) + " bm=" + std::to_string(bm) +
                          " mode=" + std::to_string(mode) + " +" + std::to_string(out_off);
  check_pdl(tag);
  check(rc == AITER_AUX_OK, tag + ": status");
  compare_sort(got, want, tag);
  std::string where;
  check(same_bytes(q, wq, &where), tag + ": a_q " + where);
  check(same_bytes(s, ws, &where), tag + ": a_scale " + where);
  check(same_bytes(std::vector<uint8_t>(ss, ss + out_bytes), wss, &where),
        tag + ": sorted_scales " + where);
  bool kept = true;
  for (int i = 0; i < out_off; ++i) kept = kept && base[i] == 0xEE;
  for (size_t i = 0; i < guard; ++i) kept = kept && ss[out_bytes + i] == 0xEE;
  check(kept, tag + ": no write outside sorted_scales' rows");
  bool z = true;
  for (auto v : zb) z = z && v == 0;
  check(z, tag + ": zero_buf");
}

void test_sort_quant_scales() {
  // the one-launch path: M = 1 (micro-path sizes), every block_m, hot / one / no local
  // expert, the largest catalog E, up to 1024 pairs, topk < 8 (more x blocks than threads), fp8
  for (int bm : {16, 32, 64, 128}) {
    run_sort_quant_scales_case<257, 9, 7168, false>(1, bm, 0, 300 + bm);
    run_sort_quant_scales_case<385, 9, 512, false>(37, bm, bm == 64 ? 1 : 0, 301 + bm);
  }
  run_sort_quant_scales_case<257, 9, 7168, false>(64, 32, 0, 310);
  run_sort_quant_scales_case<256, 8, 7168, false>(128, 16, 1, 311);
  run_sort_quant_scales_case<896, 16, 3584, false>(64, 32, 0, 312);
  run_sort_quant_scales_case<896, 16, 3584, false>(3, 64, 3, 313);
  run_sort_quant_scales_case<1024, 8, 256, false>(128, 128, 0, 314);
  run_sort_quant_scales_case<513, 11, 2560, false>(20, 32, 4, 315);
  run_sort_quant_scales_case<8, 2, 256, false>(0, 32, 0, 316);
  run_sort_quant_scales_case<8, 1, 512, false>(500, 16, 2, 317);
  run_sort_quant_scales_case<257, 9, 7168, true>(16, 32, 0, 318);
  run_sort_quant_scales_case<896, 16, 3584, true>(1, 16, 0, 319);
  // the fallback: sorted_scales not 16-byte aligned; more pairs than the tiny path; topk 1
  // (the one-launch kernel's shared memory would not fit)
  run_sort_quant_scales_case<257, 9, 7168, false>(5, 32, 0, 320, 4);
  run_sort_quant_scales_case<257, 9, 256, false>(200, 64, 0, 321);
  run_sort_quant_scales_case<8, 1, 16384, false>(100, 32, 0, 322);
  run_sort_quant_scales_case<1024, 1, 512, false>(300, 16, 1, 324);
  run_sort_quant_scales_case<385, 9, 512, true>(300, 16, 1, 323, 8);
}

}  // namespace
