// Device-side timing of the decode pipeline's kernels (development tool, not built by the
// package): moe_sort_quant, moe_sort_scales, the two in sequence, and moe_sort_quant with
// sorted_scales (one launch: the chooser's, and at n = M*topk <= 64 the pair and the tiny
// one-launch kernels forced), plus the one-launch kernels' parts alone; CUDA-graph replay
// of back-to-back launches on router-like ids; every one-launch sorted scales must equal the
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
__global__ __launch_bounds__(sd::kTinyThreads) void only_zero(AiterAuxSortArgs a,
                                                              sd::ScalesPlan sp) {
  __shared__ sd::TinyScalesSmem<E, K> sm;
  sd::scales_zero_block<E, K, D>(a, sp, sm.t, block_idx());
}

// The pair one-launch kernel's scale blocks alone.
template <int E, int K, int D>
__global__ __launch_bounds__(sd::kPairThreads) void only_pair_scales(AiterAuxSortArgs a,
                                                                     AiterAuxQuantArgs q,
                                                                     sd::ScalesPlan sp) {
  __shared__ sd::PairScalesSmem sm;
  sd::pair_scale_block<E, K, QuantFormat::Mxfp4, D>(a, q, sp, sm, block_idx() % (D / 256),
                                                    block_idx() / (D / 256), true);
}

// Its z blocks alone.
template <int E, int K, int D>
__global__ __launch_bounds__(sd::kPairThreads) void only_pair_zero(AiterAuxSortArgs a,
                                                                   sd::ScalesPlan sp) {
  const int n = static_cast<int>(a.num_tokens) * K;
  sd::scales_zero_fill<D, sd::kPairThreads>(
      sp, sd::pair_rank<E, K>(a, n, sd::Pow2Blocks::of(a.block_m)).rows, block_idx());
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
  const sd::SortProblem prob = sd::sort_problem<E, K, QuantFormat::Mxfp4, D>(a.sort, true);
  const sd::SortChoice choice = sd::choose_sort_path(pol, prob, device_sm_count);
  const bool one = choice.fused_scales;
  const int n = m * K;
  const sd::SortChoice tiny_c = {sd::SortPath::Tiny, sd::tiny_blocks(pol, prob), false, true};
  const sd::SortChoice pair_c = {sd::SortPath::Pairs, sd::pair_blocks(prob), false, true};
  const int sms = device_sm_count();
  // the plans the one-launch kernels take (no quant blocks: the parts alone)
  const sd::ScalesPlan tsp =
      sd::plan_scales<D>(pol, a.sort, ss, sd::kTinyThreads, tiny_c.blocks, 0, sms);
  const sd::ScalesPlan psp =
      sd::plan_scales<D>(pol, a.sort, ss, sd::kPairThreads, pair_c.blocks, 0, sms);
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
  std::vector<uint8_t> h1(ss_bytes), h2(ss_bytes);
  auto one_launch = [&](const char* name, auto launch) {
    CK(cudaMemset(ss, 0xA5, ss_bytes));
    time(name, launch);
    CK(cudaMemcpy(h1.data(), ss, ss_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2.data(), ss2, ss_bytes, cudaMemcpyDeviceToHost));
    if (h1 != h2) printf("%d,%d,%d,%d,%s MISMATCH,0\n", E, K, D, m, name);
  };
  one_launch(one ? "one_launch" : "one_launch(fallback)",
             [&]() { return moe_sort_quant<E, K, D>(a, st); });
  constexpr QuantFormat kF = QuantFormat::Mxfp4;
  if (n <= sd::kPairMax) {
    one_launch("one_launch:pairs",
               [&]() { return sd::launch_fused_scales<E, K, kF, D>(pol, pair_c, a, st, "x"); });
    one_launch("one_launch:tiny",
               [&]() { return sd::launch_fused_scales<E, K, kF, D>(pol, tiny_c, a, st, "x"); });
    time("parts:pair_scales", [&]() {
      only_pair_scales<E, K, D>
          <<<D / 256 * psp.parts, sd::kPairThreads, 0, st>>>(a.sort, a.quant, psp);
      return int(cudaGetLastError());
    });
    time("parts:pair_zero", [&]() {
      only_pair_zero<E, K, D><<<psp.z_blocks, sd::kPairThreads, 0, st>>>(a.sort, psp);
      return int(cudaGetLastError());
    });
  }
  if (n <= sd::kTinyThreads) {
    time("parts:scales", [&]() {
      only_scales<E, K, D><<<D / 256 * tsp.parts, sd::kTinyThreads, 0, st>>>(a.sort, a.quant, tsp);
      return int(cudaGetLastError());
    });
    time("parts:zero", [&]() {
      only_zero<E, K, D><<<tsp.z_blocks, sd::kTinyThreads, 0, st>>>(a.sort, tsp);
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
  for (int m : {1, 2, 4, 7, 16, 64}) {
    decode_case<257, 9, 7168>(m);
    decode_case<896, 16, 3584>(m);
    decode_case<513, 11, 2560>(m);
    decode_case<256, 8, 7168>(m);
  }
  return 0;
}
