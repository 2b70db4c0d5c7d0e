#include "log.hpp"

#include "env.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cmt::log {
namespace {
std::atomic<unsigned char> g_seen[4096];

void vwrite(const char* fmt, va_list ap) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "cmt[%d]: ", static_cast<int>(getpid()));
  if (n < 0) return;
  int m = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  if (m < 0) return;
  size_t len = strnlen(buf, sizeof buf - 2);
  buf[len++] = '\n';
  // One write(2) so lines from several threads and processes do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, buf, len);
  (void)ignored;
}
}  // namespace

Level level() { return static_cast<Level>(env().log_level); }

void write(Level lvl, const char* fmt, ...) {
  if (level() < lvl) return;
  va_list ap;
  va_start(ap, fmt);
  vwrite(fmt, ap);
  va_end(ap);
}

void debug_once(unsigned key, const char* fmt, ...) {
  if (level() < Level::Debug) return;
  if (g_seen[key % 4096].exchange(1, std::memory_order_relaxed)) return;
  va_list ap;
  va_start(ap, fmt);
  vwrite(fmt, ap);
  va_end(ap);
}

}  // namespace cmt::log
