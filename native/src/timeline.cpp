#include "timeline.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "env.hpp"

namespace cmt::timeline {
namespace {

struct Entry {
  int64_t ns;
  int lane;
  int step;
  long block;
};

constexpr int kCapacity = 1 << 14;  // enough for a 1 GiB copy's steps at the default plan
Entry g_entries[kCapacity];
std::atomic<int> g_count{0};
int g_direction = 0, g_lanes = 0;
size_t g_bytes = 0;
std::vector<size_t> g_block_off;
std::vector<int> g_fill;
thread_local int tl_lane = 0;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

bool enabled() {
  return env().trace;
}

void begin(int direction, size_t bytes, const std::vector<size_t>& block_off, const std::vector<int>& fill,
           int lanes) {
  g_count.store(0, std::memory_order_relaxed);
  g_direction = direction;
  g_bytes = bytes;
  g_block_off = block_off;
  g_fill = fill;
  g_lanes = lanes;
  note(Step::CopyStart);
}

void set_lane(int lane) { tl_lane = lane; }

void note(Step step, long block) {
  int i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i < kCapacity) g_entries[i] = {now_ns(), tl_lane, static_cast<int>(step), block};
}

std::string last_json(const std::string& dma_gpu) {
  size_t blocks = g_block_off.empty() ? 0 : g_block_off.size() - 1;
  std::string s = "{\"direction\":" + std::to_string(g_direction) + ",\"bytes\":" + std::to_string(g_bytes) +
                  ",\"blocks\":" + std::to_string(blocks) + ",\"block_bytes\":[";
  for (size_t b = 0; b < blocks; ++b) s += (b ? "," : "") + std::to_string(g_block_off[b + 1] - g_block_off[b]);
  s += "],\"block_fill\":[";
  for (size_t b = 0; b < g_fill.size(); ++b) s += (b ? "," : "") + std::to_string(g_fill[b]);
  s += "],\"lanes\":" + std::to_string(g_lanes) + ",\"steps\":[";
  int n = std::min(g_count.load(std::memory_order_relaxed), kCapacity);
  for (int i = 0; i < n; ++i) {
    const Entry& e = g_entries[i];
    s += (i ? ",[" : "[") + std::to_string(e.ns) + "," + std::to_string(e.lane) + "," + std::to_string(e.step) +
         "," + std::to_string(e.block) + "]";
  }
  s += "]";
  if (!dma_gpu.empty()) s += ",\"dma_gpu\":" + dma_gpu;
  return s + "}";
}

}  // namespace cmt::timeline
