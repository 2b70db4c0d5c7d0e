// Batches of file transfers that complete out of order (cmt.io.Batch, cuFile's batch API in shape).
// Each transfer starts on a native worker as soon as it is submitted, and poll() hands back what
// finished. A Python pool cannot do this: each of its transfers holds the interpreter for tens of
// microseconds around the call, which capped 1024 random 64 KiB reads at 0.8 GB/s against KvikIO's
// native futures at 5.6 (H100 machine, 2026-12-05).
//
// Workers: kSmallWorkers for transfers of up to kSmallIoBytes (a pread into a bounce buffer and one
// DMA each, many at once: file_transfer.hpp), and kBulkWorkers for larger ones (the engine carries
// one at a time per GPU), so that small transfers never queue behind bulk ones. They are shared by
// every batch of the process; a forked child starts its own.
#pragma once
#include <cstdint>

#include "file_transfer.hpp"

namespace cmt {

constexpr int kSmallWorkers = 16;  // as KvikIO's pool in `cmt bench io`: reads in flight at once
constexpr int kBulkWorkers = 2;

struct IoBatchCompletion {
  int64_t index;  // the submitter's number for the transfer
  IoResult result;
};

class IoBatch;

IoBatch* io_batch_new();
// Starts `q` (its file is retained until the transfer is done). Never blocks on the transfer.
void io_batch_submit(IoBatch* b, const IoRequest& q, int64_t index);
// Waits until at least min_nr transfers have finished that poll has not handed back (fewer if fewer
// are outstanding), or timeout_us has passed (< 0: no limit); writes up to `max` of them to `out`,
// in the order they finished, and returns how many.
int io_batch_poll(IoBatch* b, int min_nr, int64_t timeout_us, IoBatchCompletion* out, int max);
// Waits for every transfer still running, then frees the batch.
void io_batch_free(IoBatch* b);

}  // namespace cmt
