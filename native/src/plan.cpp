#include "plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "env.hpp"
#include "host_copy.hpp"
#include "log.hpp"
#include "settings.hpp"

namespace cmt {

namespace {

bool parse_size(const char*& p, size_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  if (end == p || errno) return false;
  p = end;
  *out = static_cast<size_t>(v);
  return true;
}

bool fail(std::string* error, const std::string& what) {
  if (error) *error = what;
  return false;
}

}  // namespace

bool Plan::parse(const char* text, std::string* error) {
  Plan parsed;
  const char* p = text;
  while (*p) {
    while (*p == ' ' || *p == ';') ++p;
    if (!*p) break;
    Direction dir;
    if (!strncmp(p, "h2d:", 4)) dir = Direction::HtoD;
    else if (!strncmp(p, "d2h:", 4)) dir = Direction::DtoH;
    else if (!strncmp(p, "h2h:", 4)) dir = Direction::HtoH;
    else return fail(error, std::string("expected 'h2d:', 'd2h:' or 'h2h:' at '") + p + "'");
    p += 4;
    Rule r;
    if (!parse_size(p, &r.min_bytes) || *p != '=') return fail(error, "expected min_bytes '=' in rule");
    ++p;
    if (!strncmp(p, "pass", 4)) {
      r.pass = true;
      p += 4;
    } else {
      std::string why;
      if (!parse_settings(p, &r.settings, &p, &why)) return fail(error, "expected 'pass' or settings: " + why);
      r.pass = false;
      if (!strncmp(p, "|driver:", 8)) {
        p += 8;
        char* end = nullptr;
        errno = 0;
        r.driver_gbps = strtod(p, &end);
        if (end == p || errno || !(r.driver_gbps >= 0 && r.driver_gbps < 1e6)) {
          return fail(error, "expected the driver's GB/s after '|driver:'");
        }
        p = end;
      }
    }
    if (*p && *p != ';') return fail(error, std::string("unexpected text at '") + p + "'");
    parsed.rules_[static_cast<int>(dir)].push_back(r);
  }
  for (auto& rules : parsed.rules_) {
    std::sort(rules.begin(), rules.end(),
              [](const Rule& a, const Rule& b) { return a.min_bytes < b.min_bytes; });
  }
  // A plan that says nothing of host copies (a tuned file from before they existed) gets the
  // built-in rules for them; one pass rule turns them off.
  auto& host = parsed.rules_[static_cast<int>(Direction::HtoH)];
  if (host.empty()) host = defaults().rules_[static_cast<int>(Direction::HtoH)];
  *this = parsed;
  return true;
}

Plan Plan::defaults() {
  // Before tuning. Chosen on the H200 host (16 cores, PCIe Gen5 x16; docs/engine-findings.md):
  // staging loses to the driver below ~1 MiB, larger copies want larger DMA blocks, and about 10
  // lanes saturate the link; fewer cores get fewer lanes.
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int t = static_cast<int>(std::clamp(cpus * 5 / 8, 2L, 10L));
  Plan p;
  for (int d = 0; d < kGpuDirections; ++d) {
    bool h2d = d == static_cast<int>(Direction::HtoD);
    // The driver's rates: the H200's pageable copies as `cmt tune` measured them (its profile's
    // pageable_gbps), rounded; on a slower link they only make the rate guard measure sooner.
    auto add = [&](size_t min, int threads, int buffers, size_t chunk, double driver_gbps) {
      Rule r;
      r.min_bytes = min;
      r.pass = false;
      r.settings.threads = threads;
      r.settings.buffers = buffers;
      r.settings.chunk_bytes = static_cast<int64_t>(chunk);
      r.driver_gbps = driver_gbps;
      p.rules_[d].push_back(r);
    };
    p.rules_[d].push_back(Rule{});
    add(size_t(1) << 20, std::min(t, 8), 4, size_t(512) << 10, h2d ? 10 : 7.5);
    add(size_t(4) << 20, t, 12, size_t(512) << 10, h2d ? 11 : 8);
    add(size_t(16) << 20, t, 12, size_t(2) << 20, h2d ? 12 : 10);
    add(size_t(64) << 20, t, 12, size_t(4) << 20, h2d ? 8 : 10);
    add(size_t(256) << 20, t, h2d ? 4 : 12, size_t(h2d ? 8 : 4) << 20, h2d ? 7 : 12);
  }
  // Host copies from 8 MiB, in 1 MiB pieces over up to 16 threads: one thread's memcpy moves 5-10
  // GB/s on the H200 host, 16 about 40-58 (docs/engine-findings.md); `cmt tune` measures the size
  // from which they win on a given machine.
  Rule pass, host;
  host.min_bytes = size_t(8) << 20;
  host.pass = false;
  host.settings.threads = static_cast<int>(std::clamp(cpus, 1L, 16L));
  host.settings.buffers = 1;
  host.settings.chunk_bytes = int64_t(1) << 20;
  p.rules_[static_cast<int>(Direction::HtoH)] = {pass, host};
  return p;
}

const Rule& Plan::lookup(Direction d, size_t n) const {
  static const Rule kPass{};
  const auto& rules = rules_[static_cast<int>(d)];
  const Rule* found = &kPass;
  for (const auto& r : rules) {
    if (r.min_bytes > n) break;
    found = &r;
  }
  return *found;
}

std::string Plan::to_string() const {
  std::string s;
  for (int d = 0; d < kDirections; ++d) {
    for (const auto& r : rules_[d]) {
      if (!s.empty()) s += ";";
      s += std::string(direction_name(static_cast<Direction>(d))) + ":" + std::to_string(r.min_bytes) + "=";
      s += r.pass ? std::string("pass") : settings_to_string(r.settings);
      if (!r.pass && r.driver_gbps > 0) {
        char driver[32];
        snprintf(driver, sizeof driver, "|driver:%g", r.driver_gbps);
        s += driver;
      }
    }
  }
  return s;
}

size_t Plan::stages_from(Direction d) const {
  for (const auto& r : rules_[static_cast<int>(d)]) {
    if (!r.pass) return r.min_bytes;
  }
  return SIZE_MAX;
}

Settings Plan::largest() const {
  Settings m;
  for (int d = 0; d < kGpuDirections; ++d) {
    for (const auto& r : rules_[d]) {
      if (r.pass) continue;
#define X_ITEM(name, lo, hi, dflt, choices, what) m.name = std::max(m.name, r.settings.name);
      SETTINGS_TABLE(X_ITEM)
#undef X_ITEM
    }
  }
  return m;
}

namespace {
std::atomic<const Plan*> g_plan{nullptr};
std::mutex g_plan_mutex;
}  // namespace

const Plan& active_plan() {
  const Plan* p = g_plan.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  p = g_plan.load(std::memory_order_relaxed);
  if (p) return *p;
  auto* plan = new Plan(Plan::defaults());
  if (const char* text = env().plan.c_str(); *text) {
    std::string err;
    if (!plan->parse(text, &err)) {
      // `cmt run` validates the tuned file first; a bad hand-set CMT_PLAN keeps the defaults.
      log::write(log::Level::Warn, "ignoring invalid CMT_PLAN (%s); using defaults", err.c_str());
      *plan = Plan::defaults();
    }
  }
  log::write(log::Level::Debug, "plan: %s", plan->to_string().c_str());
  g_plan.store(plan, std::memory_order_release);
  return *plan;
}

bool set_active_plan(const char* text, std::string* error) {
  auto* plan = new Plan();
  if (!plan->parse(text, error)) {
    delete plan;
    return false;
  }
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  // The old plan is leaked on purpose: a copy in flight may still read it. Plans change rarely.
  g_plan.store(plan, std::memory_order_release);
  host_copy_plan_changed(*plan);
  return true;
}

}  // namespace cmt
