// The storage path's host end: a range of a file in place of the program's memory. The engine's
// lanes read their pieces of a file-to-GPU copy into the staging slots with pread (fill), and write
// their pieces of a GPU-to-file copy out of the slots with pwrite (drain): the same pipeline as a
// memory copy, with the kernel's copy in place of memcpy.
//
// Each piece goes O_DIRECT or buffered. O_DIRECT when its file offset, length and staging address
// are aligned (the slots are pinned and page-aligned, and the engine's pieces are 4 KiB multiples)
// and its range is not in the page cache (page_cache.hpp): the disk's rate, no copy through the
// cache. Buffered when it is cached (a copy out of memory is faster than the disk) or unaligned (an
// unaligned tail of a piece goes buffered after its aligned part). A file system that refuses
// O_DIRECT (tmpfs, EINVAL at open or on the first transfer) gets buffered I/O, logged once.
//
// The engine lets a lane take over a piece whose lane has had it for longer than a memcpy of it
// takes (job.hpp: a descheduled lane). A lane waiting on the disk looks the same, and doing its
// piece again would read or write the disk twice; so a lane that comes to a piece another lane is
// doing O_DIRECT waits for that lane instead. (A buffered piece is done again, as memory is.)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "host_end.hpp"

namespace cmt {

// An open file of the storage path: a descriptor of its own (buffered I/O; the C API hands it a
// duplicate of the caller's), a second one with O_DIRECT opened on first need, and the alignment
// that direct I/O asks for on it. Counted references: the caller's handle and each transfer in
// flight hold one, so that closing the handle never pulls the file from under a transfer.
class IoFile {
 public:
  explicit IoFile(int fd);  // takes `fd` over: closed with the IoFile
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;
  void retain() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  int fd() const { return fd_; }
  // Whether pieces may go O_DIRECT at all (a regular file or block device that did not refuse it).
  bool may_direct() const { return direct_fd_.load(std::memory_order_relaxed) != kRefused; }
  // The O_DIRECT descriptor, opened on the first call; -1 where the file system refuses it.
  int direct_fd();
  // An O_DIRECT transfer failed with EINVAL: buffered I/O from now on.
  void refuse_direct(int err);
  size_t align() const { return align_; }
  // The file's size now: regular files and block devices; -1 for other kinds (pipes, devices).
  int64_t size() const;
  // Whether its descriptors (the O_DIRECT one where opened) are still the file of `dev` and `ino`,
  // and if so its size: a program that closes descriptors it did not open (close_range) lets their
  // numbers go to other files (mapped_copy.cpp keeps IoFiles open between copies).
  bool still(uint64_t dev, uint64_t ino, int64_t* size) const;
  bool regular() const { return regular_; }
  // The end of the stream-ordered writes queued on it so far (stream_io.cpp cuts reads queued after
  // them there, not at the size the file has yet).
  void note_stream_write(uint64_t end) {
    uint64_t seen = stream_write_end_.load(std::memory_order_relaxed);
    while (seen < end && !stream_write_end_.compare_exchange_weak(seen, end, std::memory_order_relaxed)) {
    }
  }
  uint64_t stream_write_end() const { return stream_write_end_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kNotOpened = -2, kRefused = -1;
  ~IoFile();
  std::atomic<int> refs_{1};
  int fd_;
  bool regular_ = false, block_ = false;
  size_t align_ = 4096;
  std::mutex open_mutex_;
  std::atomic<int> direct_fd_{kNotOpened};
  int refused_fd_ = -1;  // the O_DIRECT descriptor of a file that then refused it (under open_mutex_)
  std::atomic<uint64_t> stream_write_end_{0};
};

// One copy's range of an IoFile: bytes [off, off + len) of the copy are the file's bytes
// [file_off + off, ...). A failed transfer (or a read that meets the end of the file, which the
// caller clamped reads to) is kept, the first by file offset, and fails the engine's copy.
class FileEnd final : public HostEnd {
 public:
  // `direct`: false, every piece goes through the page cache (a range read again: mapped_copy.hpp).
  FileEnd(IoFile& file, uint64_t file_off, bool direct = true)
      : file_(file), base_(file_off), allow_direct_(direct) {}
  CUresult fill(char* staging, size_t off, size_t len, bool streaming) override;
  CUresult drain(const char* staging, size_t off, size_t len, bool streaming) override;
  bool in_disk_io(size_t off) override;
  // Whether a read of its first `len` bytes will mostly go to the disk O_DIRECT: the page cache holds
  // less than half of 8 ranges of `sample` bytes spread over them (cheap for any length).
  bool reads_cold(size_t len, size_t sample);

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  int error() const { return err_; }               // errno; 0 when the file ended early
  uint64_t error_offset() const { return err_at_; }  // the file offset it happened at
  uint64_t direct_bytes() const { return direct_.load(std::memory_order_relaxed); }
  uint64_t buffered_bytes() const { return buffered_.load(std::memory_order_relaxed); }

 private:
  CUresult transfer(char* buf, uint64_t pos, size_t len, bool write);
  // Whether the piece's aligned part should go O_DIRECT: aligned, not in the page cache.
  bool will_go_direct(const char* buf, uint64_t pos, size_t len);
  // Transfers the aligned part of [pos, pos + len) O_DIRECT; returns the bytes done, < len when the
  // rest is left to buffered I/O (or *err is set).
  size_t try_direct(char* buf, uint64_t pos, size_t len, bool write, int* err, bool* ended);
  void fail(int err, uint64_t at);
  // Claims the piece at `pos`, to be read or written O_DIRECT (`direct`) or not: false if another
  // lane has it O_DIRECT (then *result is its outcome, once it has one).
  bool claim(uint64_t pos, bool direct, CUresult* result);
  void settle(uint64_t pos, bool direct, CUresult result);

  IoFile& file_;
  uint64_t base_;
  bool allow_direct_;
  std::atomic<uint64_t> direct_{0}, buffered_{0};
  std::mutex err_mutex_;
  std::atomic<bool> failed_{false};
  int err_ = 0;
  uint64_t err_at_ = 0;
  struct Piece {
    bool direct = false, done = false;
    CUresult result = CUDA_SUCCESS;
  };
  std::mutex pieces_mutex_;
  std::condition_variable piece_done_;
  std::unordered_map<uint64_t, Piece> pieces_;  // by file offset: the pieces begun
};

// The alignment direct I/O asks for on `fd` (statx, Linux 6.1); 0 when the kernel does not say;
// *unsupported when the file system has no direct I/O.
size_t statx_dio_align(int fd, bool* unsupported);

// Process-wide counts of the storage path's bytes by how they went (cmt_io_counters).
struct IoCounters {
  uint64_t direct_bytes, buffered_bytes, direct_refused_files;
};
IoCounters io_counters();

}  // namespace cmt
