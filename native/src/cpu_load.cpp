#include "cpu_load.hpp"

#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "env.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

constexpr uint64_t kSampleNs = 50'000'000;  // long enough for /proc/stat's 10 ms ticks to mean something

struct Sample {
  uint64_t at_ns = 0;       // monotonic
  uint64_t busy_ticks = 0;  // summed over the CPUs in the affinity set
  uint64_t own_ns = 0;      // this process's CPU time
};

uint64_t process_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_nsec);
}

// Busy ticks of the CPUs this process may run on; false if /proc/stat cannot be read.
bool busy_ticks(uint64_t* out) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
  static char buf[1 << 16];  // under sample_mutex
  int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  uint64_t busy = 0;
  for (char* line = buf; line && std::strncmp(line, "cpu", 3) == 0;) {
    char* end = std::strchr(line, '\n');
    if (end) *end = '\0';
    char* p = line + 3;
    if (*p >= '0' && *p <= '9') {  // "cpuN user nice system idle iowait irq softirq steal ..."
      const long cpu = std::strtol(p, &p, 10);
      uint64_t v[8] = {};
      for (uint64_t& x : v) x = std::strtoull(p, &p, 10);
      if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set)) busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    }
    line = end ? end + 1 : nullptr;
  }
  *out = busy;
  return true;
}

std::mutex sample_mutex;
Sample last;
std::atomic<double> g_others{0};
std::atomic<uint64_t> g_sampled_at{0};
bool g_unreadable = false;

}  // namespace

double others_busy_cpus() {
  if (env().test_busy_cpus >= 0) return static_cast<double>(env().test_busy_cpus);
  const uint64_t now = monotonic_ns();
  if (now - g_sampled_at.load(std::memory_order_relaxed) < kSampleNs) return g_others.load(std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(sample_mutex, std::try_to_lock);
  if (!lock.owns_lock() || g_unreadable) return g_others.load(std::memory_order_relaxed);
  Sample s{now, 0, process_cpu_ns()};
  if (!busy_ticks(&s.busy_ticks)) {
    g_unreadable = true;  // no /proc: the budget alone
    return 0;
  }
  if (last.at_ns) {
    static const double tick_ns = 1e9 / static_cast<double>(sysconf(_SC_CLK_TCK));
    const double wall = static_cast<double>(s.at_ns - last.at_ns);
    const double busy = static_cast<double>(s.busy_ticks - last.busy_ticks) * tick_ns;
    const double own = static_cast<double>(s.own_ns - last.own_ns);
    g_others.store(busy > own ? (busy - own) / wall : 0, std::memory_order_relaxed);
  }
  last = s;
  g_sampled_at.store(now, std::memory_order_relaxed);
  return g_others.load(std::memory_order_relaxed);
}

}  // namespace cmt
