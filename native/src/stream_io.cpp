#include "stream_io.hpp"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "driver.hpp"
#include "engine.hpp"
#include "log.hpp"

namespace cmt {

class IoWorker;

struct StreamOp {
  IoRequest req;
  IoWorker* worker = nullptr;
  std::atomic<int> refs{2};  // the caller's and the I/O thread's; one more for a blocking host function
  std::mutex mutex;
  std::condition_variable done_cv;
  bool finished = false;
  IoResult result;
  uint32_t* word = nullptr;  // the pinned word the stream waits on, and the value that releases it
  uint32_t target = 0;
};

namespace {

void release(StreamOp* op) {
  if (op->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  op->req.file->release();
  delete op;
}

// Pinned, device-mapped 32-bit words, a page at a time. A free word holds the value its last
// transfer set, so the next transfer on it waits for one more.
class FlagWords {
 public:
  bool take(const Driver& d, uint32_t** word, uint32_t* target) {
    std::lock_guard<std::mutex> lock(mutex_);
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
    if (free_.empty() && !pages_) add_page(d);
  }
  void give(uint32_t* word) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(word);
  }

 private:
  bool add_page(const Driver& d) {
    void* page = nullptr;
    if (d.cuMemHostAlloc(&page, kPageBytes, CU_MEMHOSTALLOC_PORTABLE | kMemHostAllocDeviceMap) != CUDA_SUCCESS) {
      return false;
    }
    memset(page, 0, kPageBytes);
    for (size_t i = 0; i < kPageBytes / sizeof(uint32_t); ++i) free_.push_back(static_cast<uint32_t*>(page) + i);
    ++pages_;
    pages_made_.store(true, std::memory_order_release);
    return true;
  }

  static constexpr size_t kPageBytes = 4096;
  int pages_ = 0;
  std::atomic<bool> pages_made_{false};
  std::mutex mutex_;
  std::vector<uint32_t*> free_;
};

FlagWords g_words;
std::atomic<bool> g_no_wait_value{false};  // the device refused a wait on memory once

void finish(StreamOp* op, const IoResult& r) {
  {
    std::lock_guard<std::mutex> lock(op->mutex);
    op->result = r;
    op->finished = true;
  }
  op->done_cv.notify_all();
  // The result is written before the stream may go on: whoever synchronises it then reads it whole.
  if (op->word) {
    __atomic_store_n(op->word, op->target, __ATOMIC_RELEASE);
    g_words.give(op->word);
  }
  engine_stream_transfers(-1);
  release(op);
}

}  // namespace

// The thread that runs the stream-ordered transfers of one context, in the order their streams
// reach them: one for small transfers (kSmallIoBytes), one for the rest, so that a small one on one
// stream does not wait behind a bulk one on another. Never destroyed (host functions may still name it).
class IoWorker {
 public:
  IoWorker(CUcontext ctx, bool small) : ctx_(ctx), pid_(getpid()), small_(small) {
    std::thread([this] { run(); }).detach();
  }
  CUcontext ctx() const { return ctx_; }
  bool small() const { return small_; }
  pid_t pid() const { return pid_; }
  // Called from a host function: no CUDA here.
  void push(StreamOp* op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(op);
    }
    cv_.notify_one();
  }

 private:
  void run() {
    driver().cuCtxSetCurrent(ctx_);
    for (;;) {
      StreamOp* op;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        op = queue_.front();
        queue_.pop_front();
      }
      finish(op, file_transfer(op->req));
    }
  }

  CUcontext ctx_;
  pid_t pid_;
  bool small_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamOp*> queue_;
};

namespace {

IoWorker* worker_for(CUcontext ctx, bool small) {
  static std::mutex mutex;
  static std::vector<IoWorker*> workers;
  std::lock_guard<std::mutex> lock(mutex);
  for (IoWorker* w : workers) {
    // a forked child has none of the parent's threads
    if (w->ctx() == ctx && w->small() == small && w->pid() == getpid()) return w;
  }
  workers.push_back(new IoWorker(ctx, small));
  return workers.back();
}

void on_reached(void* arg) {
  auto* op = static_cast<StreamOp*>(arg);
  op->worker->push(op);
}

void block_until_done(void* arg) {
  auto* op = static_cast<StreamOp*>(arg);
  stream_io_wait(op, -1);
  release(op);
}

IoResult failure(int32_t status, CUresult r) {
  IoResult res;
  res.status = status;
  res.cu_result = r;
  return res;
}

}  // namespace

StreamOp* stream_io_submit(const IoRequest& req, CUstream stream, IoResult* failed) {
  const Driver& d = driver(/*load_if_absent=*/true);
  if (!d.ok || !d.cuLaunchHostFunc) {
    *failed = failure(kIoCudaError, CUDA_ERROR_NOT_SUPPORTED);
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
  // Everything the transfer will need is made here: made in the I/O thread, it deadlocked.
  if (!file_transfer_prepare(req, ctx)) {
    log::debug_once(0x905, "a stream-ordered transfer found no staging pipeline: it goes through the driver");
  }
  auto* op = new StreamOp;
  op->req = req;
  op->req.wait_legacy = false;  // the stream orders it
  op->req.may_set_up = false;   // what it needs was made above, by file_transfer_prepare
  op->worker = worker_for(ctx, req.bytes <= kSmallIoBytes);
  CUdeviceptr flag = 0;
  const bool wait_value = d.cuStreamWaitValue32 && d.cuMemHostGetDevicePointer && !g_no_wait_value.load();
  if (wait_value && g_words.take(d, &op->word, &op->target) &&
      d.cuMemHostGetDevicePointer(&flag, op->word, 0) != CUDA_SUCCESS) {
    g_words.give(op->word);
    op->word = nullptr;
  }
  req.file->retain();
  engine_stream_transfers(+1);
  if (CUresult r = d.cuLaunchHostFunc(stream, on_reached, op); r != CUDA_SUCCESS) {
    engine_stream_transfers(-1);
    if (op->word) g_words.give(op->word);
    req.file->release();
    delete op;
    *failed = failure(kIoCudaError, r);
    return nullptr;
  }
  // From here on the transfer runs when the stream reaches it; what is left is holding the stream's
  // later work back until it is done.
  bool ordered = false;
  if (op->word) {
    const CUresult r = d.cuStreamWaitValue32(stream, flag, op->target, kStreamWaitValueGeq);
    ordered = r == CUDA_SUCCESS;
    if (r == CUDA_ERROR_NOT_SUPPORTED) g_no_wait_value.store(true);
  }
  if (!ordered) {
    log::debug_once(0x904, "the device cannot wait on memory: a stream-ordered transfer blocks its stream "
                           "with a host function until it is done");
    op->refs.fetch_add(1, std::memory_order_relaxed);
    ordered = d.cuLaunchHostFunc(stream, block_until_done, op) == CUDA_SUCCESS;
    if (!ordered) op->refs.fetch_sub(1, std::memory_order_relaxed);
  }
  // Nothing can hold the stream's later work back: waiting here orders it as well.
  if (!ordered) stream_io_wait(op, -1);
  return op;
}

bool stream_io_wait(StreamOp* op, int64_t timeout_us) {
  std::unique_lock<std::mutex> lock(op->mutex);
  if (timeout_us < 0) {
    op->done_cv.wait(lock, [op] { return op->finished; });
    return true;
  }
  return op->done_cv.wait_for(lock, std::chrono::microseconds(timeout_us), [op] { return op->finished; });
}

IoResult stream_io_result(StreamOp* op) {
  std::lock_guard<std::mutex> lock(op->mutex);
  if (!op->finished) return failure(kIoPending, CUDA_SUCCESS);
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
