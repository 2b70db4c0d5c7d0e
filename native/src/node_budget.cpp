#include "node_budget.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "cpu_load.hpp"
#include "env.hpp"
#include "log.hpp"
#include "prefault.hpp"

namespace cmt {
namespace {

constexpr int kSlots = 256;
constexpr uint64_t kMagic = 0x636d742d62756433;  // "cmt-bud3"

struct Slot {
  std::atomic<int32_t> pid;         // 0: free
  std::atomic<int32_t> lanes;       // worker lanes this process's copies hold
  std::atomic<int32_t> pinned_mib;  // staging this process pinned
  std::atomic<int32_t> copies;      // its copies (lane runs) in flight
};

struct Segment {
  std::atomic<uint64_t> magic;
  std::atomic<int32_t> total;         // the sum of the live slots' lanes
  std::atomic<int32_t> pinned_total;  // and of their pinned MiB
  std::atomic<int32_t> copying;       // the live slots with copies in flight
  Slot slots[kSlots];
};
static_assert(std::atomic<int32_t>::is_always_lock_free, "the segment is shared between processes");

Segment* g_segment = nullptr;
Slot* g_mine = nullptr;
int g_pid = 0;
std::mutex g_open_mutex;

bool gone(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

Segment* map_segment() {
  char name[64];
  // The layout's version is in the name: processes of another cmt version keep their own budget.
  snprintf(name, sizeof name, "/cmt-budget3-%u", static_cast<unsigned>(getuid()));
  void* p = MAP_FAILED;
  int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    // A new segment is zero-filled: every slot free, the total 0.
    if (ftruncate(fd, sizeof(Segment)) == 0) p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (p == MAP_FAILED) {
    log::write(log::Level::Debug, "no shared memory for the node's budget of copy threads (%s): this process's alone",
               name);
    p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
  }
  auto* s = static_cast<Segment*>(p);
  s->magic.store(kMagic, std::memory_order_relaxed);
  return s;
}

// Gives back the lanes of processes that are gone.
void reclaim(Segment* s) {
  for (Slot& slot : s->slots) {
    const int32_t pid = slot.pid.load(std::memory_order_acquire);
    if (pid == 0 || pid == g_pid || !gone(pid)) continue;
    int32_t lanes = slot.lanes.exchange(0, std::memory_order_acq_rel);
    if (lanes) s->total.fetch_sub(lanes, std::memory_order_acq_rel);
    int32_t pinned = slot.pinned_mib.exchange(0, std::memory_order_acq_rel);
    if (pinned) s->pinned_total.fetch_sub(pinned, std::memory_order_acq_rel);
    if (slot.copies.exchange(0, std::memory_order_acq_rel) > 0) s->copying.fetch_sub(1, std::memory_order_acq_rel);
    int32_t expected = pid;
    slot.pid.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  }
}

// This process's slot (claimed on first use, again in a forked child).
Slot* mine() {
  const int pid = static_cast<int>(getpid());
  if (g_mine && g_pid == pid) return g_mine;
  std::lock_guard<std::mutex> lock(g_open_mutex);
  if (g_mine && g_pid == pid) return g_mine;
  if (!g_segment) g_segment = map_segment();
  if (!g_segment) return nullptr;
  g_pid = pid;
  reclaim(g_segment);
  for (Slot& slot : g_segment->slots) {
    int32_t free = 0;
    if (slot.pid.compare_exchange_strong(free, pid, std::memory_order_acq_rel)) {
      slot.lanes.store(0, std::memory_order_relaxed);
      slot.pinned_mib.store(0, std::memory_order_relaxed);
      slot.copies.store(0, std::memory_order_relaxed);
      g_mine = &slot;
      return g_mine;
    }
  }
  log::write(log::Level::Debug, "the node's budget of copy threads has no free slot: this process counts alone");
  return nullptr;
}

long physical_memory_mib() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<long>((static_cast<unsigned long long>(pages) * page) >> 20) : 4096;
}

// Takes up to `wanted` (or, all_or_none, exactly `wanted` or nothing) of a budget's total, also into
// this process's slot; reclaims the shares of processes that are gone when short.
int32_t take(std::atomic<int32_t> Segment::*total_of, std::atomic<int32_t> Slot::*mine_of, int32_t budget,
             int32_t wanted, bool all_or_none) {
  Slot* slot = mine();
  if (wanted <= 0) return 0;
  if (!slot) return std::min(wanted, budget);
  Segment* s = g_segment;
  std::atomic<int32_t>& total = s->*total_of;
  int32_t used = total.load(std::memory_order_acquire);
  if (used + wanted > budget) {  // short: is some of it held by processes that are gone?
    reclaim(s);
    used = total.load(std::memory_order_acquire);
  }
  int32_t granted;
  do {
    granted = std::clamp(budget - used, 0, wanted);
    if (all_or_none && granted < wanted) return 0;
  } while (granted && !total.compare_exchange_weak(used, used + granted, std::memory_order_acq_rel));
  if (granted) (slot->*mine_of).fetch_add(granted, std::memory_order_acq_rel);
  return granted;
}

void give(std::atomic<int32_t> Segment::*total_of, std::atomic<int32_t> Slot::*mine_of, int32_t taken) {
  if (taken <= 0 || !g_mine || g_pid != static_cast<int>(getpid())) return;
  (g_mine->*mine_of).fetch_sub(taken, std::memory_order_acq_rel);
  (g_segment->*total_of).fetch_sub(taken, std::memory_order_acq_rel);
}

int32_t in_use(std::atomic<int32_t> Segment::*total_of) {
  if (!mine()) return 0;
  reclaim(g_segment);
  return (g_segment->*total_of).load(std::memory_order_acquire);
}

int32_t mib(size_t bytes) { return static_cast<int32_t>((bytes + (size_t(1) << 20) - 1) >> 20); }

}  // namespace

int node_budget() {
  static const int budget = env().node_threads > 0 ? static_cast<int>(env().node_threads) : static_cast<int>(usable_cpus());
  return budget;
}

// A copy takes at most a fair share: the budget over the processes copying now, this one included,
// over this process's copies running at once (to different GPUs).
// The lanes a copy holds are not taken back mid-copy, so a process that starts copying while others
// hold most of the budget gets what is left, and its share from the others' next copies on
// (`cmt bench load`, H100 2026-12-05: four processes copying 1 GiB each got 0.37-1.73 of an equal
// share, first come first served, and together no more than plain copies).
int take_lanes(int wanted) {
  Slot* slot = mine();
  // The CPUs other programs keep busy (cpu_load.hpp), less the lanes other cmt processes hold (they
  // are shared out below).
  double others = others_busy_cpus();
  if (slot) others -= g_segment->total.load(std::memory_order_acquire) - slot->lanes.load(std::memory_order_acquire);
  const int busy = static_cast<int>(std::lround(std::max(0.0, others)));
  // On a busy host, only the CPUs left, the caller's own among them.
  const int cpus = busy > 0 ? std::max(1, node_budget() - busy - 1) : node_budget();
  int share = cpus;  // worker lanes
  if (slot) {
    const int32_t mine_now = slot->copies.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (mine_now == 1) g_segment->copying.fetch_add(1, std::memory_order_acq_rel);
    const int copying = std::max(1, static_cast<int>(g_segment->copying.load(std::memory_order_acquire)));
    const int process_share = (cpus + copying - 1) / copying;
    share = (process_share + mine_now - 1) / mine_now;
  }
  return take(&Segment::total, &Slot::lanes, node_budget(), std::min(wanted, share), false);
}

void give_lanes(int taken) {
  give(&Segment::total, &Slot::lanes, taken);
  if (g_mine && g_pid == static_cast<int>(getpid()) && g_mine->copies.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    g_segment->copying.fetch_sub(1, std::memory_order_acq_rel);
  }
}
int node_lanes_in_use() { return in_use(&Segment::total); }

long node_pinned_budget_mib() {
  static const long budget = env().node_pinned_mb > 0 ? env().node_pinned_mb : physical_memory_mib() / 4;
  return budget;
}

bool take_pinned(size_t bytes) {
  const int32_t want = mib(bytes);
  return take(&Segment::pinned_total, &Slot::pinned_mib, static_cast<int32_t>(node_pinned_budget_mib()), want,
              true) == want;
}
void give_pinned(size_t bytes) { give(&Segment::pinned_total, &Slot::pinned_mib, mib(bytes)); }
long node_pinned_in_use_mib() { return in_use(&Segment::pinned_total); }

}  // namespace cmt
