#include "log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cmt::log {
namespace {
std::atomic<int> g_level{-1};
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

Level level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l >= 0) return static_cast<Level>(l);
  const char* v = getenv("CMT_LOG");
  Level parsed = Level::Warn;
  if (v) {
    if (!strcmp(v, "debug")) parsed = Level::Debug;
    else if (!strcmp(v, "info")) parsed = Level::Info;
    else if (!strcmp(v, "quiet") || !strcmp(v, "off")) parsed = Level::Quiet;
  }
  g_level.store(static_cast<int>(parsed), std::memory_order_relaxed);
  return parsed;
}

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
