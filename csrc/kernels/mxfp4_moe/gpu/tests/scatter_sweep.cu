// Device-side timing of moe_scatter_reduce and moe_scatter_reduce_q at decode sizes
// (development tool, not built by the package): the op's own launch ("auto") and every
// small-M launch shape of scatter_small.h (V columns per thread x T threads per block), at
// M = 1, 2, 4, 8, model_dim 2560 / 3072 / 4096 / 7168, topk 8 / 9 / 11 / 16, with
// programmatic dependent launch off and on; CUDA-graph replay of back-to-back launches (with
// PDL on, each launch overlaps the previous one's end).  Every shape's output must equal the
// op's byte for byte.  scripts/scatter_sweep.sh builds it for both trigger placements of
// target_ops.h PdlScope (-DAITER_AUX_PDL_EARLY_TRIGGER=0: after the last write, 1: right
// after the wait), one binary per model_dim in parallel (-DSWEEP_DIM=D; without it, all
// four), and runs them:
//   bash scripts/scatter_sweep.sh > scatter_sweep.csv
// Prints CSV: op,D,topk,M,pdl,trigger,shape,us; then, per (op, D, topk, M, pdl), the fastest
// shape as a line "best,op,D,topk,M,pdl,trigger,shape,us,auto_us".
#define AITER_AUX_SWEEP_NO_MAIN
#include "sort_sweep.cu"  // CK, graph_us

#include <functional>
#include <type_traits>
#include <utility>

namespace {

namespace sc = aiter_aux::gpu::scatter_detail;

constexpr int kTrigger = AITER_AUX_PDL_EARLY_TRIGGER;

std::vector<std::string> g_best;  // the "best,..." lines, printed after the CSV

// Inputs of one (D, topk, M): every pair local, in its own row of 4 * M * topk (rows drawn
// without repetition), weights in [0.01, 1), finite bf16 rows, e2m1 codes with scales
// 2^-27 .. 2^13.
template <int D, int K>
AiterAuxScatterArgs make_args(int m, bool q, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = int64_t(4) * m * K;
  std::vector<int32_t> perm(rows);
  for (int64_t i = 0; i < rows; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> rev(perm.begin(), perm.begin() + int64_t(m) * K);
  std::vector<float> sw(rows);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  for (auto& w : sw) w = u(rng);
  AiterAuxScatterArgs a = {};
  int32_t* d_rev;
  float* d_sw;
  uint16_t* d_out;
  CK(cudaMalloc(&d_rev, rev.size() * 4));
  CK(cudaMalloc(&d_sw, sw.size() * 4));
  CK(cudaMalloc(&d_out, size_t(m) * D * 2));
  CK(cudaMemcpy(d_rev, rev.data(), rev.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_sw, sw.data(), sw.size() * 4, cudaMemcpyHostToDevice));
  if (q) {
    std::vector<uint8_t> eq(size_t(rows) * D / 2), es(size_t(rows) * D / 32);
    for (auto& v : eq) v = static_cast<uint8_t>(rng());
    for (auto& v : es) v = static_cast<uint8_t>(100 + rng() % 40);
    uint8_t *d_eq, *d_es;
    CK(cudaMalloc(&d_eq, eq.size()));
    CK(cudaMalloc(&d_es, es.size()));
    CK(cudaMemcpy(d_eq, eq.data(), eq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_es, es.data(), es.size(), cudaMemcpyHostToDevice));
    a.expert_out_q = d_eq;
    a.expert_out_scale = d_es;
  } else {
    std::vector<uint16_t> eo(size_t(rows) * D);
    for (auto& v : eo) v = static_cast<uint16_t>(0x3C00u + rng() % 0x0800u) | ((rng() & 1u) << 15);
    uint16_t* d_eo;
    CK(cudaMalloc(&d_eo, eo.size() * 2));
    CK(cudaMemcpy(d_eo, eo.data(), eo.size() * 2, cudaMemcpyHostToDevice));
    a.expert_out = d_eo;
  }
  a.num_rows = rows;
  a.reverse_sorted = d_rev;
  a.sorted_weights = d_sw;
  a.num_tokens = m;
  a.model_dim = D;
  a.topk = K;
  a.out = d_out;
  a.routed_scaling_factor = 1.0f;
  // the pageable cudaMemcpy calls above may still be in flight (they return once staged),
  // and the sweep's stream does not wait for the legacy stream
  CK(cudaDeviceSynchronize());
  return a;
}

void free_args(AiterAuxScatterArgs& a) {
  CK(cudaFree(const_cast<uint16_t*>(a.expert_out)));
  CK(cudaFree(const_cast<uint8_t*>(a.expert_out_q)));
  CK(cudaFree(const_cast<uint8_t*>(a.expert_out_scale)));
  CK(cudaFree(const_cast<int32_t*>(a.reverse_sorted)));
  CK(cudaFree(const_cast<float*>(a.sorted_weights)));
  CK(cudaFree(a.out));
}

bool same_output(const AiterAuxScatterArgs& a, const std::vector<uint16_t>& want) {
  std::vector<uint16_t> got(want.size());
  CK(cudaMemcpy(got.data(), a.out, got.size() * 2, cudaMemcpyDeviceToHost));
  return memcmp(got.data(), want.data(), got.size() * 2) == 0;
}

template <int D, int K, bool kQ>
void sweep_case(int m, cudaStream_t st) {
  const char* op = kQ ? "moe_scatter_reduce_q" : "moe_scatter_reduce";
  AiterAuxScatterArgs a = make_args<D, K>(m, kQ, 1000u * D + 10u * K + m);
  auto run_auto = [&]() {
    return kQ ? moe_scatter_reduce_q<D, K>(a, st) : moe_scatter_reduce<D, K>(a, st);
  };
  aiter_aux::set_pdl_enabled(false);
  if (run_auto() != 0) {
    printf("%s,%d,%d,%d,-,%d,auto,FAIL %s\n", op, D, K, m, kTrigger, g_last_error.c_str());
    free_args(a);
    return;
  }
  CK(cudaStreamSynchronize(st));
  std::vector<uint16_t> want(size_t(m) * D);
  CK(cudaMemcpy(want.data(), a.out, want.size() * 2, cudaMemcpyDeviceToHost));
  // (name, launch) of every candidate; the launch returns 0 on success
  std::vector<std::pair<std::string, std::function<int()>>> shapes;
  shapes.emplace_back("auto", run_auto);
  auto add = [&](auto v, auto t) {  // std::integral_constant shape (kV, kT)
    constexpr int kV = decltype(v)::value, kT = decltype(t)::value;
    shapes.emplace_back(
        std::to_string(sc::small_v<D, kQ, kV>()) + "x" + std::to_string(kT),
        [&a, st]() { return sc::launch_scatter_small<D, K, kQ, kV, kT>(a, st, "shape"); });
  };
  if constexpr (kQ) {
    add(std::integral_constant<int, 8>(), std::integral_constant<int, 64>());
    add(std::integral_constant<int, 16>(), std::integral_constant<int, 64>());
    add(std::integral_constant<int, 16>(), std::integral_constant<int, 128>());
    add(std::integral_constant<int, 32>(), std::integral_constant<int, 64>());
    add(std::integral_constant<int, 32>(), std::integral_constant<int, 128>());
  } else {
    add(std::integral_constant<int, 4>(), std::integral_constant<int, 64>());
    add(std::integral_constant<int, 4>(), std::integral_constant<int, 128>());
    add(std::integral_constant<int, 8>(), std::integral_constant<int, 64>());
    add(std::integral_constant<int, 8>(), std::integral_constant<int, 128>());
    add(std::integral_constant<int, 8>(), std::integral_constant<int, 256>());
  }
  shapes.emplace_back("large",
                      [&a, st]() { return sc::launch_scatter_large<D, K, kQ>(a, st, "shape"); });
  for (const bool pdl : {false, true}) {
    aiter_aux::set_pdl_enabled(pdl);
    std::string best;
    float best_us = 1e30f, auto_us = 0.0f;
    for (auto& [name, launch] : shapes) {
      CK(cudaMemsetAsync(a.out, 0xFF, size_t(m) * D * 2, st));
      if (launch() != 0) {
        printf("%s,%d,%d,%d,%d,%d,%s,FAIL %s\n", op, D, K, m, pdl, kTrigger, name.c_str(),
               g_last_error.c_str());
        continue;
      }
      CK(cudaStreamSynchronize(st));
      if (!same_output(a, want)) {
        printf("%s,%d,%d,%d,%d,%d,%s,MISMATCH\n", op, D, K, m, pdl, kTrigger, name.c_str());
        continue;
      }
      const float us = graph_us(st, launch);
      printf("%s,%d,%d,%d,%d,%d,%s,%.3f\n", op, D, K, m, pdl, kTrigger, name.c_str(), us);
      if (name == "auto") auto_us = us;
      if (us < best_us) {
        best_us = us;
        best = name;
      }
    }
    char line[256];
    snprintf(line, sizeof(line), "best,%s,%d,%d,%d,%d,%d,%s,%.3f,%.3f", op, D, K, m, pdl, kTrigger,
             best.c_str(), best_us, auto_us);
    g_best.push_back(line);
  }
  aiter_aux::set_pdl_enabled(false);
  free_args(a);
}

template <int D, int K>
void sweep_dk(cudaStream_t st) {
  // SWEEP_MS=m1,m2,...: other token counts (default 1, 2, 4, 8); SWEEP_NO_Q=1: bf16 only
  std::vector<int> ms = {1, 2, 4, 8};
  if (const char* env = getenv("SWEEP_MS")) {
    ms.clear();
    for (const char* p = env; *p;) {
      ms.push_back(atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
  }
  for (int m : ms) {
    sweep_case<D, K, false>(m, st);
    if (!env_flag("SWEEP_NO_Q")) sweep_case<D, K, true>(m, st);
  }
}

// Every topk at model_dim D (only D == SWEEP_DIM is compiled where that is defined).
template <int D>
void sweep_d(cudaStream_t st) {
#if defined(SWEEP_DIM)
  constexpr bool kBuilt = D == SWEEP_DIM;
#else
  constexpr bool kBuilt = true;
#endif
  if constexpr (kBuilt) {
    sweep_dk<D, 8>(st);
    sweep_dk<D, 9>(st);
    sweep_dk<D, 11>(st);
    sweep_dk<D, 16>(st);
  }
}

}  // namespace

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  if (!env_flag("SWEEP_NO_HEADER")) printf("op,D,topk,M,pdl,trigger,shape,us\n");
  sweep_d<2560>(st);
  sweep_d<3072>(st);
  sweep_d<4096>(st);
  sweep_d<7168>(st);
  for (const auto& line : g_best) printf("%s\n", line.c_str());
  CK(cudaStreamDestroy(st));
  return 0;
}
