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
constexpr uint64_t kMagic = 0x636d742d62756434;  // "cmt-bud4"

struct Slot {
  std::atomic<int32_t> pid;         // 0: free
  std::atomic<int32_t> lanes;       // worker lanes this process's copies hold
  std::atomic<int32_t> pinned_mib;  // staging this process pinned
  std::atomic<int32_t> copies;      // its copies (lane runs) in flight
  std::atomic<int32_t> wanting;     // worker lanes its copies in flight lack of their fair share
};

struct Segment {
  std::atomic<uint64_t> magic;
  std::atomic<int32_t> total;         // the sum of the live slots' lanes
  std::atomic<int32_t> pinned_total;  // and of their pinned MiB
  std::atomic<int32_t> copying;       // the live slots with copies in flight
  std::atomic<int32_t> wanting;       // the sum of the live slots' wanting
  Slot slots[kSlots];
};
static_assert(std::atomic<int32_t>::is_always_lock_free, "the segment is shared between processes");

Segment* g_segment = nullptr;
Slot* g_mine = nullptr;
int g_pid = 0;
std::mutex g_open_mutex;

bool gone(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

Segment* map_segment() {
  char name[96];
  // The layout's version is in the name: processes of another cmt version keep their own budget.
  snprintf(name, sizeof name, "/cmt-budget4-%u", static_cast<unsigned>(getuid()));
  if (!env().test_node.empty()) {
    snprintf(name, sizeof name, "/cmt-budget4-%u-%s", static_cast<unsigned>(getuid()), env().test_node.c_str());
  }
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
    int32_t wanting = slot.wanting.exchange(0, std::memory_order_acq_rel);
    if (wanting) s->wanting.fetch_sub(wanting, std::memory_order_acq_rel);
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
      slot.wanting.store(0, std::memory_order_relaxed);
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

// The CPUs copies may use now: the budget, or on a busy host the CPUs other programs leave (the
// caller's own among them), less what other cmt processes hold, which is shared out below. Kept
// for the lanes' checks between pieces (a read of /proc/stat is too dear there).
std::atomic<int> g_cpus{0};

int cpus_now(Slot* slot) {
  double others = others_busy_cpus();
  if (slot) others -= g_segment->total.load(std::memory_order_acquire) - slot->lanes.load(std::memory_order_acquire);
  const int busy = static_cast<int>(std::lround(std::max(0.0, others)));
  const int cpus = busy > 0 ? std::max(1, node_budget() - busy - 1) : node_budget();
  g_cpus.store(cpus, std::memory_order_relaxed);
  return cpus;
}

// This process's fair share of worker lanes: the CPUs over the processes copying now.
int process_share(int cpus) {
  const int copying = std::max(1, static_cast<int>(g_segment->copying.load(std::memory_order_acquire)));
  return (cpus + copying - 1) / copying;
}

void add_wanting(Slot* slot, int32_t n) {
  if (!n || !slot) return;
  slot->wanting.fetch_add(n, std::memory_order_acq_rel);
  g_segment->wanting.fetch_add(n, std::memory_order_acq_rel);
}

// A copy takes at most a fair share: the budget over the processes copying now, this one included,
// over this process's copies running at once (to different GPUs). What it lacks of that share
// because others hold the budget, it is `short_by`, and the lanes rebalance while the copies run:
// a lane of a process above its share leaves between two pieces while others lack lanes
// (lane_over_share), and the short copy takes the lanes that come free (take_more_lanes).
// Without that, four processes copying 1 GiB at once each on the H100 (`cmt bench load`,
// 2026-12-05/06) got 0.37-1.73 of an equal share, first come first served: two copied on 10 lanes
// and two on their caller alone (4.4 GB/s), and together no faster than plain copies.
int take_lanes(int wanted, int* short_by) {
  if (short_by) *short_by = 0;
  Slot* slot = mine();
  const int cpus = cpus_now(slot);
  int share = cpus;  // worker lanes
  if (slot) {
    const int32_t mine_now = slot->copies.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (mine_now == 1) g_segment->copying.fetch_add(1, std::memory_order_acq_rel);
    share = (process_share(cpus) + mine_now - 1) / mine_now;
  }
  const int asked = std::min(wanted, share);
  const int got = take(&Segment::total, &Slot::lanes, node_budget(), asked, false);
  if (slot && short_by && got < asked) {
    *short_by = asked - got;
    add_wanting(slot, *short_by);
  }
  return got;
}

int take_more_lanes(int short_by) {
  Slot* slot = g_mine;
  if (short_by <= 0 || !slot || g_pid != static_cast<int>(getpid())) return 0;
  Segment* s = g_segment;
  if (s->total.load(std::memory_order_acquire) >= node_budget()) return 0;  // the common case: nothing free
  const int room = process_share(g_cpus.load(std::memory_order_relaxed)) - slot->lanes.load(std::memory_order_acquire);
  const int got = take(&Segment::total, &Slot::lanes, node_budget(), std::min(short_by, room), false);
  add_wanting(slot, -got);
  return got;
}

bool lane_over_share() {
  Slot* slot = g_mine;
  if (!slot || g_pid != static_cast<int>(getpid())) return false;
  Segment* s = g_segment;
  const int32_t wanting = s->wanting.load(std::memory_order_acquire) - slot->wanting.load(std::memory_order_acquire);
  if (wanting <= 0) return false;  // the common case: nobody lacks lanes
  // Lanes that are free already go to the short copies without this one.
  if (wanting <= node_budget() - s->total.load(std::memory_order_acquire)) return false;
  const int share = process_share(g_cpus.load(std::memory_order_relaxed));
  int32_t lanes = slot->lanes.load(std::memory_order_acquire);
  do {
    if (lanes <= share) return false;
  } while (!slot->lanes.compare_exchange_weak(lanes, lanes - 1, std::memory_order_acq_rel));
  s->total.fetch_sub(1, std::memory_order_acq_rel);
  add_wanting(slot, 1);  // the copy may take it up again once shares allow (take_more_lanes)
  return true;
}

void give_lanes(int taken, int short_by) {
  give(&Segment::total, &Slot::lanes, taken);
  if (!g_mine || g_pid != static_cast<int>(getpid())) return;
  add_wanting(g_mine, -short_by);
  if (g_mine->copies.fetch_sub(1, std::memory_order_acq_rel) == 1) g_segment->copying.fetch_sub(1, std::memory_order_acq_rel);
}
int node_lanes_mine() { return g_mine && g_pid == static_cast<int>(getpid()) ? g_mine->lanes.load() : 0; }
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
