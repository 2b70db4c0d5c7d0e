// The storage path's C API (python/cmt/io loads it with ctypes): a file handle, synchronous reads and
// writes between a file and device memory, their stream-ordered forms, and the storage counters.
//
//   struct cmt_io_result {            // file_transfer.hpp's IoResult
//     int64_t done;                   // bytes read or written
//     int64_t offset;                 // the file offset where it failed
//     int32_t status;                 // -1 pending, 0 ok, 1 OS error (os_errno), 2 CUDA error
//     int32_t os_errno;               //   (cu_result), 3 the file ended early (shrank meanwhile),
//     int32_t cu_result;              //   4 not device memory / range past its allocation,
//     int32_t reserved;               //   5 bad request (settings, a capturing stream)
//     int64_t direct_bytes, buffered_bytes;  // how the bytes went: O_DIRECT or the page cache
//   };
//
// Settings: the engine's struct (types.hpp, as cmt_memcpy takes it); nullptr: the file defaults
// (cmt_io_default_settings). Host buffers need no engine: Python reads and writes them itself.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "file_end.hpp"
#include "file_transfer.hpp"
#include "io_batch.hpp"
#include "page_cache.hpp"
#include "staging_memory.hpp"
#include "staging_ring.hpp"
#include "stream_io.hpp"

#define API_EXPORT extern "C" __attribute__((visibility("default")))

using namespace cmt;

static_assert(sizeof(IoResult) == 48, "cmt_io_result's layout is part of the C API");

namespace {

IoResult bad_request(int err) {
  IoResult r;
  r.status = kIoBadRequest;
  r.os_errno = err;
  return r;
}

bool make_request(void* file, Direction dir, CUdeviceptr device, uint64_t bytes, int64_t file_off,
                  const Settings* settings, IoRequest* q, IoResult* out) {
  if (!file || file_off < 0 || bytes > uint64_t(INT64_MAX) - uint64_t(file_off)) {
    *out = bad_request(!file ? EBADF : EINVAL);
    return false;
  }
  q->file = static_cast<IoFile*>(file);
  q->dir = dir;
  q->device = device;
  q->bytes = bytes;
  q->file_off = static_cast<uint64_t>(file_off);
  q->settings = settings ? *settings : io_default_settings();
  return true;
}

int transfer(void* file, Direction dir, CUdeviceptr device, uint64_t bytes, int64_t file_off, const Settings* settings,
             IoResult* out) {
  IoRequest q;
  if (!make_request(file, dir, device, bytes, file_off, settings, &q, out)) return out->status;
  stream_io_warm();  // the caller's thread, where pinning may wait
  *out = file_transfer(q);
  return out->status;
}

void* submit(void* file, Direction dir, CUdeviceptr device, uint64_t bytes, int64_t file_off, CUstream stream,
             const Settings* settings, IoResult* failed) {
  IoRequest q;
  if (!make_request(file, dir, device, bytes, file_off, settings, &q, failed)) return nullptr;
  return stream_io_submit(q, stream, failed);
}

}  // namespace

// A handle for an open file descriptor (a duplicate is kept: the caller may close its own at any
// time, transfers in flight keep theirs). nullptr with *os_errno set if fd is not open.
API_EXPORT void* cmt_io_attach(int fd, int* os_errno) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    if (os_errno) *os_errno = errno;
    return nullptr;
  }
  stream_io_warm();
  return new IoFile(own);
}

API_EXPORT void cmt_io_detach(void* file) {
  if (file) static_cast<IoFile*>(file)->release();
}

// The settings file transfers use unless given others; returns the number of int64 fields.
API_EXPORT int cmt_io_default_settings(Settings* out) {
  if (out) *out = io_default_settings();
  return static_cast<int>(sizeof(Settings) / sizeof(int64_t));
}

// `import cmt.io`: the staging of the first transfer's setup starts being faulted in now, in the
// background, for whichever device (a fresh process's first warm 3.6 GiB read spent 13-16 ms of its
// 90 faulting 48 MiB in, H100, 2026-12-07); let go after 10 s if unused. Needs no driver.
API_EXPORT void cmt_io_prepare() {
  const Settings s = io_default_settings();
  staging_reserve_start(kAnyDevice, static_cast<int>(s.buffers) + kSpareSlots, static_cast<size_t>(s.chunk_bytes));
}

// Transfers of at most this many bytes go through a bounce buffer of their own, not the engine
// (file_transfer.hpp, kSmallIoBytes): the futures run them on a pool of their own.
API_EXPORT uint64_t cmt_io_small_bytes() { return kSmallIoBytes; }

// File to device memory: up to `bytes` from `file_off` (fewer at the end of the file). Returns the
// status; *out says the rest. Waits for the legacy default stream's work first, and returns with
// the bytes in device memory.
API_EXPORT int cmt_io_read(void* file, CUdeviceptr device, uint64_t bytes, int64_t file_off, const Settings* settings,
                           IoResult* out) {
  return transfer(file, Direction::HtoD, device, bytes, file_off, settings, out);
}

// Device memory to file: `bytes` at `file_off`. A failure leaves the file at its former size if it
// had grown.
API_EXPORT int cmt_io_write(void* file, CUdeviceptr device, uint64_t bytes, int64_t file_off, const Settings* settings,
                            IoResult* out) {
  return transfer(file, Direction::DtoH, device, bytes, file_off, settings, out);
}

// Stream-ordered forms (stream_io.hpp): return at once with the transfer, or nullptr with *failed
// set. The transfer runs when `stream` reaches it; the stream's later work waits for it.
API_EXPORT void* cmt_io_read_async(void* file, CUdeviceptr device, uint64_t bytes, int64_t file_off, CUstream stream,
                                   const Settings* settings, IoResult* failed) {
  return submit(file, Direction::HtoD, device, bytes, file_off, stream, settings, failed);
}

API_EXPORT void* cmt_io_write_async(void* file, CUdeviceptr device, uint64_t bytes, int64_t file_off, CUstream stream,
                                    const Settings* settings, IoResult* failed) {
  return submit(file, Direction::DtoH, device, bytes, file_off, stream, settings, failed);
}

// 1 once the transfer is done (waiting up to timeout_us; < 0: as long as it takes), else 0.
API_EXPORT int cmt_io_wait(void* op, int64_t timeout_us) {
  return stream_io_wait(static_cast<StreamOp*>(op), timeout_us) ? 1 : 0;
}

// The transfer's result in *out (status -1 while pending); returns the status.
API_EXPORT int cmt_io_result(void* op, IoResult* out) {
  *out = stream_io_result(static_cast<StreamOp*>(op));
  return out->status;
}

// The caller is done with the transfer (it runs to its end all the same).
API_EXPORT void cmt_io_release(void* op) {
  if (op) stream_io_release(static_cast<StreamOp*>(op));
}

// Batches (io_batch.hpp): transfers that run on native workers as soon as they are submitted and
// complete out of order.
API_EXPORT void* cmt_io_batch_new() { return io_batch_new(); }

// Transfers of one file (cuFileBatchIOSubmit's shape; Batch.read submits one), numbered first_index on: n
// device addresses, sizes and file offsets. All are checked first: 0 with all started, or the
// status of the first bad one (none started; *failed says why).
API_EXPORT int cmt_io_batch_submit_many(void* batch, void* file, int write, int64_t n, const uint64_t* devices,
                                        const uint64_t* sizes, const int64_t* file_offs, const Settings* settings,
                                        int64_t first_index, IoResult* failed) {
  if (!batch || n < 0 || (n > 0 && (!devices || !sizes || !file_offs))) {
    *failed = bad_request(EINVAL);
    return failed->status;
  }
  const Direction dir = write ? Direction::DtoH : Direction::HtoD;
  std::vector<IoRequest> reqs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (!make_request(file, dir, devices[i], sizes[i], file_offs[i], settings, &reqs[i], failed)) return failed->status;
  }
  stream_io_warm();  // the caller's thread, where pinning may wait
  for (int64_t i = 0; i < n; ++i) io_batch_submit(static_cast<IoBatch*>(batch), reqs[i], first_index + i);
  return 0;
}

// Up to `max` finished transfers (their numbers and results), waiting until min_nr have finished or
// timeout_us has passed (< 0: no limit); returns how many.
API_EXPORT int cmt_io_batch_poll(void* batch, int min_nr, int64_t timeout_us, int64_t* indices, IoResult* results,
                                 int max) {
  if (!batch || max <= 0) return 0;
  IoBatchCompletion got[64];
  const int n = io_batch_poll(static_cast<IoBatch*>(batch), min_nr, timeout_us, got, std::min(max, 64));
  for (int i = 0; i < n; ++i) {
    indices[i] = got[i].index;
    results[i] = got[i].result;
  }
  return n;
}

// Waits for the batch's transfers still running, then frees it.
API_EXPORT void cmt_io_batch_free(void* batch) {
  if (batch) io_batch_free(static_cast<IoBatch*>(batch));
}

// The process's storage counters: bytes O_DIRECT, bytes through the page cache, files that refused
// O_DIRECT. Writes up to n of them; returns how many there are.
API_EXPORT int cmt_io_counters(int64_t* out, int n) {
  const IoCounters c = io_counters();
  const int64_t all[] = {static_cast<int64_t>(c.direct_bytes), static_cast<int64_t>(c.buffered_bytes),
                         static_cast<int64_t>(c.direct_refused_files)};
  for (int i = 0; i < n && i < 3; ++i) out[i] = all[i];
  return 3;
}

// The fraction of [off, off + len) of fd in the page cache (page_cache.hpp); -1 when unknown.
API_EXPORT double cmt_io_resident_fraction(int fd, uint64_t off, uint64_t len) {
  return resident_fraction(fd, off, len);
}
