// Emulated self-test of moe_align_block_size_vllm / _sglang (align.h): moe_sort's kernels in
// vLLM's and SGLang's formats (sort_format.h), every path forced as in run_sort_case, against
// a plain reference written from docs/compat.md.  Included by emu_selftest.cpp after its
// helpers (make_ids, check, ...).
#pragma once

namespace {

struct AlignBufs {
  std::vector<int32_t> sti, eid, post, sc;
};

AlignBufs align_prefilled(int64_t cap, int bs, int64_t n) {
  AlignBufs b;
  b.sti.assign(cap + 3, 0x7B7B7B7B);  // 3 guard elements each
  b.eid.assign((cap + bs - 1) / bs + 3, 0x5D5D5D5D);
  b.post.assign(1 + 3, 0x4E4E4E4E);
  b.sc.assign(n + 3, 0x3F3F3F3F);
  return b;
}

// The formats (docs/compat.md): buckets of the pairs (vLLM: the expert, expert_map[id] with
// a map; SGLang: id + 1), segments padded to bs, ascending pair index inside; rows past the
// total padded with n, blocks past the used ones -1 (vLLM with labels: labels[last]).
void ref_align(const std::vector<int32_t>& ids, int e, int bs, int64_t cap, bool sglang,
               const std::vector<int32_t>* map, const std::vector<int32_t>* labels, AlignBufs& o) {
  const int nb = sglang ? e + 1 : e;
  const int64_t n = static_cast<int64_t>(ids.size());
  auto bucket = [&](int32_t id) -> int {
    if (sglang) return id >= -1 && id < e ? id + 1 : -1;
    if (id < 0 || id >= e) return -1;
    if (map == nullptr) return id;
    const int v = (*map)[id];
    return v >= 0 && v < e ? v : -1;
  };
  std::vector<int64_t> cnt(nb, 0), pos(nb);
  for (int32_t id : ids)
    if (bucket(id) >= 0) ++cnt[bucket(id)];
  int64_t total = 0;
  for (int b = 0; b < nb; ++b) {
    pos[b] = total;
    total += (cnt[b] + bs - 1) / bs * bs;
  }
  for (int64_t r = 0; r < cap; ++r) o.sti[r] = static_cast<int32_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    const int b = bucket(ids[i]);
    if (b >= 0) o.sti[pos[b]++] = static_cast<int32_t>(i);
    o.sc[i] = b >= 0 ? static_cast<int32_t>(i) : -1;
  }
  int64_t blk = 0;
  for (int b = 0; b < nb; ++b) {
    const int32_t label = sglang ? b - 1 : (labels ? (*labels)[b] : b);
    for (int64_t j = 0; j < (cnt[b] + bs - 1) / bs; ++j) o.eid[blk++] = label;
  }
  const int32_t tail = labels ? labels->back() : -1;
  for (; blk < (cap + bs - 1) / bs; ++blk) o.eid[blk] = tail;
  o.post[0] = static_cast<int32_t>(total);
}

void compare_align(const AlignBufs& got, const AlignBufs& want, const std::string& tag) {
  std::string w;
  check(same_bytes(got.post, want.post, &w), tag + ": num_tokens_post_pad " + w);
  check(same_bytes(got.sti, want.sti, &w), tag + ": sorted_token_ids " + w);
  check(same_bytes(got.eid, want.eid, &w), tag + ": expert_ids " + w);
  check(same_bytes(got.sc, want.sc, &w), tag + ": scatter_idx " + w);
}

// mode as make_ids; map_kind 0: none, 1: expert_map (sort by it), 2: block labels.  extra:
// rows beyond the op's capacity (a longer sorted_token_ids).
template <int E, bool kSglang>
void run_align_case(int64_t n, int bs, int mode, uint32_t seed, int map_kind = 0, int extra = 0) {
  namespace sd = aiter_aux::gpu::sort_detail;
  std::mt19937 rng(seed);
  std::vector<int32_t> ids = make_ids(static_cast<int>(n), 1, E, rng, mode);
  if (kSglang)
    for (auto& v : ids) v = v < -1 ? -1 : (v >= E ? E - 1 : v);  // SGLang's valid ids
  std::vector<int32_t> map(E + 2);
  for (auto& v : map) v = static_cast<int32_t>(rng() % (E + 3)) - 2;  // -2 .. E: some dropped
  const int64_t cap = (kSglang ? aiter_aux_sglang_align_capacity(n, E, bs)
                               : aiter_aux_vllm_align_capacity(n, E, bs)) +
                      extra;
  AlignBufs got = align_prefilled(cap, bs, n), want = align_prefilled(cap, bs, n);
  AiterAuxAlignArgs a = {};
  a.topk_ids = ids.data();
  a.numel = n;
  a.num_experts = E;
  a.block_size = bs;
  a.capacity = cap;
  a.sorted_token_ids = got.sti.data();
  a.expert_ids = got.eid.data();
  a.num_tokens_post_pad = got.post.data();
  a.scatter_idx = got.sc.data();
  if (map_kind == 1) {
    a.expert_map = map.data();
    a.num_global_experts = E;
  } else if (map_kind == 2) {
    a.block_expert_map = map.data();
    a.block_map_numel = static_cast<int64_t>(map.size());
  }
  const int rc = kSglang ? moe_align_block_size_sglang<E>(a, nullptr)
                         : moe_align_block_size_vllm<E>(a, nullptr);
  ref_align(ids, E, bs, cap, kSglang, map_kind == 1 ? &map : nullptr,
            map_kind == 2 ? &map : nullptr, want);
  const std::string tag = std::string(kSglang ? "align_sglang<" : "align_vllm<") +
                          std::to_string(E) + "> n=" + std::to_string(n) +
                          " bs=" + std::to_string(bs) + " mode=" + std::to_string(mode) +
                          " map=" + std::to_string(map_kind) + " extra=" + std::to_string(extra);
  check(rc == AITER_AUX_OK, tag + ": status " + std::to_string(rc) + " " + g_last_error);
  compare_align(got, want, tag);
  // Every other path that can take this n, launched directly.
  constexpr int NB = kSglang ? E + 1 : E;
  constexpr auto F = kSglang ? sd::IdFormat::Sglang : sd::IdFormat::Vllm;
  const AiterAuxQuantArgs none = {};
  constexpr QuantFormat kNone = QuantFormat::None;
  auto forced = [&](const std::string& path, auto launch) {
    AlignBufs f = align_prefilled(cap, bs, n);
    AiterAuxAlignArgs fa = a;
    fa.sorted_token_ids = f.sti.data();
    fa.expert_ids = f.eid.data();
    fa.num_tokens_post_pad = f.post.data();
    fa.scatter_idx = f.sc.data();
    const int frc = launch(sd::align_sort_args<F>(fa, NB));
    check(frc == AITER_AUX_OK, tag + " " + path + ": status " + g_last_error);
    compare_align(f, want, tag + " " + path);
  };
  const sd::SortPolicy pol = sd::host_sort_policy();
  const sd::SortProblem prob{n, 1, NB, bs, map_kind == 1, kNone, 0, false, false};
  // A block size outside moe_sort's (16, 32, 64, 128) never takes the tiny path, and the
  // pair path (its kernel of divisions) only where its blocks cover the rows
  // (choose_sort_path).
  const bool general = !aiter_aux::gpu::valid_block_m(bs);
  if (n <= sd::kPairMax && (!general || sd::pair_rows_fit(prob))) {
    const int ng = sd::pair_blocks(prob);
    forced("pairs", [&](const auto& k) {
      return sd::launch_pairs<NB, 1, kNone, 0>(k, none, nullptr, ng, "t");
    });
  }
  if (n <= kWarpSize)
    forced("micro",
           [&](const auto& k) { return sd::launch_micro<NB, 1, kNone, 0>(k, none, nullptr, "t"); });
  if (!general && n <= sd::kTinyThreads) {
    const int ng = sd::tiny_blocks(pol, prob);
    forced("tiny", [&](const auto& k) {
      return sd::launch_tiny<NB, 1, kNone, 0>(k, none, nullptr, ng, "t");
    });
  }
  for (int g : {1, sd::mid_chunks(pol, n, 8, false)}) {
    if (g > 1 && n < g) continue;
    if ((n + g - 1) / g > 65535) continue;
    forced("mid/" + std::to_string(g), [&](const auto& k) {
      return sd::launch_mid<NB, 1, kNone, 0>(k, none, nullptr, g, false, "t");
    });
  }
  if (n >= sd::large_unit(NB)) {
    const int nc = sd::large_chunks(pol, n, NB, aiter_aux::gpu::device_sm_count());
    forced("large", [&](const auto& k) {
      return sd::launch_large<NB, 1, kNone, 0>(k, none, nullptr, nc, false, "t");
    });
    if (sd::large_stage_fits(n, nc, NB))
      forced("large staged", [&](const auto& k) {
        return sd::launch_large<NB, 1, kNone, 0>(k, none, nullptr, nc, true, "t");
      });
  }
}

void test_align() {
  for (int bs : {16, 32, 64, 128}) {
    run_align_case<256, false>(1, bs, 0, 200 + bs);
    run_align_case<256, true>(7, bs, 2, 201 + bs);
    run_align_case<33, false>(500, bs, 0, 202 + bs, bs == 32 ? 1 : (bs == 64 ? 2 : 0));
    run_align_case<33, true>(3000, bs, 1, 203 + bs, 0, bs == 16 ? 40 : 0);
  }
  run_align_case<257, false>(0, 32, 0, 210);
  run_align_case<257, true>(0, 32, 0, 211);
  run_align_case<257, false>(64, 16, 4, 212, 1);  // nothing local: all rows tail
  run_align_case<257, false>(65, 16, 3, 213, 2);  // one expert
  run_align_case<896, true>(1000, 64, 2, 214);
  run_align_case<896, false>(300, 128, 0, 215, 2, 7);
  run_align_case<8, false>(20000, 16, 0, 216, 1);  // large path
  run_align_case<8, true>(20000, 64, 3, 217, 0, 100);
  run_align_case<8, true>(20000, 32, 2, 220);   // large path, bucket 0 (the -1 ids) the largest
  run_align_case<1023, true>(700, 32, 0, 218);  // 1024 buckets
  run_align_case<385, false>(8192, 128, 2, 219, 2);
  // Any block size (the peers take any; vLLM's Marlin MoE uses 8 and 48): powers of two
  // outside moe_sort's set, non-powers of two, 1, every path (micro, mid, large).
  for (int bs : {8, 48, 1, 7, 256}) {
    run_align_case<256, false>(1, bs, 0, 230 + bs);
    run_align_case<256, true>(kWarpSize, bs, 2, 231 + bs);  // micro: the most pairs
    run_align_case<33, false>(500, bs, 0, 232 + bs, bs == 8 ? 1 : (bs == 48 ? 2 : 0));
    run_align_case<33, true>(3000, bs, 1, 233 + bs, 0, bs == 48 ? 40 : 0);
  }
  // the pair path's kernel of divisions: more pairs than a warp's lanes, block size 1 (a
  // block per pair), the largest block size whose rows its blocks cover (1024 at 64 pairs),
  // and one past it (mid)
  for (int bs : {8, 48, 7, 1}) {
    run_align_case<256, false>(40, bs, 0, 250 + bs, bs == 8 ? 2 : 0);
    run_align_case<256, true>(64, bs, 2, 251 + bs, 0, bs == 7 ? 9 : 0);
    run_align_case<33, false>(kWarpSize + 1, bs, 3, 252 + bs);  // one expert
  }
  run_align_case<256, false>(64, 1024, 0, 260);
  run_align_case<256, true>(64, 1025, 1, 261);
  run_align_case<256, false>(50, 3, 4, 262, 1);    // nothing local
  run_align_case<8, false>(20000, 48, 0, 240, 1);  // large path
  run_align_case<8, true>(20000, 8, 3, 241, 0, 100);
  run_align_case<257, false>(64, 24, 4, 242, 1);  // nothing local: all rows tail
  run_align_case<1023, true>(700, 3, 0, 243);     // 1024 buckets
}

}  // namespace
