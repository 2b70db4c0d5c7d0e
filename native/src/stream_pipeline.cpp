#include "stream_pipeline.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "engine.hpp"
#include "env.hpp"
#include "host_copy.hpp"
#include "log.hpp"
#include "spin.hpp"

namespace cmt {
namespace {

constexpr unsigned kWriteValueDefault = 0;  // CU_STREAM_WRITE_VALUE_DEFAULT: after the stream's earlier work

// Waits until the stream has written `word` to at least `target` (cyclic): spins briefly, then
// sleeps, as the stream may be held for long.
void wait_word(const uint32_t* word, uint32_t target) {
  Backoff backoff;
  const uint64_t start = monotonic_ns();
  while (static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - target) < 0) {
    if (monotonic_ns() - start < 200000) backoff.pause();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

class StreamPipeline {
 public:
  StreamPipeline(CUcontext ctx, bool small) : ctx_(ctx), small_(small), pid_(getpid()) {}

  // Its words and lane run (in the caller's thread); false if either cannot be had.
  bool make() {
    const Driver& d = driver();
    if (d.cuMemHostAlloc(&page_, 4096, CU_MEMHOSTALLOC_PORTABLE | kMemHostAllocDeviceMap) != CUDA_SUCCESS) {
      page_ = nullptr;
      return false;
    }
    memset(page_, 0, 4096);
    CUdeviceptr dev = 0;
    if (d.cuMemHostGetDevicePointer(&dev, page_, 0) != CUDA_SUCCESS || !engine_add_run(&run_)) return false;
    host_words_ = static_cast<uint32_t*>(page_);
    gpu_words_ = host_words_ + kMaxSlots;
    host_dev_ = dev;
    gpu_dev_ = dev + kMaxSlots * sizeof(uint32_t);
    std::thread([this] { serve(); }).detach();
    return true;
  }

  CUcontext ctx() const { return ctx_; }
  bool small() const { return small_; }
  pid_t pid() const { return pid_; }
  size_t queued() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.size();
  }
  // Staging for `slots` slots of `chunk` bytes, while nothing is queued (its DMAs name the slots).
  bool fit_idle(int slots, size_t chunk) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queue_.empty()) return false;
    ring_.ensure(slots, chunk);  // short of pinned memory, what it has
    return ring_.count() > 0;
  }

  CUresult queue(PipelineTransfer* t, CUstream stream, void (*reached)(void*), void* arg);
  // One of the two things `t` waits for happened (its host function ran, its DMAs were queued).
  void awaited(PipelineTransfer* t) {
    if (t->awaited.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    { std::lock_guard<std::mutex> lock(mutex_); }  // the thread is waiting, or sees it when it looks
    cv_.notify_all();
  }

 private:
  void serve();
  void run(PipelineTransfer* t);
  CUresult queue_dmas(PipelineTransfer* t, CUstream stream);

  CUcontext ctx_;
  bool small_;
  pid_t pid_;
  StagingRing ring_;
  void* page_ = nullptr;  // the words: host[kMaxSlots], gpu[kMaxSlots], a spare (always 0)
  uint32_t* host_words_ = nullptr;
  uint32_t* gpu_words_ = nullptr;
  CUdeviceptr host_dev_ = 0, gpu_dev_ = 0;
  uint32_t counts_[kMaxSlots] = {};  // DMAs per slot queued on streams so far (under g_pipelines_mutex)
  LanePool::Run run_;
  Job job_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<PipelineTransfer*> queue_;
};

CUresult StreamPipeline::queue(PipelineTransfer* t, CUstream stream, void (*reached_fn)(void*), void* arg) {
  const Driver& d = driver();
  const IoRequest& q = t->req;
  // The plan on the staging there is (a busy pipeline's cannot change).
  const size_t chunk = std::min(std::clamp(static_cast<size_t>(q.settings.chunk_bytes), kMinChunk, kMaxChunk),
                                ring_.slot_bytes());
  const int threads = static_cast<int>(std::clamp<int64_t>(q.settings.threads, 1, kMaxThreads));
  t->plan = cut_transfer(q.dir, q.bytes, chunk, threads, env().test_piece);
  t->slots = static_cast<int>(std::min<size_t>({static_cast<size_t>(std::max<int64_t>(q.settings.buffers, 1)),
                                                t->plan.blocks, static_cast<size_t>(ring_.count())}));
  bool flipped = false;
  place_transfer(t->plan, ring_.slot_bytes(), chunk, &flipped);
  // The first transfer asks whether the device waits on and writes memory at all: a satisfied wait
  // and a write of a spare word, harmless on the caller's stream.
  static std::atomic<bool> memops_known{false};
  if (!memops_known.load(std::memory_order_acquire)) {
    const CUdeviceptr spare = host_dev_ + 2 * kMaxSlots * sizeof(uint32_t);
    CUresult r = d.cuStreamWaitValue32(stream, spare, 0, kStreamWaitValueGeq);
    if (r == CUDA_SUCCESS) r = d.cuStreamWriteValue32(stream, spare, 0, kWriteValueDefault);
    if (r != CUDA_SUCCESS) return r;
    memops_known.store(true, std::memory_order_release);
  }
  t->pipeline = this;
  t->words.host = host_words_;
  t->words.gpu = gpu_words_;
  std::copy(counts_, counts_ + kMaxSlots, t->words.base);
  if (CUresult r = d.cuLaunchHostFunc(stream, reached_fn, arg); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(t);
  }
  t->queue_error = queue_dmas(t, stream);
  for (int s = 0; s < t->slots; ++s) counts_[s] += t->waits[s];
  awaited(t);
  return CUDA_SUCCESS;
}

// Per block: wait for the lanes' word, the DMA, the stream's word. Stops at the first refusal.
CUresult StreamPipeline::queue_dmas(PipelineTransfer* t, CUstream stream) {
  const Driver& d = driver();
  const TransferPlan& plan = t->plan;
  for (size_t b = 0; b < plan.blocks; ++b) {
    const int s = static_cast<int>(b % static_cast<size_t>(t->slots));
    const uint32_t n = t->words.base[s] + t->waits[s] + 1;
    const CUdeviceptr off = s * sizeof(uint32_t);
    CUresult r = d.cuStreamWaitValue32(stream, host_dev_ + off, n, kStreamWaitValueGeq);
    if (r != CUDA_SUCCESS) return r;
    ++t->waits[s];
    char* staging = static_cast<char*>(ring_[s].mem) + plan.slot_offset(b);
    const CUdeviceptr dev = t->req.device + plan.block_off[b];
    r = t->req.dir == Direction::HtoD ? d.cuMemcpyHtoDAsync(dev, staging, plan.block_len(b), stream)
                                      : d.cuMemcpyDtoHAsync(staging, dev, plan.block_len(b), stream);
    if (r == CUDA_SUCCESS) r = d.cuStreamWriteValue32(stream, gpu_dev_ + off, n, kWriteValueDefault);
    if (r != CUDA_SUCCESS) return r;
    ++t->writes[s];
  }
  return CUDA_SUCCESS;
}

// The pipeline's thread: its transfers in the order they were queued, each once its stream reached it.
void StreamPipeline::serve() {
  mark_cmt_thread();
  for (;;) {
    PipelineTransfer* t;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return !queue_.empty() && queue_.front()->awaited.load(std::memory_order_acquire) == 0; });
      t = queue_.front();
    }
    run(t);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.pop_front();
    }
  }
}

void StreamPipeline::run(PipelineTransfer* t) {
  IoResult res;
  CUresult r = t->queue_error;
  FileEnd end(*t->req.file, t->req.file_off);
  const int64_t size_before = t->req.file->size();
  if (r == CUDA_SUCCESS) {
    Job& j = job_;
    j.plan = t->plan;
    j.slots = j.buffers = t->slots;
    j.streamed = false;
    j.device = t->req.device;
    j.host = &end;
    j.ring = &ring_;
    j.dma = nullptr;
    j.res = nullptr;
    j.words = &t->words;
    j.start();
    if (t->req.dir == Direction::DtoH) j.queue_first_round();  // sets words: cannot fail
    const int threads = static_cast<int>(std::clamp<int64_t>(t->req.settings.threads, 1, kMaxThreads));
    engine_run_job(run_, j, static_cast<int>(std::min<size_t>(threads, j.plan.pieces)));
    j.host = nullptr;
    r = j.error.load(std::memory_order_relaxed);
  }
  // Whatever did not run: its DMAs are let go (they carry stale staging), so that the stream goes on.
  for (int s = 0; s < t->slots; ++s) {
    __atomic_store_n(&host_words_[s], t->words.base[s] + t->waits[s], __ATOMIC_RELEASE);
  }
  for (int s = 0; s < t->slots; ++s) {
    wait_word(&gpu_words_[s], t->words.base[s] + t->writes[s]);
    // A DMA queued without its write (a refusal in between): the counts go on from the waits.
    if (t->writes[s] != t->waits[s]) __atomic_store_n(&gpu_words_[s], t->words.base[s] + t->waits[s], __ATOMIC_RELEASE);
  }
  if (settle_transfer(end, r, &res)) res.done = static_cast<int64_t>(t->req.bytes);
  else if (t->req.dir == Direction::DtoH) cut_back_failed_write(t->req, size_before);
  t->finished(t, res);
}

namespace {

// Selection and queuing, under one lock: a pipeline's staging changes only while nothing is queued
// on it, and each transfer's words follow the last one's.
std::mutex g_pipelines_mutex;
std::vector<StreamPipeline*> g_pipelines;  // never freed: host functions and lanes may name them

StreamPipeline* pipeline_for(CUcontext ctx, const PipelineTransfer& t) {
  const bool small = t.req.bytes <= kSmallIoBytes;
  // Small transfers: a block of up to kSmallIoBytes in each of two slots.
  const size_t chunk = small ? kSmallIoBytes : std::clamp(static_cast<size_t>(t.req.settings.chunk_bytes), kMinChunk,
                                                          kMaxChunk);
  const int slots = small ? 2 : static_cast<int>(std::clamp<int64_t>(t.req.settings.buffers, 1, kMaxBuffers));
  const pid_t pid = getpid();
  StreamPipeline* shortest = nullptr;
  size_t shortest_queue = ~size_t(0);
  int mine = 0;
  for (StreamPipeline* p : g_pipelines) {
    if (p->ctx() != ctx || p->small() != small || p->pid() != pid) continue;  // a forked child has its own
    ++mine;
    if (p->fit_idle(slots, chunk)) return p;
    const size_t n = p->queued();
    if (n > 0 && n < shortest_queue) {
      shortest = p;
      shortest_queue = n;
    }
  }
  if (mine < kMaxStreamPipelines) {
    auto* p = new StreamPipeline(ctx, small);
    if (p->make()) {
      g_pipelines.push_back(p);
      if (p->fit_idle(slots, chunk)) return p;
    } else {
      delete p;  // (no thread yet; a lane run or words it got stay)
    }
    log::debug_once(0x905, "a stream-ordered pipeline could not be made (pinned memory, the lane pool)");
  }
  return shortest;
}

}  // namespace

bool stream_pipelines_usable() {
  const Driver& d = driver();
  return d.ok && d.cuLaunchHostFunc && d.cuStreamWaitValue32 && d.cuStreamWriteValue32 && d.cuMemHostGetDevicePointer;
}

CUresult stream_pipeline_queue(CUcontext ctx, PipelineTransfer* t, CUstream stream, void (*reached)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(g_pipelines_mutex);
  StreamPipeline* p = pipeline_for(ctx, *t);
  return p ? p->queue(t, stream, reached, arg) : CUDA_ERROR_NOT_READY;
}

void stream_pipeline_reached(PipelineTransfer* t) { t->pipeline->awaited(t); }

}  // namespace cmt
