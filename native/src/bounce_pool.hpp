// The pinned bounce buffers of small file transfers (file_transfer.hpp, kSmallIoBytes): a pool per
// context, each buffer with a private non-blocking stream of its own, so that many small transfers
// run at once, each a pread into its buffer and one DMA (or the other way round), without the
// engine's pipeline (which carries one copy at a time per GPU) and without waiting for each other's
// DMAs.
//
// Buffers are made on demand, in the thread of the transfer that finds none free, up to
// kMaxBounces per context, and never freed.
#pragma once
#include <cstddef>

#include "driver.hpp"

namespace cmt {

class BouncePool;

struct Bounce {
  char* mem = nullptr;  // bounce_bytes() of portable pinned memory, page-aligned
  CUstream stream = nullptr;
  BouncePool* pool = nullptr;
};

// Room in each buffer beyond a transfer's bytes, so that a transfer whose file offset is not
// aligned can put its bytes where the aligned ones land aligned (file_transfer.cpp).
constexpr size_t kBounceRoom = size_t(64) << 10;

// At most this many buffers per context: the futures' pool of small transfers (python/cmt/io)
// and a few synchronous callers at once; more callers wait for one.
constexpr int kMaxBounces = 16;

// A free buffer of `ctx` (current in the calling thread); one is made when none is free (up to
// kMaxBounces); at the limit the caller waits for one. nullptr when the pool
// has none and cannot make one (pinned memory or a stream refused, the node's pinned budget spent, a
// forked child): the caller takes the engine's path.
Bounce* bounce_take(CUcontext ctx);
// Back to its pool, once the buffer's DMA is done.
void bounce_give(Bounce* b);

// The bytes of each buffer: the largest small transfer and the room.
size_t bounce_bytes();

}  // namespace cmt
