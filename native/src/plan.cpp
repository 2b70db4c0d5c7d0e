#include "plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "log.hpp"

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
    else return fail(error, std::string("expected 'h2d:' or 'd2h:' at '") + p + "'");
    p += 4;
    Rule r;
    if (!parse_size(p, &r.min_bytes) || *p != '=') return fail(error, "expected min_bytes '=' in rule");
    ++p;
    if (!strncmp(p, "pass", 4)) {
      r.pass = true;
      p += 4;
    } else {
      size_t t, b, c;
      if (!parse_size(p, &t) || *p++ != ',' || !parse_size(p, &b) || *p++ != ',' || !parse_size(p, &c)) {
        return fail(error, "expected 'pass' or threads,buffers,chunk_bytes");
      }
      if (t < 1 || t > size_t(kMaxThreads)) return fail(error, "threads must be 1..64");
      if (b < 1 || b > size_t(kMaxBuffers)) return fail(error, "buffers must be 1..64");
      if (c < kMinChunk || c > kMaxChunk) return fail(error, "chunk_bytes must be 4 KiB..256 MiB");
      r.pass = false;
      r.settings = Settings{static_cast<int>(t), static_cast<int>(b), c};
      if (!strncmp(p, ",stream", 7)) {
        r.settings.stream_stores = true;
        p += 7;
      }
    }
    if (*p && *p != ';') return fail(error, std::string("unexpected text at '") + p + "'");
    parsed.rules_[static_cast<int>(dir)].push_back(r);
  }
  for (auto& rules : parsed.rules_) {
    std::sort(rules.begin(), rules.end(),
              [](const Rule& a, const Rule& b) { return a.min_bytes < b.min_bytes; });
  }
  *this = parsed;
  return true;
}

Plan Plan::defaults() {
  // Before tuning. Chosen from benchmarks/explore_engine.py on the H200 host (16 cores, PCIe Gen5
  // x16; results in benchmarks/results/): staging loses to the driver below ~1 MiB, larger copies
  // want larger DMA blocks, and about 10 lanes saturate the link; fewer cores get fewer lanes.
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int t = static_cast<int>(std::clamp(cpus * 5 / 8, 2L, 10L));
  std::string s;
  for (const char* dir : {"h2d", "d2h"}) {
    bool h2d = dir[0] == 'h';
    auto add = [&](size_t min, int threads, int buffers, size_t chunk) {
      s += std::string(dir) + ":" + std::to_string(min) + "=" + std::to_string(threads) + "," +
           std::to_string(buffers) + "," + std::to_string(chunk) + ";";
    };
    s += std::string(dir) + ":0=pass;";
    add(size_t(1) << 20, std::min(t, 8), 4, size_t(512) << 10);
    add(size_t(4) << 20, t, 12, size_t(512) << 10);
    add(size_t(16) << 20, t, 12, size_t(2) << 20);
    add(size_t(64) << 20, t, 12, size_t(4) << 20);
    add(size_t(256) << 20, t, h2d ? 4 : 12, size_t(h2d ? 8 : 4) << 20);
  }
  Plan p;
  std::string err;
  p.parse(s.c_str(), &err);
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
      if (r.pass) {
        s += "pass";
      } else {
        s += std::to_string(r.settings.threads) + "," + std::to_string(r.settings.buffers) + "," +
             std::to_string(r.settings.chunk) + (r.settings.stream_stores ? ",stream" : "");
      }
    }
  }
  return s;
}

size_t Plan::max_chunk() const {
  size_t m = 0;
  for (const auto& rules : rules_)
    for (const auto& r : rules)
      if (!r.pass) m = std::max(m, r.settings.chunk);
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
  if (const char* env = getenv("CMT_PLAN"); env && *env) {
    std::string err;
    if (!plan->parse(env, &err)) {
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
  return true;
}

}  // namespace cmt
