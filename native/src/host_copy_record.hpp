// What `cmt profile` records of a host copy (host_copy.hpp) at or above the plan's threshold: its
// time, size and outcome, which of the interposed functions made it, and the shared object that
// called it. The interposed functions only pass their return address on their large-copy branch;
// caller_object.hpp names it, on the recording path alone.
#pragma once
#include <cstddef>
#include <cstdint>

#include "types.hpp"

namespace cmt {

// The interposed function a host copy came through; a record's `entry` is kEntryCount + this, and
// the recording's `entries` names them after the driver's entry points.
enum class HostCall : uint8_t { Memcpy, Memmove, MemcpyChk, MemmoveChk, Memset, MemsetChk };
constexpr int kHostCalls = 6;
const char* host_call_name(HostCall c);

// Records one host copy; `caller` is the interposed function's return address (nullptr: unknown).
void record_host_copy(uint64_t start_ns, uint64_t end_ns, size_t bytes, Outcome o, HostCall call,
                      const void* caller);

}  // namespace cmt
