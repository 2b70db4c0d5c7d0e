#include "rate_guard.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "log.hpp"

namespace cmt {
namespace {

constexpr int kClasses = 48;                          // power-of-two size classes
constexpr uint64_t kRemeasureNs = 200'000'000;        // the driver's rate is measured at most this often,
constexpr uint64_t kRemeasureCloseNs = 2'000'000;     // (staging close to the driver: one measure on a busy
                                                      // host is noisy, and a short sweep needs a second)
constexpr double kMeasureShare = 20;                  // and once per this many pass-through copies' time
constexpr size_t kSecondAtOnce = 16u << 20;           // (the second measurement, rate_guard.hpp)
constexpr uint32_t kLearnCopies = 3;                  // staged copies before the known rate is trusted
constexpr uint32_t kProbeFirst = 8;                   // while backed off, one copy in this many is staged,
constexpr uint32_t kProbeMost = 256;                  // twice as few after each probe that lost,
constexpr uint64_t kProbeAfterNs = 250'000'000;       // but at least one this often (large copies),
constexpr uint64_t kProbeAfterMostNs = 2'000'000'000; // twice as long after each probe that lost, up to this
constexpr double kMargin = 1.1;                       // a probe must beat the driver by this much
constexpr double kSuspect = 0.5;                      // below this share of the best rate: measure the driver
constexpr double kWeight = 0.25;                      // of a new sample in the moving rate

// Races between threads only blur the figures, never a copy: every field is a relaxed atomic.
struct SizeClass {
  std::atomic<double> staged{0}, best{0}, driver{0};  // bytes per ns
  std::atomic<uint64_t> driver_at{0};                 // when the driver was last measured
  std::atomic<uint32_t> driver_n{0};                  // and how often
  std::atomic<uint32_t> staged_n{0};                  // staged copies timed (not probes)
  std::atomic<bool> backed_off{false};
  std::atomic<uint32_t> passes{0};                    // copies passed since backing off or the last probe
  std::atomic<uint32_t> probe_every{kProbeFirst};
  std::atomic<uint64_t> probe_at{0};                  // when the last probe was staged
  std::atomic<uint64_t> probe_after{kProbeAfterNs};   // and how long after it the next one is due at most
};
SizeClass g_classes[kGuarded][kClasses];
std::atomic<uint64_t> g_backed_off{0}, g_staged_again{0};

SizeClass& of(Guarded g, size_t bytes) {
  int c = bytes ? 63 - __builtin_clzll(bytes) : 0;
  return g_classes[static_cast<int>(g)][c < kClasses ? c : kClasses - 1];
}

// For the debug log: what backs off, and to what.
std::string what(Guarded g, size_t bytes) {
  const std::string size = std::to_string(size_t(1) << (63 - __builtin_clzll(bytes))) + "+ bytes";
  if (g == Guarded::FileRead) return "large file reads of " + size;
  return std::string(direction_name(static_cast<Direction>(g))) + " copies of " + size;
}
const char* plain_one(Guarded g) { return g == Guarded::FileRead ? "the single read" : "the driver"; }

double rate(size_t bytes, uint64_t ns) { return static_cast<double>(bytes) / static_cast<double>(ns ? ns : 1); }

}  // namespace

bool guard_backed_off(Guarded g, size_t bytes) { return of(g, bytes).backed_off.load(std::memory_order_relaxed); }

Verdict guard_decide(Guarded g, size_t bytes, double driver_gbps) {
  SizeClass& c = of(g, bytes);
  if (c.backed_off.load(std::memory_order_relaxed)) {
    const uint32_t every = c.probe_every.load(std::memory_order_relaxed);
    const uint64_t now = monotonic_ns();
    if (c.passes.fetch_add(1, std::memory_order_relaxed) + 1 >= every ||
        now - c.probe_at.load(std::memory_order_relaxed) >= c.probe_after.load(std::memory_order_relaxed)) {
      c.passes.store(0, std::memory_order_relaxed);
      c.probe_at.store(now, std::memory_order_relaxed);
      return Verdict::Stage;
    }
    return Verdict::PassBackedOff;
  }
  const double staged = c.staged.load(std::memory_order_relaxed);
  if (staged <= 0) return Verdict::Stage;
  const double measured = c.driver.load(std::memory_order_relaxed);
  const double driver = measured > 0 ? measured : driver_gbps;  // bytes per ns = GB/s
  // Measuring passes one copy through: a 1 GiB one costs the driver's 150 ms, so not often.
  const double cost_ns = kMeasureShare * static_cast<double>(bytes) / std::max(driver, 1.0);
  const uint64_t now = monotonic_ns();
  // The driver's first pageable copy in a process also sets up its own staging: a rate measured on
  // it is far too low, and would keep the guard from ever finding staging close to the driver
  // (H100, 12 busy threads: device-to-host 1 MiB measured once, then staged at 0.63x of plain).
  // So the first measurement is followed by a second: at once for copies up to kSecondAtOnce, and
  // for larger ones as their cost allows (two 1 GiB copies through the driver in a row cost four
  // processes copying at once on the H100 much of their rate).
  const double second_after = bytes <= kSecondAtOnce ? 0 : cost_ns;
  if (c.driver_n.load(std::memory_order_relaxed) == 1 &&
      static_cast<double>(now - c.driver_at.load(std::memory_order_relaxed)) > second_after) {
    uint32_t one = 1;
    if (c.driver_n.compare_exchange_strong(one, 2, std::memory_order_relaxed)) {
      c.driver_at.store(now, std::memory_order_relaxed);
      return Verdict::PassToMeasure;
    }
  }
  const bool fell = staged < kSuspect * c.best.load(std::memory_order_relaxed);
  const bool close = driver > 0 && staged < kMargin * driver && c.staged_n.load(std::memory_order_relaxed) >= kLearnCopies;
  if (!fell && !close) return Verdict::Stage;
  const uint64_t floor_ns = fell ? kRemeasureNs : kRemeasureCloseNs;
  if (static_cast<double>(now - c.driver_at.load(std::memory_order_relaxed)) <= std::max<double>(floor_ns, cost_ns)) {
    return Verdict::Stage;
  }
  c.driver_at.store(now, std::memory_order_relaxed);  // one thread measures
  uint32_t none = 0;
  c.driver_n.compare_exchange_strong(none, 1, std::memory_order_relaxed);
  return Verdict::PassToMeasure;
}

void guard_staged(Guarded g, size_t bytes, uint64_t ns) {
  SizeClass& c = of(g, bytes);
  const double r = rate(bytes, ns), driver = c.driver.load(std::memory_order_relaxed);
  if (c.backed_off.load(std::memory_order_relaxed)) {  // a probe
    if (r <= kMargin * driver) {  // lost: on a host that stays busy, probes cost less and less
      const uint32_t every = c.probe_every.load(std::memory_order_relaxed);
      c.probe_every.store(every < kProbeMost ? 2 * every : kProbeMost, std::memory_order_relaxed);
      const uint64_t after = c.probe_after.load(std::memory_order_relaxed);
      c.probe_after.store(std::min(2 * after, kProbeAfterMostNs), std::memory_order_relaxed);
    } else {
      c.backed_off.store(false, std::memory_order_relaxed);
      c.staged.store(r, std::memory_order_relaxed);
      g_staged_again.fetch_add(1, std::memory_order_relaxed);
      log::write(log::Level::Debug, "%s staged again: %.1f GB/s against %s's %.1f", what(g, bytes).c_str(), r,
                 plain_one(g), driver);
    }
    return;
  }
  c.staged_n.fetch_add(1, std::memory_order_relaxed);
  const double old = c.staged.load(std::memory_order_relaxed);
  const double now = old > 0 ? (1 - kWeight) * old + kWeight * r : r;
  c.staged.store(now, std::memory_order_relaxed);
  if (now > c.best.load(std::memory_order_relaxed)) c.best.store(now, std::memory_order_relaxed);
}

void guard_passed(Guarded g, size_t bytes, uint64_t ns) {
  SizeClass& c = of(g, bytes);
  // Backed off, the driver's rate stays the one the guard backed off on: these passes may not have
  // waited for their stream before the clock started (copy_path.cpp), and probes need a fixed bar.
  if (c.backed_off.load(std::memory_order_relaxed)) return;
  const double r = rate(bytes, ns);
  c.driver.store(r, std::memory_order_relaxed);
  c.driver_at.store(monotonic_ns(), std::memory_order_relaxed);
  const double staged = c.staged.load(std::memory_order_relaxed);
  if (!c.backed_off.load(std::memory_order_relaxed) && staged > 0 && staged < r) {
    c.passes.store(0, std::memory_order_relaxed);
    c.probe_at.store(monotonic_ns(), std::memory_order_relaxed);
    c.probe_every.store(kProbeFirst, std::memory_order_relaxed);
    c.probe_after.store(kProbeAfterNs, std::memory_order_relaxed);
    c.backed_off.store(true, std::memory_order_relaxed);
    g_backed_off.fetch_add(1, std::memory_order_relaxed);
    log::write(log::Level::Debug, "%s back off to %s: staged %.1f GB/s against its %.1f", what(g, bytes).c_str(),
               plain_one(g), staged, r);
  }
}

GuardEvents guard_events() { return {g_backed_off.load(), g_staged_again.load()}; }

}  // namespace cmt
