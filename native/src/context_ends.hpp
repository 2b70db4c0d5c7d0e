// Which contexts have ended (cuCtxDestroy, a primary context's reset or last release), counted, so
// that what was made for a context can tell it is gone even when a new context gets its handle:
// engine_context_ended (engine.cpp) notes each one here, after the driver's call; the queries are
// engine.hpp's engine_contexts_ended and engine_context_ended_since.
#pragma once
#include "cmt/cuda_types.hpp"

namespace cmt {

void note_context_ended(CUcontext ctx);

}  // namespace cmt
