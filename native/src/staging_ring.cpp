#include "staging_ring.hpp"

#include <sys/mman.h>

#include "log.hpp"
#include "node_budget.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// Pins `bytes` for a slot. The pages are faulted in (and zeroed by the kernel) here, outside the
// driver, and then registered: a real driver's calls, the program's copies among them, wait while
// it pins, and registering pages already there holds it for a fraction of what cuMemHostAlloc does
// (64 MiB registered in 2 ms on the H200; cuMemHostAlloc pinned 112 MiB in 53-69 ms on the H100,
// docs/engine-findings.md, "First use"). Registered pages copy at the same rate. Where either step
// fails, cuMemHostAlloc. `before_driver` (if given) runs just before the driver's part.
// `map_ns` and `driver_ns` gather the time of each part, for the setup's debug line.
bool pin(const Driver& d, Slot* slot, size_t bytes, void (*before_driver)(), uint64_t* map_ns, uint64_t* driver_ns) {
  uint64_t t = monotonic_ns();
  auto lap = [&t](uint64_t* into) {
    const uint64_t now = monotonic_ns();
    *into += now - t;
    t = now;
  };
  if (d.cuMemHostRegister) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    lap(map_ns);
    if (p != MAP_FAILED) {
      madvise(p, bytes, MADV_DONTFORK);  // a forked child gets none of it: no copy-on-write of pinned pages
      if (before_driver) before_driver();
      const bool registered = d.cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
      lap(driver_ns);
      if (registered) {
        slot->mem = p;
        slot->registered = true;
        return true;
      }
      munmap(p, bytes);
      log::debug_once(0x91aee, "staging could not be registered with the driver: it is pinned by cuMemHostAlloc");
    }
  }
  slot->registered = false;
  if (before_driver) before_driver();
  const bool allocated = d.cuMemHostAlloc(&slot->mem, bytes, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS;
  lap(driver_ns);
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
  while (count_ < slots) {
    if (!take_pinned(slot_bytes_)) {
      log::debug_once(0x91aed, "the node's budget of pinned staging (%ld MiB, CMT_NODE_PINNED_MB) is spent: "
                      "copies that need more staging go to the driver", node_pinned_budget_mib());
      return false;
    }
    if (!pin(d_, &slots_[count_], slot_bytes_, before_each, &map_ns_, &pin_ns_)) {
      give_pinned(slot_bytes_);
      return false;
    }
    ++count_;
  }
  return true;
}

}  // namespace cmt
