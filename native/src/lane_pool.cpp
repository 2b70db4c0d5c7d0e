#include "lane_pool.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "env.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// How long idle workers spin before sleeping: back-to-back copies (a model's tensors) then start
// without a futex wake-up per worker (13-40 µs on the H200 host, against 2.5-12 spinning).
Clock::duration spin_time() { return std::chrono::microseconds(env().spin_us); }

// Spinning workers offer their CPU to other threads this often: a thread of the program, or a lane
// of the next copy, that the scheduler put on this CPU would otherwise wait for the whole spin.
constexpr std::chrono::microseconds kSpinYield{50};

}  // namespace

void LanePool::run(int lanes, Work work, void* arg, Clock::duration spin_tail) {
  while (workers_ < lanes - 1) start_worker(++workers_);
  if (lanes > 1) {
    work_ = work;
    arg_ = arg;
    spin_tail_ = spin_tail;
    uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> 8) + 1;
    door_.store(gen << 16, std::memory_order_release);  // open, nobody inside
    ticket_.store((gen << 8) | static_cast<uint64_t>(lanes), std::memory_order_release);
    { std::lock_guard<std::mutex> wake(wake_mutex_); }
    wake_cv_.notify_all();
  }
  work(arg, 0);
  if (lanes > 1) {
    door_.fetch_or(kDoorClosed, std::memory_order_acq_rel);
    Backoff backoff;
    while ((door_.load(std::memory_order_acquire) & (kDoorClosed - 1)) != 0) backoff.pause();
    // the workers' spin runs from now
    returned_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    returned_gen_.store(ticket_.load(std::memory_order_relaxed) >> 8, std::memory_order_release);
  }
}

void LanePool::start_worker(int index) {
  // Workers take no signals: the program's handlers run on its own threads, as without cmt.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  uint64_t seen = ticket_.load(std::memory_order_relaxed) >> 8;
  std::thread([this, index, seen] { worker_main(index, seen); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

bool LanePool::enter(uint64_t gen) {
  uint64_t d = door_.load(std::memory_order_acquire);
  while ((d >> 16) == (gen << 16 >> 16) && !(d & kDoorClosed)) {
    if (door_.compare_exchange_weak(d, d + 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void LanePool::worker_main(int index, uint64_t seen) {
  char name[16];
  snprintf(name, sizeof name, "cmt-copy-%d", index);
  pthread_setname_np(pthread_self(), name);
  const auto late_start = std::chrono::microseconds(env().test_late_start_us);
  bool spin = false;  // only a worker the last run used spins for the next: idle ones leave the CPUs to the lanes
  Clock::duration tail{};  // the last run's spin_tail
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if ((t >> 8) == seen) {
      // Spin until spin_time() + tail after the run returned, yielding every kSpinYield.
      Clock::time_point next_yield = Clock::now() + kSpinYield;
      while (spin && (ticket_.load(std::memory_order_acquire) >> 8) == seen) {
        Clock::time_point now = Clock::now();
        if (returned_gen_.load(std::memory_order_acquire) == seen &&
            now >= Clock::time_point(Clock::duration(returned_at_.load(std::memory_order_relaxed))) + spin_time() + tail) {
          break;
        }
        if (now >= next_yield) {
          sched_yield();
          next_yield = now + kSpinYield;
        }
        cpu_relax();
      }
      spin = false;
      std::unique_lock<std::mutex> lock(wake_mutex_);
      wake_cv_.wait(lock, [&] { return (ticket_.load(std::memory_order_acquire) >> 8) != seen; });
      continue;
    }
    seen = t >> 8;
    spin = index < static_cast<int>(t & 0xff);
    if (spin && late_start.count()) std::this_thread::sleep_for(late_start);
    if (!spin || !enter(seen)) continue;  // not needed for this run, or it no longer needs this worker
    work_(arg_, index);
    tail = spin_tail_;  // read before the run may end and the next one replace it
    leave();
  }
}

}  // namespace cmt
