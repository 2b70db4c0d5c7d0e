#include "dma_streams.hpp"

#include "timeline.hpp"

namespace cmt {

ContextResources* DmaStreams::for_context(CUcontext ctx, int slots) {
  ContextResources* res = nullptr;
  for (auto* c : contexts_) {
    if (c->ctx == ctx) res = c;
  }
  if (!res) {
    auto* c = new ContextResources();
    c->ctx = ctx;
    if (d_.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        d_.cuEventCreate(&c->done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      delete c;  // handles created so far are leaked; this only happens when the driver is failing
      return nullptr;
    }
    contexts_.push_back(c);
    res = c;
  }
  for (int s = 0; s < slots; ++s) {
    if (!res->slot_event[s] && d_.cuEventCreate(&res->slot_event[s], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      return nullptr;
    }
  }
  return res;
}

CUresult DmaStreams::queue(ContextResources* res, Direction dir, CUdeviceptr dev, char* staging, size_t len,
                           Slot& slot, int slot_index, size_t block) {
  CUstream stream = res->stream;
  std::unique_lock<std::mutex> traced;
  if (trace_res_) {
    traced = std::unique_lock<std::mutex>(trace_order_);
    d_.cuEventRecord(trace_res_->timing[1 + 2 * block], stream);
  }
  CUresult r = dir == Direction::HtoD ? d_.cuMemcpyHtoDAsync(dev, staging, len, stream)
                                      : d_.cuMemcpyDtoHAsync(staging, dev, len, stream);
  if (trace_res_ && r == CUDA_SUCCESS) d_.cuEventRecord(trace_res_->timing[2 + 2 * block], stream);
  if (r == CUDA_SUCCESS) r = d_.cuEventRecord(res->slot_event[slot_index], stream);
  if (r != CUDA_SUCCESS) return r;
  slot.last_event = res->slot_event[slot_index];
  if (timeline::enabled()) timeline::note(timeline::Step::DmaQueued, static_cast<long>(block));
  return CUDA_SUCCESS;
}

// GPU timestamps before and after every DMA of a copy, relative to a base event recorded now, tell
// a DMA slowed by the CPU's memory traffic from a DMA starved of filled blocks.
void DmaStreams::trace_begin(ContextResources* res, size_t blocks) {
  if (!d_.cuEventElapsedTime) return;
  while (res->timing.size() < 1 + 2 * blocks) {
    CUevent e = nullptr;
    if (d_.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return;
    res->timing.push_back(e);
  }
  if (d_.cuEventRecord(res->timing[0], res->stream) != CUDA_SUCCESS) return;
  trace_res_ = res;
}

std::string DmaStreams::trace_gpu_times(size_t blocks) {
  if (!trace_res_) return {};
  const std::vector<CUevent>& ev = trace_res_->timing;
  std::string s = "[";
  for (size_t b = 0; b < blocks; ++b) {
    float start = 0, end = 0;
    if (d_.cuEventSynchronize(ev[2 + 2 * b]) != CUDA_SUCCESS ||
        d_.cuEventElapsedTime(&start, ev[0], ev[1 + 2 * b]) != CUDA_SUCCESS ||
        d_.cuEventElapsedTime(&end, ev[0], ev[2 + 2 * b]) != CUDA_SUCCESS) {
      return {};
    }
    s += (b ? ",[" : "[") + std::to_string(start * 1e3) + "," + std::to_string(end * 1e3) + "]";
  }
  return s + "]";
}

}  // namespace cmt
