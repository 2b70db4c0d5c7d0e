#include "file_end.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "env.hpp"
#include "log.hpp"
#include "page_cache.hpp"

namespace cmt {
namespace {

std::atomic<uint64_t> g_direct_bytes{0}, g_buffered_bytes{0}, g_refused_files{0};

// A range at least this much in the page cache is read buffered: the missing pages come in by
// readahead, and the rest is a copy out of memory.
constexpr double kCachedFraction = 0.5;

}  // namespace

// statx's direct I/O alignment (Linux 6.1, STATX_DIOALIGN), read from the kernel's struct by offset:
// older C libraries do not name the fields. 0 when unknown; *unsupported when the file system says
// it has no direct I/O.
size_t statx_dio_align(int fd, bool* unsupported) {
#ifdef SYS_statx
  constexpr unsigned kStatxDioAlign = 0x2000;
  alignas(8) unsigned char buf[256] = {};
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, kStatxDioAlign, buf) != 0) return 0;
  uint32_t mask, mem_align, offset_align;
  memcpy(&mask, buf, 4);
  memcpy(&mem_align, buf + 152, 4);
  memcpy(&offset_align, buf + 156, 4);
  if (!(mask & kStatxDioAlign)) return 0;
  if (offset_align == 0) {
    *unsupported = true;
    return 0;
  }
  return std::max(mem_align, offset_align);
#else
  (void)fd;
  (void)unsupported;
  return 0;
#endif
}

IoCounters io_counters() {
  return {g_direct_bytes.load(), g_buffered_bytes.load(), g_refused_files.load()};
}

IoFile::IoFile(int fd) : fd_(fd) {
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    regular_ = S_ISREG(st.st_mode);
    block_ = S_ISBLK(st.st_mode);
  }
  bool unsupported = false;
  if (regular_ || block_) {
    align_ = std::max<size_t>(align_, statx_dio_align(fd, &unsupported));
    int logical = 0;
    if (block_ && ioctl(fd, BLKSSZGET, &logical) == 0 && logical > 0) align_ = std::max<size_t>(align_, logical);
  }
  // Pipes, character devices and the like have no page cache to bypass.
  if (!(regular_ || block_) || unsupported) direct_fd_.store(kRefused, std::memory_order_relaxed);
}

IoFile::~IoFile() {
  close(fd_);
  const int d = direct_fd_.load(std::memory_order_relaxed);
  if (d >= 0) close(d);
  if (refused_fd_ >= 0) close(refused_fd_);
}

int IoFile::direct_fd() {
  int d = direct_fd_.load(std::memory_order_acquire);
  if (d != kNotOpened) return d;
  std::lock_guard<std::mutex> lock(open_mutex_);
  d = direct_fd_.load(std::memory_order_acquire);
  if (d != kNotOpened) return d;
  // The same open file again, by its /proc name, with the caller's access mode (and never O_TRUNC,
  // O_CREAT or O_APPEND: pwrite on O_APPEND appends wherever it is asked to write).
  const int flags = fcntl(fd_, F_GETFL);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd_);
  d = flags < 0 ? -1 : open(path, (flags & O_ACCMODE) | O_DIRECT | O_CLOEXEC);
  if (d < 0) {
    const int err = errno;
    direct_fd_.store(kRefused, std::memory_order_release);
    g_refused_files.fetch_add(1, std::memory_order_relaxed);
    log::debug_once(0x901, "a file could not be opened with O_DIRECT (%s): buffered reads and writes", strerror(err));
    return -1;
  }
  direct_fd_.store(d, std::memory_order_release);
  return d;
}

void IoFile::refuse_direct(int err) {
  std::lock_guard<std::mutex> lock(open_mutex_);
  const int d = direct_fd_.exchange(kRefused, std::memory_order_acq_rel);
  if (d == kRefused) return;
  // Another lane may be about to transfer on it: closed only with the IoFile, so that its number is
  // never another file's meanwhile.
  refused_fd_ = d;
  g_refused_files.fetch_add(1, std::memory_order_relaxed);
  log::debug_once(0x902, "the file system refused an O_DIRECT transfer (%s): buffered I/O from now on",
                  strerror(err));
}

int64_t IoFile::size() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return -1;
  if (S_ISREG(st.st_mode)) return st.st_size;
  uint64_t bytes = 0;
  if (S_ISBLK(st.st_mode) && ioctl(fd_, BLKGETSIZE64, &bytes) == 0) return static_cast<int64_t>(bytes);
  return -1;
}

bool IoFile::still(uint64_t dev, uint64_t ino, int64_t* size) const {
  struct stat st {};
  auto is = [&](int fd) {
    return fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev && static_cast<uint64_t>(st.st_ino) == ino;
  };
  const int d = direct_fd_.load(std::memory_order_acquire);
  if ((d >= 0 && !is(d)) || !is(fd_)) return false;
  *size = S_ISREG(st.st_mode) ? st.st_size : -1;
  return true;
}

CUresult FileEnd::fill(char* staging, size_t off, size_t len, bool) {
  return transfer(staging, base_ + off, len, /*write=*/false);
}

CUresult FileEnd::drain(const char* staging, size_t off, size_t len, bool) {
  return transfer(const_cast<char*>(staging), base_ + off, len, /*write=*/true);  // pwrite only reads it
}

void FileEnd::fail(int err, uint64_t at) {
  std::lock_guard<std::mutex> lock(err_mutex_);
  if (failed_.load(std::memory_order_relaxed) && err_at_ <= at) return;
  err_ = err;
  err_at_ = at;
  failed_.store(true, std::memory_order_release);
}

namespace {

// pread or pwrite of [pos, pos + len), over short transfers and EINTR. Returns the bytes done; on
// an error sets *err; a read that meets the end of the file sets *ended. `stop_unaligned`: stop
// after a short transfer that leaves an unaligned position (O_DIRECT cannot go on from there).
size_t transfer_all(int fd, char* buf, uint64_t pos, size_t len, bool write, size_t stop_unaligned, int* err,
                    bool* ended) {
  size_t done = 0;
  while (done < len) {
    const ssize_t r = write ? pwrite(fd, buf + done, len - done, static_cast<off_t>(pos + done))
                            : pread(fd, buf + done, len - done, static_cast<off_t>(pos + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      break;
    }
    if (r == 0) {
      if (write) *err = EIO;  // a write that makes no progress would loop forever
      else *ended = true;
      break;
    }
    done += static_cast<size_t>(r);
    if (stop_unaligned && done < len && done % stop_unaligned) break;
  }
  return done;
}

}  // namespace

bool FileEnd::will_go_direct(const char* buf, uint64_t pos, size_t len) {
  const size_t a = file_.align();
  if (!allow_direct_ || !file_.may_direct() || len < a || pos % a || reinterpret_cast<uintptr_t>(buf) % a) {
    return false;
  }
  // A fraction that cannot be told (-1) counts as not cached.
  return resident_fraction(file_.fd(), pos, len & ~(a - 1)) < kCachedFraction && file_.direct_fd() >= 0;
}

size_t FileEnd::try_direct(char* buf, uint64_t pos, size_t len, bool write, int* err, bool* ended) {
  const size_t a = file_.align();
  const int dfd = file_.direct_fd();
  if (dfd < 0) return 0;
  int derr = 0;
  const size_t done = transfer_all(dfd, buf, pos, len & ~(a - 1), write, a, &derr, ended);
  if (derr == EINVAL && done == 0) {
    file_.refuse_direct(derr);  // the file system's own rules: the whole piece goes buffered
  } else if (derr) {
    *err = derr;
  }
  return done;
}

bool FileEnd::reads_cold(size_t len, size_t sample) {
  constexpr int kSamples = 8;
  if (!allow_direct_ || !file_.may_direct() || len == 0) return false;
  sample = std::min(std::max<size_t>(sample, 1), len);
  double cached = 0;
  for (int k = 0; k < kSamples; ++k) {
    const double f = resident_fraction(file_.fd(), base_ + (len - sample) / (kSamples - 1) * k, sample);
    cached += f < 0 ? 0 : f;  // a fraction that cannot be told counts as not cached, as for a piece
  }
  return cached / kSamples < kCachedFraction;
}

bool FileEnd::in_disk_io(size_t off) {
  std::lock_guard<std::mutex> lock(pieces_mutex_);
  auto it = pieces_.find(base_ + off);
  return it != pieces_.end() && it->second.direct && !it->second.done;
}

bool FileEnd::claim(uint64_t pos, bool direct, CUresult* result) {
  std::unique_lock<std::mutex> lock(pieces_mutex_);
  auto [it, fresh] = pieces_.try_emplace(pos);
  Piece& piece = it->second;  // references survive the map's rehashing; iterators do not
  if (fresh) piece.direct = direct;
  if (fresh || !piece.direct) return true;
  piece_done_.wait(lock, [&] { return piece.done; });
  *result = piece.result;
  return false;
}

void FileEnd::settle(uint64_t pos, bool direct, CUresult result) {
  {
    std::lock_guard<std::mutex> lock(pieces_mutex_);
    Piece& p = pieces_[pos];
    p.direct = p.direct || direct;
    p.done = true;
    p.result = result;
  }
  if (direct) piece_done_.notify_all();
}

CUresult FileEnd::transfer(char* buf, uint64_t pos, size_t len, bool write) {
  // Whether the piece goes O_DIRECT is known when it is claimed: a lane that comes to it later (its
  // lane descheduled, the piece taken over) waits for it instead of reading the disk again.
  const bool direct_first = will_go_direct(buf, pos, len);
  // (CMT_TEST_HOOKS disk_slow_at/disk_slow_us: a disk read slower than the others)
  const bool slow = env().test_disk_slow_us && static_cast<long>(pos) == env().test_disk_slow_at;
  CUresult result = CUDA_SUCCESS;
  if (!claim(pos, direct_first || slow, &result)) return result;
  if (slow) std::this_thread::sleep_for(std::chrono::microseconds(env().test_disk_slow_us));
  int err = 0;
  bool ended = false;
  const size_t direct = direct_first ? try_direct(buf, pos, len, write, &err, &ended) : 0;
  size_t done = direct;
  if (!err && !ended && done < len) {
    done += transfer_all(file_.fd(), buf + done, pos + done, len - done, write, 0, &err, &ended);
  }
  direct_.fetch_add(direct, std::memory_order_relaxed);
  buffered_.fetch_add(done - direct, std::memory_order_relaxed);
  g_direct_bytes.fetch_add(direct, std::memory_order_relaxed);
  g_buffered_bytes.fetch_add(done - direct, std::memory_order_relaxed);
  if (done != len) {
    fail(err, pos + done);  // err 0: the file ended before the range the caller was promised
    result = CUDA_ERROR_UNKNOWN;
  }
  settle(pos, direct_first || slow, result);
  return result;
}

}  // namespace cmt
