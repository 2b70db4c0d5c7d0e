#include "engine.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include "dma_streams.hpp"
#include "env.hpp"
#include "job.hpp"
#include "lane_pool.hpp"
#include "plan.hpp"
#include "prefault.hpp"
#include "staging_ring.hpp"
#include "timeline.hpp"

namespace cmt {
namespace {

// A host-to-device copy returns once its lanes have staged every byte, while up to a ring of
// blocks still waits for the copy engine: 150-350 µs at 64 MiB on the H200 host. A program that
// waits for its copy before the next one (a synchronising loop, PyTorch's copy_) would call again
// after the workers' spin has run out, and every copy would pay their wake-up before its first
// DMA. So after a host-to-device copy the workers also spin through the DMAs that may still be
// queued, estimated at kTailGBps and capped at kMaxTailSpin.
constexpr double kTailGBps = 25;  // below the Gen5 links' rate: the spin rather outlasts the DMAs
constexpr std::chrono::microseconds kMaxTailSpin{2000};

// A destination still to be faulted in gets at least this many lanes: the kernel zeroes every page
// they fault in, work the tuned thread counts did not include (docs/engine-findings.md).
int fresh_memory_threads() {
  static const int n = static_cast<int>(std::min(16L, usable_cpus()));
  return n;
}

class Engine {
 public:
  CUresult copy(const CopyRequest& req);
  void forget() { pool_.forget(); }
  std::string dma_gpu_times();

 private:
  static void lane(void* job, int index);

  std::mutex job_mutex_;  // one copy at a time
  LanePool pool_;
  StagingRing ring_;
  DmaStreams dma_;
  Job job_;
};

// Runs one lane of the job; a worker first makes the job's context current in its thread.
void Engine::lane(void* arg, int index) {
  Job& job = *static_cast<Job*>(arg);
  thread_local CUcontext current = nullptr;
  if (index > 0 && current != job.res->ctx) {
    const bool first = current == nullptr;
    CUresult r = driver().cuCtxSetCurrent(job.res->ctx);
    if (r != CUDA_SUCCESS) {
      CUresult expected = CUDA_SUCCESS;
      job.error.compare_exchange_strong(expected, r);
      job.next.store(job.plan.pieces, std::memory_order_relaxed);
      return;
    }
    current = job.res->ctx;
    if (first) {
      // Never count as an unsafe call in another thread's global-mode graph capture.
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      driver().cuThreadExchangeStreamCaptureMode(&mode);
    }
  }
  job.run_lane(index);
}

std::string Engine::dma_gpu_times() {
  std::lock_guard<std::mutex> lock(job_mutex_);
  return dma_.trace_gpu_times(job_.plan.blocks);
}

CUresult Engine::copy(const CopyRequest& req) {
  const Driver& d = driver();
  if (pool_.forgotten() || !d.ok) return CUDA_ERROR_NOT_READY;
  const Settings& st = req.settings;
  const size_t chunk = std::clamp(static_cast<size_t>(st.chunk_bytes), kMinChunk, kMaxChunk);
  int threads = static_cast<int>(std::clamp<int64_t>(st.threads, 1, kMaxThreads));
  const bool prefault = req.dir == Direction::DtoH && prepare_fresh_destination(req.host, req.bytes);
  if (prefault) threads = std::max(threads, fresh_memory_threads());

  std::lock_guard<std::mutex> lock(job_mutex_);
  // The calling thread works as lane 0; keep it out of other threads' global-mode captures too.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged = d.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  struct Restore {
    const Driver& d;
    bool exchanged;
    CUstreamCaptureMode& mode;
    ~Restore() {
      if (exchanged) d.cuThreadExchangeStreamCaptureMode(&mode);
    }
  } restore{d, exchanged, mode};

  Job& j = job_;
  dma_.trace_forget();  // the last copy's DMA times describe its blocks, about to be replaced
  j.plan = cut_transfer(req.dir, req.bytes, chunk, threads, env().test_piece);
  const int slots = static_cast<int>(std::min<size_t>(std::clamp<int64_t>(st.buffers, 1, kMaxSlots), j.plan.blocks));
  ContextResources* res = dma_.for_context(req.ctx, slots);
  // The ring is sized for the largest block any rule asks for, so that it is not replaced later.
  if (!res || !ring_.ensure(slots, std::max(chunk, active_plan().max_chunk()))) return CUDA_ERROR_NOT_READY;
  dma_.switch_to(req.ctx);
  if (timeline::enabled()) dma_.trace_begin(res, j.plan.blocks);

  place_transfer(j.plan, ring_.slot_bytes(), chunk, ring_.flipped());
  HostMemory host(req.host, req.bytes, prefault);
  j.slots = slots;
  j.streamed = st.stores == kStoresStream;
  j.device = req.device;
  j.host = &host;
  j.ring = &ring_;
  j.dma = &dma_;
  j.res = res;
  j.next.store(0, std::memory_order_relaxed);
  j.error.store(CUDA_SUCCESS, std::memory_order_relaxed);
  ring_.start_copy(slots, [&](int s) { return j.plan.pieces_in(static_cast<size_t>(s)); });
  Clock::duration spin_tail{};
  if (req.dir == Direction::HtoD) {
    spin_tail = std::min<Clock::duration>(
        std::chrono::nanoseconds(static_cast<long>(j.last_ring_bytes() / kTailGBps)), kMaxTailSpin);
  }
  const int lanes = static_cast<int>(std::min<size_t>(threads, j.plan.pieces));
  if (timeline::enabled()) {
    timeline::begin(static_cast<int>(req.dir), req.bytes, j.plan.block_off,
                    std::vector<int>(j.plan.blocks, j.streamed ? 1 : 0), lanes);
  }
  if (req.dir == Direction::DtoH) {
    // The first round of DMAs goes out before any lane starts; lanes queue the rest.
    if (CUresult r = j.queue_first_round(); r != CUDA_SUCCESS) return r;
  }
  pool_.run(lanes, &Engine::lane, &j, spin_tail);  // returns once every lane that took part is done
  j.host = nullptr;

  CUresult err = j.error.load(std::memory_order_relaxed);
  if (req.dir == Direction::HtoD && err == CUDA_SUCCESS) {
    // Later work on the caller's stream waits for the DMAs still in flight.
    err = d.cuEventRecord(res->done, res->stream);
    if (err == CUDA_SUCCESS) err = d.cuStreamWaitEvent(req.stream, res->done, 0);
  }
  if (timeline::enabled()) timeline::note(timeline::Step::CopyEnd);
  return err;
}

Engine* g_engine = nullptr;
std::once_flag g_engine_once;

}  // namespace

CUresult engine_copy(const CopyRequest& req) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });  // never destroyed: workers live on
  return g_engine->copy(req);
}

std::string engine_dma_gpu_times() { return g_engine ? g_engine->dma_gpu_times() : std::string(); }

void engine_forget_after_fork() {
  if (g_engine) g_engine->forget();
}

}  // namespace cmt
