#include "bounce_pool.hpp"

#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <vector>

#include "engine.hpp"
#include "file_transfer.hpp"
#include "log.hpp"
#include "node_budget.hpp"

namespace cmt {

class BouncePool {
 public:
  explicit BouncePool(CUcontext ctx) : made_for_(ctx), pid_(getpid()) {}
  CUcontext ctx() const { return made_for_.ctx; }
  pid_t pid() const { return pid_; }
  // Its context ended: the buffers and streams went with it. The pool is left (buffers still in
  // flight name it) and gives its pinned budget back.
  bool ended() const { return made_for_.ended(); }
  void abandon() {
    std::lock_guard<std::mutex> lock(make_mutex_);
    const size_t mib = size_t(1) << 20;
    if (pinned_) give_pinned((pinned_ + mib - 1) / mib * mib);
    pinned_ = 0;
  }

  Bounce* take() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (!free_.empty()) {
        Bounce* b = free_.back();
        free_.pop_back();
        return b;
      }
      if (!refused_ && made_ + making_ < kMaxBounces) {
        ++making_;
        lock.unlock();  // pinned memory takes a while: others meanwhile take and give buffers
        Bounce* b = make();
        lock.lock();
        --making_;
        if (b) {
          ++made_;
          return b;
        }
        refused_ = true;  // not tried again: the transfers that find none free wait, or take the engine
        cv_.notify_all();
        continue;
      }
      if (made_ + making_ == 0) return nullptr;  // none will come back
      cv_.wait(lock);
    }
  }

  void give(Bounce* b) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(b);
    }
    cv_.notify_one();
  }


 private:
  // One buffer and its stream, in the calling thread (ctx current); one at a time. The node's pinned
  // budget counts whole MiB: the pool takes what its buffers together add, not a rounded-up MiB per
  // buffer.
  Bounce* make() {
    std::lock_guard<std::mutex> lock(make_mutex_);
    const Driver& d = driver();
    const size_t bytes = bounce_bytes();
    const size_t mib = size_t(1) << 20;
    const size_t more = ((pinned_ + bytes + mib - 1) / mib - (pinned_ + mib - 1) / mib) * mib;
    if (more && !take_pinned(more)) {
      log::debug_once(0x906, "the node's budget of pinned memory (CMT_NODE_PINNED_MB) is spent: small file "
                             "transfers go through the engine");
      return nullptr;
    }
    void* mem = nullptr;
    CUstream stream = nullptr;
    if (d.cuMemHostAlloc(&mem, bytes, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS) {
      if (d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
        pinned_ += bytes;
        return new Bounce{static_cast<char*>(mem), stream, this};
      }
      d.cuMemFreeHost(mem);
    }
    if (more) give_pinned(more);
    log::debug_once(0x907, "a bounce buffer for small file transfers could not be made: they go through the engine");
    return nullptr;
  }

  ContextStamp made_for_;
  pid_t pid_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Bounce*> free_;
  int made_ = 0, making_ = 0;
  bool refused_ = false;
  std::mutex make_mutex_;
  size_t pinned_ = 0;  // bytes of this pool's buffers (under make_mutex_)
};

namespace {

// The context's pool, made on first use; never destroyed (buffers in flight name it).
BouncePool* pool_for(CUcontext ctx) {
  static std::mutex mutex;
  static std::vector<BouncePool*> pools;
  std::lock_guard<std::mutex> lock(mutex);
  const pid_t pid = getpid();
  for (size_t i = 0; i < pools.size(); ++i) {
    BouncePool* p = pools[i];
    if (p->ctx() != ctx || p->pid() != pid) continue;  // a forked child has none of the parent's
    if (!p->ended()) return p;
    p->abandon();  // a new context with the old one's handle: a pool of its own
    pools.erase(pools.begin() + static_cast<long>(i--));
  }
  pools.push_back(new BouncePool(ctx));
  return pools.back();
}

}  // namespace

size_t bounce_bytes() { return kSmallIoBytes + kBounceRoom; }

Bounce* bounce_take(CUcontext ctx) { return pool_for(ctx)->take(); }

void bounce_give(Bounce* b) { b->pool->give(b); }

}  // namespace cmt
