#include "staging_ring.hpp"

#include <sys/mman.h>

#include "log.hpp"
#include "node_budget.hpp"
#include "staging_memory.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// Pins a slot: registers `mapped` (map_staging's; nullptr if it could not) with the driver. A real
// driver's calls, the program's copies among them, wait while it pins, and registering pages
// already there holds it for a fraction of what cuMemHostAlloc does (64 MiB registered in 2 ms on
// the H200; cuMemHostAlloc pinned 112 MiB in 53-69 ms on the H100, docs/engine-findings.md, "First
// use"). Registered pages copy at the same rate. Where either step fails, cuMemHostAlloc.
// `before_driver` (if given) runs just before the driver's part, whose time gathers in `driver_ns`.
bool pin(const Driver& d, Slot* slot, size_t bytes, void* mapped, void (*before_driver)(), uint64_t* driver_ns) {
  if (mapped) {
    if (before_driver) before_driver();
    const uint64_t t = monotonic_ns();
    const bool registered = d.cuMemHostRegister(mapped, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
    *driver_ns += monotonic_ns() - t;
    if (registered) {
      slot->mem = mapped;
      slot->registered = true;
      return true;
    }
    munmap(mapped, bytes);
    log::debug_once(0x91aee, "staging could not be registered with the driver: it is pinned by cuMemHostAlloc");
  }
  slot->registered = false;
  if (before_driver) before_driver();
  const uint64_t t = monotonic_ns();
  const bool allocated = d.cuMemHostAlloc(&slot->mem, bytes, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS;
  *driver_ns += monotonic_ns() - t;
  return allocated;
}

void unpin(const Driver& d, Slot* slot, size_t bytes) {
  if (slot->registered) {
    d.cuMemHostUnregister(slot->mem);
    munmap(slot->mem, bytes);
  } else {
    d.cuMemFreeHost(slot->mem);
  }
  slot->mem = nullptr;
}

}  // namespace

void StagingRing::abandon() {
  for (int s = 0; s < count_; ++s) {
    if (slots_[s].registered) {
      d_.cuMemHostUnregister(slots_[s].mem);  // (fails where the context took the registration with it)
      munmap(slots_[s].mem, slot_bytes_);
    }
    slots_[s].mem = nullptr;
    slots_[s].last_event = nullptr;
    give_pinned(slot_bytes_);
  }
  count_ = 0;
  slot_bytes_ = 0;
  pins_.store(0, std::memory_order_release);  // a later setup's progress starts afresh
  pinned_.store(0, std::memory_order_release);
}

bool StagingRing::ensure(int slots, size_t bytes, void (*before_each)()) {
  if (slot_bytes_ < bytes) {  // larger blocks than before: replace the buffers
    for (int s = 0; s < count_; ++s) {
      if (slots_[s].last_event) d_.cuEventSynchronize(slots_[s].last_event);
      slots_[s].last_event = nullptr;
      unpin(d_, &slots_[s], slot_bytes_);
      give_pinned(slot_bytes_);
    }
    count_ = 0;
    slot_bytes_ = bytes;
  }
  // The node's budget first, then every new buffer mapped at once, then each registered in turn.
  int granted = 0;
  while (count_ + granted < slots && take_pinned(slot_bytes_)) ++granted;
  const bool all = count_ + granted >= slots;
  if (!all) {
    log::debug_once(0x91aed, "the node's budget of pinned staging (%ld MiB, CMT_NODE_PINNED_MB) is spent: "
                    "copies that need more staging go to the driver", node_pinned_budget_mib());
  }
  void* mapped[kMaxSlots] = {};
  const uint64_t t = monotonic_ns();
  if (d_.cuMemHostRegister) reserved_ += map_staging(mapped, granted, slot_bytes_, device_, any_);
  map_ns_ += monotonic_ns() - t;
  pinned_.store(0, std::memory_order_release);
  pinned_ns_.store(0, std::memory_order_release);
  pins_.store(granted, std::memory_order_release);
  const uint64_t pin_ns_before = pin_ns_;
  for (int i = 0; i < granted; ++i) {
    if (!pin(d_, &slots_[count_], slot_bytes_, mapped[i], before_each, &pin_ns_)) {
      for (int j = i; j < granted; ++j) {  // this one (cuMemHostAlloc failed too) and the rest
        if (j > i && mapped[j]) munmap(mapped[j], slot_bytes_);
        give_pinned(slot_bytes_);
      }
      return false;
    }
    ++count_;
    pinned_ns_.store(pin_ns_ - pin_ns_before, std::memory_order_release);
    pinned_.store(i + 1, std::memory_order_release);
  }
  return all;
}

}  // namespace cmt
