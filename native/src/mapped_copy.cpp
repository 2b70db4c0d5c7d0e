#include "mapped_copy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "driver.hpp"
#include "env.hpp"
#include "file_end.hpp"
#include "file_transfer.hpp"
#include "log.hpp"
#include "mapping_lookup.hpp"
#include "page_cache.hpp"

namespace cmt {
namespace {

// ---- the files behind mappings, opened once ------------------------------------------------------
// Kept open by device and inode: while cmt holds the descriptor, no other file can have that inode
// number, so an entry never names another file; each copy checks that the descriptors still are that
// file (a program may close descriptors it did not open, and their numbers go to other files). A
// file that cannot be opened as the same file (the path now names another, or it was deleted) is
// kept as such, so that it is not tried on every copy.

constexpr int kFiles = 16;
// O_DIRECT leaves the page cache as it was: a range the plain copy would have left cached stays
// cold, and a program that copies it again (a data set's next epoch) would read the disk each time.
// So each file remembers, per 2 MiB, what went from it with O_DIRECT allowed; a copy that comes back
// to any of it reads through the page cache, which its next copies then find warm.
constexpr uint64_t kChunkShift = 21;
constexpr uint64_t kMaxChunks = uint64_t(1) << 25;  // 64 TiB of file; beyond, always through the cache
struct CachedFile {
  uint64_t dev = 0, ino = 0, used = 0;
  IoFile* file = nullptr;  // nullptr: not to be had
  std::vector<uint64_t> read_direct;  // a bit per 2 MiB chunk
};
std::mutex g_files_mutex;
CachedFile g_files[kFiles];
uint64_t g_tick = 0;

// Whether the kernel tells this process which pages of the file are cached (cachestat and mincore
// both): the file's owner, a user who may write it, or root. Otherwise every page reads as absent,
// and a warm file would be read from the disk instead of memory.
bool residency_told(int fd, const struct stat& st) {
  if (geteuid() == 0 || st.st_uid == geteuid()) return true;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  return faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0;
}

// Opens the mapped file: the mapping's own file through /proc/self/map_files (where this process
// may: CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE; it is the very file, also on overlay file systems),
// else its path; either must be the regular file of the mapping's device and inode, and one whose
// cached pages the kernel tells this process.
int open_mapped(const Mapping& m) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/map_files/%" PRIxPTR "-%" PRIxPTR, m.start, m.end);
  for (const char* path : {static_cast<const char*>(link), m.path.c_str()}) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_dev) == m.dev &&
        static_cast<uint64_t>(st.st_ino) == m.ino) {
      if (residency_told(fd, st)) return fd;
      log::debug_once(0xA07, "the kernel does not tell this user which pages of a mapped file are cached (%s: "
                      "neither owned nor writable): its copies come from memory", m.path.c_str());
      close(fd);
      return -1;
    }
    close(fd);
  }
  log::debug_once(0xA02, "a mapped file could not be opened again as the same file (%s): its copies come from "
                  "memory", m.path.c_str());
  return -1;
}

// The mapped file, retained for the caller; nullptr when it cannot be had.
IoFile* mapped_file(const Mapping& m) {
  std::lock_guard<std::mutex> lock(g_files_mutex);
  CachedFile* oldest = &g_files[0];
  for (CachedFile& c : g_files) {
    if (c.used && c.dev == m.dev && c.ino == m.ino) {
      c.used = ++g_tick;
      if (c.file) c.file->retain();
      return c.file;
    }
    if (c.used < oldest->used) oldest = &c;
  }
  const int fd = open_mapped(m);
  int64_t size = 0;
  // A transfer still using it holds its own reference. Descriptors the program closed, whose numbers
  // may be its own files' now, are left open (the IoFile is never deleted).
  if (oldest->file && oldest->file->still(oldest->dev, oldest->ino, &size)) oldest->file->release();
  *oldest = CachedFile{m.dev, m.ino, ++g_tick, fd >= 0 ? new IoFile(fd) : nullptr, {}};
  if (oldest->file) oldest->file->retain();
  return oldest->file;
}

// Drops the entry of `file`, whose descriptors are no longer its own (IoFile::still). Its reference
// is kept, so that it is never deleted: that would close the numbers, which now are the program's.
void forget_file(const IoFile* file) {
  std::lock_guard<std::mutex> lock(g_files_mutex);
  for (CachedFile& c : g_files) {
    if (c.file == file) c = CachedFile{};
  }
}

// Whether [off, off + n) of `file` may go O_DIRECT: none of its chunks went so before. `mark`: they
// went so now.
bool first_time(const IoFile* file, uint64_t off, size_t n, bool mark) {
  const uint64_t first = off >> kChunkShift, last = (off + n - 1) >> kChunkShift;
  if (last >= kMaxChunks) return false;
  std::lock_guard<std::mutex> lock(g_files_mutex);
  for (CachedFile& c : g_files) {
    if (c.file != file) continue;
    std::vector<uint64_t>& bits = c.read_direct;
    if (bits.size() <= last / 64) bits.resize(last / 64 + 1);
    bool again = false;
    for (uint64_t i = first; i <= last; ++i) again = again || (bits[i / 64] >> (i % 64) & 1);
    if (mark) {
      for (uint64_t i = first; i <= last; ++i) bits[i / 64] |= uint64_t(1) << (i % 64);
    }
    return !again;
  }
  return true;  // evicted meanwhile: no record of it
}

// A reference to a mapped file, released at the end of the copy.
struct Held {
  IoFile* file = nullptr;
  void reset(IoFile* f) {
    if (file) file->release();
    file = f;
  }
  ~Held() { reset(nullptr); }
};

// ---- private mappings: which pages are still the file's ------------------------------------------

// /proc/self/pagemap, 64 bits a page: present (63), swapped (62), a file page or shared anonymous
// (61), a guard region (58). A private mapping's page the program wrote to is an anonymous copy
// (present without bit 61, or swapped); a page not present reads as the file.
constexpr uint64_t kPresent = 1ull << 63, kSwapped = 1ull << 62, kFilePage = 1ull << 61, kGuard = 1ull << 58;
KeptFd g_pagemap_fd("/proc/self/pagemap");

// Whether every page of [addr, addr + len) still reads as the file, checked 2 MiB of pages at a
// time; false at the first one that does not, or when the kernel will not say.
bool pages_are_the_file(uintptr_t addr, size_t len) {
  const int fd = g_pagemap_fd.get(/*check=*/true);  // (one fstat: it decides which bytes a copy gets)
  if (fd < 0) return false;
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = addr / page, end = (addr + len + page - 1) / page;
  uint64_t entries[512];
  for (uint64_t p = first; p < end;) {
    const size_t count = static_cast<size_t>(std::min<uint64_t>(512, end - p));
    const ssize_t r = pread(fd, entries, count * 8, static_cast<off_t>(p * 8));
    if (r != static_cast<ssize_t>(count * 8)) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    for (size_t i = 0; i < count; ++i) {
      const uint64_t e = entries[i];
      if ((e & (kSwapped | kGuard)) || ((e & kPresent) && !(e & kFilePage))) return false;
    }
    p += count;
  }
  return true;
}

bool same_mapping(const Mapping& a, const Mapping& b) {
  return a.start == b.start && a.end == b.end && a.offset == b.offset && a.dev == b.dev && a.ino == b.ino &&
         a.shared == b.shared && a.readable == b.readable;
}

// Waits for everything queued in the current context: after a file read failed, the failed copy's
// DMAs may still be in flight when the copy goes to the driver on the caller's stream.
void settle_context() {
  const Driver& d = driver();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged = d.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  if (d.cuCtxSynchronize) d.cuCtxSynchronize();
  if (exchanged) d.cuThreadExchangeStreamCaptureMode(&mode);
}

// Whether the file behind `m` may serve [addr, addr + n) (the rules of mapped_copy.hpp); if so, the
// file (retained in *held) and the range's file offset.
bool file_serves(const Mapping& m, uintptr_t addr, size_t n, Held* held, uint64_t* off) {
  if (!m.file() || !m.readable) return false;
  if (addr + n > m.end || addr + n < addr) {
    log::debug_once(0xA03, "a copy's source spans more than one mapping: it comes from memory");
    return false;
  }
  // Every time: the file may have been cut since it was mapped, and the program may have closed the
  // descriptors cmt keeps (their numbers then are other files': the entry is opened again, once).
  int64_t size = -1;
  held->reset(mapped_file(m));
  if (held->file && !held->file->still(m.dev, m.ino, &size)) {
    log::debug_once(0xA09, "a descriptor cmt kept for a mapped file was closed by the program: opened again");
    forget_file(held->file);
    held->reset(mapped_file(m));
    if (held->file && !held->file->still(m.dev, m.ino, &size)) return false;
  }
  if (!held->file) return false;
  IoFile& file = *held->file;
  *off = m.offset + (addr - m.start);
  if (size < 0 || *off + n > static_cast<uint64_t>(size)) {
    log::debug_once(0xA04, "a mapped range reaches past the end of its file (cut since it was mapped?): it comes "
                    "from memory");
    return false;
  }
  // Wholly in the page cache (or not to be told): the usual staged copy out of memory is as fast.
  const double cached = resident_fraction(file.fd(), *off, n);
  if (cached < 0 || cached >= 1) return false;
  if (!m.shared && !pages_are_the_file(addr, n)) {
    log::debug_once(0xA05, "a private file mapping the program wrote to: its copies come from memory");
    return false;
  }
  return true;
}

}  // namespace

bool copy_from_mapping(const CopyRequest& req, CUresult* result, Outcome* outcome) {
  if (!env().from_file || req.dir != Direction::HtoD || req.end || req.bytes < kMappedCopyMinBytes) return false;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(req.host);
  Mapping m;
  Held held;
  uint64_t off = 0;
  if (!find_mapping(addr, &m, /*fresh=*/false) || !file_serves(m, addr, req.bytes, &held, &off)) return false;
  if (!mapping_answers_fresh()) {
    // A kept answer is about to be trusted: ask again, and decide again if the mapping changed.
    Mapping now;
    if (!find_mapping(addr, &now, /*fresh=*/true)) return false;
    if (!same_mapping(now, m) && !file_serves(now, addr, req.bytes, &held, &off)) return false;
  }
  IoFile& file = *held.file;

  // Lanes wait on the disk as much as they copy: at least the storage path's threads.
  Settings st = req.settings;
  st.threads = std::max(st.threads, io_default_settings().threads);
  // The bytes up to the first aligned file offset on their own, so that the rest can go O_DIRECT.
  const size_t a = file.align();
  const size_t head = off % a ? std::min<size_t>(req.bytes, a - off % a) : 0;
  const bool direct = first_time(&file, off, req.bytes, /*mark=*/false);
  // CMT_TEST_HOOKS mapped_fail=1: each file copy reads the wrong bytes and counts as failed, so that
  // the tests see the copy done again from memory overwrite them.
  const uint64_t skew = env().test_mapped_fail ? 4096 : 0;
  CUresult r = CUDA_SUCCESS;
  bool failed = false;
  int err = 0;
  uint64_t err_at = 0;
  for (size_t part = 0; part < req.bytes && r == CUDA_SUCCESS;) {
    const size_t len = part == 0 && head ? head : req.bytes - part;
    FileEnd end(file, off + part + skew, direct);
    CopyRequest q{Direction::HtoD, req.ctx, nullptr, req.device + part, len, req.stream, st, &end};
    Pass passed = Pass::No;
    r = engine_copy(q, nullptr, &passed);  // rather than wait, the caller copies as usual
    if (end.failed() || skew) {
      failed = true;
      err = end.failed() ? end.error() : EIO;
      err_at = end.failed() ? end.error_offset() : off + part;
    }
    if (failed || r == CUDA_ERROR_NOT_READY) break;  // (the head's DMAs are ordered before the caller's copy)
    part += len;
  }
  if (!failed) {
    if (r == CUDA_ERROR_NOT_READY) return false;  // nothing staged from the file that matters: copy as usual
    if (direct && r == CUDA_SUCCESS) first_time(&file, off, req.bytes, /*mark=*/true);
    *result = r;
    *outcome = Outcome::FromFile;
    return true;
  }
  log::debug_once(0xA06, "reading a mapped file failed (%s at offset %" PRIu64 "): the copy comes from memory",
                  err ? strerror(err) : "it ended early", err_at);
  CopyRequest mem = req;
  mem.end = nullptr;
  r = engine_copy(mem);  // the pipeline is set up: its DMAs follow the failed copy's on one stream
  if (r == CUDA_ERROR_NOT_READY) {
    settle_context();
    return false;
  }
  *result = r;
  *outcome = Outcome::Accelerated;
  return true;
}

}  // namespace cmt
