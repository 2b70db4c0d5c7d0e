// The shared object that made an interposed call (a host copy, a pinning call), for `cmt profile`:
// named with dladdr from the interposed function's return address, on the recording path alone.
// Each calling object gets an id per process, and its path is written into the recording once, as
// name slots (recording_file.hpp).
#pragma once
#include <cstdint>

namespace cmt {

// The id of the object `caller` lies in (1-based; 0: unknown, or the table is full), and the call
// site as an offset into it (*site; the address itself where it could not be named).
uint32_t name_caller(const void* caller, uint64_t* site);

}  // namespace cmt
