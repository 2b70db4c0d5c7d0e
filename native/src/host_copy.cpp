#include "host_copy.hpp"

#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "copy_path.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "host_copy_record.hpp"
#include "plan.hpp"
#include "prefault.hpp"
#include "rate_guard.hpp"
#include "recorder.hpp"
#include "stats.hpp"
#include "transfer_plan.hpp"

#define API_EXPORT extern "C" __attribute__((visibility("default")))

namespace cmt {
namespace {

using CopyFn = void* (*)(void*, const void*, size_t);
using CheckedCopyFn = void* (*)(void*, const void*, size_t, size_t);
using FillFn = void* (*)(void*, int, size_t);
using CheckedFillFn = void* (*)(void*, int, size_t, size_t);

// Before libc's functions are resolved (other libraries' constructors can copy before ours runs,
// and dlsym itself copies): a plain forward or backward loop, `rep movsb` where the CPU has it.
// (No loop-to-memcpy transformation in these: it would call back here.)
#define NO_LIBCALL __attribute__((optimize("no-tree-loop-distribute-patterns")))

NO_LIBCALL void* early_copy(void* d, const void* s, size_t n) {
#if defined(__x86_64__)
  void* dst = d;
  asm volatile("rep movsb" : "+D"(dst), "+S"(s), "+c"(n) : : "memory");
#else
  auto* dp = static_cast<unsigned char*>(d);
  auto* sp = static_cast<const unsigned char*>(s);
  for (size_t i = 0; i < n; ++i) dp[i] = sp[i];
#endif
  return d;
}

NO_LIBCALL void* early_move(void* d, const void* s, size_t n) {
  auto* dp = static_cast<unsigned char*>(d);
  auto* sp = static_cast<const unsigned char*>(s);
  if (dp <= sp || dp >= sp + n) return early_copy(d, s, n);
  for (size_t i = n; i-- > 0;) dp[i] = sp[i];
  return d;
}

NO_LIBCALL void* early_fill(void* d, int c, size_t n) {
#if defined(__x86_64__)
  void* dst = d;
  asm volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(c) : "memory");
#else
  auto* dp = static_cast<unsigned char*>(d);
  for (size_t i = 0; i < n; ++i) dp[i] = static_cast<unsigned char>(c);
#endif
  return d;
}

void* early_checked_copy(void* d, const void* s, size_t n, size_t room) {
  if (n > room) abort();  // what glibc's __chk_fail does, without its message
  return early_copy(d, s, n);
}

void* early_checked_move(void* d, const void* s, size_t n, size_t room) {
  if (n > room) abort();
  return early_move(d, s, n);
}

void* early_checked_fill(void* d, int c, size_t n, size_t room) {
  if (n > room) abort();
  return early_fill(d, c, n);
}

CopyFn g_memcpy = early_copy;
CopyFn g_memmove = early_move;
CheckedCopyFn g_memcpy_chk = early_checked_copy;
CheckedCopyFn g_memmove_chk = early_checked_move;
FillFn g_memset = early_fill;
CheckedFillFn g_memset_chk = early_checked_fill;

// Copies below this take the plain path at once; SIZE_MAX until the library is initialised.
std::atomic<size_t> g_threshold{SIZE_MAX};

thread_local bool t_inside = false;

// A copy (s given) or a fill with byte `c` (s nullptr) of n bytes, in pieces.
struct HostCopyJob {
  char* d;
  const char* s;
  int c;
  size_t n, piece;
  bool fresh;
  std::atomic<size_t> next{0};
};

void copy_pieces(void* arg, int /*lane*/) {
  auto& j = *static_cast<HostCopyJob*>(arg);
  for (;;) {
    const size_t off = j.next.fetch_add(j.piece, std::memory_order_relaxed);
    if (off >= j.n) break;
    const size_t len = std::min(j.piece, j.n - off);
    if (j.fresh) populate(j.d + off, len);
    if (j.s) g_memcpy(j.d + off, j.s + off, len);
    else g_memset(j.d + off, j.c, len);
  }
}

// Splits a copy (or a fill: s nullptr) of n bytes over the lane pool; false when the pool is not to
// be had. `fresh`: the destination was never touched (prepare_fresh_destination), so the lanes fault
// it in ahead of each piece.
bool copy_on_lanes(char* d, const char* s, int c, size_t n, bool fresh, const Settings& st) {
  HostCopyJob job{d, s, c, n, std::clamp<size_t>(static_cast<size_t>(st.chunk_bytes), kMinChunk, n), fresh};
  const int lanes = static_cast<int>(std::min<size_t>(std::clamp<int64_t>(st.threads, 1, kMaxThreads),
                                                      (n + job.piece - 1) / job.piece));
  return engine_host_lanes(lanes, &copy_pieces, &job);
}

bool overlap(const void* d, const void* s, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(d), b = reinterpret_cast<uintptr_t>(s);
  return a < b + n && b < a + n;
}

// Why a large host call must be libc's in this process (a forked child, CMT_DISABLE), or
// Accelerated where cmt may take it.
Outcome process_allows() {
  return in_forked_child() ? Outcome::ForkedChild : copies_disabled() ? Outcome::Disabled : Outcome::Accelerated;
}

// A copy the plan (or `forced` settings, for the C API) may stage: over the lanes, or the plain
// function; the outcome is counted and returned.
Outcome staged_copy(void* d, const void* s, size_t n, CopyFn plain, const Settings* forced) {
  const Outcome plain_only = overlap(d, s, n) ? Outcome::Overlapping : process_allows();
  if (plain_only != Outcome::Accelerated) {
    plain(d, s, n);
    return plain_only;
  }
  InsideCmt inside;
  const Rule& rule = active_plan().lookup(Direction::HtoH, n);
  Outcome o = Outcome::BelowMinimum;
  if (forced) {
    o = Outcome::Accelerated;  // measured as given: no guard
  } else if (!rule.pass) {
    o = guard_decide(Direction::HtoH, n) == Verdict::Stage ? Outcome::Accelerated : Outcome::BackedOff;
  }
  if (o == Outcome::Accelerated) {
    const uint64_t start = monotonic_ns();
    const bool fresh = prepare_fresh_destination(static_cast<char*>(d), n);
    if (copy_on_lanes(static_cast<char*>(d), static_cast<const char*>(s), 0, n, fresh, forced ? *forced : rule.settings)) {
      if (!forced) guard_staged(Direction::HtoH, n, monotonic_ns() - start);
      record(Direction::HtoH, o, n);
      return o;
    }
    o = Outcome::Resources;  // another host copy has the pool
  }
  driver_copy(o, Direction::HtoH, n, [&] {
    plain(d, s, n);
    return CUDA_SUCCESS;
  });
  record(Direction::HtoH, o, n);
  return o;
}

// A large memset (the program's, or a library's around its own staging: XLA's fresh host buffers
// took 4 KiB page faults at about 2 GB/s in one thread on the lent VMs, 2026-12-07). Only a
// destination never touched is split over the lanes, which fault it in on huge pages ahead of each
// piece, in parallel; one already faulted in is libc's memset, as fast as a fill gets in one thread
// (outcome `touched`). So there is no rate guard here: the lanes only take what one thread would
// fault in page by page. Pinned memory is resident (`touched`); no driver query is made, since a
// real driver's calls wait while another thread pins memory (cmt's setup among them).
Outcome staged_fill(void* d, int c, size_t n) {
  Outcome o = process_allows();
  if (o == Outcome::Accelerated) {
    InsideCmt inside;
    const Rule& rule = active_plan().lookup(Direction::HtoH, n);
    if (rule.pass) o = Outcome::BelowMinimum;
    else if (!prepare_fresh_destination(static_cast<char*>(d), n)) o = Outcome::Touched;
    else if (!copy_on_lanes(static_cast<char*>(d), nullptr, c, n, true, rule.settings)) o = Outcome::Resources;
  }
  if (o != Outcome::Accelerated) g_memset(d, c, n);
  record(Direction::HtoH, o, n);
  return o;
}

// `cmt profile`: the copy (or fill) timed and recorded with its outcome and the object that called it.
template <typename Staged, typename Plain>
__attribute__((noinline)) void recorded(size_t n, Staged staged, Plain plain, HostCall call, const void* caller) {
  const uint64_t start = now_ns();
  Outcome o = Outcome::NoDriver;
  if (driver().ok) o = staged();
  else plain();
  const uint64_t end = now_ns();
  InsideCmt inside;  // the recorder's own copies (a new block, the file's header) are plain
  record_host_copy(start, end, n, o, call, caller);
}

// The interposer's copies and fills at or above the threshold. Only in processes that use CUDA (the
// libraries that stage their own copies): a CPU-only program under `cmt run` keeps its copies and gets
// no threads (`cmt profile` records them as no_driver); and never from cmt's own threads.
template <typename Staged, typename Plain>
void large_call(size_t n, Staged staged, Plain plain, HostCall call, const void* caller) {
  if (t_inside) {
    plain();
  } else if (__builtin_expect(recording(), 0)) {
    recorded(n, staged, plain, call, caller);
  } else if (driver().ok) {
    staged();
  } else {
    plain();
  }
}

void* large_copy(void* d, const void* s, size_t n, CopyFn plain, HostCall call, const void* caller) {
  large_call(n, [&] { return staged_copy(d, s, n, plain, nullptr); }, [&] { plain(d, s, n); }, call, caller);
  return d;
}

void* large_fill(void* d, int c, size_t n, HostCall call, const void* caller) {
  large_call(n, [&] { return staged_fill(d, c, n); }, [&] { g_memset(d, c, n); }, call, caller);
  return d;
}

template <typename Fn>
Fn resolve(const char* name, Fn fallback) {
  void* p = real_dlsym(RTLD_NEXT, name);
  return p ? reinterpret_cast<Fn>(p) : fallback;
}

}  // namespace

InsideCmt::InsideCmt() : outer(!t_inside) { t_inside = true; }
InsideCmt::~InsideCmt() {
  if (outer) t_inside = false;
}
void mark_cmt_thread() { t_inside = true; }
bool inside_cmt() { return t_inside; }

void host_copy_init() {
  g_memcpy = resolve<CopyFn>("memcpy", early_copy);
  g_memmove = resolve<CopyFn>("memmove", early_move);
  g_memcpy_chk = resolve<CheckedCopyFn>("__memcpy_chk", early_checked_copy);
  g_memmove_chk = resolve<CheckedCopyFn>("__memmove_chk", early_checked_move);
  g_memset = resolve<FillFn>("memset", early_fill);
  g_memset_chk = resolve<CheckedFillFn>("__memset_chk", early_checked_fill);
  host_copy_plan_changed(active_plan());
}

int host_copy_call(void* d, const void* s, size_t n, const Settings* forced) {
  if (!forced && n < g_threshold.load(std::memory_order_relaxed)) {
    g_memmove(d, s, n);
    return static_cast<int>(Outcome::BelowMinimum);
  }
  return static_cast<int>(staged_copy(d, s, n, g_memmove, forced));
}

void host_copy_plan_changed(const Plan& plan) {
  g_threshold.store(plan.stages_from(Direction::HtoH), std::memory_order_relaxed);
}

}  // namespace cmt

using cmt::g_threshold;
using cmt::HostCall;

// The program's (and its libraries') copies. Below the threshold: one compare, then libc's own.
// Above it the return address goes along: `cmt profile` names the library that made the copy.
API_EXPORT void* memcpy(void* d, const void* s, size_t n) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1)) return cmt::g_memcpy(d, s, n);
  return cmt::large_copy(d, s, n, cmt::g_memcpy, HostCall::Memcpy, __builtin_return_address(0));
}

API_EXPORT void* memmove(void* d, const void* s, size_t n) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1)) return cmt::g_memmove(d, s, n);
  return cmt::large_copy(d, s, n, cmt::g_memmove, HostCall::Memmove, __builtin_return_address(0));
}

// The _FORTIFY_SOURCE forms: libc's own checks the destination's room, as without cmt.
API_EXPORT void* __memcpy_chk(void* d, const void* s, size_t n, size_t room) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1) || n > room) {
    return cmt::g_memcpy_chk(d, s, n, room);
  }
  return cmt::large_copy(d, s, n, cmt::g_memcpy, HostCall::MemcpyChk, __builtin_return_address(0));
}

API_EXPORT void* __memmove_chk(void* d, const void* s, size_t n, size_t room) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1) || n > room) {
    return cmt::g_memmove_chk(d, s, n, room);
  }
  return cmt::large_copy(d, s, n, cmt::g_memmove, HostCall::MemmoveChk, __builtin_return_address(0));
}

// Large fills: a never-touched destination is faulted in and filled on the lanes (staged_fill).
API_EXPORT void* memset(void* d, int c, size_t n) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1)) return cmt::g_memset(d, c, n);
  return cmt::large_fill(d, c, n, HostCall::Memset, __builtin_return_address(0));
}

API_EXPORT void* __memset_chk(void* d, int c, size_t n, size_t room) {
  if (__builtin_expect(n < g_threshold.load(std::memory_order_relaxed), 1) || n > room) {
    return cmt::g_memset_chk(d, c, n, room);
  }
  return cmt::large_fill(d, c, n, HostCall::MemsetChk, __builtin_return_address(0));
}
