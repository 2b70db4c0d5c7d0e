// The copy engine: a persistent pool of worker threads (lanes) and a ring of portable pinned
// staging buffers (slots), one private non-blocking DMA stream per context. One engine per
// process, used by the interposer and the C API (benchmarks, tuner).
//
// A copy is cut into blocks of `chunk` bytes, one DMA each, and each block into pieces of CPU
// work. All lanes work on the same blocks: they claim pieces in order, so a block fills (or
// drains) at the speed of all lanes together while the DMA engine works on the blocks before it.
// Small pieces keep the pipeline's fill and drain short; large blocks keep the copy engine's
// per-command cost low.
//   host-to-device: lanes copy pieces of the pageable source into a slot; the lane that
//     completes a block queues its DMA. A slot is refilled once its previous DMA finished.
//   device-to-host: blocks are DMAed into slots ahead; lanes pre-fault the destination of their
//     piece, wait for the block's DMA, copy the piece out; the lane that drains a slot queues the
//     DMA of the next block that uses it.
// The calling thread is lane 0, so a copy needs no thread wake-up to start.
#pragma once
#include <cstddef>
#include <string>

#include "cmt/cuda_types.hpp"
#include "plan.hpp"

namespace cmt {

struct CopyRequest {
  Direction dir;
  CUcontext ctx;        // current in the calling thread
  char* host;           // pageable host memory
  CUdeviceptr device;   // device memory of ctx
  size_t bytes;
  CUstream stream;      // the caller's stream, already resolved (never a raw 0)
  Settings settings;
  CUevent after = nullptr;  // if set, the DMAs wait for it (else the caller has already waited)
};

// Runs the copy with CUDA's ordering: the DMAs start after prior work on `stream` (the caller has
// waited for it, or recorded `after` there); later work on `stream` waits for the copy. Returns once every source byte was read (HtoD) or
// every destination byte written (DtoH). Returns CUDA_SUCCESS, a driver error from the pipeline,
// or CUDA_ERROR_NOT_READY (nothing was copied: resources unavailable; the caller passes through).
CUresult engine_copy(const CopyRequest& req);

// With CMT_TRACE: the GPU's start and end of each DMA of the last copy, in µs from the copy's start
// on the DMA stream, as JSON [[start, end], ...]; "" when not traced.
std::string engine_dma_gpu_times();

// Tells a forked child that the engine's threads do not exist in it.
void engine_forget_after_fork();

}  // namespace cmt
