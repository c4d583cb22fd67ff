// Device-side sweep of the moe_sort paths (development tool, not built by the package):
// every path that can take (E, topk, M), the mid path at several chunk counts, timed by
// CUDA-graph replay of back-to-back launches; every variant's outputs must equal the first
// one's byte for byte.  Build and run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -arch=sm_90 -I csrc/kernels/mxfp4_moe \
//     csrc/kernels/mxfp4_moe/gpu/tests/sort_sweep.cu -o /tmp/sort_sweep && /tmp/sort_sweep
// `sort_sweep fused M...` times moe_sort_quant's paths only (its a_q / a_scale must equal
// mxfp4_quant's or mxfp8_quant's; SWEEP_FP8=1 adds moe_sort_quant_fp8, SWEEP_E=E one shape,
// SWEEP_AUTO_ONLY=1 the chooser's path only, SWEEP_NO_TIME=1 no timing).
// `sort_sweep pairs` times the decode paths at n = M*topk <= 64 in one run: the pair path
// (at the chooser's block count and one more), micro (n <= 32), tiny and the chooser's
// ("auto"), for (E, topk) = (257, 9), (385, 9), (513, 11), (896, 16), (256, 8) at M = 1 ..
// 64 / topk, the same E at topk 1 (every n = 1..64), then moe_sort_quant (MXFP4, plus MXFP8
// with SWEEP_FP8=1) of the five shapes at M = 1 .. 64 / topk; the decode pipeline's one
// launch with sorted_scales, pair against tiny kernel, is in decode_sweep.cu:
//   nvcc -std=c++17 -O3 -arch=sm_90 -I csrc/kernels/mxfp4_moe \
//     csrc/kernels/mxfp4_moe/gpu/tests/sort_sweep.cu -o /tmp/sort_sweep && /tmp/sort_sweep pairs
// `sort_sweep large M...` adds large-path variants at 2 and 4 chunks per SM (with
// SWEEP_LARGE_G=g1,g2,...: at exactly those chunk counts instead); every large-path run is
// timed with the direct place kernel ("large") and, where a chunk fits its stage, the staged
// one ("large_staged").
// Prints CSV: E,topk,M,pairs,path,chunks,us (chunks: the sort blocks of pairs / mid / large)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/mxfp4_moe_aux_gpu.h"

static std::string g_last_error;
extern "C" void aiter_aux_set_error(const char* msg) {
  g_last_error = msg ? msg : "";
}

using namespace aiter_aux::gpu;
namespace sd = aiter_aux::gpu::sort_detail;

#include "cuda_check.h"

// Router-like ids: Zipf(1.1) popularity over a random ranking, distinct experts per token;
// an odd E has a shared expert (E - 1) in every token (as aiter_aux.pipeline.draw_routing).
static void routing(int m, int e, int k, uint32_t seed, std::vector<int32_t>& ids,
                    std::vector<float>& w) {
  std::mt19937 rng(seed);
  const bool shared = e % 2 == 1 && k > 1;
  const int re = shared ? e - 1 : e, rk = shared ? k - 1 : k;
  std::vector<int> perm(re);
  for (int i = 0; i < re; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> pop(re);
  for (int i = 0; i < re; ++i) pop[i] = std::pow(double(i + 1), -1.1);
  std::discrete_distribution<int> pick(pop.begin(), pop.end());
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  ids.assign(size_t(m) * k, 0);
  w.assign(size_t(m) * k, 0.f);
  for (int t = 0; t < m; ++t) {
    std::vector<int> got;
    while (int(got.size()) < rk) {
      const int x = perm[pick(rng)];
      if (std::find(got.begin(), got.end(), x) == got.end()) got.push_back(x);
    }
    if (shared) got.push_back(e - 1);
    for (int i = 0; i < k; ++i) {
      ids[size_t(t) * k + i] = got[i];
      w[size_t(t) * k + i] = u(rng);
    }
  }
}

// Median µs per call of `launch` (returns 0 on success): a CUDA graph of kCalls
// back-to-back launches on `st`, replayed kReps times between two events.
template <class Launch>
static float graph_us(cudaStream_t st, Launch launch, int kCalls = 20) {
  constexpr int kReps = 30;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) launch();
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int r = 0; r < kReps; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.f / kCalls);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ts[ts.size() / 2];
}

struct Bufs {
  int32_t *ids, *sti, *mi, *seid, *nv, *rev;
  float *w, *sw;
};

// The sort's device buffers for ids / w (copied in) and cap rows; decode_sweep.cu uses them too.
static Bufs sort_bufs(const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t cap,
                      int bm) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t n1 = std::max<int64_t>(n, 1);
  Bufs b;
  CK(cudaMalloc(&b.ids, n1 * 4));
  CK(cudaMalloc(&b.w, n1 * 4));
  CK(cudaMalloc(&b.rev, n1 * 4));
  CK(cudaMalloc(&b.sti, cap * 4));
  CK(cudaMalloc(&b.sw, cap * 4));
  CK(cudaMalloc(&b.mi, cap * 4));
  CK(cudaMalloc(&b.seid, cap / bm * 4));
  CK(cudaMalloc(&b.nv, 8));
  CK(cudaMemcpy(b.ids, ids.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.w, w.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());  // pageable copies return once staged; the sweep's stream
                                // does not wait for the legacy stream
  return b;
}

static AiterAuxSortArgs sort_args(const Bufs& b, int m, int e, int k, int bm, int64_t cap) {
  AiterAuxSortArgs a = {};
  a.topk_ids = b.ids;
  a.topk_weights = b.w;
  a.num_tokens = m;
  a.num_experts = e;
  a.topk = k;
  a.block_m = bm;
  a.max_rows = cap;
  a.sorted_token_ids = b.sti;
  a.sorted_weights = b.sw;
  a.m_indices = b.mi;
  a.sorted_expert_ids = b.seid;
  a.num_valid_ids = b.nv;
  a.reverse_sorted = b.rev;
  return a;
}

static void free_bufs(Bufs& b) {
  cudaFree(b.ids), cudaFree(b.w), cudaFree(b.rev), cudaFree(b.sti), cudaFree(b.sw);
  cudaFree(b.mi), cudaFree(b.seid), cudaFree(b.nv);
}

// argv mode: "E K M path chunks" runs that one variant twice (for ncu), no timing.
static const char* g_only_path = nullptr;
// `pairs` mode: the decode paths only (no mid / large variants)
static bool g_decode_only = false;
static int g_only_chunks = 0;
// `large` mode: chunks per SM of the extra large-path variants
static std::vector<int> g_large_per_sm;
static bool g_large_mode = false;  // `large` mode: no mid variants

// F8: moe_sort_quant_fp8 (a_q of D bytes a row).
template <int E, int K, int D = 0, bool F8 = false>
static void sweep(int m) {
  constexpr size_t kQB = F8 ? D : D / 2;
  constexpr QuantFormat F =
      D == 0 ? QuantFormat::None : (F8 ? QuantFormat::Mxfp8 : QuantFormat::Mxfp4);
  const int bm = 32;
  std::vector<int32_t> ids;
  std::vector<float> w;
  routing(m, E, K, 1234u + m, ids, w);
  const int64_t n = int64_t(m) * K;
  const int64_t cap = sort_capacity(m, K, E, bm);
  Bufs b = sort_bufs(ids, w, cap, bm);
  const AiterAuxSortArgs a = sort_args(b, m, E, K, bm, cap);
  AiterAuxQuantArgs none = {};
  uint16_t* x = nullptr;
  uint8_t *aq = nullptr, *as = nullptr;
  if (D > 0) {
    CK(cudaMalloc(&x, size_t(m) * D * 2));
    CK(cudaMalloc(&aq, size_t(m) * kQB));
    CK(cudaMalloc(&as, size_t(m) * D / 32));
    CK(cudaMemset(x, 0x3f, size_t(m) * D * 2));
    CK(cudaDeviceSynchronize());  // the kernels run on a non-blocking stream
    none.x = x;
    none.num_tokens = m;
    none.model_dim = D;
    none.a_q = aq;
    none.a_scale = as;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // the chooser's values for this call (the forced variants below take the same tiny blocks,
  // wide flag and large chunks as the automatic choice would)
  const sd::SortPolicy pol = sd::host_sort_policy();
  const sd::SortProblem prob = sd::sort_problem<E, K, F, D>(a, false);
  const int tiny_g = sd::tiny_blocks(pol, prob);
  const int pair_g = sd::pair_blocks(prob);
  const bool wide = F == QuantFormat::Mxfp4 && int64_t(m) * D >= pol.wide_quant_elems;
  const int large_g = n >= sd::large_unit(E) ? sd::large_chunks(pol, n, E, device_sm_count()) : 0;

  std::vector<char> first;
  auto snapshot = [&]() {
    int32_t nv[2];
    CK(cudaMemcpy(nv, b.nv, 8, cudaMemcpyDeviceToHost));
    const int64_t rows = nv[0] < 0 || nv[0] > cap ? cap : nv[0];
    std::vector<char> s(8 + rows * 12 + rows / bm * 4 + n * 4);
    char* p = s.data();
    memcpy(p, nv, 8);
    p += 8;
    CK(cudaMemcpy(p, b.sti, rows * 4, cudaMemcpyDeviceToHost));
    p += rows * 4;
    CK(cudaMemcpy(p, b.sw, rows * 4, cudaMemcpyDeviceToHost));
    p += rows * 4;
    CK(cudaMemcpy(p, b.mi, rows * 4, cudaMemcpyDeviceToHost));
    p += rows * 4;
    CK(cudaMemcpy(p, b.seid, rows / bm * 4, cudaMemcpyDeviceToHost));
    p += rows / bm * 4;
    CK(cudaMemcpy(p, b.rev, n * 4, cudaMemcpyDeviceToHost));
    return s;
  };
  // A fused variant's a_q / a_scale must equal mxfp4_quant's (the "quant" run, first).
  std::vector<char> qfirst;
  auto qsnap = [&]() {
    std::vector<char> s(size_t(m) * kQB + size_t(m) * D / 32);
    if (D > 0 && m > 0) {
      CK(cudaMemcpy(s.data(), aq, size_t(m) * kQB, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(s.data() + size_t(m) * kQB, as, size_t(m) * D / 32, cudaMemcpyDeviceToHost));
    }
    return s;
  };
  auto run = [&](const char* path, int chunks, auto launch) {
    if (D > 0) {
      CK(cudaMemsetAsync(aq, 0xAB, size_t(m) * kQB, st));
      CK(cudaMemsetAsync(as, 0xAB, size_t(m) * D / 32, st));
    }
    CK(cudaMemsetAsync(b.nv, 0, 8, st));
    CK(cudaMemsetAsync(b.sti, 0xAB, cap * 4, st));
    CK(cudaMemsetAsync(b.rev, 0xAB, std::max<int64_t>(n, 1) * 4, st));
    if (launch() != 0) {
      printf("%d,%d,%d,%lld,%s,%d,FAIL %s\n", E, K, m, (long long)n, path, chunks,
             g_last_error.c_str());
      return;
    }
    CK(cudaStreamSynchronize(st));
    if (g_only_path != nullptr) {
      launch();
      CK(cudaStreamSynchronize(st));
      printf("ran %s/%d once more\n", path, chunks);
      return;
    }
    const auto s = snapshot();
    bool same = first.empty() || s == first;
    if (first.empty()) first = s;
    if (D > 0) {
      const auto qs = qsnap();
      if (!qfirst.empty() && qs != qfirst) {
        same = false;
        size_t i = 0, bad = 0;
        while (qs[i] == qfirst[i]) ++i;
        for (size_t k = 0; k < qs.size(); ++k) bad += qs[k] != qfirst[k];
        printf(
            "# %s/%d: a_q/a_scale differ at byte %zu of %zu (%s; got %02x want %02x), %zu bytes\n",
            path, chunks, i, qs.size(), i < size_t(m) * kQB ? "a_q" : "a_scale", qs[i] & 0xff,
            qfirst[i] & 0xff, bad);
      }
      if (qfirst.empty()) qfirst = qs;
    }
    if (!same && s != first) printf("# %s/%d: the sort outputs differ\n", path, chunks);
    const float us = env_flag("SWEEP_NO_TIME") ? 0.f : graph_us(st, launch);
    printf("%d,%d,%d,%lld,%s%s,%d,%.2f%s\n", E, K, m, (long long)n,
           D > 0 ? (F8 ? "fp8-" : "fused-") : "", path, chunks, us, same ? "" : ",MISMATCH");
  };
  if constexpr (D > 0) {
    run("quant", 0, [&]() { return F8 ? mxfp8_quant<D>(none, st) : mxfp4_quant<D>(none, st); });
    first.clear();
    run("auto", 0, [&]() { return sd::launch_sort<E, K, F, D>(a, none, st, "x"); });
    const bool all = !env_flag("SWEEP_AUTO_ONLY");  // else quant and auto only
    if (all && n <= sd::kPairMax) {
      run("pairs", pair_g,
          [&]() { return sd::launch_pairs<E, K, F, D>(a, none, st, pair_g, "x"); });
      run("pairs", pair_g + 1,
          [&]() { return sd::launch_pairs<E, K, F, D>(a, none, st, pair_g + 1, "x"); });
    }
    if (all && n <= kWarpSize)
      run("micro", 0, [&]() { return sd::launch_micro<E, K, F, D>(a, none, st, "x"); });
    if (all && n <= sd::kTinyThreads)
      run("tiny", tiny_g, [&]() { return sd::launch_tiny<E, K, F, D>(a, none, st, tiny_g, "x"); });
    std::vector<int> gf;
    for (int c : {4, 8, 16, 32, 64}) {
      const int g = static_cast<int>(std::min<int64_t>(std::max<int64_t>((n + c - 1) / c, 1), 132));
      if (std::find(gf.begin(), gf.end(), g) == gf.end()) gf.push_back(g);
    }
    for (int g : gf) {
      if (!all || g_decode_only || (n + g - 1) / g > 65535) continue;
      run("mid", g, [&]() { return sd::launch_mid<E, K, F, D>(a, none, st, g, wide, "x"); });
    }
    if (all && !g_decode_only && large_g > 0) {
      run("large", large_g,
          [&]() { return sd::launch_large<E, K, F, D>(a, none, st, large_g, false, "x"); });
      if (sd::large_stage_fits(n, large_g, E))
        run("large_staged", large_g,
            [&]() { return sd::launch_large<E, K, F, D>(a, none, st, large_g, true, "x"); });
    }
  } else {
    if (g_only_path != nullptr) {
      const std::string p = g_only_path;
      const int g = g_only_chunks;
      if (p == "pairs")
        run("pairs", g, [&]() { return sd::launch_pairs<E, K, F, 0>(a, none, st, g, "x"); });
      if (p == "micro")
        run("micro", 0, [&]() { return sd::launch_micro<E, K, F, 0>(a, none, st, "x"); });
      if (p == "single")
        run("single", 0, [&]() { return sd::launch_tiny<E, K, F, 0>(a, none, st, tiny_g, "x"); });
      if (p == "mid")
        run("mid", g, [&]() { return sd::launch_mid<E, K, F, 0>(a, none, st, g, false, "x"); });
      if (p == "large" || p == "large_staged")
        run(p.c_str(), large_g, [&]() {
          return sd::launch_large<E, K, F, 0>(a, none, st, large_g, p == "large_staged", "x");
        });
      return;
    }
    run("auto", 0, [&]() { return moe_sort<E, K>(a, st); });
    if (n <= sd::kPairMax) {
      run("pairs", pair_g,
          [&]() { return sd::launch_pairs<E, K, F, 0>(a, none, st, pair_g, "x"); });
      run("pairs", pair_g + 1,
          [&]() { return sd::launch_pairs<E, K, F, 0>(a, none, st, pair_g + 1, "x"); });
    }
    if (n <= kWarpSize)
      run("micro", 0, [&]() { return sd::launch_micro<E, K, F, 0>(a, none, st, "x"); });
    if (n <= sd::kTinyThreads)
      run("single", tiny_g,
          [&]() { return sd::launch_tiny<E, K, F, 0>(a, none, st, tiny_g, "x"); });
    if (g_decode_only) {
      fflush(stdout);
      free_bufs(b);
      cudaStreamDestroy(st);
      return;
    }
    std::vector<int> gs;
    for (int c : {8, 16, 32, 64}) {
      for (int cap : {66, 132}) {
        const int g =
            static_cast<int>(std::min<int64_t>(std::max<int64_t>((n + c - 1) / c, 1), cap));
        if (std::find(gs.begin(), gs.end(), g) == gs.end() && (n + g - 1) / g <= 65535)
          gs.push_back(g);
      }
    }
    for (int g : g_large_mode ? std::vector<int>{} : gs)
      run("mid", g, [&]() { return sd::launch_mid<E, K, F, 0>(a, none, st, g, false, "x"); });
    // the large path at g chunks, with the direct and (where a chunk fits) the staged place
    auto run_large = [&](int g) {
      run("large", g, [&]() { return sd::launch_large<E, K, F, 0>(a, none, st, g, false, "x"); });
      if (sd::large_stage_fits(n, g, E))
        run("large_staged", g,
            [&]() { return sd::launch_large<E, K, F, 0>(a, none, st, g, true, "x"); });
    };
    if (large_g > 0) run_large(large_g);
    // `large M...`: the large path at 2 and 4 chunks per SM too
    for (int per_sm : g_large_per_sm) {
      sd::SortPolicy p2 = pol;
      p2.large_chunks_per_sm = per_sm;
      const int g = n >= sd::large_unit(E) ? sd::large_chunks(p2, n, E, device_sm_count()) : 0;
      if (g > 0 && g != large_g) run_large(g);
    }
    // SWEEP_LARGE_G="132,264": the large path at exactly these chunk counts (where valid)
    for (const char* s = getenv("SWEEP_LARGE_G"); s != nullptr && *s != '\0';) {
      const int g = atoi(s);
      const int64_t q = g > 0 ? n / g : 0;
      if (g > 0 && g != large_g && q >= 2 * E && q + (n % g != 0) <= 65535) run_large(g);
      s = strchr(s, ',');
      s = s != nullptr ? s + 1 : nullptr;
    }
  }
  fflush(stdout);
  free_bufs(b);
  if (D > 0) cudaFree(x), cudaFree(aq), cudaFree(as);
  cudaStreamDestroy(st);
}

template <int E, int K>
static void sweep_all() {
  for (int m : {16, 32, 64, 96, 128, 192, 256, 512, 1024}) sweep<E, K>(m);
}

// `pairs` mode: the decode paths of (E, topk) at M = 1 .. 64 / topk; moe_sort_quant of model_dim
// D (0: none), MXFP8 with F8.
template <int E, int K, int D = 0, bool F8 = false>
static void sweep_pairs() {
  for (int m = 1; m * K <= sd::kPairMax; ++m) sweep<E, K, D, F8>(m);
}

#ifndef AITER_AUX_SWEEP_NO_MAIN  // decode_sweep.cu includes this file for routing()
int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "pairs") {  // the decode paths, n <= 64
    g_decode_only = true;
    printf("E,topk,M,pairs,path,chunks,us\n");
    sweep_pairs<257, 9>();
    sweep_pairs<385, 9>();
    sweep_pairs<513, 11>();
    sweep_pairs<896, 16>();
    sweep_pairs<256, 8>();
    sweep_pairs<257, 1>();
    sweep_pairs<385, 1>();
    sweep_pairs<513, 1>();
    sweep_pairs<896, 1>();
    sweep_pairs<256, 1>();
    sweep_pairs<257, 9, 7168>();
    sweep_pairs<385, 9, 7168>();
    sweep_pairs<513, 11, 2560>();
    sweep_pairs<896, 16, 3584>();
    sweep_pairs<256, 8, 7168>();
    if (env_flag("SWEEP_FP8")) {
      sweep_pairs<257, 9, 7168, true>();
      sweep_pairs<385, 9, 7168, true>();
      sweep_pairs<513, 11, 2560, true>();
      sweep_pairs<896, 16, 3584, true>();
      sweep_pairs<256, 8, 7168, true>();
    }
    return 0;
  }
  if (argc >= 3 && std::string(argv[1]) == "fused") {  // "fused M...": moe_sort_quant only
    printf("E,topk,M,pairs,path,chunks,us\n");
    const int only_e = getenv("SWEEP_E") ? atoi(getenv("SWEEP_E")) : 0;  // one shape
    for (int i = 2; i < argc; ++i) {
      const int m = atoi(argv[i]);
      if (only_e == 0 || only_e == 256) sweep<256, 8, 7168>(m);
      if (only_e == 0 || only_e == 257) sweep<257, 9, 7168>(m);
      if (only_e == 0 || only_e == 385) sweep<385, 9, 7168>(m);
      if (only_e == 0 || only_e == 513) sweep<513, 11, 2560>(m);
      if (only_e == 0 || only_e == 896) sweep<896, 16, 3584>(m);
      if (!env_flag("SWEEP_FP8")) continue;
      if (only_e == 0 || only_e == 256) sweep<256, 8, 7168, true>(m);
      if (only_e == 0 || only_e == 257) sweep<257, 9, 7168, true>(m);
      if (only_e == 0 || only_e == 385) sweep<385, 9, 7168, true>(m);
      if (only_e == 0 || only_e == 513) sweep<513, 11, 2560, true>(m);
      if (only_e == 0 || only_e == 896) sweep<896, 16, 3584, true>(m);
    }
    return 0;
  }
  // "large M...": the chooser's path, the large path at its chunks and at 2 and 4 per SM
  if (argc >= 3 && std::string(argv[1]) == "large") {
    g_large_mode = true;
    if (getenv("SWEEP_LARGE_G") == nullptr) g_large_per_sm = {2, 4};
    printf("E,topk,M,pairs,path,chunks,us\n");
    for (int i = 2; i < argc; ++i) {
      const int m = atoi(argv[i]);
      sweep<257, 9>(m);
      sweep<385, 9>(m);
      sweep<513, 11>(m);
      sweep<896, 16>(m);
      sweep<256, 8>(m);
    }
    return 0;
  }
  if (argc == 6) {
    const int e = atoi(argv[1]), k = atoi(argv[2]), m = atoi(argv[3]);
    g_only_path = argv[4];
    g_only_chunks = atoi(argv[5]);
    if (e == 257 && k == 9) sweep<257, 9>(m);
    if (e == 896 && k == 16) sweep<896, 16>(m);
    if (e == 256 && k == 8) sweep<256, 8>(m);
    if (e == 513 && k == 11) sweep<513, 11>(m);
    if (e == 385 && k == 9) sweep<385, 9>(m);
    return 0;
  }
  printf("E,topk,M,pairs,path,chunks,us\n");
  sweep_all<257, 9>();
  sweep_all<896, 16>();
  sweep_all<256, 8>();
  sweep_all<513, 11>();
  sweep_all<385, 9>();
  for (int m : {1, 4, 16, 32, 64, 128}) {
    sweep<257, 9, 7168>(m);
    sweep<513, 11, 2560>(m);
    sweep<896, 16, 3584>(m);
  }
  return 0;
}
#endif
