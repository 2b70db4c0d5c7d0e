#include "setup_pacing.hpp"

#include <atomic>
#include <chrono>
#include <thread>

#include "spin.hpp"

namespace cmt {
namespace {

// The program's copies in cmt's hands (CopyInFlight) that the setup waits for, and how many have
// ended so far. They are counted only while a pipeline is being set up (g_preparing): the rest of
// the time an intercepted copy pays one load of a line nobody writes.
std::atomic<int> g_preparing{0};
std::atomic<int> g_copies_in_flight{0};
std::atomic<uint64_t> g_copies_ended{0};
thread_local bool t_in_copy = false;    // this thread is inside an intercepted copy
thread_local bool t_in_flight = false;  // and it counts in g_copies_in_flight

void count_in_flight() {
  t_in_flight = true;
  g_copies_in_flight.fetch_add(1, std::memory_order_acq_rel);
}

std::atomic<uint64_t> g_setup_paused_ns{0};  // the pauses ended so far
std::atomic<uint64_t> g_pause_since_ns{0};   // when the pause under way began (0: none)
// A copy that takes longer gets a buffer pinned under it. Registering one 8 MiB buffer holds the
// driver for about 0.25 ms (2 ms per 64 MiB, H200), so a copy loses little; a pause of up to 500 ms
// let back-to-back large copies starve the setup (H100, 2026-12-06: CuPy's five 1 GiB `get()`s
// were all passed to the driver, one buffer pinned after each).
constexpr uint64_t kMaxSetupPauseNs = 5'000'000;

}  // namespace

void let_copies_through() {
  if (g_copies_in_flight.load(std::memory_order_acquire) == 0) return;
  const uint64_t ended = g_copies_ended.load(std::memory_order_acquire);
  const uint64_t start = monotonic_ns();
  g_pause_since_ns.store(start, std::memory_order_release);
  while (g_copies_in_flight.load(std::memory_order_acquire) > 0 &&
         g_copies_ended.load(std::memory_order_acquire) == ended && monotonic_ns() - start < kMaxSetupPauseNs) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const uint64_t end = monotonic_ns();
  g_pause_since_ns.store(0, std::memory_order_release);
  g_setup_paused_ns.fetch_add(end - start, std::memory_order_acq_rel);
}

// A pause under way counts up to now: a copy that comes during one must not take it for the setup's
// work (Engine::may_wait_for_setup).
uint64_t setup_paused_ns() {
  const uint64_t since = g_pause_since_ns.load(std::memory_order_acquire);
  const uint64_t ended = g_setup_paused_ns.load(std::memory_order_acquire);
  const uint64_t now = since ? monotonic_ns() : 0;
  return ended + (since && now > since ? now - since : 0);
}

void setup_begins() {
  g_preparing.fetch_add(1, std::memory_order_acq_rel);
  // The copy that starts it was not counted (nothing was being set up): its setup waits for it too.
  if (t_in_copy && !t_in_flight) count_in_flight();
}

void setup_ends() { g_preparing.fetch_sub(1, std::memory_order_acq_rel); }

NotInFlight::NotInFlight() {
  if (t_in_flight) g_copies_in_flight.fetch_sub(1, std::memory_order_acq_rel);
}
NotInFlight::~NotInFlight() {
  if (t_in_flight) g_copies_in_flight.fetch_add(1, std::memory_order_acq_rel);
}

CopyInFlight::CopyInFlight() {
  if (t_in_copy) return;  // inside another: that one counts
  owner_ = t_in_copy = true;
  if (g_preparing.load(std::memory_order_acquire) > 0) count_in_flight();
}
CopyInFlight::~CopyInFlight() {
  if (!owner_) return;
  t_in_copy = false;
  if (!t_in_flight) return;
  t_in_flight = false;
  g_copies_ended.fetch_add(1, std::memory_order_acq_rel);
  g_copies_in_flight.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace cmt
