#include "env.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace cmt {
namespace {

// Straight to stderr: the logger itself is configured from here.
void warn(const char* name, const char* value, const char* expected) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "cmt[%d]: warning: ignoring %s=%s (expected %s)\n", static_cast<int>(getpid()),
                   name, value, expected);
  if (n > 0) {
    ssize_t ignored = ::write(STDERR_FILENO, buf, std::min(sizeof buf - 1, static_cast<size_t>(n)));
    (void)ignored;
  }
}

bool one_of(const char* v, std::initializer_list<const char*> words) {
  for (const char* w : words) {
    if (!strcmp(v, w)) return true;
  }
  return false;
}

void read_flag(const char* name, bool* out) {
  const char* v = getenv(name);
  if (!v) return;
  if (one_of(v, {"1", "true", "yes", "on"})) *out = true;
  else if (one_of(v, {"", "0", "false", "no", "off"})) *out = false;
  else warn(name, v, "1 or 0");
}

// A whole number from lo to hi, nothing else.
bool parse_long(const char* v, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (!*v || *end || errno || n < lo || n > hi) return false;
  *out = n;
  return true;
}

void read_number(const char* name, long lo, long hi, long* out) {
  const char* v = getenv(name);
  if (v && *v && !parse_long(v, lo, hi, out)) {
    warn(name, v, ("a whole number from " + std::to_string(lo) + " to " + std::to_string(hi)).c_str());
  }
}

void read_log(Env& e) {
  const char* v = getenv("CMT_LOG");
  if (!v || !*v) return;
  if (one_of(v, {"quiet", "off"})) e.log_level = 0;
  else if (one_of(v, {"warn", "warning"})) e.log_level = 1;
  else if (!strcmp(v, "info")) e.log_level = 2;
  else if (!strcmp(v, "debug")) e.log_level = 3;
  else warn("CMT_LOG", v, "quiet, warn, info or debug");
}

void read_prefault(Env& e) {
  const char* v = getenv("CMT_PREFAULT");
  if (!v || !*v) return;
  if (!strcmp(v, "huge")) e.prefault = Prefault::HugePopulate;
  else if (!strcmp(v, "populate")) e.prefault = Prefault::Populate;
  else if (!strcmp(v, "none")) e.prefault = Prefault::None;
  else warn("CMT_PREFAULT", v, "huge, populate or none");
}

void read_test_hooks(Env& e) {
  const char* v = getenv("CMT_TEST_HOOKS");
  if (!v || !*v) return;
  std::string text(v);
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? text.size() : comma + 1;
    size_t eq = item.find('=');
    long n = 0;
    bool ok = eq != std::string::npos && parse_long(item.c_str() + eq + 1, 0, 1L << 40, &n);
    std::string key = item.substr(0, eq);
    if (key == "sysfs" && eq != std::string::npos) e.test_sysfs = item.substr(eq + 1);
    else if (key == "node" && eq != std::string::npos) e.test_node = item.substr(eq + 1);
    else if (ok && key == "piece") e.test_piece = static_cast<size_t>(n);
    else if (ok && key == "late_start_us") e.test_late_start_us = n;
    else if (ok && key == "busy_cpus") e.test_busy_cpus = n;
    else if (ok && key == "guard" && n <= 1) e.test_guard = n == 1;
    else if (ok && key == "wait_setup" && n <= 1) e.test_wait_setup = n == 1;
    else if (ok && key == "setup_delay_us") e.test_setup_delay_us = n;
    else if (ok && key == "setup_expected_ms") e.test_setup_expected_ms = n;
    else if (ok && key == "cold_buffers") e.test_cold_buffers = n;
    else if (ok && key == "fault_us") e.test_fault_us = n;
    else if (ok && key == "reserve_hold_ms") e.test_reserve_hold_ms = n;
    else if (ok && key == "reserve" && n <= 1) e.test_reserve = n == 1;
    else if (ok && key == "park_piece") e.test_park_piece = static_cast<size_t>(n);
    else if (ok && key == "park_us") e.test_park_us = n;
    else if (ok && key == "park_before" && n <= 1) e.test_park_before = n == 1;
    else if (ok && key == "maps" && n <= 1) e.test_parse_maps = n == 1;
    else if (ok && key == "mapped_fail" && n <= 1) e.test_mapped_fail = n == 1;
    else if (ok && key == "rotational" && n <= 1) e.test_rotational = static_cast<int>(n);
    else if (ok && key == "read_eio") e.test_read_eio = n;
    else if (ok && key == "read_eio_once" && n <= 1) e.test_read_eio_once = n == 1;
    else if (ok && key == "read_slow_after") e.test_read_slow_after = n;
    else if (ok && key == "read_slow_us") e.test_read_slow_us = n;
    else if (ok && key == "disk_slow_at") e.test_disk_slow_at = n;
    else if (ok && key == "disk_slow_us") e.test_disk_slow_us = n;
    else warn("CMT_TEST_HOOKS item", item.c_str(), "piece=, late_start_us=, busy_cpus=, guard=0, wait_setup=1, setup_delay_us=, setup_expected_ms=, cold_buffers=, park_piece=, park_us=, park_before=1, maps=1, mapped_fail=1, rotational=, read_eio=, read_eio_once=1, read_slow_after=, read_slow_us=, disk_slow_at=, disk_slow_us=, sysfs=, node=");
  }
}

Env read_env() {
  Env e;
  read_flag("CMT_DISABLE", &e.disable);
  read_log(e);
  read_flag("CMT_STATS", &e.stats);
  read_flag("CMT_TRACE", &e.trace);
  read_number("CMT_SPIN_US", 0, 1000000, &e.spin_us);
  read_number("CMT_NODE_THREADS", 1, 4096, &e.node_threads);
  read_number("CMT_NODE_PINNED_MB", 1, 1L << 30, &e.node_pinned_mb);
  read_prefault(e);
  read_flag("CMT_FROM_FILE", &e.from_file);
  read_number("CMT_READ_THRESHOLD", 0, 1L << 40, &e.read_threshold);
  if (const char* v = getenv("CMT_PLAN")) e.plan = v;
  if (const char* v = getenv("CMT_PROFILE_DIR")) e.profile_dir = v;
  read_test_hooks(e);
  return e;
}

}  // namespace

const Env& env() {
  static const Env parsed = read_env();
  return parsed;
}

}  // namespace cmt
