// Never slower than CUDA: the guard watches what staged copies achieve against the driver's own
// copy of the same size class, and passes copies to the driver while staging loses.
//
// On a busy host the copy threads are descheduled and staged copies slow down, sometimes below the
// driver's single-threaded copy (measured on the H200 machine with all 16 CPUs busy: device-to-host
// 1 MiB 1.2 GB/s staged against 3.2 through the driver). Per direction and power-of-two size class:
//   - staged copies keep a moving rate, and the best rate seen;
//   - once the moving rate falls below half the best, or below the driver's known rate (the plan's
//     `driver:` figure from `cmt tune`, or the last measurement) by less than kMargin, the driver's
//     rate is measured by passing one copy through: at most every kRemeasure (kRemeasureClose when
//     staging is close to the driver), and for large copies no more often than keeps that cost
//     under 5%. A host busy from the process's start never shows
//     a fall from a best, hence the known rate; where staging wins clearly nothing is measured. The
//     first measurement is followed by a second, at once up to 16 MiB: the driver's first pageable
//     copy in a process sets up its own staging, and its rate is far too low;
//   - staging below the driver's rate backs off: copies pass through (each one measuring the driver
//     again), and one copy in 8 is staged to see whether staging is faster again (one in 16, 32, ...
//     256 after each probe that lost: on a host that stays busy the probes cost less and less; and
//     one at least every 250 ms, so that large copies find out soon when the host is quiet again,
//     twice as long after each probe that lost, up to 2 s: copies spaced 250 ms or more apart were
//     otherwise all probes, and a 1 GiB probe on a busy host cost about 40 ms more than the driver's copy);
//   - a probe faster than the driver by kMargin stages again.
// CMT_LOG=debug says when a class backs off and when it stages again; CMT_STATS counts both.
#pragma once
#include <time.h>

#include <cstddef>
#include <cstdint>

#include "cmt/cuda_types.hpp"
#include "spin.hpp"
#include "types.hpp"

namespace cmt {


enum class Verdict { Stage, PassToMeasure, PassBackedOff };

// What the guard watches: the three directions of copies, and large file reads split over the
// lanes (large_read.hpp), whose "driver" is libc's one read call.
enum class Guarded : int { HtoD = 0, DtoH = 1, HtoH = 2, FileRead = 3 };
constexpr int kGuarded = 4;
inline Guarded guarded(Direction d) { return static_cast<Guarded>(d); }

// What to do with a copy the plan stages; driver_gbps: the driver's rate the plan knows (0: none).
Verdict guard_decide(Guarded g, size_t bytes, double driver_gbps = 0);
// How long a copy took through the engine (Stage) or the driver (both Pass verdicts), in ns.
void guard_staged(Guarded g, size_t bytes, uint64_t ns);
void guard_passed(Guarded g, size_t bytes, uint64_t ns);
// Whether copies of this size go to the driver for now (but for probes): guard_decide never answers
// PassToMeasure for them.
bool guard_backed_off(Guarded g, size_t bytes);
inline bool guard_backed_off(Direction d, size_t bytes) { return guard_backed_off(guarded(d), bytes); }
inline Verdict guard_decide(Direction d, size_t bytes, double driver_gbps = 0) {
  return guard_decide(guarded(d), bytes, driver_gbps);
}
inline void guard_staged(Direction d, size_t bytes, uint64_t ns) { guard_staged(guarded(d), bytes, ns); }
inline void guard_passed(Direction d, size_t bytes, uint64_t ns) { guard_passed(guarded(d), bytes, ns); }

// Runs the driver's own copy (call_real) of a copy cmt did not stage; times it for the guard when
// the guard passed it (outcome BackedOff).
template <typename CallReal>
CUresult driver_copy(Outcome o, Direction d, size_t bytes, CallReal call_real) {
  if (o != Outcome::BackedOff) return call_real();
  const uint64_t start = monotonic_ns();
  CUresult r = call_real();
  if (r == CUDA_SUCCESS) guard_passed(d, bytes, monotonic_ns() - start);
  return r;
}

// How often classes backed off and staged again in this process.
struct GuardEvents {
  uint64_t backed_off = 0, staged_again = 0;
};
GuardEvents guard_events();

}  // namespace cmt
