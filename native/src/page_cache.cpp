#include "page_cache.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <vector>

namespace cmt {
namespace {

// cachestat(2), Linux 6.5 (x86-64 and arm64 both number it 451); glibc has no wrapper yet.
constexpr long kSysCachestat = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

std::atomic<bool> g_no_cachestat{false};  // ENOSYS once: the kernel has none

long page_size() {
  static const long n = sysconf(_SC_PAGESIZE);
  return n;
}

double by_cachestat(int fd, uint64_t first, uint64_t pages) {
  if (g_no_cachestat.load(std::memory_order_relaxed)) return -1;
  CachestatRange range{first * page_size(), pages * page_size()};
  Cachestat cs{};
  if (syscall(kSysCachestat, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS) g_no_cachestat.store(true, std::memory_order_relaxed);
    return -1;
  }
  return static_cast<double>(cs.nr_cache) / static_cast<double>(pages);
}

double by_mincore(int fd, uint64_t first, uint64_t pages) {
  const size_t len = pages * page_size();
  // Mapping a range costs no I/O and faults nothing in; the pages past the end of the file are
  // reported absent.
  void* map = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first * page_size()));
  if (map == MAP_FAILED) return -1;
  thread_local std::vector<unsigned char> vec;
  vec.resize(pages);
  const int r = mincore(map, len, vec.data());
  munmap(map, len);
  if (r != 0) return -1;
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(pages);
}

}  // namespace

double resident_fraction(int fd, uint64_t off, size_t len) {
  if (len == 0) return 1;
  const uint64_t first = off / page_size();
  const uint64_t pages = (off + len + page_size() - 1) / page_size() - first;
  double f = by_cachestat(fd, first, pages);
  if (f < 0) f = by_mincore(fd, first, pages);
  return f;
}

}  // namespace cmt
