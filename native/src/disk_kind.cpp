#include "disk_kind.hpp"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "env.hpp"

namespace cmt {
namespace {

// (device << 2) | 2 | rotational, per slot; 0: empty. Lock-free: read from the read hooks.
constexpr int kSlots = 16;
std::atomic<uint64_t> g_known[kSlots];

bool ask_sysfs(dev_t dev) {
  char path[96];
  for (const char* form : {"/sys/dev/block/%u:%u/queue/rotational", "/sys/dev/block/%u:%u/../queue/rotational"}) {
    snprintf(path, sizeof path, form, major(dev), minor(dev));
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char c = '0';
    const ssize_t r = ::read(fd, &c, 1);
    close(fd);
    return r == 1 && c == '1';
  }
  return false;
}

}  // namespace

bool rotational_device(dev_t dev) {
  if (env().test_rotational >= 0) return env().test_rotational == 1;
  const uint64_t key = static_cast<uint64_t>(dev) << 2 | 2;
  for (auto& slot : g_known) {
    const uint64_t v = slot.load(std::memory_order_relaxed);
    if ((v & ~uint64_t(1)) == key) return v & 1;
  }
  const bool spins = ask_sysfs(dev);
  uint64_t empty = 0;
  for (auto& slot : g_known) {
    if (slot.compare_exchange_strong(empty, key | spins)) break;
    empty = 0;
  }
  return spins;
}

}  // namespace cmt
