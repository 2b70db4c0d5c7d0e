// The few types every part of the native core shares: a copy's direction, the settings that
// stage it (one table, SETTINGS_TABLE, that the plan's text form, the C API and Python's schema
// are all generated from), what kind of host memory it touched, and what cmt did with it.
#pragma once
#include <cstddef>
#include <climits>
#include <cstdint>

namespace cmt {

// HtoH: a large memcpy/memmove between two host buffers (or a memset of fresh memory) that the
// program (or a library staging its own copies) makes; cmt splits it over its threads (host_copy.hpp).
enum class Direction : int { HtoD = 0, DtoH = 1, HtoH = 2 };
constexpr int kDirections = 3;
constexpr int kGpuDirections = 2;  // HtoD and DtoH: the ones with a GPU, staging and DMAs
inline const char* direction_name(Direction d) {
  return d == Direction::HtoD ? "h2d" : d == Direction::DtoH ? "d2h" : "h2h";
}

constexpr int kMaxThreads = 64;
constexpr int kMaxBuffers = 64;

// Every tuning setting of a staged copy: X(name, min, max, default, choices, what). `default` is
// what a plan that leaves the setting out gets (kRequired: it may not leave it out). `choices` is
// "" for a number, else the names of the values 0, 1, ... separated by '|'.
// Adding a setting here adds it to the plan's text form, the C API's struct and the schema that
// Python validates tuned files against (cmt_settings_schema); the engine then has to use it.
constexpr int64_t kRequired = INT64_MIN;
#define SETTINGS_TABLE(X)                                                                          \
  X(threads, 1, kMaxThreads, kRequired, "", "worker threads, the calling thread included")      \
  X(buffers, 1, kMaxBuffers, kRequired, "", "pinned staging buffers in the ring: DMAs in flight") \
  X(chunk_bytes, 4096, int64_t(256) << 20, kRequired, "", "bytes per staging buffer and per DMA") \
  X(stores, 0, 1, 0, "cached|stream", "how the threads write (h2d) or read (d2h) staging buffers: " \
                                      "cached stores, or non-temporal (streaming) ones")

// Laid out as int64 fields in table order: the C API hands this struct across as it is.
struct Settings {
#define X_ITEM(name, lo, hi, dflt, choices, what) int64_t name = 0;
  SETTINGS_TABLE(X_ITEM)
#undef X_ITEM
};
constexpr int64_t kStoresStream = 1;  // Settings::stores

// What the host side of a copy is (as far as the decision had to find out).
enum class HostKind : unsigned char { Unknown = 0, Pageable = 1, Pinned = 2, Managed = 3, Device = 4 };

// What stream 0 means for an entry point.
enum class DefaultStream { Legacy, PerThread };

// What happened to a host<->device copy: X(id, name, explanation); the explanation is what
// CMT_LOG=debug prints the first time.
#define OUTCOME_TABLE(X)                                                                        \
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
  X(Resources, "resources", "staging buffers, streams or events could not be created")        \
  X(BackedOff, "backed_off", "staged copies of this size ran slower than the driver's own on this busy host (rate_guard.hpp)") \
  X(Warming, "warming", "the staging pipeline for this GPU was still being set up (its first milliseconds)") \
  X(PipelinesBusy, "pipelines_busy", "a small copy while another thread's copy had this GPU's staging pipeline") \
  X(Overlapping, "overlapping", "a host copy whose source and destination overlap: libc's memmove") \
  X(FromFile, "from_file", "the source is a file mapping not in the page cache: the lanes read the file (mapped_copy.hpp)") \
  X(Touched, "touched", "a large memset of memory already faulted in: libc's memset, as fast in one thread")

enum class Outcome : int {
#define X_ITEM(id, name, text) id,
  OUTCOME_TABLE(X_ITEM)
#undef X_ITEM
      Count
};
constexpr int kOutcomes = static_cast<int>(Outcome::Count);

// Whether cmt itself did the copy (else the driver's own function is to run).
inline bool copied_by_cmt(Outcome o) { return o == Outcome::Accelerated || o == Outcome::FromFile; }

}  // namespace cmt
