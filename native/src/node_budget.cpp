#include "node_budget.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "env.hpp"
#include "log.hpp"
#include "prefault.hpp"

namespace cmt {
namespace {

constexpr int kSlots = 256;
constexpr uint64_t kMagic = 0x636d742d6c616e31;  // "cmt-lan1"

struct Slot {
  std::atomic<int32_t> pid;    // 0: free
  std::atomic<int32_t> lanes;  // worker lanes this process's copies hold
};

struct Segment {
  std::atomic<uint64_t> magic;
  std::atomic<int32_t> total;  // the sum of the live slots' lanes
  int32_t reserved;
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
  snprintf(name, sizeof name, "/cmt-lanes-%u", static_cast<unsigned>(getuid()));
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
      g_mine = &slot;
      return g_mine;
    }
  }
  log::write(log::Level::Debug, "the node's budget of copy threads has no free slot: this process counts alone");
  return nullptr;
}

}  // namespace

int node_budget() {
  static const int budget = env().node_threads > 0 ? static_cast<int>(env().node_threads) : static_cast<int>(usable_cpus());
  return budget;
}

int take_lanes(int wanted) {
  Slot* slot = mine();
  if (!slot || wanted <= 0) return slot ? 0 : std::min(wanted, node_budget());
  Segment* s = g_segment;
  int32_t total = s->total.load(std::memory_order_acquire);
  if (total + wanted > node_budget()) {  // short of lanes: are some held by processes that are gone?
    reclaim(s);
    total = s->total.load(std::memory_order_acquire);
  }
  int32_t granted;
  do {
    granted = std::clamp(node_budget() - total, 0, wanted);
  } while (granted && !s->total.compare_exchange_weak(total, total + granted, std::memory_order_acq_rel));
  if (granted) slot->lanes.fetch_add(granted, std::memory_order_acq_rel);
  return granted;
}

void give_lanes(int taken) {
  if (taken <= 0 || !g_mine || g_pid != static_cast<int>(getpid())) return;
  g_mine->lanes.fetch_sub(taken, std::memory_order_acq_rel);
  g_segment->total.fetch_sub(taken, std::memory_order_acq_rel);
}

int node_lanes_in_use() {
  if (!mine()) return 0;
  reclaim(g_segment);
  return g_segment->total.load(std::memory_order_acquire);
}

}  // namespace cmt
