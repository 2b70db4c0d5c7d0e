// The C API that the Python side (benchmarks, tuner) loads with ctypes: the same engine and
// decision path as the interposer, with explicit settings when asked.
#include <cstring>
#include <string>

#include "copy_path.hpp"
#include "cpu_load.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "host_copy.hpp"
#include "log.hpp"
#include "node_budget.hpp"
#include "plan.hpp"
#include "rate_guard.hpp"
#include "settings.hpp"
#include "stats.hpp"
#include "timeline.hpp"
#include "transfer_plan.hpp"

#define API_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef PROJECT_VERSION
#define PROJECT_VERSION "0.0.0"
#endif

using namespace cmt;

namespace {
int copy_string(const std::string& s, char* buf, size_t len) {
  if (buf && len) {
    size_t n = std::min(len - 1, s.size());
    memcpy(buf, s.data(), n);
    buf[n] = 0;
  }
  return static_cast<int>(s.size());
}
}  // namespace

API_EXPORT const char* cmt_version() { return PROJECT_VERSION; }

// Replaces the plan in force (the CMT_PLAN string form). Returns 0, or -1 with the reason in err.
API_EXPORT int cmt_configure(const char* plan, char* err, size_t err_len) {
  std::string why;
  if (set_active_plan(plan, &why)) return 0;
  copy_string(why, err, err_len);
  return -1;
}

// 1 if the plan in force stages host<->device copies of this size (dir 0: h2d, 1: d2h), else 0:
// the interposer then hands them to the driver's own function untouched.
API_EXPORT int cmt_plan_stages(int dir, size_t bytes) {
  return bytes > 0 && !active_plan().lookup(dir == 0 ? Direction::HtoD : Direction::DtoH, bytes).pass;
}

// Writes the plan in force; returns its full length.
API_EXPORT int cmt_active_plan(char* buf, size_t len) { return copy_string(active_plan().to_string(), buf, len); }

API_EXPORT int cmt_stats_json(char* buf, size_t len) { return copy_string(stats_json(), buf, len); }

// The steps of the engine's last copy, with CMT_TRACE=1 (see timeline.hpp); "" otherwise.
API_EXPORT int cmt_last_timeline(char* buf, size_t len) {
  return copy_string(timeline::enabled() ? timeline::last_json(engine_dma_gpu_times()) : std::string(), buf, len);
}

// One host<->device copy with stream semantics like cuMemcpy{HtoD,DtoH}Async_v2.
// dir: 0 host-to-device, 1 device-to-host. settings == nullptr: the active plan decides (pass-through
// included); otherwise stage with these (the Settings struct of types.hpp: int64 fields in the order
// of cmt_settings_schema). *outcome (if given) says what happened, as an index into the outcome
// names of cmt_outcome_name().
API_EXPORT CUresult cmt_memcpy(int dir, void* host, CUdeviceptr device, size_t bytes, CUstream stream,
                               const Settings* settings, int* outcome) {
  const Driver& d = driver(/*load_if_absent=*/true);
  if (!d.ok) return CUDA_ERROR_NOT_INITIALIZED;
  std::string why;
  if (settings && !check_settings(*settings, &why)) {
    log::write(log::Level::Warn, "cmt_memcpy: %s", why.c_str());
    return CUDA_ERROR_INVALID_VALUE;
  }
  CopyCall call{dir == 0 ? Direction::HtoD : Direction::DtoH, static_cast<char*>(host), device, bytes, stream,
                DefaultStream::Legacy, settings};
  CUresult r = CUDA_SUCCESS;
  Outcome o = try_accelerate(call, &r);
  if (outcome) *outcome = static_cast<int>(o);
  if (copied_by_cmt(o)) return r;
  return driver_copy(o, call.dir, bytes, [&] {
    return call.dir == Direction::HtoD ? d.cuMemcpyHtoDAsync(device, host, bytes, stream)
                                       : d.cuMemcpyDtoHAsync(host, device, bytes, stream);
  });
}

// One copy between two host buffers through the engine's lanes (host_copy.hpp): settings == nullptr,
// as the plan in force decides; otherwise staged with these. Returns the outcome's index, -1 for
// settings out of their limits.
API_EXPORT int cmt_host_copy(void* dst, const void* src, size_t bytes, const Settings* settings) {
  std::string why;
  if (settings && !check_settings(*settings, &why)) {
    log::write(log::Level::Warn, "cmt_host_copy: %s", why.c_str());
    return -1;
  }
  return host_copy_call(dst, src, bytes, settings);
}

// The tuning settings' names, limits and choices as JSON (settings.hpp): Python validates tuned
// files against them and lays out the Settings struct for cmt_memcpy from them.
API_EXPORT int cmt_settings_schema(char* buf, size_t len) { return copy_string(settings_schema_json(), buf, len); }

// The node's budget of copy threads and the worker lanes all live processes of this user, and this
// one, hold now (node_budget.hpp).
API_EXPORT int cmt_node_budget() { return node_budget(); }
API_EXPORT int cmt_node_lanes_in_use() { return node_lanes_in_use(); }
API_EXPORT int cmt_node_lanes_mine() { return node_lanes_mine(); }
// The CPUs other programs kept busy lately, which copies leave to them (cpu_load.hpp).
API_EXPORT double cmt_others_busy_cpus() { return others_busy_cpus(); }
// The node's budget of pinned staging and what all live processes of this user pinned, in MiB.
API_EXPORT long cmt_node_pinned_budget_mib() { return node_pinned_budget_mib(); }
API_EXPORT long cmt_node_pinned_in_use_mib() { return node_pinned_in_use_mib(); }

// The blocks the engine cuts a copy into (transfer_plan.hpp): writes up to max_blocks block sizes
// into out and returns how many blocks there are. For `cmt tune`'s model.
API_EXPORT int cmt_transfer_blocks(int dir, size_t bytes, size_t chunk, int lanes, size_t* out, size_t max_blocks) {
  if (!bytes || chunk < kMinChunk || chunk > kMaxChunk || lanes < 1) return -1;
  TransferPlan t = cut_transfer(dir == 0 ? Direction::HtoD : Direction::DtoH, bytes, chunk, lanes);
  for (size_t b = 0; b < t.blocks && b < max_blocks; ++b) out[b] = t.block_len(b);
  return static_cast<int>(t.blocks);
}

API_EXPORT const char* cmt_outcome_name(int outcome) {
  if (outcome < 0 || outcome >= kOutcomes) return "unknown";
  return cmt::outcome_name(static_cast<Outcome>(outcome));
}
