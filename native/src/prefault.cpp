#include "prefault.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "env.hpp"
#include "log.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cmt {
namespace {

std::atomic<bool> g_populate_ok{true};
const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));

bool page_resident(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  unsigned char resident = 0;
  return mincore(reinterpret_cast<void*>(a), kPage, &resident) == 0 && (resident & 1);
}

// Makes the destination's whole 2 MiB-aligned interior eligible for transparent huge pages.
void advise_huge_pages(char* p, size_t len) {
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kFaultUnit - 1) & ~(kFaultUnit - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(kFaultUnit - 1);
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

}  // namespace

bool prepare_fresh_destination(char* p, size_t len) {
  if (env().prefault == Prefault::None || page_resident(p + len / 2)) return false;
  log::debug_once(4000, "d2h into memory not faulted in yet: the lanes fault it in ahead of the copy");
  if (env().prefault == Prefault::HugePopulate) advise_huge_pages(p, len);
  return true;
}

void populate(char* p, size_t len) {
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(kPage - 1);
  if (e <= a || !g_populate_ok.load(std::memory_order_relaxed)) return;
  if (madvise(reinterpret_cast<void*>(a), e - a, MADV_POPULATE_WRITE) != 0 && (errno == EINVAL || errno == ENOSYS)) {
    g_populate_ok.store(false, std::memory_order_relaxed);
    log::write(log::Level::Debug, "MADV_POPULATE_WRITE unsupported (kernel < 5.14); faults stay in the copy");
  }
}

long usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

}  // namespace cmt
