// The copy engine: one per process, used by the interposer and the C API (benchmarks, tuner).
// A staged copy is cut into DMA blocks (transfer_plan.hpp) and run by a pool of lanes (the calling
// thread and persistent workers, lane_pool.hpp) through a ring of pinned staging buffers
// (staging_ring.hpp), one private DMA stream per context (dma_streams.hpp); job.hpp says how the
// lanes and the DMAs hand blocks to each other, host_end.hpp where the host's bytes come from or
// go. docs/design.md draws the whole path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "cmt/cuda_types.hpp"
#include "lane_pool.hpp"
#include "types.hpp"

namespace cmt {

class HostEnd;
struct Job;

struct CopyRequest {
  Direction dir;
  CUcontext ctx;        // current in the calling thread
  char* host;           // pageable host memory (unused when `end` is given)
  CUdeviceptr device;   // device memory of ctx
  size_t bytes;
  CUstream stream;      // the caller's stream, already resolved (never a raw 0); its prior work is done
  Settings settings;
  HostEnd* end = nullptr;  // another host end (a file, host_end.hpp) in place of `host`
  // If this copy makes its context's pipeline: its setup pins staging for these settings, not for
  // the plan's largest rule (cmt.io's transfers, which do not follow the copy plan).
  bool setup_for_these = false;
  // At most this many of the settings' buffers in flight (0: all of them): a read from the disk
  // (file_transfer.cpp). The ring is still sized for all of them, for the transfers that follow.
  int max_in_flight = 0;
  // The plan's figure for the driver's own copy of this size, GB/s (0: none): how long a copy that
  // finds the setup running may wait for it (Engine::claim).
  double driver_gbps = 0;
};

// Why a copy that was free to go to the driver rather than wait for the engine went there.
enum class Pass { No, Warming, Busy };

// Runs the copy with CUDA's ordering: the caller has waited for prior work on `stream`; later work
// on `stream` waits for the copy. Returns once every source byte was read (HtoD) or every
// destination byte written (DtoH). Returns CUDA_SUCCESS, a driver error from the pipeline, or
// CUDA_ERROR_NOT_READY (nothing was copied: resources unavailable; the caller passes through).
// *ran_ns (if given): how long the copy itself took, all but its wait for a pipeline (other
// threads' copies, the setup): what the rate guard compares with the driver's whole call.
// A context's first copy starts its pipeline's setup in the background (staging ring, DMA stream,
// workers); copies to one context take turns on it, first come first served. With `pass` given, a
// copy returns CUDA_ERROR_NOT_READY rather than wait (the caller passes it to the driver, which is
// no slower than without cmt) when the setup is still running (*pass = Warming; a large copy first
// waits for it a while, Engine::claim), and when it is
// small and the pipeline is busy (*pass = Busy: a small copy never waits behind a large one);
// without it, the copy waits.
CUresult engine_copy(const CopyRequest& req, uint64_t* ran_ns = nullptr, Pass* pass = nullptr);

// Starts ctx's pipeline setup in the background if it has none: a copy the engine does not stage
// (pinned, or below the plan's minimum) is a sign the program copies, and its first pageable copies
// then find the staging ready rather than go to the driver while it is made (copy_path.cpp).
void engine_prepare(CUcontext ctx);

// For pipelines of their own (stream_pipeline.hpp): registers `run` with the engine's lane pool
// (false when it takes no more, or in a forked child), and runs `job` on up to `lanes` of its lanes,
// lane 0 in the calling thread, sharing the pool's budget with every other copy.
bool engine_add_run(LanePool::Run* run);
void engine_run_job(LanePool::Run& run, Job& job, int lanes);

// With CMT_TRACE: the GPU's start and end of each DMA of the last copy, in µs from the copy's start
// on the DMA stream, as JSON [[start, end], ...]; "" when not traced.
std::string engine_dma_gpu_times();

// Runs work(arg, lane) on up to `lanes` lanes of the engine's pool, lane 0 in the calling thread,
// for a copy between two host buffers (host_copy.hpp); returns once every lane that took part is
// done. False, with nothing run, while another such copy has the pool's host run, or in a forked
// child.
bool engine_host_lanes(int lanes, void (*work)(void*, int), void* arg);

// dev's primary context is about to be made (hooks.cpp): the staging its pipeline's setup will
// register, the plan's largest ring, starts being faulted in meanwhile (staging_memory.hpp).
void engine_context_starting(CUdevice dev);

// Tells a forked child that the engine's threads do not exist in it.
void engine_forget_after_fork();

// A context ended (cuCtxDestroy, a primary context's reset or last release: hooks.cpp): what the
// engine kept for it is dropped, after the driver's call. engine_contexts_ended counts the calls:
// per-thread caches keyed by context handle start again when it moves.
void engine_context_ended(CUcontext ctx);
uint64_t engine_contexts_ended();
// Whether a context with handle ctx ended after engine_contexts_ended() was `seen`: what was made
// for it then is gone (cmt.io's bounce buffers, stream-ordered pipelines and flag words).
bool engine_context_ended_since(CUcontext ctx, uint64_t seen);

// What something made for a context remembers of it: stale once that context has ended (a new
// context may then have its handle). One stamp for every per-context cache.
struct ContextStamp {
  CUcontext ctx = nullptr;
  uint64_t born = 0;  // engine_contexts_ended() when it was made
  explicit ContextStamp(CUcontext c) : ctx(c), born(engine_contexts_ended()) {}
  bool ended() const { return engine_context_ended_since(ctx, born); }
};

// For a cache of one thread keyed by context handle: whether any context ended since *seen (which
// it then moves on); the cache then starts again.
inline bool contexts_ended_since(uint64_t* seen) {
  const uint64_t now = engine_contexts_ended();
  if (now == *seen) return false;
  *seen = now;
  return true;
}

}  // namespace cmt
