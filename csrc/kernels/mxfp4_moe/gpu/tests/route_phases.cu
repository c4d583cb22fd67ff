// Device-side phase timing of moe_route (development tool, not built by the package): the
// clock64 of thread 0 of block 0 at the ROUTE_MARK points of gpu/route.h and gpu/route_wide.h
// (load, max, exp, sum, div, keys, groups, select, out) at M = 1 and 4 for both kernels, the
// graph-replay time of both in every size class at M = 1 .. 1024 (where they cross is
// kWideMaxRows' measure), and a check of route.h's div_quick against
// nvcc's division on 2^28 random pairs per range (any pair div_quick does not mark slow must
// give the same bits; ROUTE_SKIP_DIV=1 skips it).  Build and run on the GPU machine
// (repo root):
//   nvcc -std=c++17 -O3 -arch=sm_90a -I csrc/kernels/mxfp4_moe \
//     csrc/kernels/mxfp4_moe/gpu/tests/route_phases.cu -o /tmp/route_phases && /tmp/route_phases
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstdint>
__device__ long long g_marks[10];
#define ROUTE_MARK(n)                                                \
  do {                                                               \
    if (threadIdx.x == 0 && blockIdx.x == 0) g_marks[n] = clock64(); \
  } while (0)
#include "gpu/route.h"
#include <cuda_bf16.h>
#include <algorithm>
namespace RD = aiter_aux::gpu::route_detail;
extern "C" void aiter_aux_set_error(const char* msg) {
  fprintf(stderr, "%s\n", msg);
}

__global__ void divtest(unsigned long long seed, int mode, unsigned long long* bad,
                        unsigned long long* slow_n) {
  unsigned long long x = seed ^ (blockIdx.x * 1315423911ull + threadIdx.x * 2654435761ull);
  unsigned long long nb = 0, ns = 0;
  for (int it = 0; it < 64; ++it) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint32_t ua = (uint32_t)x, ub = (uint32_t)(x >> 32);
    float a, b;
    if (mode == 0) {
      a = __uint_as_float(ua & 0x7FFFFFFFu);
      b = __uint_as_float(ub & 0x7FFFFFFFu);
    } else if (mode == 1) {
      a = __uint_as_float((ua & 0x007FFFFFu) | ((100u + (ua >> 27)) << 23));
      b = __uint_as_float((ub & 0x007FFFFFu) | ((127u + (ub >> 29)) << 23));
    } else {
      a = __uint_as_float((ua % 0x3F800001u));
      b = 1.0f + __uint_as_float(ub & 0x3FFFFFFFu);
    }
    bool slow;
    float q = aiter_aux::gpu::route_detail::div_quick(a, b, &slow);
    if (slow) {
      ++ns;
      continue;
    }
    float w = __fdiv_rn(a, b);
    if (__float_as_uint(q) != __float_as_uint(w)) ++nb;
  }
  atomicAdd(bad, nb);
  atomicAdd(slow_n, ns);
}

int main() {
  if (getenv("ROUTE_SKIP_DIV") == nullptr) {
    unsigned long long* d;
    cudaMalloc(&d, 16);
    for (int mode = 0; mode < 3; ++mode)
      for (int rep = 0; rep < 4; ++rep) {
        cudaMemset(d, 0, 16);
        divtest<<<4096, 256>>>(12345 + rep * 777 + mode, mode, d, d + 1);
        unsigned long long h[2];
        cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
        printf("divtest mode %d rep %d: %llu pairs, %llu mismatches, %llu slow\n", mode, rep,
               4096ull * 256 * 64, h[0], h[1]);
      }
  }
  struct C {
    int e, k, g, kg, scoring;
    bool bias;
    const char* name;
  };
  C cases[] = {{256, 8, 0, 0, 0, false, "softmax E256"}, {128, 8, 0, 0, 0, false, "softmax E128"},
               {256, 8, 8, 4, 1, true, "grouped E256"},  {896, 16, 0, 0, 0, false, "softmax E896"},
               {384, 8, 1, 1, 1, true, "kimi E384 G1"},  {513, 11, 0, 0, 0, false, "softmax E513"},
               {896, 16, 8, 4, 1, true, "grouped E896"}};
  for (auto& c : cases) {
    for (int m : {1, 4, 16, 64, 128, 255, 256, 384, 512, 768, 1024}) {
      std::vector<uint16_t> h(m * c.e);
      for (size_t i = 0; i < h.size(); ++i) {
        float f = (float)((i * 7919) % 2001) / 300.0f - 3.3f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = u >> 16;
      }
      std::vector<float> hb(c.e);
      for (int i = 0; i < c.e; ++i) hb[i] = ((i * 31) % 101) / 1000.0f;
      void* dl;
      float *db, *dw;
      int32_t* di;
      cudaMalloc(&dl, h.size() * 2);
      cudaMalloc(&db, c.e * 4);
      cudaMalloc(&dw, m * 16 * 4);
      cudaMalloc(&di, m * 16 * 4);
      cudaMemcpy(dl, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(db, hb.data(), c.e * 4, cudaMemcpyHostToDevice);
      AiterAuxRouteArgs a = {};
      a.router_logits = dl;
      a.num_tokens = m;
      a.num_experts = c.e;
      a.topk = c.k;
      a.dtype = AITER_AUX_DTYPE_BF16;
      a.scoring = c.scoring;
      a.renormalize = 1;
      a.num_expert_group = c.g;
      a.topk_group = c.kg;
      a.routed_scaling_factor = 1.0f;
      a.correction_bias = c.bias ? db : nullptr;
      a.topk_weights = dw;
      a.topk_ids = di;
      // path 0: the warp per row, 1: the block per row, each of E's size class (route.h
      // launch_route), at every M: where they cross is kWideMaxRows' measure per class
      for (int path = 0; path < 2; ++path) {
        auto launch = [&](cudaStream_t st) {
          constexpr int kBf16 = AITER_AUX_DTYPE_BF16;
          if (path == 1)
            c.e <= 128   ? RD::launch_route_wide<kBf16, 128>(a, st)
            : c.e <= 256 ? RD::launch_route_wide<kBf16, 256>(a, st)
            : c.e <= 512 ? RD::launch_route_wide<kBf16, 512>(a, st)
                         : RD::launch_route_wide<kBf16, AITER_AUX_MAX_ROUTE_EXPERTS>(a, st);
          else
            c.e <= 128   ? RD::launch_route_narrow<kBf16, 128>(a, st)
            : c.e <= 256 ? RD::launch_route_narrow<kBf16, 256>(a, st)
            : c.e <= 512 ? RD::launch_route_narrow<kBf16, 512>(a, st)
                         : RD::launch_route_narrow<kBf16, AITER_AUX_MAX_ROUTE_EXPERTS>(a, st);
        };
        long long acc[10] = {0};
        int n = 0;
        for (int it = 0; it < (m <= 4 ? 50 : 0); ++it) {
          launch(nullptr);
          cudaDeviceSynchronize();
          long long mk[10];
          cudaMemcpyFromSymbol(mk, g_marks, sizeof(mk));
          if (c.scoring != 0) mk[2] = mk[3] = mk[4] = mk[1];
          if (it >= 10) {
            for (int j = 1; j < 10; ++j) acc[j] += mk[j] - mk[j - 1];
            ++n;
          }
        }
        // graph replay: 20 launches per graph, the median of 30 replays
        cudaStream_t st;
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        for (int it = 0; it < 20; ++it) launch(st);
        cudaStreamEndCapture(st, &g);
        cudaGraphInstantiate(&ge, g, 0);
        std::vector<float> t;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int rep = 0; rep < 33; ++rep) {
          cudaEventRecord(e0, st);
          cudaGraphLaunch(ge, st);
          cudaEventRecord(e1, st);
          cudaEventSynchronize(e1);
          float ms;
          cudaEventElapsedTime(&ms, e0, e1);
          if (rep >= 3) t.push_back(ms * 1000 / 20);
        }
        std::sort(t.begin(), t.end());
        printf("%-14s M=%-5d %-9s graph %.2f us", c.name, m, path ? "block/row" : "warp/row",
               t[t.size() / 2]);
        if (n > 0) {
          const char* nm[10] = {"",    "load", "max",    "exp",    "sum",
                                "div", "keys", "groups", "select", "out"};
          long long tot = 0;
          printf(" |");
          for (int j = 1; j < 10; ++j) {
            printf(" %s %lld", nm[j], acc[j] / n);
            tot += acc[j] / n;
          }
          printf(" | total %lld cycles", tot);
        }
        printf("\n");
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(st);
      }
      cudaFree(dl);
      cudaFree(db);
      cudaFree(dw);
      cudaFree(di);
    }
  }
  return 0;
}
