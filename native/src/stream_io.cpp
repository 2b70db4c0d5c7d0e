#include "stream_io.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "driver.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "stream_pipeline.hpp"

namespace cmt {

struct StreamOp : PipelineTransfer {
  std::atomic<int> refs{1};  // the caller's; one more while its pipeline has it
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  IoResult result;
  uint32_t* word = nullptr;  // device to file: the word the stream waits on, and the value that releases it
  uint32_t target = 0;
};

namespace {

void release(StreamOp* op) {
  if (op->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  op->req.file->release();
  delete op;
}

// Pinned, device-mapped 32-bit words, a page at a time. A free word holds the value its last
// transfer set, so the next transfer on it waits for one more. A page belongs to the context that
// was current when it was made: when that context ends, the page goes with it, and its words too.
class FlagWords {
 public:
  bool take(const Driver& d, uint32_t** word, uint32_t* target) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_ended();
    if (free_.empty() && !add_page(d)) return false;
    *word = free_.back();
    free_.pop_back();
    *target = __atomic_load_n(*word, __ATOMIC_RELAXED) + 1;  // wraps after 2^32: the wait compares cyclically
    return true;
  }
  // A first page, unless there are words already. After the first, one load: it runs at every
  // synchronous transfer.
  bool warmed() const { return pages_made_.load(std::memory_order_acquire); }
  void warm(const Driver& d) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_ended();
    if (free_.empty() && pages_.empty()) add_page(d);
  }
  void give(uint32_t* word) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Page& page : pages_) {
      if (page.holds(word)) {
        free_.push_back(word);
        return;
      }
    }  // (a word of a page whose context ended: gone with it)
  }

 private:
  static constexpr size_t kPageBytes = 4096;
  struct Page {
    uint32_t* words;
    ContextStamp made_for;
    bool holds(const uint32_t* w) const { return w >= words && w < words + kPageBytes / sizeof(uint32_t); }
  };

  void forget_if_ended() {
    for (size_t i = 0; i < pages_.size(); ++i) {
      const Page page = pages_[i];
      if (!page.made_for.ended()) continue;
      free_.erase(std::remove_if(free_.begin(), free_.end(), [&](uint32_t* w) { return page.holds(w); }), free_.end());
      pages_.erase(pages_.begin() + static_cast<long>(i--));
    }
    if (pages_.empty()) pages_made_.store(false, std::memory_order_release);
  }
  bool add_page(const Driver& d) {
    void* page = nullptr;
    CUcontext ctx = nullptr;
    if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        d.cuMemHostAlloc(&page, kPageBytes, CU_MEMHOSTALLOC_PORTABLE | kMemHostAllocDeviceMap) != CUDA_SUCCESS) {
      return false;
    }
    memset(page, 0, kPageBytes);
    for (size_t i = 0; i < kPageBytes / sizeof(uint32_t); ++i) free_.push_back(static_cast<uint32_t*>(page) + i);
    pages_.push_back(Page{static_cast<uint32_t*>(page), ContextStamp(ctx)});
    pages_made_.store(true, std::memory_order_release);
    return true;
  }

  std::vector<Page> pages_;
  std::atomic<bool> pages_made_{false};
  std::mutex mutex_;
  std::vector<uint32_t*> free_;
};

FlagWords g_words;
std::atomic<bool> g_no_stream_memops{false};  // the driver refused a wait or write on memory once

void set_result(StreamOp* op, const IoResult& r) {
  {
    std::lock_guard<std::mutex> lock(op->mutex);
    op->result = r;
    op->done = true;
  }
  op->done_cv.notify_all();
}

// The pipeline's thread, once the transfer and its DMAs are done.
void on_finished(PipelineTransfer* t, const IoResult& r) {
  auto* op = static_cast<StreamOp*>(t);
  set_result(op, r);
  // The result is written before the stream may go on: whoever synchronises it then reads it whole.
  if (op->word) {
    __atomic_store_n(op->word, op->target, __ATOMIC_RELEASE);
    g_words.give(op->word);
  }
  release(op);
}

void on_reached(void* arg) { stream_pipeline_reached(static_cast<StreamOp*>(arg)); }

IoResult failure(int32_t status, CUresult r) {
  IoResult res;
  res.status = status;
  res.cu_result = r;
  return res;
}

// Where the stream cannot be made to wait: waits for it here, then transfers synchronously.
StreamOp* run_in_order(StreamOp* op, CUstream stream) {
  log::debug_once(0x904, "stream-ordered transfers cannot be queued on this device (waits on memory, a "
                         "pipeline): the call waits for its stream and transfers before it returns");
  const CUresult r = driver().cuStreamSynchronize(stream);
  set_result(op, r == CUDA_SUCCESS ? file_transfer(op->req) : failure(kIoCudaError, r));
  return op;
}

}  // namespace

StreamOp* stream_io_submit(const IoRequest& req, CUstream stream, IoResult* failed) {
  const Driver& d = driver(/*load_if_absent=*/true);
  if (!d.ok) {
    *failed = failure(kIoCudaError, CUDA_ERROR_NOT_INITIALIZED);
    return nullptr;
  }
  CUcontext ctx = io_context_of(req.device);
  if (!ctx) {
    *failed = failure(kIoBadDevice, CUDA_SUCCESS);
    return nullptr;
  }
  ContextScope scope(d, ctx);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult r = d.cuStreamIsCapturing(stream, &capture); r != CUDA_SUCCESS) {
    *failed = failure(kIoCudaError, r);
    return nullptr;
  }
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {  // a graph would run the transfer at every launch
    *failed = failure(kIoBadRequest, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    return nullptr;
  }
  auto* op = new StreamOp;
  op->req = req;
  op->req.wait_legacy = false;  // the stream orders it
  req.file->retain();
  IoFile& file = *req.file;
  // The DMAs are queued now, so a read is cut at the end of the file as it will be once the
  // stream-ordered writes queued before it are done.
  if (req.dir == Direction::HtoD && file.size() >= 0) {
    const uint64_t end = std::max<uint64_t>(static_cast<uint64_t>(file.size()), file.stream_write_end());
    op->req.bytes = req.file_off >= end ? 0 : std::min<uint64_t>(req.bytes, end - req.file_off);
  } else if (req.dir == Direction::DtoH) {
    file.note_stream_write(req.file_off + req.bytes);
  }
  if (op->req.bytes == 0) {
    set_result(op, IoResult{});
    return op;
  }
  if (g_no_stream_memops.load() || !stream_pipelines_usable()) return run_in_order(op, stream);
  // Device to file: the stream's later work waits until the file has the bytes.
  CUdeviceptr flag = 0;
  if (req.dir == Direction::DtoH &&
      (!g_words.take(d, &op->word, &op->target) || d.cuMemHostGetDevicePointer(&flag, op->word, 0) != CUDA_SUCCESS)) {
    if (op->word) g_words.give(op->word);
    op->word = nullptr;
    return run_in_order(op, stream);
  }
  op->finished = on_finished;
  op->refs.fetch_add(1, std::memory_order_relaxed);  // the pipeline's
  const CUresult r = stream_pipeline_queue(ctx, op, stream, on_reached, op);
  if (r != CUDA_SUCCESS) {
    op->refs.fetch_sub(1, std::memory_order_relaxed);
    if (op->word) g_words.give(op->word);
    op->word = nullptr;
    if (r == CUDA_ERROR_NOT_SUPPORTED) g_no_stream_memops.store(true);
    if (r == CUDA_ERROR_NOT_READY || r == CUDA_ERROR_NOT_SUPPORTED) return run_in_order(op, stream);
    release(op);
    *failed = failure(kIoCudaError, r);
    return nullptr;
  }
  if (op->queue_error == CUDA_ERROR_NOT_SUPPORTED) g_no_stream_memops.store(true);
  if (op->word) {
    const CUresult w = d.cuStreamWaitValue32(stream, flag, op->target, kStreamWaitValueGeq);
    if (w == CUDA_ERROR_NOT_SUPPORTED) g_no_stream_memops.store(true);
    if (w != CUDA_SUCCESS) stream_io_wait(op, -1);  // nothing holds the stream's later work back: this does
  }
  return op;
}

bool stream_io_wait(StreamOp* op, int64_t timeout_us) {
  std::unique_lock<std::mutex> lock(op->mutex);
  if (timeout_us < 0) {
    op->done_cv.wait(lock, [op] { return op->done; });
    return true;
  }
  return op->done_cv.wait_for(lock, std::chrono::microseconds(timeout_us), [op] { return op->done; });
}

IoResult stream_io_result(StreamOp* op) {
  std::lock_guard<std::mutex> lock(op->mutex);
  if (!op->done) return failure(kIoPending, CUDA_SUCCESS);
  return op->result;
}

void stream_io_release(StreamOp* op) { release(op); }

void stream_io_warm() {
  if (g_words.warmed()) return;
  const Driver& d = driver(/*load_if_absent=*/true);
  CUcontext ctx = nullptr;
  if (!d.ok || !d.cuStreamWaitValue32 || d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return;
  g_words.warm(d);
}

}  // namespace cmt
