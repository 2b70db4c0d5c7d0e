// CPU copies between pageable memory and the staging buffers.
#pragma once
#include <cstddef>

namespace cmt {

// memcpy, or with `streaming` non-temporal stores where the CPU has AVX2: the destination's
// cache lines are then neither read first nor kept in cache. Which wins depends on the machine
// and the copy size (on the H200 host: streaming for host-to-device at 64 MiB, plain memcpy at
// 1 GiB), so it is a per-rule setting of the plan (Settings::stores).
void copy_stream(void* dst, const void* src, size_t n, bool streaming);

// Moves the cache lines of [p, p + n) from this core's private caches to the shared last-level
// cache (x86 CLDEMOTE, a hint: a NOP on CPUs without it; nothing elsewhere). A DMA then reads lines
// the CPU has just written without snooping them out of one core's L2.
void demote_lines(void* p, size_t n);

}  // namespace cmt
