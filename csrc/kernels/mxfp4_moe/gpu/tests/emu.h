// Test-only host emulation of the GPU kernels of ../ (no GPU needed).
//
// Include this header before gpu/mxfp4_moe_aux_gpu.h.  Every launch runs on
// the CPU: the blocks one after another (in a shuffled order), the threads of
// a block as cooperative fibers.  A thread runs until it reaches a
// warp or block primitive of hip_compat.h (ballot, shuffle, warp_sync,
// block_sync), where it waits for the other threads of its warp / block; the
// order in which threads are resumed is shuffled on every sweep, so a missing
// warp_sync / block_sync between a shared-memory write and another thread's
// read shows up as a wrong result.  Divergent warp collectives (lanes of one
// warp at different kinds of primitive) and deadlocks (a thread that exits
// while others wait at a barrier) abort with a message.
//
// The PDL points of target_ops.h (pdl_wait, pdl_launch_dependents) are recorded per
// thread: Emu::pdl counts, over the launches since the last reset_pdl(), the threads that
// ran, waited once, and triggered once after waiting, so the self-test can check that a
// kernel reaches both on every path (emu_selftest.cpp check_pdl).
//
// The warp size is AITER_AUX_EMU_WARP (32 or 64; default 32), so one test
// source covers both the NVIDIA and the CDNA shapes of every kernel.
// Device pointers are plain host pointers.  fp32 arithmetic is the host's
// (compile with -ffp-contract=off and without -ffast-math).
//
// A fiber's first entry goes through makecontext / swapcontext (its own stack); every
// later switch is a _setjmp / _longjmp pair, which, unlike swapcontext, does not save and
// restore the signal mask with a system call (that call was ~40 % of the self-test's time).
#pragma once

// A fiber switch _longjmps to another stack, which glibc's fortified longjmp (_FORTIFY_SOURCE,
// which some distributions' compilers define by default) aborts as "longjmp causes
// uninitialized stack frame".  This header comes first, before any system header.
#undef _FORTIFY_SOURCE

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#ifndef AITER_AUX_EMU_WARP
#define AITER_AUX_EMU_WARP 32
#endif
#if AITER_AUX_EMU_WARP != 32 && AITER_AUX_EMU_WARP != 64
#error "AITER_AUX_EMU_WARP must be 32 or 64"
#endif

#define AITER_AUX_GPU_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}

struct aiter_aux_emu_stream;
typedef aiter_aux_emu_stream* hipStream_t;
typedef int hipError_t;
#define hipSuccess 0
inline hipError_t hipGetLastError() {
  return hipSuccess;
}
inline const char* hipGetErrorString(hipError_t) {
  return "no error";
}

namespace aiter_aux_emu {

#if AITER_AUX_EMU_WARP == 64
typedef uint64_t lane_mask_t;
#else
typedef uint32_t lane_mask_t;
#endif
constexpr int kWarp = AITER_AUX_EMU_WARP;

enum Kind { kBallot = 1, kShfl = 2, kWarpSync = 3 };

struct WarpState {
  uint64_t val[64];
  int src[64];
  uint64_t res[64];
  int arrived = 0;
  int kind = 0;
  uint64_t gen = 0;
};

struct Fiber {
  ucontext_t ctx;  // the first entry
  jmp_buf jb;      // where the fiber resumes after a yield
  bool started = false;
  bool done = false;
  int waits = 0;     // pdl_wait calls
  int triggers = 0;  // pdl_launch_dependents calls
  bool trigger_before_wait = false;
};

// Threads of the launches since the last reset_pdl(): all of them, those that called
// pdl_wait exactly once, and those that called pdl_launch_dependents exactly once, after
// their wait.
struct PdlCounts {
  uint64_t threads = 0, waited = 0, triggered = 0;
};

struct Emu {
  ucontext_t main_ctx;
  jmp_buf main_jb;  // the scheduler, resumed by a yield or a finished fiber
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<WarpState> warps;
  std::function<void()> body;
  int nthreads = 0;
  int cur = 0;
  int block = 0;
  int bar_arrived = 0;
  uint64_t bar_gen = 0;
  uint64_t progress = 0;
  uint64_t launches = 0;
  PdlCounts pdl;
  std::mt19937 rng{20240601u};
};

inline Emu& emu() {
  static Emu e;
  return e;
}

inline int thread_idx() {
  return emu().cur;
}
inline int block_idx() {
  return emu().block;
}

inline void yield_now() {
  Emu& e = emu();
  if (_setjmp(e.fibers[e.cur].jb) == 0) _longjmp(e.main_jb, 1);
}

[[noreturn]] inline void die(const char* msg) {
  fprintf(stderr, "aiter_aux emu: %s (block %d, thread %d)\n", msg, emu().block, emu().cur);
  abort();
}

// All lanes of the warp post (kind, v, src); once the last one arrives every
// lane gets its result.
inline uint64_t warp_exchange(int kind, uint64_t v, int src) {
  Emu& e = emu();
  const int lane = e.cur % kWarp;
  WarpState& w = e.warps[e.cur / kWarp];
  if (w.arrived == 0) {
    w.kind = kind;
  } else if (w.kind != kind) {
    die("divergent warp collective");
  }
  w.val[lane] = v;
  w.src[lane] = src;
  const uint64_t gen = w.gen;
  e.progress++;
  if (++w.arrived == kWarp) {
    if (kind == kBallot) {
      uint64_t m = 0;
      for (int l = 0; l < kWarp; ++l) m |= (w.val[l] != 0 ? uint64_t(1) : uint64_t(0)) << l;
      for (int l = 0; l < kWarp; ++l) w.res[l] = m;
    } else if (kind == kShfl) {
      for (int l = 0; l < kWarp; ++l) {
        const int s = w.src[l];
        if (s < 0 || s >= kWarp) die("shuffle source lane out of range");
        w.res[l] = w.val[s];
      }
    }
    w.arrived = 0;
    w.gen++;
  } else {
    while (w.gen == gen) yield_now();
    e.progress++;
  }
  return w.res[lane];
}

inline uint64_t ballot(bool pred) {
  return warp_exchange(kBallot, pred ? 1 : 0, 0);
}
inline uint32_t shfl(uint32_t v, int src_lane) {
  return static_cast<uint32_t>(warp_exchange(kShfl, v, src_lane));
}
inline void warp_barrier() {
  warp_exchange(kWarpSync, 0, 0);
}

inline void block_barrier() {
  Emu& e = emu();
  const uint64_t gen = e.bar_gen;
  e.progress++;
  if (++e.bar_arrived == e.nthreads) {
    e.bar_arrived = 0;
    e.bar_gen++;
  } else {
    while (e.bar_gen == gen) yield_now();
    e.progress++;
  }
}

inline float mul_rn(float a, float b) {
  volatile float p = a * b;  // volatile: never contracted with a later add
  return p;
}
inline float add_rn(float a, float b) {
  volatile float s = a + b;
  return s;
}

inline void pdl_wait() {
  emu().fibers[emu().cur].waits++;
}

inline void pdl_launch_dependents() {
  Fiber& f = emu().fibers[emu().cur];
  if (f.waits == 0) f.trigger_before_wait = true;
  f.triggers++;
}

inline void reset_pdl() {
  emu().pdl = PdlCounts();
}

inline void fiber_entry() {
  Emu& e = emu();
  e.body();
  Fiber& f = e.fibers[e.cur];
  f.done = true;
  e.pdl.threads++;
  e.pdl.waited += f.waits == 1;
  e.pdl.triggered += f.triggers == 1 && !f.trigger_before_wait;
  e.progress++;
  _longjmp(e.main_jb, 1);  // never returns: the stack is abandoned
}

inline void run_block(int block, int nthreads) {
  Emu& e = emu();
  const size_t kStack = 256 * 1024;
  if (static_cast<int>(e.stacks.size()) < nthreads) e.stacks.resize(nthreads);
  e.fibers.assign(nthreads, Fiber());
  e.warps.assign((nthreads + kWarp - 1) / kWarp, WarpState());
  e.nthreads = nthreads;
  e.block = block;
  e.bar_arrived = 0;
  for (int i = 0; i < nthreads; ++i) {
    if (e.stacks[i].size() < kStack) e.stacks[i].resize(kStack);
    Fiber& f = e.fibers[i];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = e.stacks[i].data();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &e.main_ctx;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  std::vector<int> order(nthreads);
  std::iota(order.begin(), order.end(), 0);
  int remaining = nthreads;
  while (remaining > 0) {
    std::shuffle(order.begin(), order.end(), e.rng);
    const uint64_t before = e.progress;
    for (int i : order) {
      if (e.fibers[i].done) continue;
      e.cur = i;
      Fiber& f = e.fibers[i];
      if (_setjmp(e.main_jb) == 0) {
        if (f.started) _longjmp(f.jb, 1);
        f.started = true;
        swapcontext(&e.main_ctx, &f.ctx);  // first entry; comes back through main_jb
      }
      if (f.done) --remaining;
    }
    if (remaining > 0 && e.progress == before) die("deadlock: threads wait at a barrier forever");
  }
}

inline void run_grid(unsigned grid, unsigned block, const std::function<void()>& body) {
  Emu& e = emu();
  if (grid == 0 || block == 0) die("empty launch (invalid configuration)");
  if (block % kWarp != 0) die("block size is not a multiple of the warp size");
  e.launches++;
  e.body = body;
  std::vector<int> blocks(grid);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), e.rng);
  for (int b : blocks) run_block(b, static_cast<int>(block));
  e.body = nullptr;
}

template <class K>
struct Launch {
  K* kern;
  dim3 grid, block;
  template <class... A>
  void operator()(A... args) const {
    if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1) die("only 1-D launches");
    K* k = kern;
    run_grid(grid.x, block.x, [&]() { k(args...); });
  }
};

template <class K>
Launch<K> make_launch(K* kern, dim3 grid, dim3 block, hipStream_t) {
  return Launch<K>{kern, grid, block};
}

}  // namespace aiter_aux_emu
