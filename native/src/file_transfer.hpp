// One transfer between a file and device memory, synchronous: the storage path's core, which the
// C API (io_api.cpp) calls. (The stream-ordered API runs its transfers on pipelines of its own,
// stream_pipeline.hpp.)
//
// A transfer larger than kSmallIoBytes is an engine copy whose host end is the file (file_end.hpp):
// the engine's lanes, staging ring, DMA stream and CPU budget, as for a memory copy. A smaller one
// goes through a pinned bounce buffer of its own (bounce_pool.hpp): the file's bytes read into it
// (FileEnd again: O_DIRECT where aligned and not cached), then one DMA on the buffer's stream,
// waited for; a write the other way round. Many such transfers run at once, and none waits for the
// engine's pipeline, which carries one copy at a time per GPU. A file offset that is not aligned
// for direct I/O gets its first bytes up to the alignment as a piece of their own, so that the rest
// starts aligned and can go O_DIRECT. Reads stop at the end of the file (the bytes read are
// returned, 0 at or past it, as pread does). A write that fails (a full disk, the file size limit)
// leaves the file at the size it had before, if it had grown.
#pragma once
#include <cstdint>

#include "cmt/cuda_types.hpp"
#include "driver.hpp"
#include "file_end.hpp"
#include "types.hpp"

namespace cmt {

// Transfers of at most this many bytes (after a read is cut at the end of the file) go through a
// bounce buffer rather than the engine. Up to 1 MiB the engine has no pipeline to offer: with the
// files' 8 MiB chunks its first block is 1 MiB, so such a copy is one block, staged and then DMA'd
// once, as here, but paying the engine's fixed costs per copy (waking lanes, an event, the wait for
// the pipeline behind any other copy to that GPU); the copy path passes copies below 1 MiB to the
// driver for the same reason (plan.cpp), and KvikIO's threshold for POSIX over GDS is 1 MiB too.
constexpr uint64_t kSmallIoBytes = uint64_t(1) << 20;

// What became of a transfer, laid out as the C API's struct cmt_io_result (io_api.cpp).
enum IoStatus : int32_t {
  kIoPending = -1,    // stream-ordered, not run yet
  kIoOk = 0,
  kIoOsError = 1,     // os_errno at file offset `offset`
  kIoCudaError = 2,   // cu_result
  kIoFileEnded = 3,   // the file ended at `offset` while being read (it shrank meanwhile)
  kIoBadDevice = 4,   // the device range is not inside one allocation of device memory
  kIoBadRequest = 5,  // e.g. a stream being captured into a graph
};

struct IoResult {
  int64_t done = 0;      // bytes read or written
  int64_t offset = 0;    // the file offset of the failure
  int32_t status = kIoOk;
  int32_t os_errno = 0;
  int32_t cu_result = 0;
  int32_t reserved = 0;
  int64_t direct_bytes = 0;    // how the bytes went: O_DIRECT or through the page cache
  int64_t buffered_bytes = 0;
};

struct IoRequest {
  IoFile* file = nullptr;
  Direction dir = Direction::HtoD;  // HtoD: file to device (a read); DtoH: device to file (a write)
  CUdeviceptr device = 0;
  uint64_t bytes = 0;
  uint64_t file_off = 0;
  Settings settings;
  // Synchronous calls first wait for the legacy default stream's work, as KvikIO's do, so that a
  // buffer that a kernel on it is still writing is not read too early. The stream-ordered API does
  // not (its order is the caller's stream's).
  bool wait_legacy = true;
};

IoResult file_transfer(const IoRequest& req);

// A failed write leaves nothing half-written that looks whole: the file goes back to the size it had
// before (size_before, as IoFile::size() said then), if the write grew it.
void cut_back_failed_write(const IoRequest& q, int64_t size_before);

// What a transfer's file end and its copy (r) came to, into *res; false on failure (the file's
// error first).
bool settle_transfer(const FileEnd& end, CUresult r, IoResult* res);

// Settings for files: every usable CPU up to 16 (lanes wait on the disk as much as they copy), 8
// buffers of 8 MiB (the engine's pieces are then 4 KiB multiples, so aligned for O_DIRECT).
Settings io_default_settings();

// Makes a context current in the calling thread for the scope, and the previous one again after.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext ctx);
  ~ContextScope();
  bool ok() const { return ok_; }

 private:
  const Driver& d_;
  CUcontext prev_ = nullptr;
  bool swapped_ = false, ok_ = true;
};

// The context of a device pointer (its allocation's, else the calling thread's current one).
CUcontext io_context_of(CUdeviceptr device);

}  // namespace cmt
