// Waiting without sleeping, for the engine's threads: a pause instruction, a backoff that spins
// briefly and then yields its CPU on every round, and the clock they wait by.
#pragma once
#include <sched.h>
#include <time.h>

#include <cstdint>

namespace cmt {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// With as many lanes as CPUs, a lane preempted by any other thread would otherwise leave the
// spinning ones burning whole scheduler time slices (measured on the H200 machine: copies of
// 1 MiB taking milliseconds now and then).
// A wait that goes on past `nap_after_ns` sleeps in naps of 20 µs instead: lanes that wait
// milliseconds for their blocks' slots (a cold read, at the disk's pace) must not hold CPUs the
// program could use. Spinning, 5 lanes waiting for 4 ms DMAs burnt 1.8 of the stand-in machine's
// 2 CPUs; a warm copy's waits (a block's DMA, a fraction of a millisecond) never nap.
constexpr uint64_t kNapAfterNs = 1'000'000;
struct Backoff {
  explicit Backoff(uint64_t nap_after_ns = kNapAfterNs) : nap_after(nap_after_ns) {}
  void pause() {
    if (++spins < 512) {  // some µs
      cpu_relax();
      return;
    }
    const uint64_t now = monotonic_ns();
    if (since == 0) since = now;
    if (now - since < nap_after) {
      sched_yield();
      return;
    }
    timespec nap{0, 20000};
    nanosleep(&nap, nullptr);
  }
  int spins = 0;
  uint64_t since = 0;
  uint64_t nap_after;
};

}  // namespace cmt
