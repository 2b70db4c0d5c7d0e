// What happened to each host<->device copy cmt saw: accelerated, or passed through and why.
#pragma once
#include <cstddef>
#include <string>

#include "plan.hpp"

namespace cmt {

// X(id, name, explanation) -- the explanation is what CMT_LOG=debug prints the first time.
#define CMT_OUTCOMES(X)                                                                        \
  X(Accelerated, "accelerated", "staged through the multi-threaded pinned pipeline")          \
  X(Disabled, "disabled", "CMT_DISABLE is set")                                                \
  X(ForkedChild, "forked_child", "this process was forked after cmt loaded; CUDA state is not inherited") \
  X(BelowMinimum, "below_minimum", "the plan passes copies of this size to the driver")       \
  X(NoDriver, "no_driver", "a driver entry point cmt needs is missing")                       \
  X(NoContext, "no_context", "no current context; the driver reports its own error")          \
  X(PinnedHost, "pinned_host", "host memory is pinned or registered: the driver's DMA is already direct") \
  X(ManagedMemory, "managed", "managed memory is left to the driver")                         \
  X(NotHostDevice, "not_host_device", "cuMemcpy between two host or two device buffers")     \
  X(DeviceRange, "device_range", "the device range is not one allocation of this context; the driver reports it") \
  X(Capturing, "capturing", "the stream is being captured into a graph")                      \
  X(StreamContext, "stream_context", "the stream could not be used from this context")        \
  X(Resources, "resources", "staging buffers, streams or events could not be created")

enum class Outcome : int {
#define CMT_X(id, name, text) id,
  CMT_OUTCOMES(CMT_X)
#undef CMT_X
      Count
};
constexpr int kOutcomes = static_cast<int>(Outcome::Count);

const char* outcome_name(Outcome o);
const char* outcome_text(Outcome o);

// Counts a copy; logs the outcome once per direction at debug level.
void record(Direction d, Outcome o, size_t bytes);

// {"h2d": {"accelerated": [copies, bytes], ...}, "d2h": {...}}
std::string stats_json();

// Prints the counters to stderr at exit when CMT_STATS=1 (registered on first use).
void enable_exit_report();

}  // namespace cmt
