// Stream-ordered reads and writes, as cuFile's stream API: the host call returns at once; the
// transfer runs once the caller's stream has done its earlier work, and the stream's later work
// waits for the transfer (and, file to device, its DMAs).
//
// On the caller's stream go two things. A host function, which only hands the transfer to the I/O
// thread of its context (no CUDA call in a callback: the driver forbids it). Then a wait on a 32-bit
// word of pinned, device-mapped host memory (cuStreamWaitValue32, "greater or equal"), which the I/O
// thread sets once the transfer is done. Each transfer in flight has a word of its own, with the
// value it waits for one more than the word's last: a word is free again once its transfer set it,
// and a stream still to wait for an older value passes, as it should. Where the device cannot wait
// on memory, a second host function blocks the stream until the transfer is done (logged at debug).
#pragma once
#include <cstdint>

#include "cmt/cuda_types.hpp"
#include "file_transfer.hpp"

namespace cmt {

struct StreamOp;

// Queues `req` on `stream` (its file is retained until the transfer is done). Returns the
// transfer, or nullptr with *failed set when nothing was queued (a stream being captured, no host
// functions in the driver, a CUDA error).
StreamOp* stream_io_submit(const IoRequest& req, CUstream stream, IoResult* failed);
// Waits up to timeout_us (< 0: for as long as it takes) for the transfer; true once it is done.
bool stream_io_wait(StreamOp* op, int64_t timeout_us);
// The transfer's result; status kIoPending while it has not run.
IoResult stream_io_result(StreamOp* op);
// The caller lets go of the transfer (it still runs to its end if it has not).
void stream_io_release(StreamOp* op);
// Pins the first page of flag words now, if a CUDA context is current in the calling thread, so
// that a later stream-ordered transfer does not pin memory while its stream is busy (a pinning call
// may wait for the device). cmt.io calls it when a file is opened and at synchronous transfers.
void stream_io_warm();

}  // namespace cmt
