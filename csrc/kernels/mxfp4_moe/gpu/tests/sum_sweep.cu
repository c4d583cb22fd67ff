// Device-side timing of moe_sum's launch shapes (development tool, not built by the package):
// the op's own launch ("auto") and every candidate of gpu/sums.h's sum_kernel (V columns per
// thread x kT threads per block x kKB slots loaded together, one unit per thread or a
// grid-stride loop over `cap` blocks), bf16 rows [M, topk, model_dim] at the four
// (topk, model_dim) of the benchmark's sum rows, M = 1 .. 16384, PDL off and on; CUDA-graph
// replay of back-to-back launches over rotated input / output sets, as bench_sums.py: enough
// sets to exceed twice the L2 (at most 64; SWEEP_WARM=1: one set, the inputs L2-resident
// wherever they fit).  Every shape's output must equal the op's byte for byte.
// Build and run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -arch=sm_90 -I csrc/kernels/mxfp4_moe \
//     csrc/kernels/mxfp4_moe/gpu/tests/sum_sweep.cu -o /tmp/sum_sweep && /tmp/sum_sweep
// (arguments: the token counts to run, default all).  Prints CSV: topk,D,M,pdl,shape,us;
// then per (topk, D, M, pdl) the fastest shape as "best,topk,D,M,pdl,shape,us,auto_us".
// SWEEP_WIDE_TOPK=1: the bench's topk 9 / 11 / 16 shapes ((9, 7168), (11, 2560), (16, 3584))
// instead; SWEEP_EP=1: with topk_ids and an expert map, as moe_sum_ep (ids uniform over 128
// global experts, the first 64 local).
#define AITER_AUX_SWEEP_NO_MAIN
#include "sort_sweep.cu"  // CK, graph_us

#include <functional>
#include <type_traits>
#include <utility>

namespace {

namespace sm = aiter_aux::gpu::sum_detail;
constexpr int kBF16 = AITER_AUX_DTYPE_BF16;

std::vector<std::string> g_best;

// The input / output sets of a case: every set holds the same input.
struct SumSets {
  std::vector<void*> in, out;
  int32_t* ids = nullptr;  // SWEEP_EP: topk_ids and the expert map
  int32_t* map = nullptr;
};

constexpr int kEpGlobal = 128;  // SWEEP_EP: global experts, the first half local

// Sets of this many bytes each that exceed twice the L2 (at most 64).
int rotated_sets(size_t set_bytes) {
  if (env_flag("SWEEP_WARM")) return 1;
  int dev = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t want = (2 * size_t(l2) + set_bytes - 1) / std::max<size_t>(set_bytes, 1);
  return static_cast<int>(std::min<size_t>(std::max<size_t>(want, 1), 64));
}

AiterAuxSumArgs make_args(int m, int k, int d, uint32_t seed, SumSets& sets) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> in(size_t(m) * k * d);
  for (auto& v : in) v = static_cast<uint16_t>(0x3C00u + rng() % 0x0800u) | ((rng() & 1u) << 15);
  const int n = rotated_sets(in.size() * 2 + size_t(m) * d * 2);
  for (int i = 0; i < n; ++i) {
    void *d_in, *d_out;
    CK(cudaMalloc(&d_in, in.size() * 2 + 16));
    CK(cudaMalloc(&d_out, size_t(m) * d * 2 + 16));
    CK(cudaMemcpy(d_in, in.data(), in.size() * 2, cudaMemcpyHostToDevice));
    sets.in.push_back(d_in);
    sets.out.push_back(d_out);
  }
  if (env_flag("SWEEP_EP")) {
    std::vector<int32_t> ids(size_t(m) * k), map(kEpGlobal);
    for (auto& v : ids) v = static_cast<int32_t>(rng() % kEpGlobal);
    for (int g = 0; g < kEpGlobal; ++g) map[g] = g < kEpGlobal / 2 ? g : -1;
    CK(cudaMalloc(&sets.ids, ids.size() * 4 + 4));
    CK(cudaMalloc(&sets.map, map.size() * 4));
    CK(cudaMemcpy(sets.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sets.map, map.data(), map.size() * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaDeviceSynchronize());
  AiterAuxSumArgs a = {};
  a.topk_ids = sets.ids;
  a.expert_map = sets.map;
  a.num_global_experts = sets.map ? kEpGlobal : 0;
  a.input = sets.in[0];
  a.num_tokens = m;
  a.model_dim = d;
  a.topk = k;
  a.dtype = kBF16;
  a.routed_scaling_factor = 1.0f;
  a.output = sets.out[0];
  return a;
}

void sweep_case(int k, int d, int m, cudaStream_t st) {
  SumSets sets;
  AiterAuxSumArgs a = make_args(m, k, d, 1000u * d + 10u * k + m, sets);
  const size_t out_bytes = size_t(m) * d * 2;
  const int num_sets = static_cast<int>(sets.in.size());
  int cur = 0;  // the set of the next launch
  auto next_set = [&]() {
    a.input = sets.in[cur % num_sets];
    a.output = sets.out[cur % num_sets];
    ++cur;
  };
  auto run_auto = [&a, st]() { return aiter_aux::gpu::moe_sum(a, st); };
  aiter_aux::set_pdl_enabled(false);
  CK(cudaMemsetAsync(a.output, 0xFF, out_bytes, st));
  if (run_auto() != 0) {
    printf("%d,%d,%d,-,auto,FAIL %s\n", k, d, m, g_last_error.c_str());
    return;
  }
  CK(cudaStreamSynchronize(st));
  std::vector<uint16_t> want(size_t(m) * d), got(want.size());
  CK(cudaMemcpy(want.data(), a.output, out_bytes, cudaMemcpyDeviceToHost));
  std::vector<std::pair<std::string, std::function<int()>>> shapes;
  shapes.emplace_back("auto", run_auto);
  auto add = [&](auto v, auto t, auto kb, int cap) {
    constexpr int kV = decltype(v)::value, kT = decltype(t)::value, kKB = decltype(kb)::value;
    if (d % kV != 0) return;
    const int64_t units = int64_t(m) * (d / kV);
    if (cap != 65535 && (units + kT - 1) / kT <= cap) return;  // same as one unit per thread
    shapes.emplace_back(
        std::to_string(kV * 2) + "Bx" + std::to_string(kT) + "/k" + std::to_string(kKB) +
            (cap == 65535 ? "" : "/g" + std::to_string(cap)),
        [&a, st, cap]() { return sm::launch_sum_shape<kBF16, kV, kT, kKB>(a, st, cap); });
  };
  using I = std::integral_constant<int, 0>;
  (void)sizeof(I);
#define C(x) std::integral_constant<int, x>()
  for (int cap : {65535, 8192, 2112, 1056, 528}) {
    if (cap != 65535 && m < 256) continue;
    add(C(2), C(64), C(16), cap);
    add(C(2), C(128), C(16), cap);
    add(C(4), C(64), C(16), cap);
    add(C(4), C(128), C(16), cap);
    add(C(4), C(256), C(16), cap);
    add(C(8), C(64), C(8), cap);
    add(C(8), C(128), C(8), cap);
    add(C(8), C(256), C(8), cap);
    add(C(8), C(512), C(8), cap);
    add(C(8), C(128), C(4), cap);
    add(C(8), C(256), C(4), cap);
    if (k > 8) {  // a thread's slots in one round trip
      add(C(8), C(128), C(16), cap);
      add(C(8), C(256), C(16), cap);
    }
  }
  auto add_split = [&](auto kp, auto t) {
    constexpr int kKP = decltype(kp)::value, kT = decltype(t)::value;
    if (k > kKP || d % 8 != 0 || m > 4096) return;
    shapes.emplace_back("split" + std::to_string(kKP) + "x" + std::to_string(kT),
                        [&a, st]() { return sm::launch_sum_split<kBF16, kKP, kT>(a, st); });
  };
  add_split(C(4), C(64));
  add_split(C(4), C(128));
  add_split(C(8), C(64));
  add_split(C(8), C(128));
  add_split(C(8), C(256));
  add_split(C(16), C(128));
  add_split(C(16), C(256));
#undef C
  for (const bool pdl : {false, true}) {
    aiter_aux::set_pdl_enabled(pdl);
    std::string best;
    float best_us = 1e30f, auto_us = 0.0f;
    for (auto& [name, launch] : shapes) {
      cur = 0;
      next_set();
      CK(cudaMemsetAsync(a.output, 0xFF, out_bytes, st));
      if (launch() != 0) {
        printf("%d,%d,%d,%d,%s,FAIL %s\n", k, d, m, pdl, name.c_str(), g_last_error.c_str());
        continue;
      }
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), a.output, out_bytes, cudaMemcpyDeviceToHost));
      if (memcmp(got.data(), want.data(), out_bytes) != 0) {
        printf("%d,%d,%d,%d,%s,MISMATCH\n", k, d, m, pdl, name.c_str());
        continue;
      }
      cur = 0;
      const std::function<int()>& f = launch;
      const float us = graph_us(
          st,
          [&]() {
            next_set();
            return f();
          },
          std::max(20, num_sets));
      printf("%d,%d,%d,%d,%s,%.3f\n", k, d, m, pdl, name.c_str(), us);
      if (name == "auto") auto_us = us;
      if (us < best_us) {
        best_us = us;
        best = name;
      }
    }
    char line[256];
    snprintf(line, sizeof(line), "best,%d,%d,%d,%d,%s,%.3f,%.3f", k, d, m, pdl, best.c_str(),
             best_us, auto_us);
    g_best.push_back(line);
  }
  aiter_aux::set_pdl_enabled(false);
  for (int i = 0; i < num_sets; ++i) {
    CK(cudaFree(sets.in[i]));
    CK(cudaFree(sets.out[i]));
  }
  if (sets.ids != nullptr) CK(cudaFree(sets.ids));
  if (sets.map != nullptr) CK(cudaFree(sets.map));
}

}  // namespace

int main(int argc, char** argv) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(atoi(argv[i]));
  if (ms.empty()) ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384};
  printf("topk,D,M,pdl,shape,us\n");
  const std::vector<std::pair<int, int>> kd =
      env_flag("SWEEP_WIDE_TOPK")
          ? std::vector<std::pair<int, int>>{{9, 7168}, {11, 2560}, {16, 3584}}
          : std::vector<std::pair<int, int>>{{8, 7168}, {8, 4096}, {4, 2880}, {8, 2048}};
  for (const auto& [k, d] : kd)
    for (int m : ms) sweep_case(k, d, m, st);
  for (const auto& line : g_best) printf("%s\n", line.c_str());
  CK(cudaStreamDestroy(st));
  return 0;
}
