// CPU copies between pageable memory and the staging buffers.
#pragma once
#include <cstddef>

namespace cmt {

// memcpy, or with `streaming` non-temporal stores where the CPU has AVX2: the destination's
// cache lines are then neither read first nor kept in cache. Which wins depends on the machine
// and the copy size (on the H200 host: streaming for host-to-device at 64 MiB, plain memcpy at
// 1 GiB), so it is a per-rule setting of the plan. CMT_COPY=stream|memcpy overrides it.
void copy_stream(void* dst, const void* src, size_t n, bool streaming);

// Experimental (CMT_DEMOTE=1, CPUs with CLDEMOTE): pushes the staging lines a lane has just
// written or read out of its core's private caches into the shared last-level cache, so that the
// DMA that reads or overwrites them next need not snoop the core.
void demote_staging(const void* staging, size_t n);

}  // namespace cmt
