// What `cmt profile` records of the program's calls that pin host memory or let it go
// (entry_points.def's ENTRY_PIN): each call's time, its size and the shared object that made it.
// Pinning costs milliseconds per 16 MiB (the kernel faults the pages in, the driver maps them for
// the GPU), so a library that pins a fresh buffer for each transfer may spend more there than in its
// copies, which cmt cannot speed up; the profile shows where. cmt's own staging is pinned through
// the driver's functions directly, and is not recorded.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cmt/cuda_types.hpp"

namespace cmt {

enum class PinCall : uint8_t { HostAlloc, AllocHost, Register, FreeHost, Unregister };
constexpr int kPinCalls = 5;
const char* pin_call_name(PinCall c);

// Records one call (the hooks call it only while recording). `ptr`: the memory pinned (a pinning
// call that succeeded) or let go; `bytes`: the size asked for, 0 for a release (the size of the
// pinning it ends is looked up, where that was recorded). `caller`: the hook's return address.
void record_pin_call(PinCall call, uint64_t start_ns, uint64_t end_ns, const void* ptr, size_t bytes,
                     CUresult result, const void* caller);

}  // namespace cmt
