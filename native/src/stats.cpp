#include "stats.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "env.hpp"
#include "large_read.hpp"
#include "log.hpp"
#include "rate_guard.hpp"

namespace cmt {
namespace {

std::atomic<uint64_t> g_taken_over{0};

const char* const kNames[] = {
#define X_ITEM(id, name, text) name,
    OUTCOME_TABLE(X_ITEM)
#undef X_ITEM
};
const char* const kTexts[] = {
#define X_ITEM(id, name, text) text,
    OUTCOME_TABLE(X_ITEM)
#undef X_ITEM
};

struct Counter {
  std::atomic<unsigned long long> copies{0};
  std::atomic<unsigned long long> bytes{0};
};
Counter g_counters[kDirections][kOutcomes];

void print_report() {
  char buf[4096];
  size_t len = 0;
  auto add = [&](const char* fmt, auto... args) {
    int n = snprintf(buf + len, sizeof buf - len, fmt, args...);
    if (n > 0) len = std::min(sizeof buf - 1, len + static_cast<size_t>(n));
  };
  add("cmt[%d] stats:\n", static_cast<int>(getpid()));
  bool any = false;
  for (int d = 0; d < kDirections; ++d) {
    for (int o = 0; o < kOutcomes; ++o) {
      unsigned long long c = g_counters[d][o].copies.load(), b = g_counters[d][o].bytes.load();
      if (!c) continue;
      any = true;
      add("  %s %-16s %10llu copies %16llu bytes\n", direction_name(static_cast<Direction>(d)), kNames[o], c, b);
    }
  }
  const ReadCounters reads = read_counters();
  if (!any && !dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    // One debug line, and no report, in the program's processes that never loaded the driver
    // (shells, compilers, a machine without a GPU).
    log::write(log::Level::Debug, "no CUDA driver (libcuda.so.1) was loaded in this process: nothing was staged");
    return;
  }
  if (!env().stats) return;
  if (!any) add("  no host<->device copies seen\n");
  const GuardEvents ev = guard_events();
  if (ev.backed_off) {
    add("  backed off to the driver %llu times, staged again %llu times\n",
        static_cast<unsigned long long>(ev.backed_off), static_cast<unsigned long long>(ev.staged_again));
  }
  if (reads.split_calls || reads.alone_calls || reads.guarded_calls) {
    add("  large file reads: %llu split over the copy threads (%llu bytes), %llu by the calling thread alone "
        "(%llu bytes), %llu passed to libc by the rate guard\n",
        static_cast<unsigned long long>(reads.split_calls), static_cast<unsigned long long>(reads.split_bytes),
        static_cast<unsigned long long>(reads.alone_calls), static_cast<unsigned long long>(reads.alone_bytes),
        static_cast<unsigned long long>(reads.guarded_calls));
  }
  if (uint64_t n = g_taken_over.load()) {
    add("  %llu pieces taken over from stalled (descheduled) copy threads\n", static_cast<unsigned long long>(n));
  }
  ssize_t ignored = write(STDERR_FILENO, buf, len);
  (void)ignored;
}

}  // namespace

void count_taken_over() { g_taken_over.fetch_add(1, std::memory_order_relaxed); }

const char* outcome_name(Outcome o) { return kNames[static_cast<int>(o)]; }
const char* outcome_text(Outcome o) { return kTexts[static_cast<int>(o)]; }

void record(Direction d, Outcome o, size_t bytes) {
  Counter& c = g_counters[static_cast<int>(d)][static_cast<int>(o)];
  c.copies.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(bytes, std::memory_order_relaxed);
  log::debug_once(static_cast<unsigned>(d) * 64 + static_cast<unsigned>(o), "%s copy of %zu bytes: %s (%s)",
                  direction_name(d), bytes, outcome_name(o), outcome_text(o));
}

std::string stats_json() {
  std::string s = "{";
  for (int d = 0; d < kDirections; ++d) {
    if (d) s += ",";
    s += std::string("\"") + direction_name(static_cast<Direction>(d)) + "\":{";
    bool first = true;
    for (int o = 0; o < kOutcomes; ++o) {
      if (!first) s += ",";
      first = false;
      s += std::string("\"") + kNames[o] + "\":[" + std::to_string(g_counters[d][o].copies.load()) + "," +
           std::to_string(g_counters[d][o].bytes.load()) + "]";
    }
    s += "}";
  }
  const ReadCounters r = read_counters();
  s += ",\"reads\":{\"split\":[" + std::to_string(r.split_calls) + "," + std::to_string(r.split_bytes) +
       "],\"alone\":[" + std::to_string(r.alone_calls) + "," + std::to_string(r.alone_bytes) +
       "],\"guarded\":" + std::to_string(r.guarded_calls) + "}";
  const GuardEvents ev = guard_events();
  return s + ",\"events\":{\"backed_off\":" + std::to_string(ev.backed_off) + ",\"staged_again\":" +
         std::to_string(ev.staged_again) + ",\"taken_over\":" + std::to_string(g_taken_over.load()) + "}}";
}

void enable_exit_report() {
  static std::atomic<bool> once{false};
  if (once.exchange(true)) return;
  if (env().stats || log::level() >= log::Level::Debug) atexit(print_report);
}

}  // namespace cmt
