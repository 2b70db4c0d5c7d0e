#include "engine.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "driver.hpp"
#include "log.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cmt {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

using Clock = std::chrono::steady_clock;

// How long idle workers spin before sleeping: back-to-back copies (a model's tensors) then start
// without a futex wake-up per worker.
std::chrono::microseconds spin_time() {
  static const long us = [] {
    const char* v = getenv("CMT_SPIN_US");
    return v ? std::max(0L, atol(v)) : 200L;
  }();
  return std::chrono::microseconds(us);
}

// Device-to-host into never-touched pages would take one page fault per 4 KiB inside memcpy,
// serialised on the process's page-table lock. Faulting a chunk in with one madvise while its DMA
// runs takes them in bulk and in parallel across lanes (shared/measurements: 1.4 -> 22 GB/s).
std::atomic<bool> g_populate_ok{true};

void prefault_destination(char* p, size_t len) {
  if (!g_populate_ok.load(std::memory_order_relaxed)) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(page - 1);
  if (e <= a) return;
  unsigned char resident = 0;
  // Already faulted in (the common case for reused buffers): nothing to do.
  if (mincore(reinterpret_cast<void*>(a), page, &resident) == 0 && (resident & 1)) return;
  if (madvise(reinterpret_cast<void*>(a), e - a, MADV_POPULATE_WRITE) != 0 &&
      (errno == EINVAL || errno == ENOSYS)) {
    g_populate_ok.store(false, std::memory_order_relaxed);
    log::write(log::Level::Debug, "MADV_POPULATE_WRITE unsupported (kernel < 5.14); faults stay in memcpy");
  }
}

struct LaneContext {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUevent slot_event[kMaxDepth] = {};
  CUevent done_event = nullptr;
};

struct Lane {
  std::vector<LaneContext> contexts;  // one per CUDA context this lane has served
  LaneContext* active = nullptr;
  void* slot[kMaxDepth] = {};
  int slots = 0;
  size_t slot_bytes = 0;
  CUevent busy[kMaxDepth] = {};  // event of the DMA still using a slot, or null
  int next_slot = 0;
  bool issued = false;           // queued a DMA in the current job
  CUcontext thread_ctx = nullptr;  // context current in this lane's worker thread
};

struct Job {
  Direction dir = Direction::HtoD;
  CUcontext ctx = nullptr;
  char* host = nullptr;
  CUdeviceptr device = 0;
  size_t bytes = 0, chunk = 0, chunks = 0;
  int depth = 1;
  std::atomic<size_t> next{0};
  std::atomic<int> remaining{0};
  std::atomic<CUresult> error{CUDA_SUCCESS};
};

class Engine {
 public:
  CUresult copy(const CopyRequest& req);
  void forget() { forked_ = true; }

 private:
  bool prepare(int lanes, CUcontext ctx, size_t chunk, int depth);
  bool prepare_lane(Lane& lane, CUcontext ctx, size_t slot_bytes, int depth);
  void start_worker(int index);
  void worker_main(int index, uint64_t seen);
  void run_lane(Lane& lane);
  void run_lane_htod(Lane& lane);
  void run_lane_dtoh(Lane& lane);
  void fail(CUresult r);
  size_t chunk_len(size_t c) const { return std::min(job_.chunk, job_.bytes - c * job_.chunk); }

  const Driver& d_ = driver();
  std::mutex job_mutex_;  // one copy at a time; copies are link-bound anyway
  Lane lanes_[kMaxThreads];
  int workers_ = 0;       // worker threads started (lanes 1..workers_)
  Job job_;
  std::atomic<uint64_t> ticket_{0};  // (generation << 8) | lanes of the current job
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  std::atomic<bool> forked_{false};
};

void Engine::fail(CUresult r) {
  CUresult expected = CUDA_SUCCESS;
  job_.error.compare_exchange_strong(expected, r);
  job_.next.store(job_.chunks, std::memory_order_relaxed);  // the other lanes stop claiming
}

bool Engine::prepare_lane(Lane& lane, CUcontext ctx, size_t slot_bytes, int depth) {
  lane.active = nullptr;
  for (auto& lc : lane.contexts) {
    if (lc.ctx == ctx) lane.active = &lc;
  }
  if (!lane.active) {
    LaneContext lc;
    lc.ctx = ctx;
    if (d_.cuStreamCreate(&lc.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return false;
    for (auto& e : lc.slot_event) {
      if (d_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
    }
    if (d_.cuEventCreate(&lc.done_event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return false;
    lane.contexts.push_back(lc);
    lane.active = &lane.contexts.back();
  }
  if (lane.slot_bytes < slot_bytes) {  // larger chunks than before: replace the buffers
    for (int s = 0; s < lane.slots; ++s) {
      if (lane.busy[s]) d_.cuEventSynchronize(lane.busy[s]);
      lane.busy[s] = nullptr;
      d_.cuMemFreeHost(lane.slot[s]);
    }
    lane.slots = 0;
    lane.slot_bytes = slot_bytes;
  }
  while (lane.slots < depth) {
    // Portable: one set of buffers serves every context and device.
    if (d_.cuMemHostAlloc(&lane.slot[lane.slots], lane.slot_bytes, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
      return false;
    }
    ++lane.slots;
  }
  lane.next_slot %= depth;
  lane.issued = false;
  return true;
}

bool Engine::prepare(int lanes, CUcontext ctx, size_t chunk, int depth) {
  size_t slot_bytes = std::max(chunk, active_plan().max_chunk());
  for (int i = 0; i < lanes; ++i) {
    if (!prepare_lane(lanes_[i], ctx, slot_bytes, depth)) return false;
  }
  while (workers_ < lanes - 1) start_worker(++workers_);
  return true;
}

void Engine::start_worker(int index) {
  // Workers take no signals: the program's handlers run on its own threads, as without cmt.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  uint64_t seen = ticket_.load(std::memory_order_relaxed) >> 8;
  std::thread([this, index, seen] { worker_main(index, seen); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Engine::worker_main(int index, uint64_t seen) {
  char name[16];
  snprintf(name, sizeof name, "cmt-copy-%d", index);
  pthread_setname_np(pthread_self(), name);
  Lane& lane = lanes_[index];
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if ((t >> 8) == seen) {
      auto until = Clock::now() + spin_time();
      while ((ticket_.load(std::memory_order_acquire) >> 8) == seen && Clock::now() < until) cpu_relax();
      std::unique_lock<std::mutex> lock(wake_mutex_);
      wake_cv_.wait(lock, [&] { return (ticket_.load(std::memory_order_acquire) >> 8) != seen; });
      continue;
    }
    seen = t >> 8;
    if (index >= static_cast<int>(t & 0xff)) continue;  // not needed for this copy
    if (lane.thread_ctx != job_.ctx) {
      bool first = lane.thread_ctx == nullptr;
      CUresult r = d_.cuCtxSetCurrent(job_.ctx);
      if (r != CUDA_SUCCESS) {
        fail(r);
        job_.remaining.fetch_sub(1, std::memory_order_release);
        continue;
      }
      lane.thread_ctx = job_.ctx;
      if (first) {
        // Never count as an unsafe call in another thread's global-mode graph capture.
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        d_.cuThreadExchangeStreamCaptureMode(&mode);
      }
    }
    run_lane(lane);
    job_.remaining.fetch_sub(1, std::memory_order_release);
  }
}

void Engine::run_lane(Lane& lane) {
  if (job_.dir == Direction::HtoD) run_lane_htod(lane);
  else run_lane_dtoh(lane);
}

void Engine::run_lane_htod(Lane& lane) {
  LaneContext& lc = *lane.active;
  for (;;) {
    size_t c = job_.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job_.chunks) break;
    size_t off = c * job_.chunk, len = chunk_len(c);
    int s = lane.next_slot;
    lane.next_slot = (s + 1) % job_.depth;
    if (lane.busy[s]) {  // its previous DMA must have read the buffer before we refill it
      CUresult r = d_.cuEventSynchronize(lane.busy[s]);
      lane.busy[s] = nullptr;
      if (r != CUDA_SUCCESS) return fail(r);
    }
    memcpy(lane.slot[s], job_.host + off, len);
    CUresult r = d_.cuMemcpyHtoDAsync(job_.device + off, lane.slot[s], len, lc.stream);
    if (r == CUDA_SUCCESS) r = d_.cuEventRecord(lc.slot_event[s], lc.stream);
    if (r != CUDA_SUCCESS) return fail(r);
    lane.busy[s] = lc.slot_event[s];
    lane.issued = true;
  }
  if (lane.issued) {
    CUresult r = d_.cuEventRecord(lc.done_event, lc.stream);
    if (r != CUDA_SUCCESS) fail(r);
  }
}

void Engine::run_lane_dtoh(Lane& lane) {
  LaneContext& lc = *lane.active;
  size_t pending_chunk[kMaxDepth];
  int pending_slot[kMaxDepth];
  int head = 0, count = 0;
  bool exhausted = false;
  CUresult err = CUDA_SUCCESS;
  for (;;) {
    // Keep up to `depth` DMAs in flight for this lane, pre-faulting their destinations meanwhile.
    while (!exhausted && count < job_.depth && err == CUDA_SUCCESS) {
      size_t c = job_.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job_.chunks) {
        exhausted = true;
        break;
      }
      int s = lane.next_slot;
      lane.next_slot = (s + 1) % job_.depth;
      if (lane.busy[s]) {  // an earlier host-to-device DMA may still read this buffer
        err = d_.cuEventSynchronize(lane.busy[s]);
        lane.busy[s] = nullptr;
        if (err != CUDA_SUCCESS) break;
      }
      size_t off = c * job_.chunk;
      err = d_.cuMemcpyDtoHAsync(lane.slot[s], job_.device + off, chunk_len(c), lc.stream);
      if (err == CUDA_SUCCESS) err = d_.cuEventRecord(lc.slot_event[s], lc.stream);
      if (err != CUDA_SUCCESS) break;
      int tail = (head + count) % kMaxDepth;
      pending_chunk[tail] = c;
      pending_slot[tail] = s;
      ++count;
      prefault_destination(job_.host + off, chunk_len(c));
    }
    if (count == 0) break;
    size_t c = pending_chunk[head];
    int s = pending_slot[head];
    head = (head + 1) % kMaxDepth;
    --count;
    if (err != CUDA_SUCCESS) {  // stop copying; later users of the slot wait for its DMA
      lane.busy[s] = lc.slot_event[s];
      continue;
    }
    err = d_.cuEventSynchronize(lc.slot_event[s]);
    if (err != CUDA_SUCCESS) continue;
    memcpy(job_.host + c * job_.chunk, lane.slot[s], chunk_len(c));
  }
  if (err != CUDA_SUCCESS) fail(err);
}

CUresult Engine::copy(const CopyRequest& req) {
  if (forked_.load(std::memory_order_relaxed) || !d_.ok) return CUDA_ERROR_NOT_READY;
  const Settings& st = req.settings;
  size_t chunk = std::clamp(st.chunk, kMinChunk, kMaxChunk);
  size_t chunks = (req.bytes + chunk - 1) / chunk;
  int lanes = static_cast<int>(std::min<size_t>(std::clamp(st.threads, 1, kMaxThreads), chunks));
  int depth = st.depth();

  std::lock_guard<std::mutex> lock(job_mutex_);
  // The calling thread works as lane 0; keep it out of other threads' global-mode captures too.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged = d_.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  if (!prepare(lanes, req.ctx, chunk, depth)) {
    if (exchanged) d_.cuThreadExchangeStreamCaptureMode(&mode);
    return CUDA_ERROR_NOT_READY;
  }
  job_.dir = req.dir;
  job_.ctx = req.ctx;
  job_.host = req.host;
  job_.device = req.device;
  job_.bytes = req.bytes;
  job_.chunk = chunk;
  job_.chunks = chunks;
  job_.depth = depth;
  job_.next.store(0, std::memory_order_relaxed);
  job_.error.store(CUDA_SUCCESS, std::memory_order_relaxed);
  job_.remaining.store(lanes - 1, std::memory_order_relaxed);
  if (lanes > 1) {
    uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> 8) + 1;
    ticket_.store((gen << 8) | static_cast<uint64_t>(lanes), std::memory_order_release);
    { std::lock_guard<std::mutex> wake(wake_mutex_); }
    wake_cv_.notify_all();
  }
  run_lane(lanes_[0]);
  auto spin_until = Clock::now() + std::chrono::milliseconds(1);
  while (job_.remaining.load(std::memory_order_acquire) != 0) {
    if (Clock::now() < spin_until) cpu_relax();
    else sched_yield();
  }
  if (exchanged) d_.cuThreadExchangeStreamCaptureMode(&mode);

  CUresult err = job_.error.load(std::memory_order_relaxed);
  if (req.dir == Direction::HtoD) {
    // Later work on the caller's stream waits for the DMAs still in flight.
    for (int i = 0; i < lanes; ++i) {
      if (!lanes_[i].issued) continue;
      CUresult r = d_.cuStreamWaitEvent(req.stream, lanes_[i].active->done_event, 0);
      if (err == CUDA_SUCCESS) err = r;
    }
  }
  return err;
}

Engine* g_engine = nullptr;
std::once_flag g_engine_once;

}  // namespace

CUresult engine_copy(const CopyRequest& req) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });  // never destroyed: workers live on
  return g_engine->copy(req);
}

void engine_forget_after_fork() {
  if (g_engine) g_engine->forget();
}

}  // namespace cmt
