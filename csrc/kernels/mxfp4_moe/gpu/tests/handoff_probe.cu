// The cost of handing a gate's ids to the decode pipeline's blocks (development tool, not
// built by the package): graph replay of
//   two:   a producer kernel (one block: logits load, a chain of dependent block steps, the
//          ids stored) then a consumer kernel (the blocks of a decode launch: ids load, a
//          chain of block steps, stores), PDL between them;
//   flag:  one launch, the producer as block 0 and the consumers after it, which wait on a
//          global counter the producer raises (release / acquire), the last consumer resets it;
//   flagx: as flag, the consumers load their x rows before the wait;
//   p, c:  each kernel alone.
// Every launch has PDL (wait at entry, trigger at exit), rotated input sets past L2.
//   nvcc -std=c++17 -O3 -arch=sm_90a csrc/kernels/mxfp4_moe/gpu/tests/handoff_probe.cu \
//     -o /tmp/handoff && /tmp/handoff
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_check.h"

constexpr int kT = 256;    // threads of every block
constexpr int kSets = 64;  // rotated input sets
constexpr int kE = 256;    // logits per row
constexpr int kK = 8;      // ids per row
constexpr int kX = 7168;   // x elements per row (fp32 here: the load's latency is the point)

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// `steps` dependent block steps: a shared store, a barrier, a neighbour's load.
__device__ __forceinline__ float chain(float v, int steps, float* sh) {
  for (int s = 0; s < steps; ++s) {
    sh[threadIdx.x] = v;
    __syncthreads();
    v = v * 0.5f + sh[(threadIdx.x + 1 + s) % kT];
    __syncthreads();
  }
  return v;
}

struct Args {
  const float* logits;  // [kSets][rows][kE]
  const float* x;       // [kSets][rows][kX]
  int* ids;             // [kSets][rows][kK]
  float* out;           // [kSets][blocks][kT]
  int* flag;            // [2]: raised rows, finished consumers
  int rows, pj, cj, consumers;
};

__device__ void produce(const Args& a, int set, int row, float* sh) {
  const float l = a.logits[(static_cast<size_t>(set) * a.rows + row) * kE + threadIdx.x];
  const float v = chain(l, a.pj, sh);
  if (threadIdx.x < kK)
    a.ids[(static_cast<size_t>(set) * a.rows + row) * kK + threadIdx.x] = static_cast<int>(v) & 255;
}

__device__ void consume(const Args& a, int set, int b, float xv, float* sh) {
  float v = xv;
  for (int r = 0; r < a.rows; ++r)
    v += static_cast<float>(a.ids[(static_cast<size_t>(set) * a.rows + r) * kK + threadIdx.x % kK]);
  v = chain(v, a.cj, sh);
  a.out[(static_cast<size_t>(set) * a.consumers + b) * kT + threadIdx.x] = v;
}

__device__ __forceinline__ float load_x(const Args& a, int set, int b) {
  const int r = b % a.rows;
  return a.x[(static_cast<size_t>(set) * a.rows + r) * kX + (b * kT + threadIdx.x) % kX];
}

__global__ void k_produce(Args a, int set) {
  __shared__ float sh[kT];
  pdl_wait();
  produce(a, set, blockIdx.x, sh);
  pdl_trigger();
}

__global__ void k_consume(Args a, int set) {
  __shared__ float sh[kT];
  pdl_wait();
  consume(a, set, blockIdx.x, load_x(a, set, blockIdx.x), sh);
  pdl_trigger();
}

template <bool kXFirst>
__global__ void k_fused(Args a, int set) {
  __shared__ float sh[kT];
  pdl_wait();
  const int b = blockIdx.x;
  if (b < a.rows) {
    produce(a, set, b, sh);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&a.flag[0], 1);
    }
  } else {
    const int cb = b - a.rows;
    float xv = kXFirst ? load_x(a, set, cb) : 0.0f;
    if (threadIdx.x == 0)
      while (ld_acquire(&a.flag[0]) < a.rows) {
      }
    __syncthreads();
    if (!kXFirst) xv = load_x(a, set, cb);
    consume(a, set, cb, xv, sh);
    if (threadIdx.x == 0) {
      // the last consumer resets the counters for the next launch
      if (atomicAdd(&a.flag[1], 1) == a.consumers - 1) {
        a.flag[0] = 0;
        a.flag[1] = 0;
        __threadfence();
      }
    }
  }
  pdl_trigger();
}

template <class K>
void launch(K kern, int grid, cudaStream_t st, Args a, int set) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kT);
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kern, a, set));
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int max_rows = 64, consumers = 150;
  float *logits, *x, *out;
  int *ids, *flag;
  CK(cudaMalloc(&logits, sizeof(float) * kSets * max_rows * kE));
  CK(cudaMalloc(&x, sizeof(float) * kSets * max_rows * kX));
  CK(cudaMalloc(&ids, sizeof(int) * kSets * max_rows * kK));
  CK(cudaMalloc(&out, sizeof(float) * kSets * consumers * kT));
  CK(cudaMalloc(&flag, sizeof(int) * 2));
  CK(cudaMemset(flag, 0, sizeof(int) * 2));
  CK(cudaMemset(logits, 0, sizeof(float) * kSets * max_rows * kE));
  CK(cudaMemset(x, 0, sizeof(float) * kSets * max_rows * kX));
  // evict: a buffer past L2 touched between replays
  float* big;
  const size_t big_n = size_t(256) << 20;
  CK(cudaMalloc(&big, big_n));
  printf("variant rows pj cj us_per_call\n");
  for (int rows : {1, 4}) {
    for (int pj : {4, 16}) {
      for (int cj : {4, 16}) {
        Args a{logits, x, ids, out, flag, rows, pj, cj, consumers};
        const char* names[] = {"two", "flag", "flagx", "p", "c"};
        for (int v = 0; v < 5; ++v) {
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
          for (int s = 0; s < kSets; ++s) {
            if (v == 0) {
              launch(k_produce, rows, st, a, s);
              launch(k_consume, consumers, st, a, s);
            } else if (v == 1) {
              launch(k_fused<false>, rows + consumers, st, a, s);
            } else if (v == 2) {
              launch(k_fused<true>, rows + consumers, st, a, s);
            } else if (v == 3) {
              launch(k_produce, rows, st, a, s);
            } else {
              launch(k_consume, consumers, st, a, s);
            }
          }
          CK(cudaStreamEndCapture(st, &g));
          CK(cudaGraphInstantiate(&ge, g, 0));
          std::vector<float> ts;
          cudaEvent_t e0, e1;
          CK(cudaEventCreate(&e0));
          CK(cudaEventCreate(&e1));
          for (int rep = 0; rep < 12; ++rep) {
            CK(cudaMemsetAsync(big, rep, big_n, st));
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep >= 2) ts.push_back(ms * 1000.0f / kSets);
          }
          std::sort(ts.begin(), ts.end());
          printf("%s %d %d %d %.3f\n", names[v], rows, pj, cj, ts[ts.size() / 2]);
          int hf[2];
          CK(cudaMemcpy(hf, flag, sizeof(hf), cudaMemcpyDeviceToHost));
          if (hf[0] != 0 || hf[1] != 0) printf("  flag not reset: %d %d\n", hf[0], hf[1]);
          CK(cudaGraphExecDestroy(ge));
          CK(cudaGraphDestroy(g));
        }
      }
    }
  }
  return 0;
}
