#include "staging_ring.hpp"

#include "log.hpp"
#include "node_budget.hpp"

namespace cmt {

bool StagingRing::ensure(int slots, size_t bytes, void (*before_each)()) {
  if (slot_bytes_ < bytes) {  // larger blocks than before: replace the buffers
    for (int s = 0; s < count_; ++s) {
      if (slots_[s].last_event) d_.cuEventSynchronize(slots_[s].last_event);
      slots_[s].last_event = nullptr;
      d_.cuMemFreeHost(slots_[s].mem);
      give_pinned(slot_bytes_);
    }
    count_ = 0;
    slot_bytes_ = bytes;
  }
  while (count_ < slots) {
    if (!take_pinned(slot_bytes_)) {
      log::debug_once(0x91aed, "the node's budget of pinned staging (%ld MiB, CMT_NODE_PINNED_MB) is spent: "
                      "copies that need more staging go to the driver", node_pinned_budget_mib());
      return false;
    }
    if (before_each) before_each();
    // Portable pinned memory. (The engine's own memory on transparent
    // huge pages, registered, measured the same: docs/engine-findings.md.)
    if (d_.cuMemHostAlloc(&slots_[count_].mem, slot_bytes_, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
      give_pinned(slot_bytes_);
      return false;
    }
    ++count_;
  }
  return true;
}

}  // namespace cmt
