// The DMA side of a pipeline: per CUDA context, one private non-blocking stream that carries every
// DMA of cmt's copies in order, an event per staging slot (its last DMA) and one for a copy's end;
// with CMT_TRACE, timing events around each DMA of the last copy.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "driver.hpp"
#include "staging_ring.hpp"

namespace cmt {

struct ContextResources {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;  // every DMA of this context, in order
  CUevent slot_event[kMaxSlots] = {};
  CUevent done = nullptr;
  std::vector<CUevent> timing;  // CMT_TRACE only: a base event, then start and end of each block's DMA
};

class DmaStreams {
 public:
  // The context's stream and events, with events for at least `slots` slots; nullptr if the driver
  // could not create them.
  ContextResources* for_context(CUcontext ctx, int slots);
  // Queues one DMA between device memory and a staging slot on the context's stream, then records
  // the slot's event there. `block` numbers it for the trace.
  CUresult queue(ContextResources* res, Direction dir, CUdeviceptr dev, char* staging, size_t len, Slot& slot,
                 int slot_index, size_t block);

  // CMT_TRACE: timing events for a copy of `blocks` DMAs on res's stream (from now on).
  void trace_begin(ContextResources* res, size_t blocks);
  void trace_forget() { trace_res_ = nullptr; }
  // Their context ended, and its streams and events with it: a context with the same handle gets
  // new ones. (The old records are left: their handles are dead.)
  void forget_contexts() {
    contexts_.clear();
    trace_res_ = nullptr;
  }
  // The traced copy's DMAs as JSON [[start_us, end_us], ...] from its base event; waits for them.
  std::string trace_gpu_times(size_t blocks);

 private:
  const Driver& d_ = driver();
  std::vector<ContextResources*> contexts_;
  ContextResources* trace_res_ = nullptr;  // the context whose timing events hold the last copy's
  std::mutex trace_order_;  // one DMA queued at a time, so that its timing events bracket it alone
};

}  // namespace cmt
