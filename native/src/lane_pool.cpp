#include "lane_pool.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "env.hpp"
#include "host_copy.hpp"
#include "node_budget.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// How long idle workers spin before sleeping: back-to-back copies (a model's tensors) then start
// without a futex wake-up per worker (13-40 µs on the H200 host, against 2.5-12 spinning).
Clock::duration spin_time() { return std::chrono::microseconds(env().spin_us); }

// Spinning workers offer their CPU to other threads this often: a thread of the program, or a lane
// of the next copy, that the scheduler put on this CPU would otherwise wait for the whole spin.
constexpr std::chrono::microseconds kSpinYield{50};

constexpr uint64_t kInside = (uint64_t(1) << 15) - 1;

thread_local LanePool::Run* t_run = nullptr;  // the run this thread is a lane of

}  // namespace

bool LanePool::add(Run* run) {
  std::lock_guard<std::mutex> lock(start_mutex_);
  int n = run_count_.load(std::memory_order_relaxed);
  if (n == kMaxRuns) return false;
  runs_[n] = run;
  run->pool = this;
  run_count_.store(n + 1, std::memory_order_release);
  return true;
}

void LanePool::prestart(int workers) {
  std::lock_guard<std::mutex> lock(start_mutex_);
  while (workers_.load(std::memory_order_relaxed) < workers) {
    start_worker(workers_.fetch_add(1, std::memory_order_relaxed) + 1);
  }
}

void LanePool::run(Run& r, int lanes, Work work, void* arg, Clock::duration spin_tail) {
  // Workers as the node's budget allows (node_budget.hpp); a run always has its caller.
  int short_by = 0;
  const int taken = take_lanes(lanes - 1, r.follows_shares ? &short_by : nullptr);
  r.held.store(taken, std::memory_order_relaxed);
  r.short_by.store(short_by, std::memory_order_relaxed);
  // A run that lacks lanes keeps its door open for those that come free meanwhile.
  const bool open = taken > 0 || short_by > 0;
  if (open) {
    r.work = work;
    r.arg = arg;
    r.spin_tail = spin_tail;
    r.wanted.store(0, std::memory_order_relaxed);
    const uint64_t gen = (r.door.load(std::memory_order_relaxed) >> 32) + 1;
    r.door.store(gen << 32, std::memory_order_release);  // open, nobody inside
    admit(r, taken);
  }
  Run* outer = t_run;
  t_run = &r;
  work(arg, 0);
  t_run = outer;
  if (open) {
    r.door.fetch_or(kDoorClosed, std::memory_order_acq_rel);
    Backoff backoff;
    while ((r.door.load(std::memory_order_acquire) & kInside) != 0) backoff.pause();
    // the workers' spin runs from now
    r.returned_at.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    r.returned_gen.store(r.door.load(std::memory_order_relaxed) >> 32, std::memory_order_release);
  }
  // Every worker has left: what the run holds now is what it took, took up and did not let go.
  const int held = r.held.load(std::memory_order_relaxed);
  workers_busy_.fetch_sub(held, std::memory_order_relaxed);
  give_lanes(held, r.short_by.load(std::memory_order_relaxed));
}

void LanePool::admit(Run& r, int more) {
  if (more <= 0) return;
  const int busy = workers_busy_.fetch_add(more, std::memory_order_relaxed) + more;
  if (workers_.load(std::memory_order_relaxed) < busy) prestart(busy);
  r.wanted.fetch_add(more, std::memory_order_release);
  ticket_.fetch_add(1, std::memory_order_release);
  { std::lock_guard<std::mutex> wake(wake_mutex_); }
  wake_cv_.notify_all();
}

bool LanePool::between_pieces(int lane) {
  Run* r = t_run;
  if (!r || !r->pool) return true;
  if (lane == 0) {
    if (r->short_by.load(std::memory_order_relaxed) > 0) {
      if (const int got = take_more_lanes(r->short_by.load(std::memory_order_relaxed)); got > 0) {
        r->short_by.fetch_sub(got, std::memory_order_relaxed);
        r->held.fetch_add(got, std::memory_order_relaxed);
        r->pool->admit(*r, got);
      }
    }
    return true;
  }
  if (!lane_over_share()) return true;
  r->held.fetch_sub(1, std::memory_order_relaxed);
  r->short_by.fetch_add(1, std::memory_order_relaxed);
  r->pool->workers_busy_.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

void LanePool::start_worker(int index) {
  // Workers take no signals: the program's handlers run on its own threads, as without cmt.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread([this, index] { worker_main(index); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

LanePool::Run* LanePool::enter_any(int* lane, uint64_t* gen) {
  const int n = run_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Run* r = runs_[i];
    uint64_t d = r->door.load(std::memory_order_acquire);
    while (!(d & kDoorClosed) && ((d >> 16) & 0xffff) < static_cast<uint64_t>(r->wanted.load(std::memory_order_relaxed))) {
      if (r->door.compare_exchange_weak(d, d + (uint64_t(1) << 16) + 1, std::memory_order_acq_rel)) {
        *lane = static_cast<int>((d >> 16) & 0xffff) + 1;
        *gen = d >> 32;
        return r;
      }
    }
  }
  return nullptr;
}

void LanePool::worker_main(int index) {
  mark_cmt_thread();  // a worker's large memcpy calls are libc's (host_copy.hpp)
  char name[16];
  snprintf(name, sizeof name, "cmt-copy-%d", index);
  pthread_setname_np(pthread_self(), name);
  numa_worker_start();
  int node = kNumaUnknown;
  const auto late_start = std::chrono::microseconds(env().test_late_start_us);
  Run* served = nullptr;  // the last run this worker took part in, and its generation: it spins after it
  uint64_t served_gen = 0;
  Clock::duration tail{};
  uint64_t seen = ~uint64_t(0);
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if (t != seen) {
      seen = t;
      if (late_start.count() && run_count_.load(std::memory_order_relaxed)) std::this_thread::sleep_for(late_start);
      int lane = 0;
      uint64_t gen = 0;
      if (Run* r = enter_any(&lane, &gen)) {
        numa_follow(r->place, &node);
        t_run = r;
        r->work(r->arg, lane);
        t_run = nullptr;
        tail = r->spin_tail;  // read before the run may end and its next copy replace it
        leave(r);
        served = r;
        served_gen = gen;
        seen = ~uint64_t(0);  // look again at once: another run may want workers
      }
      continue;
    }
    // Spin until spin_time() + tail after the run this worker served returned, yielding every
    // kSpinYield; then sleep until a run starts.
    Clock::time_point next_yield = Clock::now() + kSpinYield;
    while (served && ticket_.load(std::memory_order_acquire) == seen) {
      Clock::time_point now = Clock::now();
      if (served->returned_gen.load(std::memory_order_acquire) == served_gen &&
          now >= Clock::time_point(Clock::duration(served->returned_at.load(std::memory_order_relaxed))) +
                     spin_time() + tail) {
        break;
      }
      if (now >= next_yield) {
        sched_yield();
        next_yield = now + kSpinYield;
      }
      cpu_relax();
    }
    served = nullptr;
    std::unique_lock<std::mutex> lock(wake_mutex_);
    wake_cv_.wait(lock, [&] { return ticket_.load(std::memory_order_acquire) != seen; });
  }
}

}  // namespace cmt
