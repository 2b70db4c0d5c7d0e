#include "mapping_lookup.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "env.hpp"
#include "log.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

// PROCMAP_QUERY (linux/fs.h, 6.11), declared here: the build machine's headers may predate it.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr;
  uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01, kVmaShared = 0x08;

// The /proc/self/maps descriptor the ioctl goes to: it stays bound to this process's memory, which a
// forked child does not use (copies there pass through).
KeptFd g_query_fd("/proc/self/maps");
std::atomic<bool> g_no_query{false};  // no ioctl here

bool query(uintptr_t addr, Mapping* out, bool* unsupported) {
  if (g_no_query.load(std::memory_order_relaxed)) return *unsupported = true, false;
  // Checked every time (one fstat): an ioctl must never reach a file of the program's that took the number.
  const int fd = g_query_fd.get(/*check=*/true);
  if (fd < 0) {
    g_no_query.store(true);
    return *unsupported = true, false;
  }
  char name[PATH_MAX];
  ProcmapQuery q{};
  q.size = sizeof q;
  q.query_addr = addr;
  q.vma_name_addr = reinterpret_cast<uintptr_t>(name);
  q.vma_name_size = sizeof name;
  if (ioctl(fd, kProcmapQuery, &q) != 0) {
    if (errno == ENOENT) return false;  // no mapping contains the address
    if (errno == ENOTTY || errno == EINVAL || errno == ENOSYS) {
      log::debug_once(0xA01, "PROCMAP_QUERY is not available (%s): /proc/self/maps is parsed", strerror(errno));
      g_no_query.store(true);
      *unsupported = true;
    }
    return false;
  }
  out->start = q.vma_start;
  out->end = q.vma_end;
  out->offset = q.vma_offset;
  out->dev = makedev(q.dev_major, q.dev_minor);
  out->ino = q.inode;
  out->readable = q.vma_flags & kVmaReadable;
  out->shared = q.vma_flags & kVmaShared;
  out->path.assign(name, q.vma_name_size ? strnlen(name, q.vma_name_size) : 0);
  return true;
}

// ---- the parsed /proc/self/maps, for kernels without the ioctl ------------------------------------

// Kept answers older than this are doubtful: the table is parsed again (at most this often while
// copies come, a bounded cost), so that a mapping made since is found soon.
constexpr uint64_t kMaxAgeNs = 100'000'000;

std::mutex g_maps_mutex;
std::map<uintptr_t, Mapping> g_maps;  // by end: the first entry whose end is above an address
uint64_t g_parsed_at = 0;

bool parse_line(const char* line, Mapping* m) {
  unsigned long start, end, offset, ino;
  unsigned major, minor;
  char perms[8] = {};
  int at = 0;
  if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &start, &end, perms, &offset, &major, &minor, &ino, &at) < 7) {
    return false;
  }
  m->start = start;
  m->end = end;
  m->offset = offset;
  m->dev = makedev(major, minor);
  m->ino = ino;
  m->readable = perms[0] == 'r';
  m->shared = perms[3] == 's';
  const char* path = line + at;
  size_t len = strcspn(path, "\n");
  m->path.assign(path, len);
  return true;
}

// Parses the whole file into g_maps (under g_maps_mutex); false if it cannot be read.
bool parse_maps() {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string text;
  char buf[65536];  // reads below the large-read threshold: the plain read (large_read.hpp)
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  g_parsed_at = monotonic_ns();
  g_maps.clear();
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    Mapping m;
    if (parse_line(text.c_str() + at, &m)) g_maps[m.end] = std::move(m);
    at = nl + 1;
  }
  return !g_maps.empty();
}

bool lookup_parsed(uintptr_t addr, Mapping* out, bool fresh) {
  std::lock_guard<std::mutex> lock(g_maps_mutex);
  if (monotonic_ns() - g_parsed_at > kMaxAgeNs) fresh = true;
  for (int pass = 0; pass < 2; ++pass) {
    if (fresh || pass == 1) {
      if (!parse_maps()) return false;
    }
    auto it = g_maps.upper_bound(addr);
    if (it != g_maps.end() && it->second.start <= addr) {
      *out = it->second;
      return true;
    }
    if (fresh) return false;  // parsed just now: no mapping contains it
  }
  return false;
}

}  // namespace

int KeptFd::get(bool check) {
  std::lock_guard<std::mutex> lock(mutex_);
  struct stat st {};
  if (fd_ >= 0 && (!check || (fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_))) return fd_;
  fd_ = open(path_, O_RDONLY | O_CLOEXEC);  // (a number the program took over is not closed)
  if (fd_ >= 0 && fstat(fd_, &st) == 0) dev_ = st.st_dev, ino_ = st.st_ino;
  return fd_;
}

bool mapping_answers_fresh() {
  return !env().test_parse_maps && !g_no_query.load(std::memory_order_relaxed);
}

bool find_mapping(uintptr_t addr, Mapping* out, bool fresh) {
  if (!env().test_parse_maps) {
    bool unsupported = false;
    if (query(addr, out, &unsupported)) return true;
    if (!unsupported) return false;
  }
  return lookup_parsed(addr, out, fresh);
}

}  // namespace cmt
