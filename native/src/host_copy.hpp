// Large copies between two host buffers, split over the engine's threads. Several libraries stage
// their own host<->device copies (safetensors, CuPy, JAX): they memcpy into a pinned buffer of
// theirs with one thread, then hand the driver a pinned copy, so cmt's copy path never sees the
// slow part. Under `cmt run` the library's memcpy, memmove and their fortified forms are cmt's:
//   - below the plan's threshold (the first staged "h2h" rule), one compare and the libc function;
//   - above it, the copy's pieces go to the lane pool (the calling thread is lane 0), faulting a
//     never-touched destination in as they go, and return once every byte is copied.
// The plain path serves everything cmt cannot do safely: calls before the library is initialised,
// from cmt's own threads (and thus from a signal handler that interrupts them), in a forked child,
// overlapping ranges, while another host copy holds the pool, and while the rate guard finds the
// threads slower than one memcpy on a busy host (rate_guard.hpp).
// memset and __memset_chk likewise, where the destination was never touched: the lanes fault it in
// on huge pages and fill it (a library's fresh host buffer is faulted in 4 KiB at a time by one
// thread otherwise); any other large fill is libc's (host_copy.cpp, staged_fill).
// Under `cmt profile` every copy above the threshold is recorded with its outcome and the library
// that called it (host_copy_record.hpp).
#pragma once
#include <cstddef>

namespace cmt {

class Plan;

// Resolves libc's own functions and arms the threshold (the library's constructor).
void host_copy_init();
// The plan in force changed: its host-copy threshold with it.
void host_copy_plan_changed(const Plan& plan);

struct Settings;
// One host copy for the C API (benchmarks, the tuner): staged with `forced` settings as given, or
// as the plan decides (nullptr); returns the Outcome. Overlapping ranges are moved as memmove does.
int host_copy_call(void* d, const void* s, size_t n, const Settings* forced);

// Marks the calling thread as inside cmt (its copy path, its workers): its large copies take the
// plain path, so that cmt never waits for itself.
struct InsideCmt {
  InsideCmt();
  ~InsideCmt();
  bool outer;
};
void mark_cmt_thread();
bool inside_cmt();  // whether the calling thread is (large_read.cpp)

}  // namespace cmt
