// CPU copies between pageable memory and the staging buffers.
#pragma once
#include <cstddef>

namespace cmt {

// memcpy, or with CMT_COPY=stream non-temporal (streaming) stores where the CPU has AVX2: the
// destination's cache lines are then not read first, which saves memory traffic when the
// staging ring does not fit in the last-level cache.
void copy_stream(void* dst, const void* src, size_t n);

}  // namespace cmt
