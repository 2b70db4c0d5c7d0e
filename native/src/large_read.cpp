// This file defines read, pread and the rest: the fortified headers' inline wrappers of them must
// not be in force here.
#undef _FORTIFY_SOURCE
#include "large_read.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "copy_path.hpp"
#include "disk_kind.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "env.hpp"
#include "file_end.hpp"
#include "host_copy.hpp"
#include "log.hpp"
#include "page_cache.hpp"
#include "prefault.hpp"
#include "rate_guard.hpp"

#define API_EXPORT extern "C" __attribute__((visibility("default")))

namespace cmt {
namespace {

using ReadFn = ssize_t (*)(int, void*, size_t);
using PreadFn = ssize_t (*)(int, void*, size_t, off_t);
using ReadvFn = ssize_t (*)(int, const iovec*, int);
using PreadvFn = ssize_t (*)(int, const iovec*, int, off_t);
using ReadChkFn = ssize_t (*)(int, void*, size_t, size_t);
using PreadChkFn = ssize_t (*)(int, void*, size_t, off_t, size_t);

// Before libc's functions are resolved (other libraries' constructors read files before ours runs):
// the system calls themselves. The lanes use them too: no cancellation point inside a split read.
ssize_t sys_read(int fd, void* b, size_t n) { return syscall(SYS_read, fd, b, n); }
ssize_t sys_pread(int fd, void* b, size_t n, off_t o) { return syscall(SYS_pread64, fd, b, n, o); }
ssize_t sys_readv(int fd, const iovec* v, int c) { return syscall(SYS_readv, fd, v, c); }
ssize_t sys_preadv(int fd, const iovec* v, int c, off_t o) {
  return syscall(SYS_preadv, fd, v, c, static_cast<long>(o), static_cast<long>(static_cast<uint64_t>(o) >> 32));
}
ssize_t early_read_chk(int fd, void* b, size_t n, size_t room) {
  if (n > room) abort();  // what glibc's __chk_fail does, without its message
  return sys_read(fd, b, n);
}
ssize_t early_pread_chk(int fd, void* b, size_t n, off_t o, size_t room) {
  if (n > room) abort();
  return sys_pread(fd, b, n, o);
}

ReadFn g_read = sys_read;
PreadFn g_pread = sys_pread, g_pread64 = sys_pread;
ReadvFn g_readv = sys_readv;
PreadvFn g_preadv = sys_preadv, g_preadv64 = sys_preadv;
ReadChkFn g_read_chk = early_read_chk;
PreadChkFn g_pread_chk = early_pread_chk, g_pread64_chk = early_pread_chk;

// Reads below this take the plain path at once; SIZE_MAX until the library is initialised.
std::atomic<size_t> g_threshold{SIZE_MAX};

std::atomic<uint64_t> g_split_calls{0}, g_split_bytes{0}, g_alone_calls{0}, g_alone_bytes{0}, g_guarded_calls{0};

constexpr uint64_t kMaxRw = 0x7ffff000;  // the most one read returns (the kernel's MAX_RW_COUNT)
constexpr int kSubIov = 64;              // iovecs per system call of a lane (its stack stays small)

struct ReadJob {
  int fd = -1;
  const iovec* iov = nullptr;
  int iovcnt = 0;
  uint64_t start = 0, len = 0, piece = 0;
  uint64_t align = 1;  // O_DIRECT: a short read that leaves an unaligned position is the file's end
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> stop{UINT64_MAX};  // where the bytes stop: the first short piece's end
  std::atomic<uint64_t> written{0};        // the end of the furthest bytes any lane read into the buffer
  struct Short {
    uint64_t at = UINT64_MAX;
    int err = 0;
  } shorts[kMaxThreads];
};

void note_short(ReadJob& j, int lane, uint64_t at, int err) {
  if (at < j.shorts[lane].at) j.shorts[lane] = {at, err};
  uint64_t s = j.stop.load(std::memory_order_relaxed);
  while (at < s && !j.stop.compare_exchange_weak(s, at, std::memory_order_relaxed)) {
  }
}

// CMT_TEST_HOOKS read_eio=OFFSET: the lanes' reads stop at that file offset and fail there with EIO;
// read_eio_once=1: only the first time (a transient error). UINT64_MAX: no such failure.
std::atomic<bool> g_eio_spent{false};
uint64_t eio_offset() {
  const long e = env().test_read_eio;
  if (__builtin_expect(e < 0, 1)) return UINT64_MAX;
  return env().test_read_eio_once && g_eio_spent.load(std::memory_order_relaxed) ? UINT64_MAX : static_cast<uint64_t>(e);
}

// Reads the bytes [a, b) of the request (a flat range over its iovecs) at file offset start + a, at
// most kSubIov iovecs a system call, on over short reads (as transfer_all in file_end.cpp) and EINTR;
// the end of the file or an error ends the piece.
void read_range(ReadJob& j, uint64_t a, uint64_t b, int lane) {
  int seg = 0;
  uint64_t seg_start = 0;  // the flat offset of iov[seg]
  uint64_t pos = a;
  while (pos < b) {
    while (seg < j.iovcnt && seg_start + j.iov[seg].iov_len <= pos) seg_start += j.iov[seg++].iov_len;
    uint64_t end = b;
    const uint64_t eio = eio_offset();
    if (__builtin_expect(eio != UINT64_MAX, 0) && j.start + pos <= eio && eio < j.start + b) {
      if (j.start + pos == eio) {
        g_eio_spent.store(true, std::memory_order_relaxed);
        return note_short(j, lane, pos, EIO);
      }
      end = eio - j.start;
    }
    iovec sub[kSubIov];
    int k = 0, s = seg;
    uint64_t want = 0, s_start = seg_start;
    while (k < kSubIov && pos + want < end && s < j.iovcnt) {
      const uint64_t in = pos + want - s_start;
      const uint64_t take = std::min<uint64_t>(j.iov[s].iov_len - in, end - (pos + want));
      if (take) sub[k++] = {static_cast<char*>(j.iov[s].iov_base) + in, take};
      want += take;
      if (in + take == j.iov[s].iov_len) s_start += j.iov[s++].iov_len;
    }
    const off_t at = static_cast<off_t>(j.start + pos);
    const ssize_t r = k == 1 ? sys_pread(j.fd, sub[0].iov_base, sub[0].iov_len, at) : sys_preadv(j.fd, sub, k, at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return note_short(j, lane, pos, errno);
    if (r == 0) return note_short(j, lane, pos, 0);  // the end of the file (cut since fstat)
    pos += static_cast<uint64_t>(r);
    uint64_t w = j.written.load(std::memory_order_relaxed);
    while (pos > w && !j.written.compare_exchange_weak(w, pos, std::memory_order_relaxed)) {
    }
    if (static_cast<uint64_t>(r) < want && pos % j.align) return note_short(j, lane, pos, 0);  // O_DIRECT's end
  }
}

// Where the bytes of the job stop (the first short piece's end, or len) and its error.
uint64_t first_short(const ReadJob& j, uint64_t len, int* err) {
  uint64_t done = len;
  for (const auto& s : j.shorts) {
    if (s.at < done) done = s.at, *err = s.err;
  }
  return done;
}

void read_pieces(void* arg, int lane) {
  auto& j = *static_cast<ReadJob*>(arg);
  const long slow_us = env().test_read_slow_us;  // CMT_TEST_HOOKS read_slow_us / read_slow_after
  const bool slow = __builtin_expect(slow_us > 0, 0) &&
                    g_split_calls.load(std::memory_order_relaxed) >= static_cast<uint64_t>(env().test_read_slow_after);
  for (;;) {
    const uint64_t a = j.next.fetch_add(j.piece, std::memory_order_relaxed);
    if (a >= j.len || a >= j.stop.load(std::memory_order_relaxed)) break;
    if (slow) usleep(static_cast<useconds_t>(slow_us));
    read_range(j, a, std::min(a + j.piece, j.len), lane);
  }
}

int read_lanes() {
  static const int n = static_cast<int>(std::clamp(usable_cpus(), 1L, 16L));
  return n;
}

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// The alignment an O_DIRECT descriptor asks for; 0: the request is not aligned to it (plain call).
uint64_t direct_alignment(int fd, const iovec* iov, int iovcnt, uint64_t start) {
  bool unsupported = false;
  const uint64_t a = std::max<uint64_t>(4096, statx_dio_align(fd, &unsupported));
  if (start % a) return 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (reinterpret_cast<uintptr_t>(iov[i].iov_base) % a || iov[i].iov_len % a) return 0;
  }
  return a;
}

// One read, split when it may be; `plain` is the call as the program made it. `offset` < 0: at the
// file position (read, readv).
template <typename Plain>
ssize_t split_read(int fd, const iovec* iov, int iovcnt, bool positional, off_t offset, Plain plain) {
  if (inside_cmt() || in_forked_child() || copies_disabled() || !driver().ok) return plain();
  if (iovcnt <= 0 || iovcnt > IOV_MAX || (positional && offset < 0)) return plain();
  uint64_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    total += iov[i].iov_len;
    if (iov[i].iov_len > SSIZE_MAX || total > SSIZE_MAX) return plain();  // the kernel's EINVAL
  }
  total = std::min(total, kMaxRw);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return plain();
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY || (flags & O_PATH)) return plain();
  const off_t here = positional ? offset : lseek(fd, 0, SEEK_CUR);
  if (here < 0) return plain();
  uint64_t align = 1;
  if (flags & O_DIRECT) {
    align = direct_alignment(fd, iov, iovcnt, static_cast<uint64_t>(here));
    if (!align) return plain();
  }
  // What the file holds from there, as its size says (O_DIRECT reads whole blocks: the last rounded up).
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t avail = size > static_cast<uint64_t>(here) ? size - static_cast<uint64_t>(here) : 0;
  const uint64_t len = std::min(total, round_up(avail, align));
  if (len < g_threshold.load(std::memory_order_relaxed)) return plain();
  // A spinning disk reads one sequential stream faster than pieces at once: split only a range wholly in
  // the page cache (a part of it read from the disk in pieces would make the head seek between them).
  if (rotational_device(st.st_dev) && resident_fraction(fd, static_cast<uint64_t>(here), len) < 1) return plain();

  // Never slower than the one call: the rate guard watches split reads against libc's, as it watches
  // staged copies against the driver's (rate_guard.hpp), and passes reads to libc while splitting
  // loses on this host.
  const bool guarded = env().test_guard;
  if (guarded && guard_decide(Guarded::FileRead, len) != Verdict::Stage) {
    const uint64_t t0 = monotonic_ns();
    const ssize_t n = plain();
    if (n > 0) guard_passed(Guarded::FileRead, static_cast<size_t>(n), monotonic_ns() - t0);
    g_guarded_calls.fetch_add(1, std::memory_order_relaxed);
    return n;
  }
  const uint64_t t0 = monotonic_ns();
  InsideCmt inside;  // the lanes' own calls, and any signal handler's, are plain
  int cancel = 0;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
  uint64_t start = static_cast<uint64_t>(here);
  if (!positional) {
    // The range is this read's at once: another reader of the open file reads after it.
    const off_t after = lseek(fd, static_cast<off_t>(len), SEEK_CUR);
    if (after < 0) {
      pthread_setcancelstate(cancel, nullptr);
      return plain();
    }
    start = static_cast<uint64_t>(after) - len;  // (moved meanwhile: the pieces read from there)
  }
  const int lanes = read_lanes();
  uint64_t piece = std::clamp<uint64_t>(round_up(len / (4 * static_cast<uint64_t>(lanes)), 64 << 10), 512 << 10,
                                        8 << 20);
  ReadJob job;
  job.fd = fd;
  job.iov = iov;
  job.iovcnt = iovcnt;
  job.start = start;
  job.len = len;
  job.piece = round_up(piece, align);
  job.align = align;
  const bool split = engine_host_lanes(std::min<int>(lanes, static_cast<int>((len + job.piece - 1) / job.piece)),
                                       &read_pieces, &job);
  if (!split) read_pieces(&job, 0);  // another host copy has the pool: this thread alone
  int err = 0;
  uint64_t done = first_short(job, len, &err);
  if (done < len && (err || job.written.load() > done) && done % align == 0) {
    // An error, or the file cut below bytes later pieces read already: the single call would have
    // returned fewer bytes and left those untouched. Read on from there in this thread, once: a
    // transient error, or a file that grew again, then returns every byte up to theirs.
    for (auto& s : job.shorts) s = {};
    read_range(job, done, len, 0);
    int again = 0;
    const uint64_t now = first_short(job, len, &again);
    if (now > done) done = now, err = again;
    if (job.written.load() > done) {
      log::debug_once(0xA08, "a large read met an error or the file's end where later pieces had read already: the "
                      "buffer past the bytes returned holds some of the file's later bytes");
    }
  }
  if (!positional && done != len) lseek(fd, static_cast<off_t>(start + done), SEEK_SET);
  pthread_setcancelstate(cancel, nullptr);
  if (guarded && split && done == len) guard_staged(Guarded::FileRead, done, monotonic_ns() - t0);
  (split ? g_split_calls : g_alone_calls).fetch_add(1, std::memory_order_relaxed);
  (split ? g_split_bytes : g_alone_bytes).fetch_add(done, std::memory_order_relaxed);
  if (done == 0 && err) {
    errno = err;
    return -1;
  }
  return static_cast<ssize_t>(done);
}

template <typename Fn>
Fn resolve(const char* name, Fn fallback) {
  void* p = real_dlsym(RTLD_NEXT, name);
  return p ? reinterpret_cast<Fn>(p) : fallback;
}

bool large(size_t n) { return __builtin_expect(n >= g_threshold.load(std::memory_order_relaxed), 0); }

bool large_v(const iovec* iov, int iovcnt) {
  const size_t t = g_threshold.load(std::memory_order_relaxed);
  if (__builtin_expect(t == SIZE_MAX || iovcnt <= 0, 1)) return false;
  size_t total = 0;
  for (int i = 0; i < iovcnt && i < IOV_MAX; ++i) total += iov[i].iov_len;
  return total >= t;
}

}  // namespace

void large_read_init() {
  g_read = resolve<ReadFn>("read", sys_read);
  g_pread = resolve<PreadFn>("pread", sys_pread);
  g_pread64 = resolve<PreadFn>("pread64", sys_pread);
  g_readv = resolve<ReadvFn>("readv", sys_readv);
  g_preadv = resolve<PreadvFn>("preadv", sys_preadv);
  g_preadv64 = resolve<PreadvFn>("preadv64", sys_preadv);
  g_read_chk = resolve<ReadChkFn>("__read_chk", early_read_chk);
  g_pread_chk = resolve<PreadChkFn>("__pread_chk", early_pread_chk);
  g_pread64_chk = resolve<PreadChkFn>("__pread64_chk", early_pread_chk);
  const long t = env().read_threshold;
  g_threshold.store(t > 0 ? static_cast<size_t>(t) : SIZE_MAX, std::memory_order_relaxed);
}

ReadCounters read_counters() {
  return {g_split_calls.load(), g_split_bytes.load(), g_alone_calls.load(), g_alone_bytes.load(), g_guarded_calls.load()};
}

}  // namespace cmt

using cmt::large;

namespace cmt {
namespace {
// A large read split over the lanes; the exported read/pread/pread64 and their _chk forms call these
// (never each other: with _FORTIFY_SOURCE, the headers make read & co. always-inline wrappers, and a
// call to our own definition then fails to build with some glibc versions).
ssize_t read_large(int fd, void* buf, size_t n) {
  const iovec v{buf, n};
  return split_read(fd, &v, 1, false, 0, [&] { return g_read(fd, buf, n); });
}
ssize_t pread_large(int fd, void* buf, size_t n, off_t off) {
  const iovec v{buf, n};
  return split_read(fd, &v, 1, true, off, [&] { return g_pread(fd, buf, n, off); });
}
ssize_t pread64_large(int fd, void* buf, size_t n, off_t off) {
  const iovec v{buf, n};
  return split_read(fd, &v, 1, true, off, [&] { return g_pread64(fd, buf, n, off); });
}
}  // namespace
}  // namespace cmt

// The program's (and its libraries') reads. Below the threshold: one compare, then libc's own.
API_EXPORT ssize_t read(int fd, void* buf, size_t n) {
  return large(n) ? cmt::read_large(fd, buf, n) : cmt::g_read(fd, buf, n);
}

API_EXPORT ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  return large(n) ? cmt::pread_large(fd, buf, n, off) : cmt::g_pread(fd, buf, n, off);
}

API_EXPORT ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
  return large(n) ? cmt::pread64_large(fd, buf, n, off) : cmt::g_pread64(fd, buf, n, off);
}

API_EXPORT ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  if (!cmt::large_v(iov, iovcnt)) return cmt::g_readv(fd, iov, iovcnt);
  return cmt::split_read(fd, iov, iovcnt, false, 0, [&] { return cmt::g_readv(fd, iov, iovcnt); });
}

API_EXPORT ssize_t preadv(int fd, const iovec* iov, int iovcnt, off_t off) {
  if (!cmt::large_v(iov, iovcnt)) return cmt::g_preadv(fd, iov, iovcnt, off);
  return cmt::split_read(fd, iov, iovcnt, true, off, [&] { return cmt::g_preadv(fd, iov, iovcnt, off); });
}

API_EXPORT ssize_t preadv64(int fd, const iovec* iov, int iovcnt, off_t off) {
  if (!cmt::large_v(iov, iovcnt)) return cmt::g_preadv64(fd, iov, iovcnt, off);
  return cmt::split_read(fd, iov, iovcnt, true, off, [&] { return cmt::g_preadv64(fd, iov, iovcnt, off); });
}

// The _FORTIFY_SOURCE forms: libc's own checks the buffer's room, as without cmt.
API_EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t room) {
  if (!large(n) || n > room) return cmt::g_read_chk(fd, buf, n, room);
  return cmt::read_large(fd, buf, n);
}

API_EXPORT ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t room) {
  if (!large(n) || n > room) return cmt::g_pread_chk(fd, buf, n, off, room);
  return cmt::pread_large(fd, buf, n, off);
}

API_EXPORT ssize_t __pread64_chk(int fd, void* buf, size_t n, off_t off, size_t room) {
  if (!large(n) || n > room) return cmt::g_pread64_chk(fd, buf, n, off, room);
  return cmt::pread64_large(fd, buf, n, off);
}
