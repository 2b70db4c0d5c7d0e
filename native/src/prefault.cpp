#include "prefault.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "env.hpp"
#include "log.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cmt {
namespace {

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

// Whether the kernel has MADV_POPULATE_WRITE (5.14): asked once, on a page of our own. (An EINVAL
// for the program's memory says only that its mapping refuses it: a device's, or a driver's.)
bool kernel_populates() {
  static const bool yes = [] {
    void* page = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return false;
    const bool ok = madvise(page, kPage, MADV_POPULATE_WRITE) == 0;
    munmap(page, kPage);
    if (!ok) log::write(log::Level::Debug, "MADV_POPULATE_WRITE unsupported (kernel < 5.14); faults stay in the copy");
    return ok;
  }();
  return yes;
}

void populate(char* p, size_t len) {
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(kPage - 1);
  if (e <= a || !kernel_populates()) return;
  madvise(reinterpret_cast<void*>(a), e - a, MADV_POPULATE_WRITE);  // where refused, the copy faults them
}

long usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

}  // namespace cmt
