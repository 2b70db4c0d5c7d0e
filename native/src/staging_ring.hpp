// The staging ring: portable pinned buffers (slots) that the lanes fill or drain while the copy
// engine DMAs others. Each pipeline of the engine has its own. Each slot remembers its last DMA's
// event and, for the copy in flight, which of its rounds (block b uses slot b % slots in round
// b / slots) have been queued and finished.
#pragma once
#include <atomic>
#include <cstddef>

#include "driver.hpp"
#include "types.hpp"

namespace cmt {

constexpr int kMaxSlots = kMaxBuffers;

struct Slot {
  void* mem = nullptr;
  CUevent last_event = nullptr;        // the slot's most recent DMA (any context)
  std::atomic<long> issued{-1};        // last round of this copy whose DMA was queued
  std::atomic<long> known_done{-1};    // last round whose DMA is known finished
  std::atomic<long> sync_claimed{-1};  // last round a lane has taken on to wait for in the driver
  std::atomic<int> pending{0};         // pieces of the current round still to fill / drain
};

class StagingRing {
 public:
  // At least `slots` buffers of at least `bytes` each. Buffers too small are replaced (after their
  // last DMA); false if pinned memory could not be had.
  bool ensure(int slots, size_t bytes);
  // Readies the first `slots` slots for a new copy whose first round has `pieces_in(s)` pieces.
  template <typename PiecesIn>
  void start_copy(int slots, PiecesIn pieces_in) {
    for (int s = 0; s < slots; ++s) {
      slots_[s].issued.store(-1, std::memory_order_relaxed);
      slots_[s].known_done.store(-2, std::memory_order_relaxed);
      slots_[s].sync_claimed.store(-2, std::memory_order_relaxed);
      slots_[s].pending.store(pieces_in(s), std::memory_order_relaxed);
    }
  }
  Slot& operator[](int i) { return slots_[i]; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Which end of the slots the last device-to-host copy used (place_transfer turns it over).
  bool* flipped() { return &flipped_; }

 private:
  const Driver& d_ = driver();
  Slot slots_[kMaxSlots];
  int count_ = 0;
  size_t slot_bytes_ = 0;
  bool flipped_ = false;
};

}  // namespace cmt
