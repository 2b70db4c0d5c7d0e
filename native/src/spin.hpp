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
struct Backoff {
  int spins = 0;
  void pause() {
    if (++spins < 512) cpu_relax();  // some µs, then a yield per round
    else sched_yield();
  }
};

}  // namespace cmt
