// The staging ring: portable pinned buffers (slots) that the lanes fill or drain while the copy
// engine DMAs others. Each pipeline of the engine has its own. Each slot remembers its last DMA's
// event and, for the copy in flight, how many DMAs it has carried, how many are known finished,
// and whether a late lane may still touch it (job.hpp: such a slot is quarantined, and a spare
// takes its place).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "driver.hpp"
#include "types.hpp"

namespace cmt {

// Buffers beyond the copy's own: a slot that a descheduled lane may still write is set aside
// until that lane has left, and a spare carries its blocks meanwhile.
constexpr int kSpareSlots = 2;
constexpr int kMaxSlots = kMaxBuffers + kSpareSlots;

struct Slot {
  void* mem = nullptr;
  bool registered = false;             // mapped here and registered (else the driver's cuMemHostAlloc)
  CUevent last_event = nullptr;        // the slot's most recent DMA (any context)
  // For the copy in flight (its DMAs numbered 1, 2, ... per slot; 0 is the one before the copy):
  std::atomic<long> uses{0};           // DMAs queued
  std::atomic<long> known_done{-1};    // DMAs known finished
  std::atomic<uint64_t> known_at{0};   // when known_done last moved on (monotonic ns)
  std::atomic<long> sync_claimed{-1};  // the DMA a lane has taken on to wait for in the driver
  std::atomic<int> late{0};            // lanes whose piece was taken over and that may still touch it
  std::atomic<long> last_block{-1};    // the block of its last DMA (for CMT_TRACE)
  bool in_chain = false;               // carries a chain of blocks (else a spare); under Job's spare lock
};

class StagingRing {
 public:
  // At least `slots` buffers of at least `bytes` each. Buffers too small are replaced (after their
  // last DMA); false if pinned memory could not be had (the node's budget, node_budget.hpp, or the
  // driver), with the buffers it got kept. `before_each` (if given) runs before the driver pins each buffer.
  bool ensure(int slots, size_t bytes, void (*before_each)() = nullptr);
  int count() const { return count_; }
  // The context that pinned the buffers is gone, and its registrations and cuMemHostAlloc memory
  // with it: unmaps the buffers cmt mapped itself, touches nothing of the driver's, and gives their
  // bytes back to the node's budget. No copy may be using the ring.
  void abandon();
  // Readies `buffers` slots for a new copy; the first `chains` carry its blocks, the others are spares.
  void start_copy(int chains, int buffers) {
    for (int s = 0; s < buffers; ++s) {
      slots_[s].uses.store(0, std::memory_order_relaxed);
      slots_[s].known_done.store(-1, std::memory_order_relaxed);
      slots_[s].sync_claimed.store(-1, std::memory_order_relaxed);
      slots_[s].late.store(0, std::memory_order_relaxed);  // every late lane left with its copy
      slots_[s].in_chain = s < chains;
    }
  }
  Slot& operator[](int i) { return slots_[i]; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Time spent making buffers so far (the setup's debug line): mapping and faulting pages in, and
  // the driver's part (registering, or cuMemHostAlloc, with the pauses before each).
  uint64_t map_ns() const { return map_ns_; }
  int reserved() const { return reserved_; }  // buffers whose pages were faulted in ahead
  // The device whose staging faulted in ahead (staging_memory.hpp) the ring may take; `any`: also
  // the staging faulted in for any device (the ring is not placed on a NUMA node).
  void set_device(int dev, bool any) {
    device_ = dev;
    any_ = any;
  }
  uint64_t pin_ns() const { return pin_ns_; }
  // How far the running ensure() has got, for other threads: the buffers it pins, those pinned so
  // far, and the driver's time for them.
  struct Progress {
    int pins = 0, pinned = 0;
    uint64_t pin_ns = 0;
  };
  Progress progress() const {
    return {pins_.load(std::memory_order_acquire), pinned_.load(std::memory_order_acquire),
            pinned_ns_.load(std::memory_order_acquire)};
  }
  // Which end of the slots the last device-to-host copy used (place_transfer turns it over).
  bool* flipped() { return &flipped_; }

 private:
  const Driver& d_ = driver();
  Slot slots_[kMaxSlots];
  int count_ = 0;
  size_t slot_bytes_ = 0;
  bool flipped_ = false;
  uint64_t map_ns_ = 0, pin_ns_ = 0;
  std::atomic<int> pins_{0}, pinned_{0};
  std::atomic<uint64_t> pinned_ns_{0};
  int device_ = -1;
  bool any_ = false;
  int reserved_ = 0;
};

}  // namespace cmt
