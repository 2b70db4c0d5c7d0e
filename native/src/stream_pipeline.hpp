// The staging pipelines of stream-ordered file transfers (stream_io.hpp): every driver call of such
// a transfer is made in the caller's thread when it is queued, none once its stream waits for it.
//
// Why: on the real driver a thread that launches a kernel can hold a lock of the driver while it
// waits for every stream of the context (lazy loading of the kernel's module does). If that stream
// waits for a transfer whose DMAs are still to be queued from another thread, that thread blocks on
// the lock and neither moves again (docs/storage.md, "The stream-ordered hang").
//
// So the transfer's DMAs are queued on the caller's stream up front, block by block, each gated by
// 32-bit words in pinned, device-mapped memory (job.hpp's SlotWords): for block b in slot s,
//     wait until host[s] >= n;  DMA between the slot and device memory;  write gpu[s] = n
// where n counts slot s's DMAs; a block's write and the next one's wait are one cuStreamBatchMemOp,
// and the blocks are large (stream_geometry), so that the caller's thread returns soon. The
// engine's lanes (the same Job, lane pool and CPU budget as every copy) then only read or write the
// file, set host words and watch gpu words. A pipeline runs its
// transfers one at a time in the order they were queued; each is started by a host function on its
// stream, so that it runs after the stream's earlier work. The caller's thread takes an idle
// pipeline of the context (one for transfers up to kSmallIoBytes, one for larger ones) or makes one,
// up to kMaxStreamPipelines of each; beyond, it queues behind the shortest queue.
#pragma once
#include <atomic>
#include <cstdint>

#include "file_transfer.hpp"
#include "job.hpp"

namespace cmt {

class StreamPipeline;

constexpr int kMaxStreamPipelines = 4;
// A transfer's DMA blocks (stream_pipeline.cpp, stream_geometry) and its pipeline's staging.
constexpr size_t kStreamBlockMax = size_t(128) << 20;
constexpr size_t kStreamRingBytes = size_t(256) << 20;

// One stream-ordered transfer on its pipeline.
struct PipelineTransfer {
  StreamPipeline* pipeline = nullptr;
  IoRequest req;  // bytes already cut at the end of the file
  TransferPlan plan;
  int slots = 0;
  SlotWords words;                 // base: the slots' counts before this transfer
  uint32_t waits[kMaxSlots] = {};  // per slot, the DMAs queued on the stream (their waits)
  uint32_t writes[kMaxSlots] = {};  // and the words the stream will write after them
  CUresult queue_error = CUDA_SUCCESS;  // a stream operation the driver refused: not run, words released
  std::atomic<int> awaited{2};          // it runs once its DMAs are queued and its stream reached it
  // Called from the pipeline's thread once the transfer is over and its DMAs are done.
  void (*finished)(PipelineTransfer* t, const IoResult& r) = nullptr;
};

// In the caller's thread, whose current context is `ctx`: takes a pipeline for `t` (its req set;
// an idle one with staging that fits, grown if need be, else a new one, else the one of its kind with
// the shortest queue), plans `t` on it and queues it there (the pipeline then owns it until
// finished()), and on `stream` a host function `reached(arg)`, which must call
// stream_pipeline_reached(t), then its DMAs and words. Returns CUDA_SUCCESS; CUDA_ERROR_NOT_READY
// with nothing queued when no pipeline can be had (no pinned memory, the lane pool full, a forked
// child); or the driver's error when the host function could not be queued, or the device refused
// its first wait on memory (CUDA_ERROR_NOT_SUPPORTED; nothing was queued). An error
// after that leaves `t` queued with queue_error set: it transfers nothing, and releases the stream.
CUresult stream_pipeline_queue(CUcontext ctx, PipelineTransfer* t, CUstream stream, void (*reached)(void*), void* arg);

// From the host function (no CUDA): `t` may run once those queued before it on its pipeline have.
void stream_pipeline_reached(PipelineTransfer* t);

// Whether the driver has what queuing needs (host functions, waits and writes on memory).
bool stream_pipelines_usable();

}  // namespace cmt
