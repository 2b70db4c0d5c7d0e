// The worker pool: persistent threads (lanes 1..N) that join the calling thread (lane 0) on each
// copy. A copy runs `work(lane)` on as many lanes as it asks for; the caller starts at once, and
// workers join as the scheduler wakes them.
//
// Which workers a copy waits for: a worker enters a copy only while its door is open; the caller
// closes it once it runs out of work and then waits for the workers inside alone. A worker the
// scheduler wakes late thus finds the door closed and never holds a copy up.
//
// Idle workers that took part in the last copy spin for a while before they sleep (CMT_SPIN_US,
// plus the copy's `spin_tail`), so that back-to-back copies start without a futex wake-up per
// worker; while spinning they offer their CPU to other threads every 50 µs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "types.hpp"

namespace cmt {

using Clock = std::chrono::steady_clock;

class LanePool {
 public:
  using Work = void (*)(void* arg, int lane);
  // Runs work(arg, lane) on lanes 0..lanes-1, lane 0 in the calling thread; returns once lane 0 has
  // returned and every worker that entered has left. The workers then spin for `spin_tail` beyond
  // the usual spin. One run at a time.
  void run(int lanes, Work work, void* arg, Clock::duration spin_tail);
  // A forked child has none of the parent's threads: the pool must never wait for them.
  void forget() { forked_ = true; }
  bool forgotten() const { return forked_; }

 private:
  void start_worker(int index);
  void worker_main(int index, uint64_t seen);
  bool enter(uint64_t gen);
  void leave() { door_.fetch_sub(1, std::memory_order_release); }

  int workers_ = 0;  // worker threads started (lanes 1..workers_)
  Work work_ = nullptr;
  void* arg_ = nullptr;
  Clock::duration spin_tail_{};
  std::atomic<uint64_t> ticket_{0};  // (generation << 8) | lanes of the current run
  // (generation << 16) | workers inside | kDoorClosed
  std::atomic<uint64_t> door_{0};
  static constexpr uint64_t kDoorClosed = uint64_t(1) << 15;
  std::atomic<Clock::rep> returned_at_{0};  // when the run of generation returned_gen_ returned
  std::atomic<uint64_t> returned_gen_{0};
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  std::atomic<bool> forked_{false};
};

}  // namespace cmt
