#include "file_transfer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bounce_pool.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "env.hpp"
#include "log.hpp"
#include "prefault.hpp"
#include "settings.hpp"

namespace cmt {
namespace {

// The bounce buffer of the path through the driver, when the engine has no pipeline for the copy.
constexpr size_t kDriverBounceBytes = size_t(4) << 20;

// A private non-blocking stream per context: what the engine orders its end of a file-to-device
// copy on, and what the transfer then waits for (the DMAs still in flight). Never destroyed; made
// again for a new context with the handle of one that ended (engine.hpp).
CUstream private_stream(const Driver& d, CUcontext ctx) {
  static std::mutex mutex;
  static std::vector<std::pair<ContextStamp, CUstream>> streams;
  std::lock_guard<std::mutex> lock(mutex);
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].first.ctx != ctx) continue;
    if (!streams[i].first.ended()) return streams[i].second;
    streams.erase(streams.begin() + static_cast<long>(i--));
  }
  const ContextStamp made_for(ctx);
  CUstream s = nullptr;
  if (d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return nullptr;
  streams.emplace_back(made_for, s);
  return s;
}

// When the engine cannot take the copy (its pipeline could not be set up, the node's pinned
// budget is spent, a forked child): through one pageable buffer and the driver's own copies.
CUresult copy_through_driver(const Driver& d, Direction dir, CUdeviceptr device, size_t bytes, CUstream stream,
                             FileEnd& end) {
  log::debug_once(0x903, "the staging pipeline is not available: a file transfer goes through the driver");
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, kDriverBounceBytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  char* buf = static_cast<char*>(raw);
  CUresult r = CUDA_SUCCESS;
  for (size_t off = 0; off < bytes && r == CUDA_SUCCESS; off += kDriverBounceBytes) {
    const size_t n = std::min(kDriverBounceBytes, bytes - off);
    if (dir == Direction::HtoD) {
      r = end.fill(buf, off, n, false);
      if (r == CUDA_SUCCESS) r = d.cuMemcpyHtoDAsync(device + off, buf, n, stream);
      if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(stream);
    } else {
      r = d.cuMemcpyDtoHAsync(buf, device + off, n, stream);
      if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(stream);
      if (r == CUDA_SUCCESS) r = end.drain(buf, off, n, false);
    }
  }
  free(buf);
  return r;
}

void fail_cuda(IoResult* res, CUresult r) {
  res->status = kIoCudaError;
  res->cu_result = r;
}

}  // namespace

bool settle_transfer(const FileEnd& end, CUresult r, IoResult* res) {
  res->direct_bytes += static_cast<int64_t>(end.direct_bytes());
  res->buffered_bytes += static_cast<int64_t>(end.buffered_bytes());
  if (end.failed()) {
    res->status = end.error() ? kIoOsError : kIoFileEnded;
    res->os_errno = end.error();
    res->offset = static_cast<int64_t>(end.error_offset());
    return false;
  }
  if (r != CUDA_SUCCESS) {
    fail_cuda(res, r);
    return false;
  }
  return true;
}

namespace {

// A read from the disk keeps at most this many staging buffers' blocks in flight. Its lanes then
// read a narrow window of the file, in order: cold 3.6 GiB reads from 2 x 8 MiB buffers ran at
// 3.25-3.68 GB/s (median 3.51, six processes) against 2.70-3.65 (median 3.12, seven) from 4, 2.73
// from 8 and 2.59 from 16 x 16 MiB, and fastsafetensors' 16 reads of 512 KiB in file order 3.57
// (H100, 2026-12-07, research/cold_depth.py). Two still overlap one block's DMA with the next's reads.
constexpr int kColdBuffers = 2;

// One engine copy of [part_off, part_off + len) of the request; false with *res set on failure.
bool copy_part(const Driver& d, const IoRequest& q, CUcontext ctx, CUstream stream, uint64_t part_off, size_t len,
               IoResult* res) {
  FileEnd end(*q.file, q.file_off + part_off);
  CopyRequest req{q.dir, ctx, nullptr, q.device + part_off, len, stream, q.settings, &end};
  req.setup_for_these = true;
  // (Only a read of more blocks than that can keep fewer in flight: no page-cache check for the rest.)
  const size_t chunk = static_cast<size_t>(q.settings.chunk_bytes);
  // (CMT_TEST_HOOKS cold_buffers=N: another cap, 0 for none; research/cold_depth.py compares them)
  const int cold = env().test_cold_buffers >= 0 ? static_cast<int>(env().test_cold_buffers) : kColdBuffers;
  if (cold > 0 && q.dir == Direction::HtoD && q.settings.buffers > cold && len > static_cast<size_t>(cold) * chunk &&
      end.reads_cold(len, chunk)) {
    req.max_in_flight = cold;
    log::debug_once(0x903, "a read mostly from the disk (O_DIRECT) keeps %d of its %lld buffers in flight", cold,
                    static_cast<long long>(q.settings.buffers));
  }
  CUresult r = engine_copy(req);
  if (r == CUDA_ERROR_NOT_READY && !end.failed()) r = copy_through_driver(d, q.dir, req.device, len, stream, end);
  // A file-to-device copy returns once its bytes are staged: the transfer is done once its DMAs are.
  if (r == CUDA_SUCCESS && q.dir == Direction::HtoD) r = d.cuStreamSynchronize(stream);
  return settle_transfer(end, r, res);
}

// Keeps the calling thread out of other threads' global-mode graph captures for the scope (as the
// engine's lanes are): its allocations, copies and synchronisations are not theirs.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const Driver& d) : d_(d) {
    exchanged_ = d_.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCapture() {
    if (exchanged_) d_.cuThreadExchangeStreamCaptureMode(&mode_);
  }

 private:
  const Driver& d_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

enum class Moved { Done, Failed, NoBuffer };

// A small transfer (kSmallIoBytes) through one bounce buffer: the file's bytes read into it and one
// DMA on the buffer's own stream, waited for; a write the other way round. Its `head` (the bytes up
// to the first aligned file offset) goes as a piece of its own, as the engine's path does, and the
// bytes lie in the buffer so that those after the head start at an aligned address: the rest can go
// O_DIRECT (FileEnd decides, per piece). NoBuffer when the context has no buffer to give.
Moved bounce_transfer(const Driver& d, const IoRequest& q, CUcontext ctx, uint64_t bytes, uint64_t head,
                      IoResult* res) {
  RelaxedCapture relaxed(d);
  Bounce* b = bounce_take(ctx);
  if (!b) return Moved::NoBuffer;
  const size_t a = q.file->align();
  char* data = b->mem;
  if (2 * a <= kBounceRoom) {  // else (an unusual alignment) FileEnd may find them unaligned: buffered
    const uintptr_t at = reinterpret_cast<uintptr_t>(b->mem);
    data = b->mem + ((a - at % a) % a) + (head ? a - head : 0);
  }
  FileEnd end(*q.file, q.file_off);
  auto piece = [&](uint64_t off, uint64_t len) {
    return q.dir == Direction::HtoD ? end.fill(data + off, off, len, false) : end.drain(data + off, off, len, false);
  };
  auto file_side = [&] {  // the head, then the rest; a failure stops it (FileEnd keeps the error)
    if ((head == 0 || piece(0, head) == CUDA_SUCCESS) && head < bytes) piece(head, bytes - head);
  };
  CUresult r = CUDA_SUCCESS;
  if (q.dir == Direction::HtoD) {
    file_side();
    if (!end.failed()) {
      r = d.cuMemcpyHtoDAsync(q.device, data, bytes, b->stream);
      if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(b->stream);
    }
  } else {
    r = d.cuMemcpyDtoHAsync(data, q.device, bytes, b->stream);
    if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(b->stream);
    if (r == CUDA_SUCCESS) file_side();
  }
  bounce_give(b);
  return settle_transfer(end, r, res) ? Moved::Done : Moved::Failed;
}

struct DeviceRange {
  CUcontext ctx = nullptr;
  unsigned int memory_type = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
};

bool query_device(const Driver& d, CUdeviceptr p, DeviceRange* out) {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[] = {&out->ctx, &out->memory_type, &out->start, &out->size};
  if (d.cuPointerGetAttributes(4, attrs, data, p) != CUDA_SUCCESS) return false;
  // Memory mapped with the virtual memory API belongs to no context: the caller's current one.
  if (!out->ctx && d.cuCtxGetCurrent(&out->ctx) != CUDA_SUCCESS) out->ctx = nullptr;
  return true;
}

}  // namespace

ContextScope::ContextScope(const Driver& d, CUcontext ctx) : d_(d) {
  if (d_.cuCtxGetCurrent(&prev_) != CUDA_SUCCESS) prev_ = nullptr;
  if (prev_ != ctx) ok_ = swapped_ = d_.cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

ContextScope::~ContextScope() {
  if (swapped_) d_.cuCtxSetCurrent(prev_);
}

// 4 buffers: a fresh process's first warm 3.6 GiB read took 88-91 ms with 4 against 102-114 with 8
// (the setup faults in and registers 48 MiB, not 80), and later reads 70-71 ms with either (H100,
// 2026-12-07, research/load_setup.py).
Settings io_default_settings() {
  Settings s;
  s.threads = std::clamp<long>(usable_cpus(), 1, 16);
  s.buffers = 4;
  s.chunk_bytes = int64_t(8) << 20;
  s.stores = 0;
  return s;
}

CUcontext io_context_of(CUdeviceptr device) {
  const Driver& d = driver(/*load_if_absent=*/true);
  DeviceRange range;
  if (!d.ok || !query_device(d, device, &range)) return nullptr;
  return range.ctx;
}

IoResult file_transfer(const IoRequest& q) {
  IoResult res;
  const Driver& d = driver(/*load_if_absent=*/true);
  if (!d.ok) {
    fail_cuda(&res, CUDA_ERROR_NOT_INITIALIZED);
    return res;
  }
  std::string why;
  if (!check_settings(q.settings, &why)) {
    log::write(log::Level::Warn, "file transfer: %s", why.c_str());
    res.status = kIoBadRequest;
    res.os_errno = EINVAL;
    return res;
  }
  if (q.bytes == 0) return res;
  DeviceRange range;
  if (!query_device(d, q.device, &range) || !range.ctx || range.memory_type != CU_MEMORYTYPE_DEVICE ||
      q.device < range.start || q.device + q.bytes > range.start + range.size || q.device + q.bytes < q.device) {
    res.status = kIoBadDevice;
    return res;
  }
  ContextScope scope(d, range.ctx);
  if (!scope.ok()) {
    fail_cuda(&res, CUDA_ERROR_INVALID_CONTEXT);
    return res;
  }
  if (q.wait_legacy) {
    if (CUresult r = d.cuStreamSynchronize(CU_STREAM_LEGACY); r != CUDA_SUCCESS) {
      fail_cuda(&res, r);
      return res;
    }
  }
  IoFile& file = *q.file;
  const int64_t size_before = file.size();
  uint64_t bytes = q.bytes;
  if (q.dir == Direction::HtoD && size_before >= 0) {
    const uint64_t size = static_cast<uint64_t>(size_before);
    bytes = q.file_off >= size ? 0 : std::min<uint64_t>(bytes, size - q.file_off);
    if (bytes == 0) return res;
  }
  // The bytes up to the first aligned file offset first, on their own: the rest starts aligned.
  const size_t a = file.align();
  const uint64_t head = file.may_direct() && q.file_off % a ? std::min<uint64_t>(bytes, a - q.file_off % a) : 0;
  const Moved small = bytes <= kSmallIoBytes ? bounce_transfer(d, q, range.ctx, bytes, head, &res) : Moved::NoBuffer;
  bool ok = small == Moved::Done;
  if (small == Moved::NoBuffer) {  // a large transfer (or no bounce buffer to be had): the engine
    CUstream stream = private_stream(d, range.ctx);
    if (!stream) {
      fail_cuda(&res, CUDA_ERROR_OUT_OF_MEMORY);
      return res;
    }
    ok = head == 0 || copy_part(d, q, range.ctx, stream, 0, head, &res);
    if (ok && head < bytes) ok = copy_part(d, q, range.ctx, stream, head, bytes - head, &res);
  }
  if (ok) {
    res.done = static_cast<int64_t>(bytes);
    return res;
  }
  if (q.dir == Direction::DtoH) cut_back_failed_write(q, size_before);
  return res;
}

void cut_back_failed_write(const IoRequest& q, int64_t size_before) {
  // Back to the larger of its former size and the write's offset (bytes before the write are never
  // cut: another write's), unless another write has meanwhile put bytes beyond this one's.
  IoFile& file = *q.file;
  if (!file.regular() || size_before < 0) return;
  const int64_t target = std::max<int64_t>(size_before, static_cast<int64_t>(q.file_off));
  const int64_t now = file.size();
  if (now > target && static_cast<uint64_t>(now) <= q.file_off + q.bytes && ftruncate(file.fd(), target) != 0) {
    log::write(log::Level::Warn, "a failed write could not be cut back to %lld bytes: %s",
               static_cast<long long>(target), strerror(errno));
  }
}

}  // namespace cmt
