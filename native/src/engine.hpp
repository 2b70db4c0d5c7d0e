// The copy engine: a persistent pool of worker threads and a ring of portable pinned staging
// buffers per worker. One engine per process, used by the interposer, the C API (benchmarks,
// tuner) and later the storage path.
//
// Host-to-device: each lane copies a chunk of the pageable source into a free staging buffer and
// queues its DMA on the lane's private non-blocking stream; a buffer is reused once its DMA event
// completed. Device-to-host: each lane queues DMAs into its buffers ahead, pre-faults the
// destination pages while they run, then copies each finished buffer out.
// The calling thread is lane 0, so a copy needs no thread wake-up to start.
#pragma once
#include <cstddef>

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
};

// Runs the copy with CUDA's ordering: it starts after prior work on `stream`, later work on
// `stream` waits for it; returns once every source byte was read (HtoD) or every destination byte
// written (DtoH). Returns CUDA_SUCCESS, a driver error from the pipeline, or
// CUDA_ERROR_NOT_READY (nothing was copied: resources unavailable; the caller passes through).
CUresult engine_copy(const CopyRequest& req);

// Tells a forked child that the engine's threads do not exist in it.
void engine_forget_after_fork();

}  // namespace cmt
