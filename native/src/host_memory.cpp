#include "host_end.hpp"

#include <algorithm>

#include "fast_copy.hpp"
#include "prefault.hpp"

namespace cmt {

CUresult HostMemory::fill(char* staging, size_t off, size_t len, bool streaming) {
  copy_stream(staging, base_ + off, len, streaming);
  return CUDA_SUCCESS;
}

CUresult HostMemory::drain(const char* staging, size_t off, size_t len, bool streaming) {
  copy_stream(base_ + off, staging, len, streaming);
  return CUDA_SUCCESS;
}

// Faults in the destination up to `upto` + the lookahead in 2 MiB units, each claimed by one lane:
// the faults overlap the DMAs and no two lanes fault the same pages.
void HostMemory::prepare_drain(size_t upto) {
  if (!prefault_) return;
  upto = std::min(upto + kFaultLookahead, bytes_);
  size_t u = fault_next_.load(std::memory_order_relaxed);
  while (u < upto) {
    if (fault_next_.compare_exchange_weak(u, u + kFaultUnit)) {
      populate(base_ + u, std::min(kFaultUnit, bytes_ - u));
      u += kFaultUnit;
    }
  }
}

}  // namespace cmt
