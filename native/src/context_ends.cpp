#include "context_ends.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace cmt {
namespace {

std::atomic<uint64_t> g_contexts_ended{0};  // contexts that ended
std::mutex g_ended_mutex;
std::vector<std::pair<CUcontext, uint64_t>> g_ended;  // each one, and g_contexts_ended once it had ended

}  // namespace

void note_context_ended(CUcontext ctx) {
  std::lock_guard<std::mutex> lock(g_ended_mutex);
  g_ended.emplace_back(ctx, g_contexts_ended.fetch_add(1, std::memory_order_acq_rel) + 1);
}

bool engine_context_ended_since(CUcontext ctx, uint64_t seen) {
  if (g_contexts_ended.load(std::memory_order_acquire) == seen) return false;  // the usual case: one load
  std::lock_guard<std::mutex> lock(g_ended_mutex);
  for (const auto& [c, n] : g_ended) {
    if (c == ctx && n > seen) return true;
  }
  return false;
}

uint64_t engine_contexts_ended() { return g_contexts_ended.load(std::memory_order_acquire); }

}  // namespace cmt
