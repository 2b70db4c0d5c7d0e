#include "staging_ring.hpp"

namespace cmt {

bool StagingRing::ensure(int slots, size_t bytes) {
  if (slot_bytes_ < bytes) {  // larger blocks than before: replace the buffers
    for (int s = 0; s < count_; ++s) {
      if (slots_[s].last_event) d_.cuEventSynchronize(slots_[s].last_event);
      slots_[s].last_event = nullptr;
      d_.cuMemFreeHost(slots_[s].mem);
    }
    count_ = 0;
    slot_bytes_ = bytes;
  }
  while (count_ < slots) {
    // Portable pinned memory. (The engine's own memory on transparent
    // huge pages, registered, measured the same: docs/engine-findings.md.)
    if (d_.cuMemHostAlloc(&slots_[count_].mem, slot_bytes_, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return false;
    ++count_;
  }
  return true;
}

}  // namespace cmt
