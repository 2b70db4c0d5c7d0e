#include "staging_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "copy_path.hpp"
#include "driver.hpp"
#include "env.hpp"
#include "host_copy.hpp"
#include "log.hpp"
#include "numa_place.hpp"
#include "prefault.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// Maps and faults in one slot (the kernel zeroes its pages here, outside the driver); nullptr if it
// could not.
void* map_populated(size_t bytes) {
  if (env().test_fault_us) std::this_thread::sleep_for(std::chrono::microseconds(env().test_fault_us));
  // (Transparent huge pages faulted in 2-6x faster, yet a first read was no faster: the faulting is
  // out of its way now; docs/engine-findings.md, eighth steps.)
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, MADV_DONTFORK);  // a forked child gets none of it: no copy-on-write of pinned pages
  return p;
}

// Runs share(t) for t in [0, threads), t = 0 in the calling thread. Page faults of one process run
// in parallel: several threads gain about 1.3x on the lent VMs' hosts (3.0 GB/s against 2.3 for one,
// 2026-12-06), which back fresh pages at about that rate however many threads ask. The threads
// inherit the caller's NUMA placement. Where a thread cannot start, its share runs here.
constexpr int kMapThreads = 8;
template <typename Share>
void in_threads(int n, Share share) {
  const int threads = static_cast<int>(std::clamp<long>(std::min<long>(n, usable_cpus() / 2), 1, kMapThreads));
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back([&share, t, threads] { share(t, threads); });
    } catch (const std::system_error&) {
      share(t, threads);
    }
  }
  share(0, threads);
  for (auto& h : helpers) h.join();
}

// How long a reserve that no setup took is kept once faulted in (CMT_TEST_HOOKS reserve_hold_ms).
constexpr long kReserveHoldMs = 10'000;
constexpr int kMaxReserves = 64;  // devices

// One device's staging, faulted in ahead. Under g_mutex.
struct Reserve {
  size_t bytes = 0;
  int todo = 0;                  // slots no thread has started on
  int pending = 0;               // slots not yet faulted in (todo, and those being faulted)
  int faulted = 0;               // slots faulted in
  std::vector<void*> ready;
  bool closed = false;           // taken by a setup, let go, or forgotten in a forked child
};

// Never destroyed: a reserve's thread may still wait on them while the process exits.
std::mutex& g_mutex = *new std::mutex();
std::condition_variable& g_changed = *new std::condition_variable();
constexpr int kAnySlot = kMaxReserves;  // the reserve for any device (kAnyDevice)
Reserve* g_reserves[kMaxReserves + 1] = {};
std::atomic<bool> g_device_reserve{false};  // one reserve for a device per process

void unmap_all(const std::vector<void*>& regions, size_t bytes) {
  for (void* p : regions) munmap(p, bytes);
}

std::string device_name(CUdevice dev) { return dev == kAnyDevice ? "any device" : "device " + std::to_string(dev); }

// The reserve's own thread: faults the slots in with helpers, then keeps them for a setup a while.
void fill(Reserve* r, CUdevice dev) {
  mark_cmt_thread();
  if (dev != kAnyDevice) numa_move_setup_thread(numa_place_for(dev));  // on the GPU's node, as the setup's
  const uint64_t t0 = monotonic_ns();
  int slots = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    slots = r->todo;
  }
  in_threads(slots, [r](int, int) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (r->closed || r->todo == 0) return;
        --r->todo;
      }
      void* p = map_populated(r->bytes);
      std::lock_guard<std::mutex> lock(g_mutex);
      --r->pending;
      if (p) ++r->faulted;
      if (p && r->closed) munmap(p, r->bytes);
      else if (p) r->ready.push_back(p);
      g_changed.notify_all();
    }
  });
  std::unique_lock<std::mutex> lock(g_mutex);
  log::write(log::Level::Debug, "staging for %s faulted in ahead: %d slots of %zu bytes in %.1f ms",
             device_name(dev).c_str(), r->faulted, r->bytes, static_cast<double>(monotonic_ns() - t0) / 1e6);
  const long hold = env().test_reserve_hold_ms >= 0 ? env().test_reserve_hold_ms : kReserveHoldMs;
  g_changed.wait_for(lock, std::chrono::milliseconds(hold), [r] { return r->closed; });
  if (r->closed) return;
  r->closed = true;
  std::vector<void*> left;
  left.swap(r->ready);
  lock.unlock();
  unmap_all(left, r->bytes);
  log::write(log::Level::Debug, "no setup took the staging faulted in ahead for %s within %ld ms: let go",
             device_name(dev).c_str(), hold);
}

// Up to n of the reserved slots of `bytes` in g_reserves[slot] into mem, waiting for those still
// being faulted in; closes the reserve (what is left is unmapped).
int take_reserved(void** mem, int n, size_t bytes, int slot) {
  std::vector<void*> left;
  int got = 0;
  size_t left_bytes = 0;
  {
    std::unique_lock<std::mutex> lock(g_mutex);
    Reserve* r = g_reserves[slot];
    if (!r || r->closed) return 0;
    if (r->bytes == bytes) {
      for (;;) {
        while (got < n && !r->ready.empty()) {
          mem[got++] = r->ready.back();
          r->ready.pop_back();
        }
        if (got == n || r->pending == 0) break;
        g_changed.wait(lock);
      }
    }
    r->closed = true;  // its threads start no more slots
    left.swap(r->ready);
    left_bytes = r->bytes;
    g_changed.notify_all();
  }
  unmap_all(left, left_bytes);
  return got;
}

}  // namespace

void staging_reserve_start(CUdevice dev, int slots, size_t bytes) {
  const bool any = dev == kAnyDevice;
  if ((!any && (dev < 0 || dev >= kMaxReserves)) || slots <= 0 || bytes == 0 || !env().test_reserve) return;
  if (inside_cmt() || in_forked_child() || copies_disabled()) return;
  if (!any && g_device_reserve.load(std::memory_order_relaxed)) return;  // later retains: one load
  if (any && !numa_one_node()) return;  // its pages would sit on whichever node this thread is on
  if (!any) {
    const Driver& d = driver();
    char bus[32];  // a device the driver knows (the retain of another is refused anyway)
    if (!d.cuMemHostRegister || !d.cuDeviceGetPCIBusId ||
        d.cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS) {
      return;
    }
  }
  Reserve* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const int slot = any ? kAnySlot : dev;
    if (any ? g_reserves[kAnySlot] != nullptr : g_device_reserve.exchange(true)) return;  // once per process
    r = g_reserves[slot] = new Reserve();  // never freed: a late setup may still look at it
    r->bytes = bytes;
    r->todo = r->pending = slots;
  }
  try {
    std::thread(fill, r, dev).detach();
  } catch (const std::system_error&) {
    std::lock_guard<std::mutex> lock(g_mutex);
    r->closed = true;
    r->todo = r->pending = 0;
  }
}

StagingAhead staging_ahead() {
  std::lock_guard<std::mutex> lock(g_mutex);
  StagingAhead ahead;
  for (const Reserve* r : g_reserves) {
    if (!r || r->closed) continue;
    ahead.waiting = true;
    ahead.pending_bytes += static_cast<size_t>(r->pending) * r->bytes;
  }
  return ahead;
}

int map_staging(void** mem, int n, size_t bytes, int dev, bool any) {
  int reserved = 0;
  if (dev >= 0 && dev < kMaxReserves) {
    reserved = take_reserved(mem, n, bytes, dev);
    if (any) reserved += take_reserved(mem + reserved, n - reserved, bytes, kAnySlot);
  }
  in_threads(n - reserved, [&](int t, int threads) {
    for (int i = reserved + t; i < n; i += threads) mem[i] = map_populated(bytes);
  });
  return reserved;
}

void staging_reserve_forget_after_fork() {
  // The child has one thread: a lock the parent's other threads held is made anew.
  new (&g_mutex) std::mutex();
  new (&g_changed) std::condition_variable();
  for (Reserve*& r : g_reserves) {
    if (r && !r->closed) {
      r->ready.clear();
      r->todo = r->pending = 0;
      r->closed = true;
    }
  }
}

}  // namespace cmt
