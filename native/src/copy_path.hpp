// The decision every intercepted copy goes through: is this a host<->device copy of pageable
// memory that the plan says to stage, and can it be staged with CUDA's exact semantics? If so
// the engine runs it; if not, the caller runs the driver's own function with the original args.
#pragma once
#include <cstddef>

#include "cmt/cuda_types.hpp"
#include "stats.hpp"
#include "types.hpp"

namespace cmt {

struct CopyCall {
  Direction dir;
  char* host;
  CUdeviceptr device;
  size_t bytes;
  CUstream stream;          // as the caller passed it (0 allowed)
  DefaultStream default_stream;
  const Settings* forced = nullptr;  // the C API's explicit settings, else the plan's rule
};

// Returns Outcome::Accelerated with the copy's result in *result, or why the driver should do
// it. Records the outcome in the statistics; *kind says what the host side was, when known.
Outcome try_accelerate(const CopyCall& call, CUresult* result, HostKind* kind = nullptr);

// Starts the staging setup of ctx (nullptr: the current context) in the background, once per
// process: at its first context (hooks.cpp), or its first copy that cmt does not stage.
void prepare_staging_early(CUcontext ctx);

// The host side's kind, classified by the driver (for copies the decision did not classify).
HostKind classify_host(const void* host);

// For cuMemcpy/cuMemcpyAsync: which of the two pointers is pageable host memory and which is
// device memory. Returns false (and the outcome to record, if any) when it is not such a copy.
bool classify_uva(CUdeviceptr dst, CUdeviceptr src, Direction* dir);

// Process-wide switches, set by the library constructor and the fork handler.
void set_disabled(bool disabled);
void mark_forked_child();
// Whether cmt is off (CMT_DISABLE), and whether this process was forked after cmt loaded: copies
// then pass through.
bool copies_disabled();
bool in_forked_child();

}  // namespace cmt
