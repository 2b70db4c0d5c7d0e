#include "io_batch.hpp"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "host_copy.hpp"

namespace cmt {

class IoBatch {
 public:
  void started() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++running_;
  }
  void finished(int64_t index, const IoResult& r) {
    std::lock_guard<std::mutex> lock(mutex_);  // notified under the lock: once it is let go, the
    --running_;                                 // batch may be freed (io_batch_free)
    done_.push_back({index, r});
    cv_.notify_all();
  }
  int poll(int min_nr, int64_t timeout_us, IoBatchCompletion* out, int max) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto enough = [&] {
      return static_cast<int64_t>(done_.size()) >= std::min<int64_t>(min_nr, running_ + done_.size());
    };
    if (timeout_us < 0) cv_.wait(lock, enough);
    else cv_.wait_for(lock, std::chrono::microseconds(timeout_us), enough);
    int n = 0;
    while (n < max && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return n;
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t running_ = 0;
  std::deque<IoBatchCompletion> done_;
};

namespace {

struct Work {
  IoBatch* batch;
  IoRequest req;
  int64_t index;
};

// A queue and its workers, started on first use.
class Workers {
 public:
  explicit Workers(int count) : count_(count) {}
  void push(Work w) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(w);
      if (started_ < count_ && idle_ == 0) {  // a worker more, up to count_, while all are busy
        ++started_;
        std::thread([this] { serve(); }).detach();
      }
    }
    cv_.notify_one();
  }

 private:
  void serve() {
    mark_cmt_thread();
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return !queue_.empty(); });
      --idle_;
      Work w = queue_.front();
      queue_.pop_front();
      lock.unlock();
      const IoResult r = file_transfer(w.req);
      w.req.file->release();
      w.batch->finished(w.index, r);
      lock.lock();
    }
  }

  const int count_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  int started_ = 0, idle_ = 0;
};

struct Pools {
  pid_t pid;
  Workers small{kSmallWorkers}, bulk{kBulkWorkers};
};

// This process's workers; a forked child has none of its parent's threads, so it makes its own (the
// parent's are left as they are: their locks may have been held at the fork).
Pools& pools() {
  static std::mutex mutex;
  static Pools* current = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (!current || current->pid != getpid()) current = new Pools{getpid()};
  return *current;
}

}  // namespace

IoBatch* io_batch_new() { return new IoBatch; }

void io_batch_submit(IoBatch* b, const IoRequest& q, int64_t index) {
  q.file->retain();
  b->started();
  Pools& p = pools();
  (q.bytes <= kSmallIoBytes ? p.small : p.bulk).push(Work{b, q, index});
}

int io_batch_poll(IoBatch* b, int min_nr, int64_t timeout_us, IoBatchCompletion* out, int max) {
  return b->poll(min_nr, timeout_us, out, max);
}

void io_batch_free(IoBatch* b) {
  b->wait_idle();
  delete b;
}

}  // namespace cmt
