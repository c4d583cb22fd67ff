// MXFP8 part of the emulated self-test (included by emu_selftest.cpp after its quant and
// sort helpers): a reference written from docs/ops.md in double arithmetic (independent of
// ../../mxfp8_e4m3.h), the integer encoder against it for every finite bf16 x every scale,
// mxfp8_quant (direct grids, misaligned pointers) and moe_sort_quant_fp8 against it.
#pragma once

namespace {

// Value of the non-negative E4M3 code c (0..126).
double e4m3_value(int c) {
  const int e = c >> 3, f = c & 7;
  return e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10);
}

// The spec's E4M3 byte of x * 2^(127 - s) (finite x), by search over the 127 values.
uint8_t ref_e4m3(uint16_t x, uint32_t s) {
  const double v = std::fabs(static_cast<double>(u2f(static_cast<uint32_t>(x) << 16))) *
                   std::ldexp(1.0, 127 - static_cast<int>(s));
  int lo = 0, hi = 126;  // largest code with value <= v
  if (v >= 448.0) {
    lo = 126;
  } else {
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (e4m3_value(mid) <= v)
        lo = mid;
      else
        hi = mid - 1;
    }
    const double d0 = v - e4m3_value(lo), d1 = e4m3_value(lo + 1) - v;
    if (d1 < d0 || (d1 == d0 && (lo & 1))) ++lo;
  }
  return static_cast<uint8_t>(lo | ((x & 0x8000u) ? 0x80 : 0));
}

// The smallest s in [1, 254] with amax <= 448 * 2^(s - 127); 0 for amax = 0.
uint32_t ref_scale_fp8(uint32_t amax16) {
  if (amax16 == 0) return 0;
  const double a = u2f(amax16 << 16);
  for (uint32_t s = 1; s < 254; ++s)
    if (a <= std::ldexp(448.0, static_cast<int>(s) - 127)) return s;
  return 254;
}

void ref_quant_fp8(const uint16_t* x, int64_t m, int d, std::vector<uint8_t>& aq,
                   std::vector<uint8_t>& as) {
  for (int64_t r = 0; r < m; ++r) {
    for (int b = 0; b < d / 32; ++b) {
      const uint16_t* blk = x + r * d + b * 32;
      uint32_t amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max<uint32_t>(amax, blk[i] & 0x7FFFu);
      uint8_t* q = &aq[r * d + b * 32];
      const bool bad = amax >= 0x7F80u;
      const uint32_t s = bad ? 255 : ref_scale_fp8(amax);
      as[r * (d / 32) + b] = static_cast<uint8_t>(s);
      for (int i = 0; i < 32; ++i) q[i] = bad ? 0 : ref_e4m3(blk[i], s);
    }
  }
}

void test_fp8_helpers() {
  bool ok_s = true, ok_q = true;
  for (uint32_t a = 0; a < 0x7F80u; ++a)
    ok_s = ok_s && aiter_aux::e4m3::scale_from_amax_bits(a) == ref_scale_fp8(a);
  check(ok_s, "e4m3::scale_from_amax_bits: every finite bf16 amax");
  for (uint32_t x = 0; x < 0x10000u && ok_q; ++x) {
    if ((x & 0x7FFFu) >= 0x7F80u) continue;
    for (uint32_t s = 1; s <= 254 && ok_q; ++s)
      if (aiter_aux::e4m3::encode(x, s) != ref_e4m3(static_cast<uint16_t>(x), s)) {
        ok_q = false;
        fprintf(stderr, "e4m3::encode(0x%04x, %u) = 0x%02x, spec 0x%02x\n", x, s,
                aiter_aux::e4m3::encode(x, s), ref_e4m3(static_cast<uint16_t>(x), s));
      }
  }
  check(ok_q, "e4m3::encode: every finite bf16 x every scale 1..254");
}

// q_off: a_q's byte offset (0: 16-byte aligned, the vector stores; 4/8: 4-aligned).
template <int D>
void run_quant_fp8_case(int64_t m, uint32_t seed, bool mis_x, int q_off, int grid = 0) {
  run_quant_case_of<QuantFormat::Mxfp8, D>(m, seed, mis_x, q_off, grid, ref_quant_fp8);
}

template <int E, int K, int D>
void run_sort_quant_fp8_case(int m, int bm, uint32_t seed) {
  run_sort_quant_case_of<QuantFormat::Mxfp8, E, K, D>(m, bm, seed, ref_quant_fp8);
}

void test_fp8() {
  test_fp8_helpers();
  run_quant_fp8_case<256>(5, 121, false, 0);
  run_quant_fp8_case<256>(33, 122, true, 1);
  run_quant_fp8_case<7168>(3, 123, false, 0);
  run_quant_fp8_case<2560>(9, 124, true, 0);
  run_quant_fp8_case<32>(17, 125, false, 1);
  run_quant_fp8_case<96>(11, 126, false, 4);  // 4-aligned a_q: the 4-byte store path
  run_quant_fp8_case<256>(40, 136, false, 8);
  run_quant_fp8_case<256>(0, 127, false, 0);
  run_quant_fp8_case<256>(333, 128, false, 0, 3);
  run_quant_fp8_case<96>(101, 137, false, 0, 2);  // partial steps, several per warp
  run_quant_fp8_case<7168>(70, 129, false, 0);
  run_sort_quant_fp8_case<257, 9, 512>(40, 32, 131);    // tiny path
  run_sort_quant_fp8_case<257, 9, 256>(1000, 64, 132);  // mid path
  run_sort_quant_fp8_case<8, 2, 256>(21000, 32, 136);   // large path (42000 pairs)
  run_sort_quant_fp8_case<8, 2, 7168>(2, 16, 133);
  run_sort_quant_fp8_case<896, 16, 3584>(64, 32, 134);
  run_sort_quant_fp8_case<257, 9, 256>(600, 16, 135);  // small path (5400 pairs)
}

}  // namespace
