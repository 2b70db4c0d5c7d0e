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

// A 32-bit wait ("greater or equal", cyclic) or write ("after the stream's earlier work"): both
// flags are 0.
StreamMemOp mem_op(unsigned operation, CUdeviceptr word, uint32_t n) {
  static_assert(kStreamWaitValueGeq == 0 && kWriteValueDefault == 0);
  StreamMemOp op = {};
  op.value.operation = operation;
  op.value.address = word;
  op.value.value = n;
  return op;
}

// How a transfer is cut on its pipeline: DMA blocks of `block` bytes in `slots` staging slots.
struct StreamGeometry {
  size_t block;
  int slots;
};

// Small transfers: a block of up to kSmallIoBytes in each of two slots. Larger ones: blocks of an
// eighth of the transfer, from the settings' chunk up to kStreamBlockMax, in at most
// kStreamRingBytes of staging. The caller's thread pays two driver calls per block when it queues
// the transfer (queue_dmas), so few large blocks keep read_async's return short: a 1 GiB read
// queues eleven (docs/storage.md, "The stream-ordered hang"); the lanes still share each block.
StreamGeometry stream_geometry(const IoRequest& q) {
  if (q.bytes <= kSmallIoBytes) return {kSmallIoBytes, 2};
  const size_t chunk = std::clamp(static_cast<size_t>(q.settings.chunk_bytes), kMinChunk, kMaxChunk);
  const size_t eighth = (q.bytes / 8 + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);
  const size_t block = std::clamp(eighth, chunk, std::max(chunk, kStreamBlockMax));
  const auto ring_slots = static_cast<int64_t>(std::max<size_t>(2, kStreamRingBytes / block));
  return {block, static_cast<int>(std::clamp<int64_t>(q.settings.buffers, 1, std::min<int64_t>(ring_slots, kMaxBuffers)))};
}

// Waits until the stream has written `word` to at least `target` (cyclic): spins briefly, then
// sleeps, as the stream may be held for long.
void wait_word(const uint32_t* word, uint32_t target) {
  Backoff backoff(200000);
  while (static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - target) < 0) backoff.pause();
}

}  // namespace

class StreamPipeline {
 public:
  StreamPipeline(CUcontext ctx, bool small) : made_for_(ctx), small_(small), pid_(getpid()) {}

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

  CUcontext ctx() const { return made_for_.ctx; }
  bool small() const { return small_; }
  pid_t pid() const { return pid_; }
  // Its context ended, with its staging, streams and words: never used again (engine.hpp).
  bool ended() const { return made_for_.ended(); }
  size_t queued() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.size();
  }
  // Staging for `slots` slots of `chunk` bytes, while nothing is queued (its DMAs name the slots);
  // no more than kStreamRingBytes in all once its slots are larger (at least two slots).
  bool fit_idle(int slots, size_t chunk) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queue_.empty()) return false;
    const size_t slot = std::max(chunk, ring_.slot_bytes());
    ring_.ensure(std::min(slots, static_cast<int>(std::max<size_t>(2, kStreamRingBytes / slot))), chunk);
    return ring_.count() > 0;  // short of pinned memory, what it has
  }

  CUresult queue(PipelineTransfer* t, const StreamGeometry& want, CUstream stream, void (*reached)(void*), void* arg);
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

  ContextStamp made_for_;
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

CUresult StreamPipeline::queue(PipelineTransfer* t, const StreamGeometry& want, CUstream stream,
                               void (*reached_fn)(void*), void* arg) {
  const Driver& d = driver();
  const IoRequest& q = t->req;
  // The plan on the staging there is (a busy pipeline's cannot change).
  const size_t chunk = std::min(want.block, ring_.slot_bytes());
  const int threads = static_cast<int>(std::clamp<int64_t>(q.settings.threads, 1, kMaxThreads));
  t->plan = cut_transfer(q.dir, q.bytes, chunk, threads, env().test_piece);
  t->slots = static_cast<int>(std::min<size_t>({static_cast<size_t>(want.slots), t->plan.blocks,
                                                static_cast<size_t>(ring_.count())}));
  bool flipped = false;
  place_transfer(t->plan, ring_.slot_bytes(), chunk, &flipped);
  // The first transfer asks whether the device waits on and writes memory at all: a satisfied wait
  // and a write of a spare word, harmless on the caller's stream.
  static std::atomic<bool> memops_known{false};
  if (!memops_known.load(std::memory_order_acquire)) {
    const CUdeviceptr spare = host_dev_ + 2 * kMaxSlots * sizeof(uint32_t);
    StreamMemOp probe[2] = {mem_op(kMemOpWaitValue32, spare, 0), mem_op(kMemOpWriteValue32, spare, 0)};
    if (CUresult r = d.cuStreamBatchMemOp(stream, 2, probe, 0); r != CUDA_SUCCESS) return r;
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

// Per block: wait for the lanes' word, the DMA, the stream's word. Each block's wait goes to the
// driver in one call with the last block's write, so a block costs the caller two calls. Stops at
// the first refusal.
CUresult StreamPipeline::queue_dmas(PipelineTransfer* t, CUstream stream) {
  const Driver& d = driver();
  const TransferPlan& plan = t->plan;
  int written = -1;  // the slot of the DMA whose word is still to be written (none yet)
  uint32_t written_n = 0;
  for (size_t b = 0; b < plan.blocks; ++b) {
    const int s = static_cast<int>(b % static_cast<size_t>(t->slots));
    const uint32_t n = t->words.base[s] + t->waits[s] + 1;
    StreamMemOp ops[2];
    unsigned count = 0;
    if (written >= 0) ops[count++] = mem_op(kMemOpWriteValue32, gpu_dev_ + written * sizeof(uint32_t), written_n);
    ops[count++] = mem_op(kMemOpWaitValue32, host_dev_ + s * sizeof(uint32_t), n);
    CUresult r = d.cuStreamBatchMemOp(stream, count, ops, 0);
    if (r != CUDA_SUCCESS) return r;
    if (written >= 0) ++t->writes[written];
    ++t->waits[s];
    char* staging = static_cast<char*>(ring_[s].mem) + plan.slot_offset(b);
    const CUdeviceptr dev = t->req.device + plan.block_off[b];
    r = t->req.dir == Direction::HtoD ? d.cuMemcpyHtoDAsync(dev, staging, plan.block_len(b), stream)
                                      : d.cuMemcpyDtoHAsync(staging, dev, plan.block_len(b), stream);
    if (r != CUDA_SUCCESS) return r;
    written = s;
    written_n = n;
  }
  if (written < 0) return CUDA_SUCCESS;
  StreamMemOp last = mem_op(kMemOpWriteValue32, gpu_dev_ + written * sizeof(uint32_t), written_n);
  const CUresult r = d.cuStreamBatchMemOp(stream, 1, &last, 0);
  if (r == CUDA_SUCCESS) ++t->writes[written];
  return r;
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

StreamPipeline* pipeline_for(CUcontext ctx, const PipelineTransfer& t, const StreamGeometry& want) {
  const bool small = t.req.bytes <= kSmallIoBytes;
  const pid_t pid = getpid();
  StreamPipeline* shortest = nullptr;
  size_t shortest_queue = ~size_t(0);
  int mine = 0;
  for (StreamPipeline* p : g_pipelines) {
    if (p->ctx() != ctx || p->small() != small || p->pid() != pid) continue;  // a forked child has its own
    if (p->ended()) continue;  // (left in the list: host functions and lanes may still name it)
    ++mine;
    if (p->fit_idle(want.slots, want.block)) return p;
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
      if (p->fit_idle(want.slots, want.block)) return p;
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
  return d.ok && d.cuLaunchHostFunc && d.cuStreamWaitValue32 && d.cuStreamBatchMemOp && d.cuMemHostGetDevicePointer;
}

CUresult stream_pipeline_queue(CUcontext ctx, PipelineTransfer* t, CUstream stream, void (*reached)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(g_pipelines_mutex);
  const StreamGeometry want = stream_geometry(t->req);
  StreamPipeline* p = pipeline_for(ctx, *t, want);
  return p ? p->queue(t, want, stream, reached, arg) : CUDA_ERROR_NOT_READY;
}

void stream_pipeline_reached(PipelineTransfer* t) { t->pipeline->awaited(t); }

}  // namespace cmt
