// The worker pool: persistent threads that join the calling thread (lane 0) of each copy. Several
// copies may run at once (each pipeline of the engine has its own Run); the workers are one pool
// that serves them all, within one budget of lanes. A copy runs `work(lane)` on as many lanes as
// it is granted; its caller starts at once, and workers join as the scheduler wakes them.
//
// Which workers a copy waits for: a worker enters a run only while its door is open; the caller
// closes it once it runs out of work and then waits for the workers inside alone. A worker the
// scheduler wakes late thus finds the door closed and never holds a copy up.
//
// Lanes follow the node's fair shares while copies run (between_pieces, node_budget.hpp).
//
// Idle workers that took part in a copy spin for a while after it returns before they sleep
// (CMT_SPIN_US, plus the copy's `spin_tail`), so that back-to-back copies start without a futex
// wake-up per worker; while spinning they offer their CPU to other threads every 50 µs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "numa_place.hpp"
#include "types.hpp"

namespace cmt {

using Clock = std::chrono::steady_clock;

class LanePool {
 public:
  using Work = void (*)(void* arg, int lane);
  static constexpr int kMaxRuns = 64;  // pipelines that may ever run copies (engine.cpp)

  // One copy's place in the pool: its door and what its lanes run. Owned by a pipeline, which
  // runs one copy at a time through it; registered once, never removed.
  struct Run {
    // (generation << 32) | (workers that entered << 16) | kDoorClosed | (workers inside)
    std::atomic<uint64_t> door{0};
    std::atomic<int> wanted{0};  // workers this generation takes at most
    Work work = nullptr;
    void* arg = nullptr;
    Clock::duration spin_tail{};
    std::atomic<Clock::rep> returned_at{0};  // when generation returned_gen returned
    std::atomic<uint64_t> returned_gen{0};
    const NumaPlace* place = nullptr;  // where its workers run (numa_place.hpp); nullptr: anywhere
    LanePool* pool = nullptr;
    bool follows_shares = true;    // its work calls between_pieces (a Job's lanes do)
    std::atomic<int> held{0};      // worker lanes this copy holds of the node's budget
    std::atomic<int> short_by{0};  // and lacks of its fair share (node_budget.hpp)
  };

  // Registers a run; false when kMaxRuns are registered already.
  bool add(Run* run);
  // Starts workers until there are `workers`, so that the first copies do not start them.
  void prestart(int workers);
  // Runs work(arg, lane) on up to `lanes` lanes, lane 0 in the calling thread; returns once lane 0
  // has returned and every worker that entered has left. How many lanes it gets depends on what
  // other runs hold of the budget (at least the caller's own). Workers then spin for `spin_tail`
  // beyond the usual spin.
  void run(Run& r, int lanes, Work work, void* arg, Clock::duration spin_tail);
  // Called by a copy's lanes between two pieces: its caller (lane 0) takes up lanes that came free
  // while the copy lacks its share; a worker lane whose process holds more than its share while
  // other processes lack lanes gets false, and leaves the copy (its lane given back). Other lanes
  // take the pieces it leaves.
  static bool between_pieces(int lane);
  // A forked child has none of the parent's threads: the pool must never wait for them.
  void forget() { forked_ = true; }
  bool forgotten() const { return forked_; }

 private:
  static constexpr uint64_t kDoorClosed = uint64_t(1) << 15;
  void start_worker(int index);
  void worker_main(int index);
  // Enters some open run that still wants workers; returns it (and the lane) or nullptr.
  Run* enter_any(int* lane, uint64_t* gen);
  static void leave(Run* r) { r->door.fetch_sub(1, std::memory_order_release); }
  // Opens the door of a run to more workers and wakes them.
  void admit(Run& r, int more);

  std::mutex start_mutex_;          // starting workers, registering runs
  std::atomic<int> workers_{0};     // worker threads started
  std::atomic<int> run_count_{0};
  Run* runs_[kMaxRuns] = {};
  std::atomic<int> workers_busy_{0};  // worker lanes granted to runs in progress in this process
  std::atomic<uint64_t> ticket_{0};   // counts run starts: a new one wakes the workers
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  std::atomic<bool> forked_{false};
};

}  // namespace cmt
