// Device-side timing of the decode pipeline's kernels (development tool, not built by the
// package): moe_sort_quant, moe_sort_scales, the two in sequence, and moe_sort_quant with
// sorted_scales (one launch), plus the one-launch kernel's parts alone; CUDA-graph replay
// of back-to-back launches on router-like ids; the one-launch sorted scales must equal the
// two launches' byte for byte.  Build and run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -arch=sm_90 -I csrc/kernels/mxfp4_moe \
//     csrc/kernels/mxfp4_moe/gpu/tests/decode_sweep.cu -o /tmp/decode_sweep && /tmp/decode_sweep
// Prints CSV: E,topk,D,M,variant,us
#define AITER_AUX_SWEEP_NO_MAIN
#include "sort_sweep.cu"

namespace {

// The one-launch kernel's scale blocks alone (no sort, z, quant or zero blocks).
template <int E, int K, int D>
__global__ __launch_bounds__(sd::kTinyThreads) void only_scales(AiterAuxSortArgs a,
                                                                AiterAuxQuantArgs q,
                                                                sd::ScalesPlan sp) {
  __shared__ sd::TinyScalesSmem<E, K> sm;
  sd::scale_group_block<E, K, QuantFormat::Mxfp4, D>(a, q, sp, sm, block_idx() % (D / 256),
                                                      block_idx() / (D / 256), true);
}

// Its z blocks alone.
template <int E, int K, int D>
__global__ __launch_bounds__(sd::kTinyThreads) void only_zero(AiterAuxSortArgs a, sd::ScalesPlan sp) {
  __shared__ sd::TinyScalesSmem<E, K> sm;
  sd::scales_zero_block<E, K, D>(a, sp, sm.t, block_idx());
}

template <int E, int K, int D>
void decode_case(int m) {
  const int bm = 32;
  std::vector<int32_t> ids;
  std::vector<float> w;
  routing(m, E, K, 4321u + m, ids, w);
  const int64_t cap = sort_capacity(m, K, E, bm);
  const int64_t out_rows = (cap + 31) / 32 * 32;
  const size_t ss_bytes = size_t(out_rows) * (D / 32);
  Bufs b = sort_bufs(ids, w, cap, bm);
  uint16_t* x;
  uint8_t *aq, *as, *ss, *ss2;
  CK(cudaMalloc(&x, size_t(m) * D * 2));
  CK(cudaMalloc(&aq, size_t(m) * D / 2));
  CK(cudaMalloc(&as, size_t(m) * D / 32));
  CK(cudaMalloc(&ss, ss_bytes));
  CK(cudaMalloc(&ss2, ss_bytes + 16));
  std::vector<uint16_t> hx(size_t(m) * D);
  std::mt19937 rng(77 + m);
  for (auto& v : hx) v = static_cast<uint16_t>(0x3C00u + rng() % 0x0800u) | ((rng() & 1u) << 15);
  CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  AiterAuxSortQuantArgs a = {};
  a.sort = sort_args(b, m, E, K, bm, cap);
  a.quant.x = x;
  a.quant.num_tokens = m;
  a.quant.model_dim = D;
  a.quant.a_q = aq;
  a.quant.a_scale = as;
  AiterAuxSortScalesArgs s = {};
  s.a_scale = as;
  s.num_tokens = m;
  s.model_dim = D;
  s.block_m = bm;
  s.sorted_token_ids = b.sti;
  s.num_valid_ids = b.nv;
  s.max_rows = cap;
  s.sorted_scales = ss2;
  a.sorted_scales = ss;
  const sd::SortPolicy pol = sd::host_sort_policy();
  const sd::SortChoice choice = sd::choose_sort_path(
      pol, sd::sort_problem<E, K, QuantFormat::Mxfp4, D>(a.sort, true), device_sm_count);
  const bool one = choice.fused_scales;
  const sd::ScalesPlan sp = sd::plan_tiny_scales<D>(pol, a.sort, ss, choice.blocks, 0, device_sm_count());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto time = [&](const char* name, auto launch) {
    if (launch() != 0) {
      printf("%d,%d,%d,%d,%s,FAIL %s\n", E, K, D, m, name, g_last_error.c_str());
      return;
    }
    CK(cudaStreamSynchronize(st));
    printf("%d,%d,%d,%d,%s,%.2f\n", E, K, D, m, name, graph_us(st, launch));
  };
  AiterAuxSortQuantArgs plain = a;
  plain.sorted_scales = nullptr;
  time("sort_quant", [&]() { return moe_sort_quant<E, K, D>(plain, st); });
  time("sort_scales", [&]() { return moe_sort_scales<D>(s, st); });
  time("two_launches", [&]() {
    const int rc = moe_sort_quant<E, K, D>(plain, st);
    return rc != 0 ? rc : moe_sort_scales<D>(s, st);
  });
  CK(cudaMemset(ss, 0xA5, ss_bytes));
  time(one ? "one_launch" : "one_launch(fallback)", [&]() { return moe_sort_quant<E, K, D>(a, st); });
  std::vector<uint8_t> h1(ss_bytes), h2(ss_bytes);
  CK(cudaMemcpy(h1.data(), ss, ss_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h2.data(), ss2, ss_bytes, cudaMemcpyDeviceToHost));
  if (h1 != h2) printf("%d,%d,%d,%d,MISMATCH,0\n", E, K, D, m);
  if (one) {
    time("parts:scales", [&]() {
      only_scales<E, K, D><<<D / 256 * sp.parts, sd::kTinyThreads, 0, st>>>(a.sort, a.quant, sp);
      return int(cudaGetLastError());
    });
    time("parts:zero", [&]() {
      only_zero<E, K, D><<<sp.z_blocks, sd::kTinyThreads, 0, st>>>(a.sort, sp);
      return int(cudaGetLastError());
    });
  }
  fflush(stdout);
  free_bufs(b);
  cudaFree(x), cudaFree(aq), cudaFree(as), cudaFree(ss), cudaFree(ss2);
  cudaStreamDestroy(st);
}

}  // namespace

int main() {
  printf("E,topk,D,M,variant,us\n");
  for (int m : {1, 4, 16, 64}) {
    decode_case<257, 9, 7168>(m);
    decode_case<896, 16, 3584>(m);
    decode_case<513, 11, 2560>(m);
    decode_case<256, 8, 7168>(m);
  }
  return 0;
}
