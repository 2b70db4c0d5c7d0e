#include "copy_path.hpp"

#include <atomic>
#include <cstdint>

#include "driver.hpp"
#include "engine.hpp"
#include "env.hpp"
#include "host_copy.hpp"
#include "mapped_copy.hpp"
#include "plan.hpp"
#include "rate_guard.hpp"

namespace cmt {
namespace {

std::atomic<bool> g_disabled{false};
std::atomic<bool> g_forked{false};
std::atomic<bool> g_prepared_early{false};

struct PointerInfo {
  unsigned int memory_type = 0;  // 0: not known to CUDA (pageable host memory)
  unsigned long long managed = 0;  // a bool in the driver's answer; wide slot, zeroed
  CUcontext context = nullptr;
  CUdeviceptr range_start = 0;
  size_t range_size = 0;
};

// One driver call per pointer: it never fails on a pointer CUDA does not know.
bool query_pointer(const Driver& d, CUdeviceptr p, PointerInfo* info) {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[] = {&info->memory_type, &info->managed, &info->context, &info->range_start, &info->range_size};
  return d.cuPointerGetAttributes(5, attrs, data, p) == CUDA_SUCCESS;
}

// A per-thread event per context, recorded on the caller's stream to wait for its prior work.
CUevent entry_event(const Driver& d, CUcontext ctx) {
  constexpr int kSlots = 8;
  static thread_local CUcontext ctxs[kSlots];
  static thread_local CUevent events[kSlots];
  static thread_local int used = 0;
  static thread_local uint64_t ended_seen = 0;
  if (contexts_ended_since(&ended_seen)) used = 0;  // their events went with them
  for (int i = 0; i < used; ++i) {
    if (ctxs[i] == ctx) return events[i];
  }
  CUevent e = nullptr;
  if (d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  int i = used < kSlots ? used++ : kSlots - 1;  // beyond 8 contexts a thread recycles the last slot
  ctxs[i] = ctx;
  events[i] = e;
  return e;
}

HostKind kind_of(const PointerInfo& info) {
  if (info.managed) return HostKind::Managed;
  if (info.memory_type == CU_MEMORYTYPE_HOST) return HostKind::Pinned;
  if (info.memory_type == 0) return HostKind::Pageable;
  return HostKind::Device;
}

Outcome decide_and_copy(const CopyCall& call, CUresult* result, HostKind* kind) {
  if (g_disabled.load(std::memory_order_relaxed)) return Outcome::Disabled;
  if (g_forked.load(std::memory_order_relaxed)) return Outcome::ForkedChild;
  // Cheapest test first: small copies must cost nothing measurable.
  Settings settings;
  double driver_gbps = 0;  // the plan's figure for the driver's own copy (rate_guard.hpp)
  if (call.forced) {
    settings = *call.forced;
  } else {
    const Rule& rule = active_plan().lookup(call.dir, call.bytes);
    if (rule.pass || call.bytes == 0) {
      prepare_staging_early(nullptr);
      return Outcome::BelowMinimum;
    }
    settings = rule.settings;
    driver_gbps = rule.driver_gbps;
  }
  const Driver& d = driver();
  if (!d.ok) return Outcome::NoDriver;
  CUcontext ctx = nullptr;
  if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return Outcome::NoContext;

  PointerInfo host, dev;
  if (!query_pointer(d, reinterpret_cast<CUdeviceptr>(call.host), &host)) return Outcome::NoContext;
  *kind = kind_of(host);
  if (host.managed) return Outcome::ManagedMemory;
  if (host.memory_type == CU_MEMORYTYPE_HOST) {
    prepare_staging_early(ctx);
    return Outcome::PinnedHost;
  }
  if (host.memory_type != 0) return Outcome::NotHostDevice;
  // A size the rate guard has backed off goes to the driver before the checks and the wait for the
  // stream below, which cost a passed 1 MiB copy 5-15 µs of its 95 (H100, 2026-12-06: 0.9x of
  // plain); not where a file mapping may serve the copy, which the guard leaves alone. (A backed-off
  // class is never measured, only probed: its passes need no wait.)
  const bool guarded = call.forced == nullptr && env().test_guard;
  const bool early = guarded && guard_backed_off(call.dir, call.bytes) &&
                     !(call.dir == Direction::HtoD && call.bytes >= kMappedCopyMinBytes);
  if (early && guard_decide(call.dir, call.bytes, driver_gbps) != Verdict::Stage) return Outcome::BackedOff;
  if (!query_pointer(d, call.device, &dev)) return Outcome::DeviceRange;
  if (dev.managed) return Outcome::ManagedMemory;
  // Only a range inside one device allocation of this context is staged: a chunked copy must not
  // write part of it and then fail where the driver would have refused the whole copy.
  if (dev.memory_type != CU_MEMORYTYPE_DEVICE || (dev.context && dev.context != ctx) ||
      call.device < dev.range_start || call.device + call.bytes > dev.range_start + dev.range_size ||
      call.device + call.bytes < call.device) {
    return Outcome::DeviceRange;
  }

  // Resolve stream 0 here, in the caller's thread: legacy or this thread's per-thread stream.
  CUstream stream = call.stream;
  if (!stream) stream = call.default_stream == DefaultStream::PerThread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    return Outcome::Capturing;
  }
  // Start after all prior work on the stream (on the legacy stream this includes every blocking
  // stream), as the driver's staged copy does: record an event there and wait for it in this
  // thread. (Waiting on the DMA stream instead was measured no better: docs/engine-findings.md.)
  CUevent entry = entry_event(d, ctx);
  if (!entry) return Outcome::Resources;
  if (d.cuEventRecord(entry, stream) != CUDA_SUCCESS) return Outcome::StreamContext;
  if (d.cuEventSynchronize(entry) != CUDA_SUCCESS) return Outcome::StreamContext;

  // A source in a file mapping that is not in the page cache: read from the file (mapped_copy.hpp).
  // Not the rate guard's business: faulting such a mapping in is what the driver's copy would wait on.
  if (call.dir == Direction::HtoD && !call.forced) {
    CopyRequest req{call.dir, ctx, call.host, call.device, call.bytes, stream, settings};
    Outcome o = Outcome::FromFile;
    if (copy_from_mapping(req, result, &o)) return o;
  }

  // Never slower than the driver: while staging loses on this host, the driver copies (rate_guard.hpp).
  // Both are timed with the stream's earlier work done (the engine's copy from when it has its
  // pipeline, not while it waits for another thread's copy). The C API's explicit settings
  // (benchmarks, the tuner) are measured as they are.
  if (guarded && !early && guard_decide(call.dir, call.bytes, driver_gbps) != Verdict::Stage) return Outcome::BackedOff;

  // While a GPU's pipeline is being set up (its first copy starts that), the program's copies go to
  // the driver rather than wait for it (large ones after a short wait, engine.cpp), and so do small
  // copies while another thread's copy has the pipeline. Explicit settings are measured on a ready
  // pipeline.
  CopyRequest req{call.dir, ctx, call.host, call.device, call.bytes, stream, settings};
  req.driver_gbps = driver_gbps;
  uint64_t ran_ns = 0;
  Pass passed = Pass::No;
  const bool may_pass = call.forced == nullptr;
  CUresult r = engine_copy(req, &ran_ns, may_pass ? &passed : nullptr);
  if (passed == Pass::Warming) return Outcome::Warming;
  if (passed == Pass::Busy) return Outcome::PipelinesBusy;
  if (r == CUDA_ERROR_NOT_READY) return Outcome::Resources;
  if (guarded && r == CUDA_SUCCESS) guard_staged(call.dir, call.bytes, ran_ns);
  *result = r;
  return Outcome::Accelerated;
}

}  // namespace

Outcome try_accelerate(const CopyCall& call, CUresult* result, HostKind* kind) {
  HostKind k = HostKind::Unknown;
  Outcome o = decide_and_copy(call, result, &k);
  if (kind) *kind = k;
  record(call.dir, o, call.bytes);
  return o;
}

HostKind classify_host(const void* host) {
  const Driver& d = driver();
  PointerInfo info;
  if (!d.ok || !query_pointer(d, reinterpret_cast<CUdeviceptr>(host), &info)) return HostKind::Unknown;
  return kind_of(info);
}

// The process's first context, or its first copy that is not staged (pinned, or below the plan's
// minimum), starts the context's staging setup in the background (engine_prepare), unless the plan
// stages nothing: libraries that stage their own copies (CuPy, safetensors, JAX) and loaders that
// make small copies first (Hugging Face) then find it ready for their first pageable copies. (H100,
// 2026-12-06: CuPy's 1 GiB get() and every copy of a from_pretrained went to the driver while it
// was made; 2026-12-07: a from_pretrained's setup, started by its first copies, took 96-120 ms
// while those copies held the driver, and all 30 went to it.) After the first, one load.
void prepare_staging_early(CUcontext ctx) {
  if (g_prepared_early.load(std::memory_order_relaxed)) return;
  if (!active_plan().stages_device_copies()) {
    g_prepared_early.store(true, std::memory_order_relaxed);
    return;
  }
  if (copies_disabled() || in_forked_child() || inside_cmt()) return;
  const Driver& d = driver();
  if (!ctx && (!d.ok || d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)) return;
  if (!ctx || g_prepared_early.exchange(true, std::memory_order_acq_rel)) return;
  engine_prepare(ctx);
}

bool classify_uva(CUdeviceptr dst, CUdeviceptr src, Direction* dir) {
  const Driver& d = driver();
  if (!d.ok) return false;
  PointerInfo a, b;
  if (!query_pointer(d, dst, &a) || !query_pointer(d, src, &b)) return false;
  bool dst_device = a.memory_type == CU_MEMORYTYPE_DEVICE, src_device = b.memory_type == CU_MEMORYTYPE_DEVICE;
  if (dst_device == src_device) return false;  // host<->host or device<->device: not ours
  *dir = dst_device ? Direction::HtoD : Direction::DtoH;
  return true;
}

void set_disabled(bool disabled) { g_disabled.store(disabled); }

bool copies_disabled() { return g_disabled.load(std::memory_order_relaxed); }
bool in_forked_child() { return g_forked.load(std::memory_order_relaxed); }

void mark_forked_child() {
  g_forked.store(true);
  engine_forget_after_fork();
}

}  // namespace cmt
