// Self-test of the GPU kernels of ../ on the CPU, through the fiber emulation
// of emu.h, against plain C++ references written from docs/ops.md.  Also checks
// the pure arithmetic helpers exhaustively.  No GPU, no torch.
//
//   g++ -std=c++17 -O2 -ffp-contract=off -fno-strict-aliasing -Wno-unknown-pragmas
//       -DAITER_AUX_EMU_WARP=32 -I csrc/kernels/mxfp4_moe
//       csrc/kernels/mxfp4_moe/gpu/tests/emu_selftest.cpp -o /tmp/emu32
//   (and -DAITER_AUX_EMU_WARP=64), then run; the last line is "N passed, M failed".
//   AITER_AUX_EMU_LONG=1 adds a large sort with 7168-pair chunks (slow);
//   AITER_AUX_EMU_ONLY=moe_sum (=align, =moe_route) runs only those cases.
#include "emu.h"  // must come first

// A small sort_scales grid, so that most cases run its grid-stride loop (the
// GPU build caps the grid only for huge inputs).
#define AITER_AUX_SORT_SCALES_MAX_BLOCKS 16

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "gpu/mxfp4_moe_aux_gpu.h"

static std::string g_last_error;
extern "C" void aiter_aux_set_error(const char* msg) {
  g_last_error = msg;
}

namespace {

using namespace aiter_aux::gpu;

int g_pass = 0, g_fail = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    if (g_fail <= 50) fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// Every thread of the launches since the last aiter_aux_emu::reset_pdl() reached both PDL
// points of target_ops.h PdlScope on its path: the wait once, then the trigger once.
void check_pdl(const std::string& tag) {
  const aiter_aux_emu::PdlCounts& c = aiter_aux_emu::emu().pdl;
  check(c.waited == c.threads && c.triggered == c.threads,
        tag + ": PDL wait and trigger in every thread (" + std::to_string(c.waited) + ", " +
            std::to_string(c.triggered) + " of " + std::to_string(c.threads) + ")");
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b, std::string* where = nullptr) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      if (where) *where = "first difference at element " + std::to_string(i);
      return false;
    }
  }
  return true;
}

uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
float bf2f(uint16_t h) {
  return u2f(uint32_t(h) << 16);
}

// ------------------------------------------------------------ references ----
// e8m0 exponent per the spec (host fp: IEEE, subnormals kept).
uint32_t ref_scale(uint32_t amax16) {
  const double amax = static_cast<double>(bf2f(static_cast<uint16_t>(amax16)));
  const double sixth = static_cast<double>(u2f(0x3E2AAAABu));
  const float w = static_cast<float>(amax * sixth);  // exact product, one RNE rounding
  const uint32_t s = (f2u(w) + 0x7FFFFFu) >> 23;
  return s < 254 ? s : 254;
}

// e2m1 nibble of bf16 h in a finite block of exponent s, per the spec.
uint32_t ref_code(uint16_t h, uint32_t s) {
  const double q =
      std::fabs(static_cast<double>(bf2f(h))) * std::ldexp(1.0, 127 - static_cast<int>(s));
  uint32_t c;
  if (q <= 0.25)
    c = 0;
  else if (q < 0.75)
    c = 1;
  else if (q <= 1.25)
    c = 2;
  else if (q < 1.75)
    c = 3;
  else if (q <= 2.5)
    c = 4;
  else if (q < 3.5)
    c = 5;
  else if (q <= 5.0)
    c = 6;
  else
    c = 7;
  return c | ((h & 0x8000u) ? 8u : 0u);
}

// A model of the documented gfx950 scaled conversion bf16 -> e2m1 (AMD's host
// emulation of v_cvt_scalef32_pk_fp4_*: source exponent minus the scale
// exponent, round to nearest even at e2m1 precision, overflow saturates to
// the max code, signed zeros), written independently.  `flush` models an
// input-denormal flush to a signed zero.
uint32_t model_hw_code(uint16_t h, uint32_t s, bool flush) {
  const uint32_t sign = (h & 0x8000u) ? 8u : 0u;
  const uint32_t e = (h >> 7) & 0xFFu;
  uint32_t man = h & 0x7Fu;
  if (e == 0 && man == 0) return sign;
  int exp;  // unbiased exponent of the value 1.man * 2^exp
  if (e == 0) {
    if (flush) return sign;
    exp = -126;
    while ((man & 0x80u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x7Fu;
  } else {
    exp = static_cast<int>(e) - 127;
  }
  const int x = exp - (static_cast<int>(s) - 127);  // exponent of q = x_val / 2^(s-127)
  const uint32_t full = 0x80u | man;                // q = full * 2^(x-7)
  if (x > 2) return sign | 7u;                      // >= 8: saturate
  uint32_t code, round, sticky;
  if (x >= 0) {  // normal e2m1: 1.m1 * 2^x, code = (x+1)*2 + m1
    code = (static_cast<uint32_t>(x + 1) << 1) | ((full >> 6) & 1u);
    round = (full >> 5) & 1u;
    sticky = full & 0x1Fu;
  } else {  // subnormal e2m1: multiples of 0.5, q / 0.5 = full * 2^(x-6)
    const int shift = 6 - x;
    if (shift >= 32) return sign;
    code = full >> shift;
    round = (full >> (shift - 1)) & 1u;
    sticky = full & ((1u << (shift - 1)) - 1u);
  }
  if (round && (sticky || (code & 1u))) ++code;  // nearest, ties to the even code
  return sign | (code > 7u ? 7u : code);
}

struct SortBufs {
  std::vector<int32_t> sti, mi, seid, nv, rev;
  std::vector<float> sw;
};

SortBufs prefilled(int64_t max_rows, int bm, int64_t n) {
  SortBufs b;
  b.sti.assign(max_rows, 0x7B7B7B7B);
  b.mi.assign(max_rows, 0x6C6C6C6C);
  b.sw.assign(max_rows, u2f(0x7FA5A5A5u));
  b.seid.assign(max_rows / bm, 0x5D5D5D5D);
  b.nv.assign(2, 0x4E4E4E4E);
  b.rev.assign(n, 0x3F3F3F3F);
  return b;
}

void ref_sort(const std::vector<int32_t>& ids, const std::vector<float>& w, int m, int k, int e,
              int bm, SortBufs& o) {
  const int n = m * k;
  std::vector<int64_t> cnt(e, 0), off(e, 0), fill(e, 0);
  for (int j = 0; j < n; ++j)
    if (ids[j] >= 0 && ids[j] < e) ++cnt[ids[j]];
  int64_t r = 0;
  for (int x = 0; x < e; ++x) {
    off[x] = r;
    r += (cnt[x] + bm - 1) / bm * bm;
  }
  for (int j = 0; j < n; ++j) {
    const int id = ids[j];
    if (id >= 0 && id < e) {
      const int64_t p = off[id] + fill[id]++;
      const int t = j / k, kk = j % k;
      o.sti[p] = static_cast<int32_t>(static_cast<uint32_t>(t) | (static_cast<uint32_t>(kk) << 24));
      o.sw[p] = w[j];
      o.mi[p] = t;
      o.rev[j] = static_cast<int32_t>(p);
    } else {
      o.rev[j] = -1;
    }
  }
  for (int x = 0; x < e; ++x) {
    const int64_t padded = (cnt[x] + bm - 1) / bm * bm;
    for (int64_t q = cnt[x]; q < padded; ++q) {
      o.sti[off[x] + q] = m;
      o.sw[off[x] + q] = 0.0f;
      o.mi[off[x] + q] = m;
    }
    for (int64_t b = 0; b < padded / bm; ++b) o.seid[off[x] / bm + b] = x;
  }
  o.nv[0] = static_cast<int32_t>(r);
  o.nv[1] = m;
}

void ref_quant(const uint16_t* x, int64_t m, int d, std::vector<uint8_t>& aq,
               std::vector<uint8_t>& as) {
  for (int64_t r = 0; r < m; ++r) {
    for (int b = 0; b < d / 32; ++b) {
      const uint16_t* blk = x + r * d + b * 32;
      bool bad = false;
      uint32_t amax = 0;
      for (int i = 0; i < 32; ++i) {
        const uint32_t a = blk[i] & 0x7FFFu;
        if (a >= 0x7F80u) bad = true;
        if (a > amax) amax = a;
      }
      uint8_t* q = &aq[r * (d / 2) + b * 16];
      if (bad) {
        as[r * (d / 32) + b] = 255;
        for (int i = 0; i < 16; ++i) q[i] = 0;
        continue;
      }
      const uint32_t s = ref_scale(amax);
      as[r * (d / 32) + b] = static_cast<uint8_t>(s);
      for (int i = 0; i < 16; ++i)
        q[i] = static_cast<uint8_t>(ref_code(blk[2 * i], s) | (ref_code(blk[2 * i + 1], s) << 4));
    }
  }
}

uint16_t ref_bf16(float f) {
  const uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float ref_decode(uint32_t nib, uint32_t s) {
  static const float lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const float scale =
      s == 255 ? NAN : static_cast<float>(std::ldexp(1.0, static_cast<int>(s) - 127));
  volatile float v = lut[nib] * scale;
  return v;
}

// ---------------------------------------------------------- helper tests ----
void test_helpers() {
  // scale exponent, every finite amax
  int bad = 0;
  for (uint32_t a = 0; a < 0x7F80u; ++a)
    if (quant_detail::mx_scale_exponent(a) != ref_scale(a)) {
      if (++bad < 5)
        fprintf(stderr, "  scale mismatch amax16=%#x: %u vs %u\n", a,
                quant_detail::mx_scale_exponent(a), ref_scale(a));
    }
  check(bad == 0, "mx_scale_exponent == spec for every finite amax");

  // element codes, every finite bf16 and every s
  bad = 0;
  for (uint32_t s = 0; s <= 254; ++s) {
    const quant_detail::Bounds b = quant_detail::mx_bounds(s);
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      if ((h & 0x7FFFu) >= 0x7F80u) continue;
      if (quant_detail::mx_code(h, b) != ref_code(static_cast<uint16_t>(h), s)) {
        if (++bad < 5) fprintf(stderr, "  code mismatch s=%u h=%#x\n", s, h);
      }
    }
  }
  check(bad == 0, "mx_code == spec for every finite bf16 and every s");

  // the gfx950 instruction model vs the spec, where quant8 uses it (amax >= 2^-119 -> s >= 3)
  bad = 0;
  int bad_sub = 0;
  for (uint32_t s = 0; s <= 254; ++s) {
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      if ((h & 0x7FFFu) >= 0x7F80u) continue;
      const uint32_t want = ref_code(static_cast<uint16_t>(h), s);
      if (model_hw_code(static_cast<uint16_t>(h), s, false) != want) ++bad;
      const bool sub = (h & 0x7F80u) == 0 && (h & 0x7Fu) != 0;
      if (sub && s >= 3 && model_hw_code(static_cast<uint16_t>(h), s, true) != want) ++bad_sub;
    }
  }
  check(bad == 0, "gfx950 conversion model == spec for every finite bf16 and s");
  check(bad_sub == 0, "gfx950 conversion with flushed subnormal input == spec for s >= 3");
  // the packed bf16x2 path (sm_90, emulation): every finite |x| <= 6 * 2^(s-127)
  // (a block's elements never exceed its max, and q = amax * 2^(127-s) <= 6), both
  // signs, every s in [3, 253]; also q <= 6 holds for every finite amax and its s
  // Two arrangements of +-a, +-0 over the 8 element positions (each position
  // sees a of both signs), so the byte gather is checked position by position.
  bad = 0;
  for (uint32_t s = 3; s <= 253; ++s) {
    const double lim = 6.0 * std::ldexp(1.0, static_cast<int>(s) - 127);
    for (uint32_t a = 0; a < 0x7F80u; ++a) {
      if (static_cast<double>(bf2f(static_cast<uint16_t>(a))) > lim) break;
      const uint32_t n = a | 0x8000u;
      const uint32_t pats[2][8] = {{a, n, n, a, a, 0u, 0u, a}, {0x8000u, a, a, n, 0u, n, a, n}};
      for (const auto& e : pats) {
        uint32_t w[4], want = 0;
        for (int j = 0; j < 4; ++j) w[j] = e[2 * j] | (e[2 * j + 1] << 16);
        for (int i = 0; i < 8; ++i) want |= ref_code(static_cast<uint16_t>(e[i]), s) << (4 * i);
        const uint32_t got = quant_detail::mx_pack8_pk(w, s);
        if (got != want) {
          if (++bad < 5) fprintf(stderr, "  pk mismatch s=%u a=%#x: %#x vs %#x\n", s, a, got, want);
        }
      }
    }
  }
  check(bad == 0,
        "packed bf16x2 quantisation == spec for every s in [3, 253] and |x| <= 6*2^(s-127)");
  // the fast path's scale (no clamp, amax16 in [0x0C00, 0x7F80))
  bad = 0;
  for (uint32_t a = 0x0C00u; a < 0x7F80u; ++a)
    if (quant_detail::mx_scale_exponent_normal(a << 16) != ref_scale(a)) ++bad;
  check(bad == 0, "mx_scale_exponent_normal == spec for every amax16 in [0x0C00, 0x7F80)");
  bool q6 = true;
  for (uint32_t a = 1; a < 0x7F80u; ++a) {
    const uint32_t s = quant_detail::mx_scale_exponent(a);
    q6 = q6 && s <= 253 &&
         static_cast<double>(bf2f(static_cast<uint16_t>(a))) <=
             6.0 * std::ldexp(1.0, static_cast<int>(s) - 127);
  }
  check(q6, "every finite amax: s <= 253 and amax <= 6 * 2^(s-127)");
  // and quant8's threshold: amax >= 0x0400 gives s >= 3
  bool s3 = true;
  for (uint32_t a = 0x0400u; a < 0x7F80u; ++a) s3 = s3 && quant_detail::mx_scale_exponent(a) >= 3;
  check(s3, "amax16 >= 0x0400 implies s >= 3");

  // mxfp4 decode
  bad = 0;
  for (uint32_t s = 0; s < 256; ++s)
    for (uint32_t nib = 0; nib < 16; ++nib) {
      const uint32_t got = scatter_detail::mx_decode_bits(nib, s);
      const uint32_t want = f2u(ref_decode(nib, s));
      const bool both_nan = std::isnan(u2f(got)) && std::isnan(u2f(want));
      if (got != want && !both_nan) ++bad;
    }
  check(bad == 0, "mx_decode_bits == fp32(e2m1 * 2^(s-127)) for every nibble and s");

  // scatter_reduce_q fast path: fp32(f16(e2m1 * 2^-14) * W), W = w * 2^(s-113), equals the
  // spec's fp32(decode(nib, s) * w) whenever q_fast_weight accepts (w, s); and it accepts the
  // usual range.  Weights: every exponent, random mantissas, both signs, plus 0, subnormal,
  // Inf, NaN; every s and every nibble.
  bad = 0;
  int fast = 0, tried = 0;
  bool usual = true;
  std::mt19937 wrng(11);
  for (uint32_t ew = 0; ew < 256; ++ew)
    for (int rep = 0; rep < 6; ++rep) {
      uint32_t wb = (ew << 23) | (wrng() & 0x807FFFFFu);
      if (rep == 0) wb = ew << 23;  // +-0 at ew 0, powers of two, Inf
      for (uint32_t s = 0; s < 256; ++s) {
        uint32_t big_w;
        const bool ok = scatter_detail::q_fast_weight(wb, s, &big_w);
        ++tried;
        if (ew >= 100 && ew <= 140 && s >= 40 && s <= 200) usual = usual && ok;
        if (!ok) continue;
        ++fast;
        for (uint32_t word = 0; word < 16; ++word) {  // nibble j of a word: both halves, every j
          const uint32_t x = word * 0x11111111u;
          uint32_t hs[4];
          scatter_detail::e2m1x8_as_f16x2(x, hs);
          for (int h = 0; h < 8; ++h) {
            const uint32_t h16 = h < 4 ? hs[h] & 0xFFFFu : hs[h - 4] >> 16;
            volatile float prod = f16_bits_to_f32_any(h16) * u2f(big_w);
            volatile float spec = ref_decode(word, s) * u2f(wb);
            const uint32_t g = f2u(prod), w = f2u(spec);
            if (g != w && !(std::isnan(u2f(g)) && std::isnan(u2f(w)))) {
              if (++bad < 5)
                fprintf(stderr, "  q fast mismatch w=%#x s=%u nib=%u: %#x vs %#x\n", wb, s, word, g,
                        w);
            }
          }
        }
      }
    }
  check(bad == 0, "scatter_q fast product == spec product for every nibble, s and " +
                      std::to_string(fast) + " accepted (w, s) of " + std::to_string(tried));
  check(usual, "scatter_q fast path accepts |w| in [2^-27, 2^14), s in [40, 200]");
  // e2m1x8_as_f16x2: nibble j of any word lands, alone, in half j % 4 (j < 4: low) of
  // word j % 4 as e2m1_as_f16 (the neighbours' bits must not leak in)
  bad = 0;
  std::mt19937 xrng(12);
  for (int rep = 0; rep < 200000; ++rep) {
    const uint32_t x = rep < 65536
                           ? static_cast<uint32_t>(rep) * 0x10001u ^ (rep < 256 ? 0u : xrng())
                           : static_cast<uint32_t>(xrng());
    uint32_t hs[4];
    scatter_detail::e2m1x8_as_f16x2(x, hs);
    for (int j = 0; j < 8; ++j) {
      const uint32_t got = j < 4 ? hs[j] & 0xFFFFu : hs[j - 4] >> 16;
      if (got != scatter_detail::e2m1_as_f16((x >> (4 * j)) & 0xFu)) ++bad;
    }
  }
  check(bad == 0, "e2m1x8_as_f16x2 places every nibble of any word alone in its fp16 half");
  // e2m1_as_f16 is e2m1 * 2^-14 (the fp16 definition the fast product relies on)
  bad = 0;
  for (uint32_t nib = 0; nib < 16; ++nib) {
    const float want = ref_decode(nib, 127) * 0x1p-14f;
    if (f2u(f16_bits_to_f32_any(scatter_detail::e2m1_as_f16(nib))) != f2u(want)) ++bad;
  }
  check(bad == 0, "e2m1_as_f16(nib) == e2m1 * 2^-14 for every nibble");
#if defined(__FLT16_MAX__)
  bad = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t hb = static_cast<uint16_t>(h);
    _Float16 hv;
    std::memcpy(&hv, &hb, 2);
    const float want = static_cast<float>(hv);
    const float got = f16_bits_to_f32_any(h);
    if (f2u(got) != f2u(want) && !(std::isnan(got) && std::isnan(want))) ++bad;
  }
  check(bad == 0, "f16 -> f32 bit conversion (emulation) == the compiler's, every pattern");
#endif

  // bf16 rounding
  bad = 0;
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = rng();
    if (f32_bits_to_bf16_rne(u) != ref_bf16(u2f(u))) ++bad;
  }
  check(bad == 0, "f32 -> bf16 RNE (NaN -> 0x7FC0)");
}

// ------------------------------------------------------------ sort tests ----
std::vector<int32_t> make_ids(int m, int k, int e, std::mt19937& rng, int mode) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * k);
  for (auto& v : ids) {
    const uint32_t r = rng() % 100;
    if (mode == 1) {  // skewed: most pairs to a few experts
      v = r < 70 ? 0 : (r < 90 ? e - 1 : static_cast<int32_t>(rng() % e));
    } else if (mode == 2) {  // expert parallel: mostly non-local
      v = r < 80 ? -1 : static_cast<int32_t>(rng() % e);
    } else if (mode == 3) {  // one expert takes every pair
      v = e / 2;
    } else if (mode == 4) {  // no local pair at all: -1 or out of range
      v = r < 50 ? -1
                 : (r < 75 ? e + static_cast<int32_t>(rng() % 1000)
                           : INT32_MIN + static_cast<int32_t>(r));
    } else {
      if (r < 8)
        v = -1;
      else if (r < 10)
        v = e + static_cast<int32_t>(rng() % 5);
      else if (r < 11)
        v = -2 - static_cast<int32_t>(rng() % 1000);
      else
        v = static_cast<int32_t>(rng() % e);
    }
  }
  return ids;
}

std::vector<float> make_weights(size_t n, std::mt19937& rng) {
  std::vector<float> w(n);
  for (auto& x : w) x = u2f((rng() & 0x3FFFFFFFu) | 0x3C000000u);
  return w;
}

AiterAuxSortArgs sort_args(const std::vector<int32_t>& ids, const std::vector<float>& w, int m,
                           int k, int e, int bm, int64_t max_rows, SortBufs& o) {
  AiterAuxSortArgs a = {};
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.num_tokens = m;
  a.num_experts = e;
  a.topk = k;
  a.block_m = bm;
  a.max_rows = max_rows;
  a.sorted_token_ids = o.sti.data();
  a.sorted_weights = o.sw.data();
  a.m_indices = o.mi.data();
  a.sorted_expert_ids = o.seid.data();
  a.num_valid_ids = o.nv.data();
  a.reverse_sorted = o.rev.data();
  return a;
}

// The fused op's args: sort_args plus zero_buf and the quant of x into q / s.
AiterAuxSortQuantArgs sort_quant_args(const std::vector<int32_t>& ids, const std::vector<float>& w,
                                      int m, int k, int e, int bm, int64_t max_rows, SortBufs& o,
                                      std::vector<uint16_t>& zb, const std::vector<uint16_t>& xs,
                                      int d, std::vector<uint8_t>& q, std::vector<uint8_t>& s) {
  AiterAuxSortQuantArgs a = {};
  a.sort = sort_args(ids, w, m, k, e, bm, max_rows, o);
  a.sort.zero_buf = zb.data();
  a.sort.zero_numel = static_cast<int64_t>(zb.size());
  a.quant.x = xs.data();
  a.quant.num_tokens = m;
  a.quant.model_dim = d;
  a.quant.a_q = q.data();
  a.quant.a_scale = s.data();
  return a;
}

void compare_sort(const SortBufs& got, const SortBufs& want, const std::string& tag) {
  std::string w;
  check(same_bytes(got.nv, want.nv, &w), tag + ": num_valid_ids " + w);
  check(same_bytes(got.sti, want.sti, &w), tag + ": sorted_token_ids " + w);
  check(same_bytes(got.sw, want.sw, &w), tag + ": sorted_weights " + w);
  check(same_bytes(got.mi, want.mi, &w), tag + ": m_indices " + w);
  check(same_bytes(got.seid, want.seid, &w), tag + ": sorted_expert_ids " + w);
  check(same_bytes(got.rev, want.rev, &w), tag + ": reverse_sorted " + w);
}

template <int E, int K>
void run_sort_case(int m, int bm, int mode, uint32_t seed, bool with_zero) {
  std::mt19937 rng(seed);
  const auto ids = make_ids(m, K, E, rng, mode);
  const auto w = make_weights(ids.size(), rng);
  const int64_t cap = sort_capacity(m, K, E, bm);
  const int64_t max_rows = cap + (seed % 2 ? bm : 0);  // buffers may be larger than needed
  SortBufs got = prefilled(max_rows, bm, ids.size());
  SortBufs want = prefilled(max_rows, bm, ids.size());
  AiterAuxSortArgs a = sort_args(ids, w, m, K, E, bm, max_rows, got);
  // zero_buf: odd length, 2-byte (not 16-byte) aligned, guarded on both sides
  std::vector<uint16_t> zb(static_cast<size_t>(m) * 37 + 19, 0xBEEF);
  if (with_zero) {
    a.zero_buf = zb.data() + 1;
    a.zero_numel = static_cast<int64_t>(zb.size()) - 2;
  }
  aiter_aux_emu::reset_pdl();
  const int rc = moe_sort<E, K>(a, nullptr);
  ref_sort(ids, w, m, K, E, bm, want);
  const std::string tag = "moe_sort<" + std::to_string(E) + "," + std::to_string(K) +
                          "> M=" + std::to_string(m) + " bm=" + std::to_string(bm) +
                          " mode=" + std::to_string(mode);
  check_pdl(tag);
  check(rc == AITER_AUX_OK, tag + ": status " + std::to_string(rc) + " " + g_last_error);
  compare_sort(got, want, tag);
  if (with_zero) {
    bool ok = zb.front() == 0xBEEF && zb.back() == 0xBEEF;
    for (size_t i = 1; i + 1 < zb.size(); ++i) ok = ok && zb[i] == 0;
    check(ok, tag + ": zero_buf");
  }
  // Every other path that can take this n, launched directly (choose_sort_path picks one).
  namespace sd = aiter_aux::gpu::sort_detail;
  const int64_t n = static_cast<int64_t>(m) * K;
  const AiterAuxQuantArgs none = {};
  auto forced = [&](const std::string& path, auto launch) {
    SortBufs f = prefilled(max_rows, bm, ids.size());
    AiterAuxSortArgs fa = sort_args(ids, w, m, K, E, bm, max_rows, f);
    const int frc = launch(fa);
    check(frc == AITER_AUX_OK, tag + " " + path + ": status " + g_last_error);
    compare_sort(f, want, tag + " " + path);
  };
  constexpr QuantFormat kNone = QuantFormat::None;
  const sd::SortPolicy pol = sd::host_sort_policy();
  if (n <= sd::kPairMax) {
    const int ng = sd::pair_blocks(sd::sort_problem<E, K, kNone, 0>(a, false));
    forced("pairs", [&](const AiterAuxSortArgs& fa) {
      return sd::launch_pairs<E, K, kNone, 0>(fa, none, nullptr, ng, "t");
    });
  }
  if (n <= kWarpSize)
    forced("micro", [&](const AiterAuxSortArgs& fa) {
      return sd::launch_micro<E, K, kNone, 0>(fa, none, nullptr, "t");
    });
  if (n <= sd::kTinyThreads) {
    const int ng = sd::tiny_blocks(pol, sd::sort_problem<E, K, kNone, 0>(a, false));
    forced("tiny", [&](const AiterAuxSortArgs& fa) {
      return sd::launch_tiny<E, K, kNone, 0>(fa, none, nullptr, ng, "t");
    });
  }
  for (int g : {1, sd::mid_chunks(pol, n, 8, false)}) {
    if (g > 1 && n < g) continue;
    if ((n + g - 1) / g > 65535) continue;
    forced("mid/" + std::to_string(g), [&](const AiterAuxSortArgs& fa) {
      return sd::launch_mid<E, K, kNone, 0>(fa, none, nullptr, g, false, "t");
    });
  }
  if (n >= sd::large_unit(E)) {
    const int nc = sd::large_chunks(pol, n, E, aiter_aux::gpu::device_sm_count());
    forced("large", [&](const AiterAuxSortArgs& fa) {
      return sd::launch_large<E, K, kNone, 0>(fa, none, nullptr, nc, false, "t");
    });
    if (sd::large_stage_fits(n, nc, E))
      forced("large staged", [&](const AiterAuxSortArgs& fa) {
        return sd::launch_large<E, K, kNone, 0>(fa, none, nullptr, nc, true, "t");
      });
  }
}

// ----------------------------------------------------------- quant tests ----
std::vector<uint16_t> make_x(int64_t m, int d, std::mt19937& rng) {
  std::vector<uint16_t> x(static_cast<size_t>(m) * d);
  for (int64_t r = 0; r < m; ++r) {
    for (int b = 0; b < d / 32; ++b) {
      const uint32_t kind = rng() % 16;
      // a per-block magnitude so that every range of s is visited
      const uint32_t ebase = rng() % 256;
      for (int i = 0; i < 32; ++i) {
        uint16_t h;
        const uint32_t r2 = rng();
        switch (kind) {
          case 0:
            h = static_cast<uint16_t>(r2 & 0x807Fu);
            break;  // zeros and subnormals
          case 1:
            h = static_cast<uint16_t>(r2 & 0x8000u);
            break;  // +-0 only
          case 2:
            h = static_cast<uint16_t>((r2 & 0x8000u) | ((r2 >> 16) % 0x0500u));
            break;  // tiny
          case 3:
            h = (static_cast<uint32_t>(i) == (r2 >> 8) % 32) ? 0x7F80u : static_cast<uint16_t>(r2);
            break;  // +Inf
          case 4:
            h = (static_cast<uint32_t>(i) == (r2 >> 8) % 32) ? 0xFFC1u
                                                             : static_cast<uint16_t>(r2 & 0x3FFFu);
            break;  // NaN
          case 5:
            h = static_cast<uint16_t>((r2 & 0x8000u) | (0x7F00u + (r2 >> 16) % 0x80u));
            break;  // huge
          default: {
            const uint32_t e = (ebase + (r2 >> 20) % 6) % 255;
            h = static_cast<uint16_t>((r2 & 0x8000u) | (e << 7) | (r2 & 0x7Fu));
            if ((h & 0x7FFFu) >= 0x7F80u) h = static_cast<uint16_t>(h & 0x807Fu);
          }
        }
        x[r * d + b * 32 + i] = h;
      }
    }
  }
  return x;
}

// One quant case of format F (mxfp4_quant, mxfp8_quant) against ref: x misaligned (+2 bytes)
// when mis_x, a_q at byte offset q_off (0: 16-byte aligned).  grid != 0: the kernel launched
// directly with |grid| blocks (several grid-stride steps per warp) instead of through the op:
// two tiles per step (grid > 0) or one (grid < 0).
using RefQuant = void (*)(const uint16_t*, int64_t, int, std::vector<uint8_t>&,
                          std::vector<uint8_t>&);
template <QuantFormat F, int D>
void run_quant_case_of(int64_t m, uint32_t seed, bool mis_x, int q_off, int grid, RefQuant ref) {
  constexpr bool kFp8 = F == QuantFormat::Mxfp8;
  constexpr int64_t kRowQ = kFp8 ? D : D / 2;  // a_q bytes of a row
  const bool q_al4 = (q_off & 3) == 0;
  std::mt19937 rng(seed);
  const auto xs = make_x(m, D, rng);
  std::vector<uint16_t> xbuf(xs.size() + 8);
  uint16_t* x = xbuf.data() + (mis_x ? 1 : 0);
  memcpy(x, xs.data(), xs.size() * 2);
  std::vector<uint8_t> qbuf(m * kRowQ + 16, 0xAB), sbuf(m * D / 32 + 16, 0xCD);
  uint8_t* q = qbuf.data() + q_off;
  AiterAuxQuantArgs a = {};
  a.x = x;
  a.num_tokens = m;
  a.model_dim = D;
  a.a_q = q;
  a.a_scale = sbuf.data();
  int rc = AITER_AUX_OK;
  aiter_aux_emu::reset_pdl();
  if (grid > 0) {
    AITER_AUX_LAUNCH((quant_detail::quant_kernel<F, D, quant_detail::kStepTiles>), dim3(grid),
                     dim3(quant_detail::kQuantThreads), nullptr)(a, grid, !mis_x, q_al4);
  } else if (grid < 0) {
    AITER_AUX_LAUNCH((quant_detail::quant_kernel<F, D, 1>), dim3(-grid),
                     dim3(quant_detail::kQuantThreads), nullptr)(a, -grid, !mis_x, q_al4);
  } else if constexpr (kFp8) {
    rc = mxfp8_quant<D>(a, nullptr);
  } else {
    rc = mxfp4_quant<D>(a, nullptr);
  }
  std::vector<uint8_t> wq(m * kRowQ), ws(m * D / 32);
  ref(xs.data(), m, D, wq, ws);
  const std::string tag = std::string(kFp8 ? "mxfp8" : "mxfp4") + "_quant<" + std::to_string(D) +
                          "> M=" + std::to_string(m) + (mis_x ? " x misaligned" : "") +
                          (q_off ? " a_q +" + std::to_string(q_off) : "") +
                          (grid != 0 ? " grid " + std::to_string(grid) : "");
  check(rc == AITER_AUX_OK, tag + ": status");
  check_pdl(tag);
  std::vector<uint8_t> gq(q, q + m * kRowQ), gs(sbuf.begin(), sbuf.begin() + m * D / 32);
  std::string w;
  check(same_bytes(gq, wq, &w), tag + ": a_q " + w);
  check(same_bytes(gs, ws, &w), tag + ": a_scale " + w);
  check(sbuf[m * D / 32] == 0xCD && q[m * kRowQ] == 0xAB, tag + ": no write past the end");
}

// mis_q: a_q at +1 byte.
template <int D>
void run_quant_case(int64_t m, uint32_t seed, bool mis_x, bool mis_q, int grid = 0) {
  run_quant_case_of<QuantFormat::Mxfp4, D>(m, seed, mis_x, mis_q ? 1 : 0, grid, ref_quant);
}

template <int D>
void run_quant_case(int64_t m, uint32_t seed, bool misalign) {
  run_quant_case<D>(m, seed, misalign, misalign);
}

// One fused sort+quant case of format F (moe_sort_quant, moe_sort_quant_fp8) against
// ref_sort and ref.  zero_buf: as large as x for MXFP4, 64 columns for MXFP8 (two zero-block
// counts).
template <QuantFormat F, int E, int K, int D>
void run_sort_quant_case_of(int m, int bm, uint32_t seed, RefQuant ref) {
  constexpr bool kFp8 = F == QuantFormat::Mxfp8;
  constexpr int64_t kRowQ = kFp8 ? D : D / 2;  // a_q bytes of a row
  std::mt19937 rng(seed);
  const auto ids = make_ids(m, K, E, rng, 0);
  const auto w = make_weights(ids.size(), rng);
  const auto xs = make_x(m, D, rng);
  const int64_t max_rows = sort_capacity(m, K, E, bm);
  SortBufs got = prefilled(max_rows, bm, ids.size());
  SortBufs want = prefilled(max_rows, bm, ids.size());
  std::vector<uint8_t> q(m * kRowQ + 8, 0xAB), s(m * D / 32 + 8, 0xCD), wq(m * kRowQ),
      ws(m * D / 32);
  std::vector<uint16_t> zb(static_cast<size_t>(m) * (kFp8 ? 64 : D), 0x1234);
  const AiterAuxSortQuantArgs a =
      sort_quant_args(ids, w, m, K, E, bm, max_rows, got, zb, xs, D, q, s);
  aiter_aux_emu::reset_pdl();
  int rc;
  if constexpr (kFp8) {
    rc = moe_sort_quant_fp8<E, K, D>(a, nullptr);
  } else {
    rc = moe_sort_quant<E, K, D>(a, nullptr);
  }
  ref_sort(ids, w, m, K, E, bm, want);
  ref(xs.data(), m, D, wq, ws);
  const std::string tag = std::string(kFp8 ? "moe_sort_quant_fp8<" : "moe_sort_quant<") +
                          std::to_string(E) + "," + std::to_string(K) + "," + std::to_string(D) +
                          "> M=" + std::to_string(m);
  check_pdl(tag);
  check(rc == AITER_AUX_OK, tag + ": status");
  compare_sort(got, want, tag);
  check(same_bytes(std::vector<uint8_t>(q.begin(), q.begin() + m * kRowQ), wq), tag + ": a_q");
  check(same_bytes(std::vector<uint8_t>(s.begin(), s.begin() + m * D / 32), ws), tag + ": a_scale");
  check(q[m * kRowQ] == 0xAB && s[m * D / 32] == 0xCD, tag + ": no write past the end");
  bool z = true;
  for (auto v : zb) z = z && v == 0;
  check(z, tag + ": zero_buf");
}

template <int E, int K, int D>
void run_sort_quant_case(int m, int bm, uint32_t seed) {
  run_sort_quant_case_of<QuantFormat::Mxfp4, E, K, D>(m, bm, seed, ref_quant);
}

// ----------------------------------------------------- sort_scales tests ----
// moe_sort_scales' output (docs/ops.md): a loop over (row, scale column) that places the
// byte; want has ceil(max_rows / BM) * BM rows.
void ref_sorted_scales(const uint8_t* as, int m, int d, int bm, const std::vector<int32_t>& sti,
                       int64_t nv0, int64_t max_rows, std::vector<uint8_t>& want) {
  const int BM = bm > 32 ? bm : 32;
  const int64_t out_rows = static_cast<int64_t>(want.size()) / (d / 32);
  const int cm1 = BM / 32, ck1 = d / 256;
  for (int64_t row = 0; row < out_rows; ++row) {
    const int64_t c = row / BM;
    const int rr = static_cast<int>(row % BM);
    const int mi = rr / 32, ia = (rr / 16) % 2, nl = rr % 16;
    int64_t tok = -1;
    if (row < max_rows && row < nv0) {
      tok = static_cast<uint32_t>(sti[row]) & 0xFFFFFFu;
      if (tok >= m) tok = -1;
    }
    for (int col = 0; col < d / 32; ++col) {
      const int ku = col / 8, ik = (col / 4) % 2, kl = col % 4;
      const int64_t dw = ((((c * cm1 + mi) * ck1 + ku) * 4 + kl) * 16 + nl);
      want[dw * 4 + 2 * ik + ia] = tok >= 0 ? as[tok * (d / 32) + col] : 0;
    }
  }
}

template <int D>
void run_scales_case(int m, int bm, int e, int k, uint32_t seed, bool shrink_valid, int in_off = 0,
                     int out_off = 0) {
  std::mt19937 rng(seed);
  const auto ids = make_ids(m, k, e, rng, 0);
  const auto w = make_weights(ids.size(), rng);
  const int64_t max_rows = sort_capacity(m, k, e, bm);
  SortBufs sb = prefilled(max_rows, bm, ids.size());
  ref_sort(ids, w, m, k, e, bm, sb);
  // rows past num_valid_ids[0] hold junk (including token ids < M)
  for (int64_t r = sb.nv[0]; r < max_rows; ++r) sb.sti[r] = static_cast<int32_t>(rng() % (m + 1));
  std::vector<int32_t> nv = sb.nv;
  if (shrink_valid && nv[0] > 0) nv[0] = nv[0] / 2;
  std::vector<uint8_t> as_buf(static_cast<size_t>(m) * (D / 32) + 16);
  for (auto& v : as_buf) v = static_cast<uint8_t>(rng());
  const uint8_t* as = as_buf.data() + in_off;  // in_off / out_off: misaligned pointers
  const int BM = bm > 32 ? bm : 32;
  const int64_t out_rows = (max_rows + BM - 1) / BM * BM;
  std::vector<uint8_t> got_buf(out_rows * (D / 32) + 7 + 16, 0xEE), want(out_rows * (D / 32), 0);
  uint8_t* got = got_buf.data() + out_off;
  AiterAuxSortScalesArgs a = {};
  a.a_scale = as;
  a.num_tokens = m;
  a.model_dim = D;
  a.block_m = bm;
  a.sorted_token_ids = sb.sti.data();
  a.num_valid_ids = nv.data();
  a.max_rows = max_rows;
  a.sorted_scales = got;
  aiter_aux_emu::reset_pdl();
  const int rc = moe_sort_scales<D>(a, nullptr);
  ref_sorted_scales(as, m, D, bm, sb.sti, nv[0], max_rows, want);
  const std::string tag = "moe_sort_scales<" + std::to_string(D) + "> M=" + std::to_string(m) +
                          " bm=" + std::to_string(bm) + (shrink_valid ? " shrunk" : "") +
                          " offs=" + std::to_string(in_off) + "," + std::to_string(out_off);
  check(rc == AITER_AUX_OK, tag + ": status");
  check_pdl(tag);
  std::vector<uint8_t> g(got, got + want.size());
  for (int i = 0; i < out_off; ++i) check(got_buf[i] == 0xEE, tag + ": no write before the start");
  std::string where;
  check(same_bytes(g, want, &where), tag + ": bytes " + where);
  check(got[want.size()] == 0xEE, tag + ": no write past the end");
}

// --------------------------------------------------------- scatter tests ----
float rand_weight(std::mt19937& rng) {
  const uint32_t r = rng() % 64;
  if (r == 0) return u2f(0x00000300u);  // subnormal weight
  if (r == 1) return 0.0f;
  if (r == 2) return -1.5f;
  return u2f((rng() & 0x807FFFFFu) | ((120u + rng() % 10) << 23));
}

// kV, kT > 0: the small-M kernel with that launch shape (scatter_small.h), whatever M is;
// 0: the op's own choice.
template <int D, int K, bool kQ, int kV = 0, int kT = 0>
void run_scatter_case(int m, int rows, uint32_t seed, bool extreme = false, bool misalign = false) {
  std::mt19937 rng(seed);
  std::vector<int32_t> rev(static_cast<size_t>(m) * K);
  for (auto& p : rev) {
    const uint32_t r = rng() % 10;
    p = r == 0 ? -1 : static_cast<int32_t>(rng() % rows);
  }
  if (m > 2) {  // a token with no local pair, and an out-of-range row (skipped)
    for (int k = 0; k < K; ++k) rev[1 * K + k] = -1;
    rev[2 * K] = rows + 3;
  }
  std::vector<float> sw(rows);
  for (auto& v : sw)
    v = extreme ? u2f(rng()) : rand_weight(rng);  // extreme: any bits, every exponent
  std::vector<uint16_t> eo(static_cast<size_t>(rows) * D);
  for (auto& h : eo) {
    const uint32_t r = rng();
    h = static_cast<uint16_t>(r);
    if (r % 97 == 0)
      h = 0x7F80u;  // inf
    else if (r % 89 == 0)
      h = 0xFFC0u;  // nan
    else if (r % 13 == 0)
      h = static_cast<uint16_t>(r & 0x807Fu);  // subnormal
    else if ((h & 0x7F80u) == 0x7F80u)
      h = static_cast<uint16_t>(h & 0xBFFFu);
  }
  std::vector<uint8_t> eq(static_cast<size_t>(rows) * D / 2),
      es(static_cast<size_t>(rows) * (D / 32 > 0 ? D / 32 : 1));
  for (auto& v : eq) v = static_cast<uint8_t>(rng());
  for (auto& v : es) {
    const uint32_t r = rng() % 50;
    v = r == 0 ? 255 : (r == 1 ? 0 : (r == 2 ? 254 : static_cast<uint8_t>(100 + rng() % 40)));
    if (extreme) v = static_cast<uint8_t>(rng());  // every scale, incl. 0..2 and 252..255
  }
  std::vector<uint16_t> got_buf(static_cast<size_t>(m) * D + 2, 0x5555),
      want(static_cast<size_t>(m) * D);
  // misalign: expert_out and out 2 bytes, expert_out_q 1 byte past an aligned address
  const int off = misalign ? 1 : 0;
  std::vector<uint16_t> eo_buf(eo.size() + 1);
  std::vector<uint8_t> eq_buf(eq.size() + 1);
  memcpy(eo_buf.data() + off, eo.data(), eo.size() * 2);
  memcpy(eq_buf.data() + off, eq.data(), eq.size());
  uint16_t* got = got_buf.data() + off;
  AiterAuxScatterArgs a = {};
  a.expert_out = eo_buf.data() + off;
  a.expert_out_q = eq_buf.data() + off;
  a.expert_out_scale = es.data();
  a.num_rows = rows;
  a.reverse_sorted = rev.data();
  a.sorted_weights = sw.data();
  a.num_tokens = m;
  a.model_dim = D;
  a.topk = K;
  a.out = got;
  // every third case scales the routed sum (2.5, or -0.75 in the extreme cases)
  const float scale = (m % 3 == 2) ? (extreme ? -0.75f : 2.5f) : 1.0f;
  a.routed_scaling_factor = scale;
  int rc;
  aiter_aux_emu::reset_pdl();
  if constexpr (kV > 0)
    rc = scatter_detail::launch_scatter_small<D, K, kQ, kV, kT>(a, nullptr, "shape");
  else if constexpr (kQ)
    rc = moe_scatter_reduce_q<D, K>(a, nullptr);
  else
    rc = moe_scatter_reduce<D, K>(a, nullptr);
  for (int t = 0; t < m; ++t) {
    for (int c = 0; c < D; ++c) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) {
        const int p = rev[t * K + k];
        if (p < 0 || p >= rows) continue;
        float v;
        if (kQ) {
          const uint32_t byte = eq[static_cast<size_t>(p) * (D / 2) + c / 2];
          v = ref_decode((c % 2) ? (byte >> 4) : (byte & 0xFu),
                         es[static_cast<size_t>(p) * (D / 32) + c / 32]);
        } else {
          v = bf2f(eo[static_cast<size_t>(p) * D + c]);
        }
        volatile float prod = v * sw[p];
        volatile float sum = acc + prod;
        acc = sum;
      }
      if (scale != 1.0f) {
        volatile float scaled = acc * scale;
        acc = scaled;
      }
      want[static_cast<size_t>(t) * D + c] = ref_bf16(acc);
    }
  }
  const std::string tag =
      std::string(kQ ? "moe_scatter_reduce_q<" : "moe_scatter_reduce<") + std::to_string(D) + "," +
      std::to_string(K) + "> M=" + std::to_string(m) + (extreme ? " (extreme w, s)" : "") +
      (kV > 0 ? " shape " + std::to_string(kV) + "x" + std::to_string(kT) : "") +
      (misalign ? " misaligned" : "");
  check(rc == AITER_AUX_OK, tag + ": status");
  check_pdl(tag);
  std::vector<uint16_t> g(got, got + want.size());
  std::string where;
  check(same_bytes(g, want, &where), tag + ": out " + where);
  check(got[want.size()] == 0x5555 && (off == 0 || got_buf[0] == 0x5555),
        tag + ": no write outside out");
}

// ------------------------------------------------------- argument checks ----
void test_arg_checks() {
  std::vector<int32_t> ids(4, 0), sti(64), mi(64), seid(64), nv(2), rev(4);
  std::vector<float> w(4), sw(64);
  AiterAuxSortArgs a = {};
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.num_tokens = 2;
  a.num_experts = 4;
  a.topk = 2;
  a.block_m = 16;
  a.max_rows = 64;
  a.sorted_token_ids = sti.data();
  a.sorted_weights = sw.data();
  a.m_indices = mi.data();
  a.sorted_expert_ids = seid.data();
  a.num_valid_ids = nv.data();
  a.reverse_sorted = rev.data();
  const uint64_t launches = aiter_aux_emu::emu().launches;
  g_last_error.clear();
  check(moe_sort<8, 2>(a, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT && !g_last_error.empty(),
        "moe_sort: num_experts mismatch rejected");
  check(moe_sort<4, 3>(a, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT,
        "moe_sort: topk mismatch rejected");
  a.block_m = 8;
  check(moe_sort<4, 2>(a, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT,
        "moe_sort: block_m 8 rejected");
  a.block_m = 16;
  a.max_rows = 16;
  check(moe_sort<4, 2>(a, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT,
        "moe_sort: small max_rows rejected");
  check(aiter_aux_emu::emu().launches == launches, "nothing launched for rejected arguments");
  AiterAuxQuantArgs q = {};
  q.model_dim = 64;
  check(mxfp4_quant<32>(q, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT,
        "mxfp4_quant: model_dim mismatch");
  AiterAuxScatterArgs s = {};
  s.model_dim = 64;
  s.topk = 2;
  check(moe_scatter_reduce<64, 3>(s, nullptr) == AITER_AUX_ERR_INVALID_ARGUMENT,
        "scatter: topk mismatch");

  // no expert rows at all (every pair remote): zeros, nothing read
  std::vector<int32_t> rv(3 * 2, -1);
  std::vector<uint16_t> out(3 * 64, 0x7777);
  s.reverse_sorted = rv.data();
  s.num_tokens = 3;
  s.num_rows = 0;
  s.out = out.data();
  bool ok = moe_scatter_reduce<64, 2>(s, nullptr) == AITER_AUX_OK;
  for (auto v : out) ok = ok && v == 0;
  std::fill(out.begin(), out.end(), 0x7777);
  ok = ok && moe_scatter_reduce_q<64, 2>(s, nullptr) == AITER_AUX_OK;
  for (auto v : out) ok = ok && v == 0;
  check(ok, "scatter with num_rows = 0 gives zeros");
}

}  // namespace

#include "emu_fp8.h"     // the MXFP8 cases (uses the helpers above)
#include "emu_scales.h"  // moe_sort_quant[_fp8] with sorted_scales (uses both)
#include "emu_pairs.h"   // the pair path (uses all of the above)
#include "emu_sums.h"    // moe_sum
#include "emu_align.h"   // moe_align_block_size_vllm / _sglang (the peers' formats)
#include "emu_route.h"   // moe_route

int main() {
  const bool long_mode = getenv("AITER_AUX_EMU_LONG") != nullptr;
  printf("emulated warp size %d\n", AITER_AUX_EMU_WARP);
  // AITER_AUX_EMU_ONLY=moe_sum / =align: only those cases
  const char* only = getenv("AITER_AUX_EMU_ONLY");
  if (only != nullptr && (strcmp(only, "moe_sum") == 0 || strcmp(only, "align") == 0 ||
                          strcmp(only, "moe_route") == 0)) {
    if (strcmp(only, "moe_sum") == 0)
      test_sums();
    else if (strcmp(only, "moe_route") == 0)
      test_route();
    else
      test_align();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
  }
  test_helpers();
  test_arg_checks();

  // moe_sort (each case also runs every other path that can take it: run_sort_case).
  // micro path (M*topk <= kWarpSize): pads of every block_m, one expert, none local, 32 pairs
  for (int bm : {16, 32, 64, 128}) {
    run_sort_case<257, 9>(1, bm, 0, 90 + bm, bm == 32);
    run_sort_case<257, 9>(3, bm, 1, 91 + bm, false);
  }
  run_sort_case<1024, 16>(2, 32, 0, 92, true);
  run_sort_case<1, 1>(32, 16, 0, 93, false);
  run_sort_case<8, 4>(8, 128, 3, 94, false);
  run_sort_case<385, 9>(2, 16, 4, 95, false);
  run_sort_case<8, 2>(16, 64, 1, 96, true);
  run_sort_case<513, 11>(2, 32, 2, 97, false);
  // mid path: chunks of uneven size, a chunk per expert and more
  run_sort_case<257, 9>(256, 32, 0, 98, true);
  run_sort_case<256, 8>(1024, 32, 1, 99, false);
  run_sort_case<896, 16>(256, 64, 0, 100, false);
  // the older cases
  run_sort_case<257, 9>(0, 32, 0, 1, true);
  run_sort_case<257, 9>(1, 16, 0, 2, true);
  run_sort_case<257, 9>(7, 128, 0, 3, false);
  run_sort_case<257, 9>(64, 32, 0, 4, true);
  run_sort_case<257, 9>(910, 64, 0, 5, false);
  run_sort_case<257, 9>(910, 16, 1, 6, false);
  run_sort_case<385, 9>(300, 128, 2, 7, true);
  run_sort_case<8, 2>(100, 16, 1, 8, false);
  run_sort_case<1, 1>(50, 16, 0, 9, false);
  run_sort_case<1024, 8>(1000, 128, 0, 10, false);
  run_sort_case<896, 16>(512, 32, 0, 11, false);
  run_sort_case<257, 9>(911, 32, 0, 12, true);
  run_sort_case<257, 9>(3000, 16, 0, 13, false);
  run_sort_case<257, 9>(3000, 128, 1, 14, true);
  run_sort_case<385, 9>(2000, 64, 2, 15, false);
  run_sort_case<8, 2>(5000, 16, 0, 16, false);
  run_sort_case<1024, 8>(1100, 32, 0, 17, false);
  run_sort_case<896, 16>(700, 128, 1, 18, false);
  run_sort_case<896, 16>(4000, 32, 2, 60, true);   // 31 chunks of 2064
  run_sort_case<513, 11>(3000, 16, 0, 61, false);  // 2048-pair chunks, tail rows
  run_sort_case<1, 1>(20000, 64, 1, 62, false);    // 19 chunks, a single scan warp
  // large-path chunking (N split evenly into N / chunk chunks; chunk row + pad ends in the
  // chunk's own pair range): just above the threshold, k*chunk, k*chunk + small tail, more
  // chunks than experts, E=896 with many chunks, one expert / no local pair at all
  run_sort_case<8, 1>(8193, 16, 0, 63, true);       // 8 chunks, one of 1025
  run_sort_case<1024, 1>(8193, 128, 0, 64, false);  // 4 chunks of >= 2E, 256 pad slots each
  run_sort_case<1024, 8>(1025, 32, 1, 65, false);   // 4 chunks, E=1024 skewed
  run_sort_case<257, 9>(1024, 64, 0, 66, false);    // 9 chunks of exactly 1024
  run_sort_case<257, 9>(2277, 128, 0, 67, true);    // 20 chunks: 1024 pairs, the first 13 one more
  run_sort_case<8, 2>(100000, 16, 0, 68, false);    // 97 chunks, E=8: most chunks pad none
  run_sort_case<896, 16>(8192, 128, 0, 69, false);  // 64 chunks of 2048, 14 pad slots
  run_sort_case<896, 16>(8192, 16, 3, 70, false);   // every pair to one expert
  run_sort_case<385, 9>(3000, 32, 4, 71, true);     // no local pair: rows untouched
  run_sort_case<513, 11>(5000, 64, 3, 72, false);   // one expert, 2048-pair chunks
  // parallel scan (one warp per expert, totals in every chunk's home) + per-block offset
  // scan: the largest catalog E with the fewest chunks (896: 4 chunks of 2052 >= 2E),
  // and a mid-size M (385: 13 chunks of 1038/1039), every block_m
  for (int bm : {16, 32, 64, 128}) {
    run_sort_case<896, 16>(513, bm, bm == 64 ? 3 : 0, 77 + bm, bm == 16);
    run_sort_case<385, 9>(1500, bm, bm == 128 ? 1 : 0, 78 + bm, false);
  }
  // former lean-path edges (4096 pairs and around), degenerate
  run_sort_case<8, 2>(2048, 16, 1, 50, false);
  run_sort_case<1, 1>(4096, 128, 0, 51, true);
  run_sort_case<257, 9>(455, 32, 0, 52, false);
  run_sort_case<1024, 8>(512, 16, 2, 53, false);
  run_sort_case<1024, 8>(513, 64, 0, 54, false);
  run_sort_case<896, 16>(64, 32, 0, 55, false);
  run_sort_case<896, 16>(100, 32, 0, 56, true);    // 1600 pairs < 2E: never large
  run_sort_case<1024, 1>(1500, 64, 1, 57, false);  // lean, skewed
  run_sort_case<8, 2>(513, 16, 0, 58, true);       // 1026 pairs, E = 8: large with one chunk
  run_sort_case<1024, 8>(128, 32, 1, 56, true);    // tiny path, largest E
  // tiny path: a hot expert's rows across several blocks' row slices; one expert; none local
  run_sort_case<257, 9>(113, 128, 1, 73, false);
  run_sort_case<8, 8>(128, 16, 3, 74, true);
  run_sort_case<385, 9>(100, 32, 4, 75, false);
  run_sort_case<896, 16>(64, 16, 1, 76, false);
  // tiny path: one expert with 255 pairs (rank bytes rewritten as prefix sums) / 256 (summed
  // per pair), and 1024
  run_sort_case<8, 1>(255, 16, 3, 79, false);
  run_sort_case<8, 1>(256, 32, 3, 80, false);
  run_sort_case<8, 4>(256, 16, 3, 81, false);
  run_sort_case<1024, 8>(129, 16, 0, 57, false);                  // just past the tiny path
  run_sort_case<257, 9>(32768, 32, 0, 19, false);                 // 8192-pair chunks
  if (long_mode) run_sort_case<257, 16>(65536, 32, 0, 20, true);  // 7168-pair chunks

  run_quant_case<256>(5, 21, false);
  run_quant_case<256>(33, 22, true);
  run_quant_case<7168>(3, 23, false);
  run_quant_case<2560>(9, 24, true);
  run_quant_case<32>(1, 25, false);

  run_sort_quant_case<257, 9, 512>(40, 32, 26);
  run_sort_quant_case<257, 9, 256>(1000, 64, 27);
  run_sort_quant_case<8, 2, 7168>(2, 16, 28);
  run_sort_quant_case<896, 16, 3584>(64, 32, 29);
  run_sort_quant_case<8, 2, 256>(21000, 32, 91);  // large path: the quant beside the place launch
  run_sort_quant_case<8, 2, 7168>(2400, 64, 92);  // mid path, wide MXFP4 quant (two tiles a step)
  run_quant_case<7168>(70, 33, true);
  // partial tiles / steps (a step is kWarpSize blocks of 32), M = 0, one-sided
  // misalignment, and several grid-stride steps per warp (small direct grids)
  run_quant_case<256>(0, 63, false);
  run_quant_case<32>(17, 64, false);
  run_quant_case<32>(47, 65, true);
  run_quant_case<96>(11, 66, false);
  run_quant_case<96>(22, 67, false, true);
  run_quant_case<2560>(5, 68, true, false);
  run_quant_case<256>(333, 69, false, false, 1);
  run_quant_case<256>(333, 70, true, false, 3);
  run_quant_case<32>(1000, 71, false, true, 2);
  run_quant_case<7168>(9, 72, false, false, 2);
  run_quant_case<256>(333, 73, false, false, -2);
  run_quant_case<96>(101, 74, false, true, -1);
  run_quant_case<7168>(40, 75, false, false);  // one tile per warp step, 70 blocks

  for (int bm : {16, 32, 64, 128}) {
    run_scales_case<256>(37, bm, 16, 4, 30 + bm, false);
    run_scales_case<512>(100, bm, 33, 3, 31 + bm, true);
  }
  run_scales_case<7168>(5, 32, 8, 2, 32, false);
  // shared-memory tile path: 16-byte loads/stores, 4-byte, byte-misaligned, D % 512 != 0
  run_scales_case<7168>(300, 32, 257, 9, 33, true);
  run_scales_case<7168>(300, 64, 257, 9, 34, false, 4, 4);
  run_scales_case<2560>(200, 128, 513, 11, 35, true, 3, 1);
  run_scales_case<3584>(150, 16, 896, 16, 36, false, 8, 2);
  run_scales_case<768>(90, 32, 33, 5, 37, true);
  run_scales_case<768>(90, 64, 33, 5, 38, false, 1, 16);
  run_scales_case<256>(0, 32, 8, 2, 39, false);
  // column slabs (D > 8192): 16-byte slots, 8-byte slots, a shorter last slab of each
  run_scales_case<16384>(20, 32, 8, 3, 48, true);
  run_scales_case<16384>(20, 64, 8, 3, 49, false, 8, 0);
  run_scales_case<8448>(20, 32, 8, 3, 50, false);
  run_scales_case<8704>(20, 128, 8, 3, 51, true, 0, 4);
  run_scales_case<2560>(1, 16, 513, 11, 52, false);
  // many more tiles than the (emulator's small) grid has sub-warps: the grid-stride loop
  run_scales_case<256>(40000, 32, 8, 8, 53, false);
  // enough tiles for the prefill kernels: KuMax 32 (D = 2560), KuMax 10 (D = 7168: slabs of
  // 10, 10, 8 ku; D = 3584: 8, 6; D = 16384: 6 x 10 + 4); the cases above take the decode
  // kernel (KuMax 8)
  run_scales_case<7168>(4000, 32, 257, 9, 54, true);
  run_scales_case<3584>(2200, 32, 896, 16, 57, false, 0, 4);
  run_scales_case<2560>(4000, 64, 513, 11, 55, false, 0, 4);
  run_scales_case<16384>(2000, 32, 8, 9, 56, false);

  run_scatter_case<64, 3, false>(17, 40, 41);
  run_scatter_case<64, 1, false>(5, 3, 46);
  run_scatter_case<96, 1, true>(5, 3, 47);
  run_scatter_case<100, 2, false>(9, 20, 42);
  run_scatter_case<7168, 9, false>(3, 30, 43);
  run_scatter_case<64, 3, true>(17, 40, 44);
  run_scatter_case<2560, 16, true>(2, 40, 45);
  run_scatter_case<2560, 11, true>(3, 40, 58);        // batches 4 + 4 + 3: a pad slot in the last
  run_scatter_case<256, 9, true>(40, 300, 48, true);  // fast and general decode mixed in a warp
  run_scatter_case<7168, 9, true>(5, 60, 49);
  // the cases above take the small-M launch shape (M <= 1024 bf16, <= 256 MXFP4); more of
  // it at M = 1, 2, 16 (topk 16: one batch of 16; topk 17: 16 + 1), then the large-M kernels
  run_scatter_case<7168, 9, false>(1, 30, 82);
  run_scatter_case<7168, 9, false>(2, 30, 83);
  run_scatter_case<2560, 16, false>(16, 60, 84);
  run_scatter_case<98, 17, false>(16, 40, 85);  // V = 2
  run_scatter_case<7168, 9, true>(1, 30, 86);
  run_scatter_case<7168, 9, true>(2, 30, 87);
  run_scatter_case<2560, 16, true>(16, 60, 88);
  run_scatter_case<256, 17, true>(16, 40, 89, true);
  run_scatter_case<64, 3, false>(1100, 40, 90);
  run_scatter_case<100, 2, false>(1030, 20, 91);
  run_scatter_case<256, 9, true>(300, 300, 92, true);
  run_scatter_case<2560, 11, true>(260, 40, 93);
  run_scatter_case<1024, 5, false>(300, 60, 101);  // M * D > 2^18: mid_shape
  // every small-M launch shape (V columns per thread x threads per block) the decode rule can
  // pick: bf16 V = 8 (16-byte loads; V = 4 where D % 8 != 0), MXFP4 V = 16, 32; M = 1..4,
  // partial blocks, the grid-stride loop (M = 70 at 64 threads), unaligned rows, extremes
  run_scatter_case<7168, 9, false, 8, 64>(1, 30, 94);
  run_scatter_case<7168, 16, false, 8, 128>(2, 60, 95);
  run_scatter_case<2560, 11, false, 8, 256>(4, 50, 96);
  run_scatter_case<3072, 8, false, 4, 128>(3, 40, 97);
  run_scatter_case<100, 2, false, 8, 64>(9, 20, 98);     // D % 8 != 0: V = 4
  run_scatter_case<4096, 17, false, 8, 256>(3, 60, 99);  // 16 + 1 pairs
  run_scatter_case<7168, 9, true, 16, 64>(1, 30, 100);
  run_scatter_case<7168, 9, true, 32, 64>(2, 30, 101);
  run_scatter_case<2560, 16, true, 32, 128>(4, 60, 102);
  run_scatter_case<3072, 11, true, 16, 256>(3, 40, 103);
  run_scatter_case<256, 9, true, 32, 64>(40, 300, 104, true);  // fast and general decode mixed
  run_scatter_case<256, 17, true, 16, 128>(5, 40, 105, true);
  run_scatter_case<64, 3, true, 8, 128>(70, 40, 106);
  run_scatter_case<7168, 9, false, 8, 64>(2, 30, 107, false, true);
  run_scatter_case<3072, 8, false, 4, 64>(2, 30, 108, false, true);
  run_scatter_case<2560, 9, true, 32, 64>(2, 30, 109, false, true);
  run_scatter_case<2560, 9, true, 16, 128>(2, 30, 110, false, true);
  run_scatter_case<2560, 9, true, 8, 64>(2, 30, 111, false, true);
  run_scatter_case<7168, 9, false>(3, 30, 112, false, true);  // the op's choice, misaligned
  run_scatter_case<256, 9, true>(300, 300, 113, false, true);

  test_fp8();
  test_sort_quant_scales();
  test_pairs();
  test_sums();
  test_align();
  test_route();

  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
