// Cold sequential reads of one file, by mode: which way should cmt.io read ranges that are not in the
// page cache? Buffered pread or O_DIRECT pread from 1-16 threads, buffered with readahead hints, and
// io_uring (O_DIRECT, one thread) by queue depth, each at a few I/O sizes. CPU only (no CUDA), no
// dependencies beyond libc and the kernel headers (io_uring through its raw system calls).
//
//   g++ -O2 -std=c++17 -pthread -o /tmp/cold_read_modes research/cold_read_modes.cpp
//   /tmp/cold_read_modes FILE [--make SIZE] [--seconds-max N] [--json OUT] [--quick] [--repeats N]
//                             [--run-seconds-max N]
//
// Before every run the file is evicted from the page cache (posix_fadvise DONTNEED) and how much of it
// is still resident is measured (cachestat, else mmap + mincore), and again after the run. Every
// configuration runs --repeats times (default 2), interleaved with the other configurations of its
// group; the groups run most decision-relevant first, and no run starts after --seconds-max (default
// 240; a run in progress stops issuing I/O after --run-seconds-max, default 30, and is marked partial).
// GB/s are 1e9 bytes per second. stdout: the table at the end; stderr: one line per run as it goes.
// --json OUT is rewritten after every run (machine, file, probes, results).
// --make SIZE (e.g. 4G) first writes FILE with SIZE pseudo-random bytes unless it already has that size.
// --quick: a few small configurations (the CI test). Exit status: 0 done, 1 setup failed (file, args:
// 2), 3 no run succeeded.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#define HAVE_URING_HEADER 1
#else
#define HAVE_URING_HEADER 0
#endif
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425  // the same number on every architecture since Linux 5.1
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr size_t kAlign = 4096;  // O_DIRECT buffers, offsets and lengths; the I/O sizes are multiples of it

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string errno_text(const char* what, int e) { return fmt("%s: errno %d (%s)", what, e, strerror(e)); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

double cpu_seconds() {  // user + system time of every thread of this process
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

double load1() {  // the 1-minute load average (-1 where there is no /proc/loadavg)
  const std::string s = read_text("/proc/loadavg");
  return s.empty() ? -1 : atof(s.c_str());
}

bool parse_size(const char* s, uint64_t* out) {
  char* end = nullptr;
  const double v = strtod(s, &end);
  if (end == s || v < 0) return false;
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(toupper(c));
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KIB" || unit == "KB") mul = 1024.0;
  else if (unit == "M" || unit == "MIB" || unit == "MB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GIB" || unit == "GB") mul = 1024.0 * 1024 * 1024;
  else return false;
  *out = static_cast<uint64_t>(v * mul);
  return true;
}

// -- the page cache ---------------------------------------------------------------------------------
// cachestat(2), Linux 6.5 (451 on x86-64 and arm64); glibc has no wrapper.
constexpr long kSysCachestat = 451;
struct CachestatRange {
  uint64_t off, len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
bool g_no_cachestat = false;

// The share of the file's pages in the page cache, 0..1 (-1: could not tell); *method says how.
double resident_fraction(int fd, uint64_t size, std::string* method) {
  const long page = sysconf(_SC_PAGESIZE);
  const uint64_t pages = (size + page - 1) / page;
  if (pages == 0) return 0;
  if (!g_no_cachestat) {
    CachestatRange range{0, pages * page};
    Cachestat cs{};
    if (syscall(kSysCachestat, fd, &range, &cs, 0) == 0) {
      *method = "cachestat";
      return std::min(1.0, static_cast<double>(cs.nr_cache) / static_cast<double>(pages));
    }
    g_no_cachestat = true;  // ENOSYS (before 6.5, gVisor) or refused: mincore from now on
  }
  *method = "mincore";
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);  // maps, faults nothing in
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> vec(pages);
  const int r = mincore(map, size, vec.data());
  munmap(map, size);
  if (r != 0) return -1;
  uint64_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(pages);
}

void evict(int fd) { posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

// -- the matrix -------------------------------------------------------------------------------------
enum class Mode { Buffered, BufferedSeq, BufferedReadahead, Direct, Uring };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Buffered: return "buffered";
    case Mode::BufferedSeq: return "buffered+fadv_seq";
    case Mode::BufferedReadahead: return "buffered+readahead";
    case Mode::Direct: return "o_direct";
    case Mode::Uring: return "io_uring_o_direct";
  }
  return "?";
}

struct Config {
  Mode mode;
  int threads;  // io_uring: 1
  uint64_t io;
  int qd;     // io_uring's queue depth, else 0
  int group;  // the runs of a group's configurations are interleaved; groups run in order
  std::string name;
};

struct Run {
  double gbps = 0, seconds = 0, cpu_s = 0, load_before = -1, load_after = -1;
  double resident_before = -1, resident_after = -1;
  uint64_t bytes = 0;
  bool partial = false;
};

struct Result {
  Config cfg;
  std::string status = "not run";  // ok, skipped, error, not run
  std::string reason;
  std::vector<Run> runs;
};

Config make_config(Mode mode, int threads, uint64_t io_mib, int qd, int group) {
  Config c{mode, threads, io_mib * kMiB, qd, group, ""};
  const char* short_mode = mode == Mode::Buffered            ? "buffered"
                           : mode == Mode::BufferedSeq       ? "buffered+seq"
                           : mode == Mode::BufferedReadahead ? "buffered+readahead"
                           : mode == Mode::Direct            ? "O_DIRECT"
                                                             : "io_uring O_DIRECT";
  c.name = qd ? fmt("%s qd%d %" PRIu64 "M", short_mode, qd, io_mib)
              : fmt("%s t%d %" PRIu64 "M", short_mode, threads, io_mib);
  return c;
}

std::vector<Config> full_matrix() {
  using M = Mode;
  std::vector<Config> m;
  // 1: what decides O_DIRECT against buffered, and io_uring against threads
  m.push_back(make_config(M::Buffered, 16, 16, 0, 1));
  m.push_back(make_config(M::Direct, 16, 8, 0, 1));
  m.push_back(make_config(M::Direct, 4, 8, 0, 1));
  m.push_back(make_config(M::Uring, 1, 8, 32, 1));
  // 2: the I/O size at 16 threads, the readahead hints, a deep queue
  m.push_back(make_config(M::Buffered, 16, 2, 0, 2));
  m.push_back(make_config(M::Direct, 16, 16, 0, 2));
  m.push_back(make_config(M::Direct, 16, 1, 0, 2));
  m.push_back(make_config(M::BufferedSeq, 16, 16, 0, 2));
  m.push_back(make_config(M::BufferedReadahead, 16, 16, 0, 2));
  m.push_back(make_config(M::Uring, 1, 8, 128, 2));
  // 3: fewer threads
  m.push_back(make_config(M::Buffered, 8, 16, 0, 3));
  m.push_back(make_config(M::Direct, 8, 8, 0, 3));
  m.push_back(make_config(M::Buffered, 4, 16, 0, 3));
  m.push_back(make_config(M::Direct, 4, 16, 0, 3));
  m.push_back(make_config(M::Direct, 4, 1, 0, 3));
  m.push_back(make_config(M::Uring, 1, 8, 8, 3));
  // 4: the rest at 4-8 threads, io_uring at 1 MiB
  m.push_back(make_config(M::Buffered, 8, 2, 0, 4));
  m.push_back(make_config(M::Direct, 8, 16, 0, 4));
  m.push_back(make_config(M::Direct, 8, 1, 0, 4));
  m.push_back(make_config(M::Buffered, 4, 2, 0, 4));
  m.push_back(make_config(M::Uring, 1, 1, 32, 4));
  m.push_back(make_config(M::Uring, 1, 1, 128, 4));
  // 5: one thread (the slowest runs)
  m.push_back(make_config(M::Uring, 1, 1, 8, 5));
  m.push_back(make_config(M::Buffered, 1, 16, 0, 5));
  m.push_back(make_config(M::Buffered, 1, 2, 0, 5));
  m.push_back(make_config(M::Direct, 1, 8, 0, 5));
  m.push_back(make_config(M::Direct, 1, 16, 0, 5));
  m.push_back(make_config(M::Direct, 1, 1, 0, 5));
  return m;
}

std::vector<Config> quick_matrix() {
  using M = Mode;
  return {make_config(M::Buffered, 2, 2, 0, 1), make_config(M::Direct, 2, 1, 0, 1),
          make_config(M::Uring, 1, 1, 8, 1), make_config(M::BufferedSeq, 2, 2, 0, 1),
          make_config(M::BufferedReadahead, 2, 2, 0, 1)};
}

// -- io_uring through its system calls ----------------------------------------------------------------
#if HAVE_URING_HEADER
struct Ring {
  int fd = -1;
  void* sq_ptr = MAP_FAILED;
  void* cq_ptr = MAP_FAILED;
  size_t sq_len = 0, cq_len = 0, sqes_len = 0;
  io_uring_sqe* sqes = static_cast<io_uring_sqe*>(MAP_FAILED);
  unsigned *sq_head = nullptr, *sq_tail = nullptr, *sq_mask = nullptr, *sq_array = nullptr;
  unsigned *cq_head = nullptr, *cq_tail = nullptr, *cq_mask = nullptr;
  io_uring_cqe* cqes = nullptr;
  unsigned features = 0;

  // 0, or the errno of what failed (*what names it).
  int setup(unsigned entries, const char** what) {
    io_uring_params p{};
    fd = static_cast<int>(syscall(__NR_io_uring_setup, entries, &p));
    if (fd < 0) {
      *what = "io_uring_setup";
      return errno;
    }
    features = p.features;
    sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_len = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    bool single = false;
#ifdef IORING_FEAT_SINGLE_MMAP
    single = p.features & IORING_FEAT_SINGLE_MMAP;
#endif
    if (single) sq_len = cq_len = std::max(sq_len, cq_len);
    sq_ptr = mmap(nullptr, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (sq_ptr == MAP_FAILED) {
      *what = "mmap of the submission ring";
      return errno;
    }
    cq_ptr = single ? sq_ptr
                    : mmap(nullptr, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
    if (cq_ptr == MAP_FAILED) {
      *what = "mmap of the completion ring";
      return errno;
    }
    sqes_len = p.sq_entries * sizeof(io_uring_sqe);
    void* s = mmap(nullptr, sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (s == MAP_FAILED) {
      *what = "mmap of the submission entries";
      return errno;
    }
    sqes = static_cast<io_uring_sqe*>(s);
    char* sq = static_cast<char*>(sq_ptr);
    char* cq = static_cast<char*>(cq_ptr);
    sq_head = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    sq_tail = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    sq_mask = reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    sq_array = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    cq_head = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    cq_tail = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    cq_mask = reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    cqes = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    return 0;
  }

  ~Ring() {
    if (sqes != MAP_FAILED) munmap(sqes, sqes_len);
    if (cq_ptr != MAP_FAILED && cq_ptr != sq_ptr) munmap(cq_ptr, cq_len);
    if (sq_ptr != MAP_FAILED) munmap(sq_ptr, sq_len);
    if (fd >= 0) close(fd);
  }

  // Queues one readv (IORING_OP_READV: in every kernel with io_uring, and in gVisor's).
  void queue_readv(int file, const iovec* iov, uint64_t off, uint64_t user) {
    const unsigned tail = *sq_tail;
    const unsigned idx = tail & *sq_mask;
    io_uring_sqe* e = &sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READV;
    e->fd = file;
    e->addr = reinterpret_cast<uint64_t>(iov);
    e->len = 1;
    e->off = off;
    e->user_data = user;
    sq_array[idx] = idx;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
  }

  // Submits `to_submit` and waits for at least `wait` completions: how many were submitted, or -errno.
  int enter(unsigned to_submit, unsigned wait) {
    for (;;) {
      const long r = syscall(__NR_io_uring_enter, fd, to_submit, wait, wait ? IORING_ENTER_GETEVENTS : 0, nullptr, 0);
      if (r >= 0) return static_cast<int>(r);
      if (errno != EINTR) return -errno;
    }
  }

  template <class F>
  void reap(F&& on_cqe) {
    unsigned head = *cq_head;
    const unsigned tail = __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE);
    while (head != tail) {
      const io_uring_cqe& c = cqes[head & *cq_mask];
      on_cqe(c.user_data, c.res);
      ++head;
    }
    __atomic_store_n(cq_head, head, __ATOMIC_RELEASE);
  }
};
#endif

// -- the file -----------------------------------------------------------------------------------------
struct FileInfo {
  std::string path;
  uint64_t size = 0;
  std::string fs_type;
  uint64_t fs_magic = 0;
  bool memory_fs = false;  // tmpfs/ramfs: nothing to read cold, O_DIRECT (where accepted) is no disk read
  std::string block_device;  // major:minor
  std::string queue;         // the block queue's settings, as "key=value ..."
};

std::string fs_name(uint64_t magic, bool* memory) {
  *memory = false;
  switch (magic) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x794c7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x01021997: return "9p";
    case 0x2fc12fc1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x01021994: *memory = true; return "tmpfs";
    case 0x858458f6: *memory = true; return "ramfs";
    default: return fmt("0x%" PRIx64, magic);
  }
}

void describe_file(int fd, FileInfo* f) {
  struct statfs sf {};
  if (fstatfs(fd, &sf) == 0) {
    f->fs_magic = static_cast<uint64_t>(sf.f_type);
    f->fs_type = fs_name(f->fs_magic, &f->memory_fs);
  }
  struct stat st {};
  fstat(fd, &st);
  const unsigned ma = major(st.st_dev), mi = minor(st.st_dev);
  f->block_device = fmt("%u:%u", ma, mi);
  for (const char* dir : {"queue", "../queue"}) {  // a partition's queue is its disk's
    const std::string base = fmt("/sys/dev/block/%u:%u/%s/", ma, mi, dir);
    const std::string ra = read_text(base + "read_ahead_kb");
    if (ra.empty()) continue;
    std::string q = "read_ahead_kb=" + ra;
    for (const char* k : {"max_sectors_kb", "nr_requests", "rotational", "scheduler", "logical_block_size"}) {
      const std::string v = read_text(base + k);
      if (!v.empty()) q += fmt(" %s=%s", k, v.c_str());
    }
    f->queue = q;
    break;
  }
}

// Writes SIZE pseudo-random bytes (no holes, nothing a disk or host could compress) to PATH through
// a temporary name, from several threads, then syncs and evicts it.
bool make_file(const std::string& path, uint64_t size) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == size) {
    fprintf(stderr, "--make: %s already has %" PRIu64 " bytes, reused\n", path.c_str(), size);
    return true;
  }
  const std::string tmp = path + ".making";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    fprintf(stderr, "--make: %s\n", errno_text(("open " + tmp).c_str(), errno).c_str());
    return false;
  }
  const double t0 = now_s();
  constexpr uint64_t kBlock = 16 * kMiB;
  const uint64_t blocks = (size + kBlock - 1) / kBlock;
  const int writers = static_cast<int>(std::min<uint64_t>(8, std::max<uint64_t>(1, blocks)));
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < writers; ++w) {
    ts.emplace_back([&, w] {
      std::vector<uint64_t> buf(kBlock / 8);
      for (uint64_t b = w; b < blocks && !failed.load(); b += writers) {
        uint64_t x = 0x9E3779B97F4A7C15ull * (b + 1);
        for (uint64_t& v : buf) {  // xorshift64
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          v = x;
        }
        const uint64_t off = b * kBlock;
        const uint64_t len = std::min(kBlock, size - off);
        uint64_t done = 0;
        while (done < len) {
          const ssize_t n = pwrite(fd, reinterpret_cast<char*>(buf.data()) + done, len - done, off + done);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            failed = n < 0 ? errno : EIO;
            break;
          }
          done += n;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  if (failed.load() == 0 && fdatasync(fd) != 0) failed = errno;
  evict(fd);
  close(fd);
  if (failed.load() != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = failed.load() ? failed.load() : errno;
    fprintf(stderr, "--make: %s\n", errno_text(("writing " + tmp).c_str(), e).c_str());
    unlink(tmp.c_str());
    return false;
  }
  const double s = now_s() - t0;
  fprintf(stderr, "--make: wrote %s, %" PRIu64 " bytes in %.1f s (%.2f GB/s, synced)\n", path.c_str(), size, s,
          size / s / 1e9);
  return true;
}

// -- the runs -----------------------------------------------------------------------------------------
struct Outcome {
  uint64_t bytes = 0;
  int err = 0;  // errno of the first failed read
  bool partial = false;
};

// Thread t of T reads blocks t, t+T, t+2T, ... of the file into its own buffer.
void thread_reader(int fd, Mode mode, char* buf, uint64_t io, uint64_t size, int t, int T, double deadline,
                   Outcome* out) {
  const uint64_t blocks = (size + io - 1) / io;
  const bool direct = mode == Mode::Direct;
  for (uint64_t k = t; k < blocks; k += T) {
    if (now_s() > deadline) {
      out->partial = true;
      return;
    }
    const uint64_t off = k * io;
    const uint64_t len = std::min(io, size - off);
    if (mode == Mode::BufferedReadahead && k + T < blocks) {
      const uint64_t next = (k + T) * io;  // the thread's next block, started while this one is read
      readahead(fd, static_cast<off64_t>(next), static_cast<size_t>(std::min(io, size - next)));
    }
    // O_DIRECT asks for whole aligned blocks; at the end of the file the read comes back short.
    const uint64_t want = direct ? (len + kAlign - 1) / kAlign * kAlign : len;
    uint64_t got = 0;
    while (got < len) {
      const ssize_t n = pread(fd, buf + got, want - got, static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        out->err = errno;
        return;
      }
      if (n == 0) break;  // the file was cut meanwhile
      got += n;
    }
    out->bytes += std::min(got, len);
  }
}

#if HAVE_URING_HEADER
// One thread, `qd` readv's in flight, each into its own slot of the arena.
Outcome uring_reader(int fd, char* arena, uint64_t io, uint64_t size, int qd, double deadline, std::string* err) {
  Outcome out;
  Ring ring;
  const char* what = "";
  if (const int e = ring.setup(static_cast<unsigned>(qd), &what)) {
    *err = errno_text(what, e);
    out.err = e;
    return out;
  }
  const uint64_t blocks = (size + io - 1) / io;
  const int slots = static_cast<int>(std::min<uint64_t>(qd, blocks));
  struct Slot {
    iovec iov;
    uint64_t off, len, got;
  };
  std::vector<Slot> slot(slots);
  std::vector<int> free_slots;
  for (int s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  uint64_t next = 0;
  int inflight = 0;
  unsigned unsubmitted = 0;
  auto issue = [&](int s) {  // the rest of slot s's block (all of it, or what a short read left)
    Slot& sl = slot[s];
    const uint64_t want = (sl.len - sl.got + kAlign - 1) / kAlign * kAlign;
    sl.iov.iov_base = arena + static_cast<uint64_t>(s) * io + sl.got;
    sl.iov.iov_len = want;
    ring.queue_readv(fd, &sl.iov, sl.off + sl.got, static_cast<uint64_t>(s));
    ++inflight;
    ++unsubmitted;
  };
  while (true) {
    bool late = now_s() > deadline;
    if (late) out.partial = next < blocks;
    while (!late && !out.err && !free_slots.empty() && next < blocks) {
      const int s = free_slots.back();
      free_slots.pop_back();
      slot[s].off = next * io;
      slot[s].len = std::min(io, size - slot[s].off);
      slot[s].got = 0;
      ++next;
      issue(s);
    }
    if (inflight == 0) break;
    const int r = ring.enter(unsubmitted, 1);
    if (r < 0) {
      *err = errno_text("io_uring_enter", -r);
      out.err = -r;
      break;  // the ring's teardown waits for what is in flight
    }
    unsubmitted -= static_cast<unsigned>(r);
    ring.reap([&](uint64_t user, int res) {
      const int s = static_cast<int>(user);
      --inflight;
      Slot& sl = slot[s];
      if (res < 0) {
        if (!out.err) {
          out.err = -res;
          *err = errno_text("io_uring readv", -res);
        }
        return;
      }
      sl.got += static_cast<uint64_t>(res);
      if (res > 0 && sl.got < sl.len && !out.err) {
        issue(s);  // a short read inside the file: read on
        return;
      }
      out.bytes += std::min(sl.got, sl.len);
      free_slots.push_back(s);
    });
  }
  return out;
}
#endif

struct Probes {
  std::string residency_method = "unknown";
  bool direct_ok = false;
  std::string direct_reason;
  bool uring_ok = false;
  std::string uring_status;  // "available (features 0x...)" or "unavailable (...)"
  int uring_errno = 0;
};

void probe(const FileInfo& f, Probes* p) {
  // O_DIRECT: where the file system lives in memory there is nothing to read cold (and since Linux
  // 6.6 tmpfs accepts O_DIRECT without it meaning anything), else open and read one aligned block.
  char* block = static_cast<char*>(aligned_alloc(kAlign, kAlign));
  int dfd = -1;
  if (f.memory_fs) {
    p->direct_reason = f.fs_type + " keeps files in memory, there is no disk to read";
  } else if ((dfd = open(f.path.c_str(), O_RDONLY | O_DIRECT)) < 0) {
    p->direct_reason = errno_text("open", errno);
  } else if (pread(dfd, block, kAlign, 0) < 0) {
    p->direct_reason = errno_text("pread", errno);
  } else {
    p->direct_ok = true;
  }
#if HAVE_URING_HEADER
  Ring ring;
  const char* what = "";
  // COLD_READ_URING_ENTRIES (default 8) sizes this probe's ring; the CI test sets 0, which
  // io_uring_setup refuses, to see the "unavailable" path on any kernel.
  const char* entries_env = getenv("COLD_READ_URING_ENTRIES");
  const unsigned entries = entries_env ? static_cast<unsigned>(atoi(entries_env)) : 8u;
  if (const int e = ring.setup(entries, &what)) {
    p->uring_errno = e;
    p->uring_status = "unavailable (" + errno_text(what, e) + ")";
  } else {
    // One readv of the file, to see that the operation works (gVisor has a partial io_uring).
    const int rfd = dfd >= 0 && p->direct_ok ? dfd : open(f.path.c_str(), O_RDONLY);
    iovec iov{block, kAlign};
    ring.queue_readv(rfd, &iov, 0, 7);
    int res = 0;
    const int r = ring.enter(1, 1);
    if (r < 0) {
      res = r;
    } else {
      ring.reap([&](uint64_t, int v) { res = v; });
    }
    if (res < 0) {
      p->uring_errno = -res;
      p->uring_status = "unavailable (" + errno_text(r < 0 ? "io_uring_enter" : "io_uring readv", -res) + ")";
    } else {
      p->uring_ok = true;
      p->uring_status = fmt("available (features 0x%x)", ring.features);
    }
    if (rfd != dfd) close(rfd);
  }
#else
  p->uring_errno = ENOSYS;
  p->uring_status = "unavailable (built without <linux/io_uring.h>)";
#endif
  if (dfd >= 0) close(dfd);
  free(block);
}

// One cold run of `c` over the whole file.
Run run_once(const Config& c, const FileInfo& f, int evict_fd, char* arena, double run_seconds_max,
             std::string* err, int* err_no, Probes* probes) {
  Run r;
  evict(evict_fd);
  r.resident_before = resident_fraction(evict_fd, f.size, &probes->residency_method);
  const bool direct = c.mode == Mode::Direct || c.mode == Mode::Uring;
  const int fd = open(f.path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  if (fd < 0) {
    *err_no = errno;
    *err = errno_text(direct ? "open O_DIRECT" : "open", errno);
    return r;
  }
  if (c.mode == Mode::BufferedSeq) posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  r.load_before = load1();
  const double cpu0 = cpu_seconds();
  std::vector<Outcome> outs(static_cast<size_t>(c.threads));
  double t0 = 0, t1 = 0;
  if (c.mode == Mode::Uring) {
#if HAVE_URING_HEADER
    t0 = now_s();
    outs[0] = uring_reader(fd, arena, c.io, f.size, c.qd, t0 + run_seconds_max, err);
    t1 = now_s();
#endif
  } else {
    // The threads start together; the time runs from their release to the last one's end.
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::atomic<double> deadline{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < c.threads; ++t) {
      ts.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        thread_reader(fd, c.mode, arena + static_cast<uint64_t>(t) * c.io, c.io, f.size, t, c.threads,
                      deadline.load(), &outs[t]);
      });
    }
    while (ready.load() < c.threads) std::this_thread::yield();
    t0 = now_s();
    deadline = t0 + run_seconds_max;
    go.store(true, std::memory_order_release);
    for (auto& t : ts) t.join();
    t1 = now_s();
  }
  r.cpu_s = cpu_seconds() - cpu0;
  r.load_after = load1();
  close(fd);
  r.seconds = t1 - t0;
  for (const Outcome& o : outs) {
    r.bytes += o.bytes;
    r.partial = r.partial || o.partial;
    if (o.err && !*err_no) {
      *err_no = o.err;
      if (err->empty()) *err = errno_text(direct ? "pread O_DIRECT" : "pread", o.err);
    }
  }
  if (!r.partial && !*err_no && r.bytes < f.size) {
    *err_no = EIO;
    *err = fmt("read %" PRIu64 " of %" PRIu64 " bytes (the file shrank?)", r.bytes, f.size);
  }
  r.gbps = r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0;
  r.resident_after = resident_fraction(evict_fd, f.size, &probes->residency_method);
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<double> rates(const Result& r) {
  std::vector<double> v;
  for (const Run& x : r.runs) v.push_back(x.gbps);
  return v;
}

// -- output -------------------------------------------------------------------------------------------
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      o += fmt("\\u%04x", c);
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string jnum(double v) {
  if (!(v == v) || v > 1e300 || v < -1e300) return "null";
  return fmt("%.6g", v);
}

struct Machine {
  std::string uname, date, cpu_model, mem_total;
  long nproc_online = 0;
  int nproc_affinity = 0;
  double load_start = -1;
  std::string loadavg_start;
};

Machine machine_info() {
  Machine m;
  utsname u{};
  if (uname(&u) == 0) m.uname = fmt("%s %s %s %s %s", u.sysname, u.nodename, u.release, u.version, u.machine);
  m.nproc_online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) m.nproc_affinity = CPU_COUNT(&set);
  const time_t t = time(nullptr);
  tm g{};
  gmtime_r(&t, &g);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &g);
  m.date = buf;
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream mem("/proc/meminfo");
  for (std::string line; std::getline(mem, line);) {
    if (line.rfind("MemTotal:", 0) == 0) {
      m.mem_total = line.substr(9);
      m.mem_total.erase(0, m.mem_total.find_first_not_of(' '));
      break;
    }
  }
  m.loadavg_start = read_text("/proc/loadavg");
  return m;
}

struct Report {
  Machine machine;
  FileInfo file;
  Probes probes;
  std::vector<Result> results;
  double seconds_max = 0, run_seconds_max = 0, elapsed = 0;
  int repeats = 0;
  bool quick = false, budget_hit = false, finished = false;
  std::string loadavg_end;
};

std::string to_json(const Report& R) {
  std::string j = "{\n";
  j += "  \"program\": \"research/cold_read_modes.cpp\",\n";
  j += "  \"machine\": {\"uname\": " + jstr(R.machine.uname) + ", \"nproc\": " +
       std::to_string(R.machine.nproc_affinity) + ", \"nproc_online\": " + std::to_string(R.machine.nproc_online) +
       ", \"date\": " + jstr(R.machine.date) + ", \"cpu_model\": " + jstr(R.machine.cpu_model) +
       ", \"mem_total\": " + jstr(R.machine.mem_total) + ", \"loadavg_start\": " + jstr(R.machine.loadavg_start) +
       ", \"loadavg_end\": " + jstr(R.loadavg_end) + "},\n";
  j += "  \"file\": {\"path\": " + jstr(R.file.path) + ", \"size\": " + std::to_string(R.file.size) +
       ", \"fs_type\": " + jstr(R.file.fs_type) + ", \"block_device\": " + jstr(R.file.block_device) +
       ", \"queue\": " + jstr(R.file.queue) + "},\n";
  j += "  \"residency_method\": " + jstr(R.probes.residency_method) + ",\n";
  j += "  \"o_direct\": {\"available\": " + std::string(R.probes.direct_ok ? "true" : "false") +
       ", \"reason\": " + jstr(R.probes.direct_reason) + "},\n";
  j += "  \"io_uring\": {\"available\": " + std::string(R.probes.uring_ok ? "true" : "false") +
       ", \"status\": " + jstr(R.probes.uring_status) + ", \"errno\": " + std::to_string(R.probes.uring_errno) +
       "},\n";
  j += "  \"settings\": {\"seconds_max\": " + jnum(R.seconds_max) + ", \"run_seconds_max\": " +
       jnum(R.run_seconds_max) + ", \"repeats\": " + std::to_string(R.repeats) +
       ", \"quick\": " + (R.quick ? "true" : "false") + ", \"gb\": 1e9},\n";
  j += "  \"elapsed_s\": " + jnum(R.elapsed) + ",\n";
  j += "  \"finished\": " + std::string(R.finished ? "true" : "false") + ",\n";
  j += "  \"budget_hit\": " + std::string(R.budget_hit ? "true" : "false") + ",\n";
  j += "  \"results\": [";
  for (size_t i = 0; i < R.results.size(); ++i) {
    const Result& r = R.results[i];
    const Config& c = r.cfg;
    j += i ? ",\n    " : "\n    ";
    j += "{\"name\": " + jstr(c.name) + ", \"mode\": " + jstr(mode_name(c.mode)) +
         ", \"o_direct\": " + (c.mode == Mode::Direct || c.mode == Mode::Uring ? "true" : "false") +
         ", \"threads\": " + std::to_string(c.threads) + ", \"io_bytes\": " + std::to_string(c.io) +
         ", \"queue_depth\": " + std::to_string(c.qd) + ", \"group\": " + std::to_string(c.group) +
         ", \"status\": " + jstr(r.status) + ", \"reason\": " + jstr(r.reason) +
         ", \"median_gbps\": " + (r.runs.empty() ? std::string("null") : jnum(median(rates(r)))) +
         ", \"gbps\": [";
    for (size_t k = 0; k < r.runs.size(); ++k) j += (k ? ", " : "") + jnum(r.runs[k].gbps);
    j += "], \"runs\": [";
    for (size_t k = 0; k < r.runs.size(); ++k) {
      const Run& x = r.runs[k];
      j += (k ? ", " : "");
      j += "{\"gbps\": " + jnum(x.gbps) + ", \"seconds\": " + jnum(x.seconds) + ", \"bytes\": " +
           std::to_string(x.bytes) + ", \"partial\": " + (x.partial ? "true" : "false") +
           ", \"resident_before\": " + jnum(x.resident_before) + ", \"resident_after\": " +
           jnum(x.resident_after) + ", \"cpu_s\": " + jnum(x.cpu_s) + ", \"load_before\": " +
           jnum(x.load_before) + ", \"load_after\": " + jnum(x.load_after) + "}";
    }
    j += "]}";
  }
  j += "\n  ]\n}\n";
  return j;
}

void write_json(const Report& R, const std::string& path) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) {
    fprintf(stderr, "warning: %s\n", errno_text(("open " + tmp).c_str(), errno).c_str());
    return;
  }
  const std::string j = to_json(R);
  const bool ok = fwrite(j.data(), 1, j.size(), f) == j.size();
  if (fclose(f) != 0 || !ok || rename(tmp.c_str(), path.c_str()) != 0)
    fprintf(stderr, "warning: %s\n", errno_text(("writing " + path).c_str(), errno).c_str());
}

std::string pct(double f) { return f < 0 ? "?" : fmt("%.0f%%", f * 100); }

void print_table(const Report& R) {
  const Machine& m = R.machine;
  printf("cold_read_modes: %s, %" PRIu64 " bytes (%.2f GiB), %s on %s%s%s\n", R.file.path.c_str(), R.file.size,
         R.file.size / double(1ull << 30), R.file.fs_type.c_str(), R.file.block_device.c_str(),
         R.file.queue.empty() ? "" : " ", R.file.queue.c_str());
  printf("machine: %s; %d CPUs (%ld online), %s; %s; memory %s\n", m.uname.c_str(), m.nproc_affinity, m.nproc_online,
         m.cpu_model.c_str(), m.date.c_str(), m.mem_total.c_str());
  printf("loadavg: %s before, %s after\n", m.loadavg_start.c_str(), R.loadavg_end.c_str());
  printf("residency: %s; O_DIRECT: %s%s; io_uring: %s\n", R.probes.residency_method.c_str(),
         R.probes.direct_ok ? "ok" : "refused: ", R.probes.direct_reason.c_str(), R.probes.uring_status.c_str());
  printf("%d run(s) per configuration, interleaved; %.0f s of %.0f s budget%s\n\n", R.repeats, R.elapsed,
         R.seconds_max, R.budget_hit ? " (budget reached: later runs not started)" : "");
  printf("%-28s %8s  %-19s %-15s %8s %-11s %s\n", "configuration", "median", "runs GB/s", "resident b/a", "CPU s/GB",
         "load 1m", "status");
  bool warm_seen = false;
  for (const Result& r : R.results) {
    std::string runs, res, load;
    std::vector<double> cpu;
    bool warm = false;
    for (const Run& x : r.runs) {
      runs += fmt("%s%.2f%s", runs.empty() ? "" : " ", x.gbps, x.partial ? "*" : "");
      if (x.resident_before > 0.05) warm = true;
      if (x.bytes) cpu.push_back(x.cpu_s / (x.bytes / 1e9));
    }
    if (!r.runs.empty()) {
      double before = -1, after = -1;
      for (const Run& x : r.runs) {
        before = std::max(before, x.resident_before);
        after = std::max(after, x.resident_after);
      }
      res = pct(before) + "/" + pct(after);
      load = fmt("%.1f-%.1f", r.runs.front().load_before, r.runs.back().load_after);
    }
    std::string status = r.status;
    if (!r.reason.empty()) status += ": " + r.reason;
    if (warm) {
      status += " (NOT COLD: resident before the run)";
      warm_seen = true;
    }
    printf("%-28s %8s  %-19s %-15s %8s %-11s %s\n", r.cfg.name.c_str(),
           r.runs.empty() ? "-" : fmt("%.2f", median(rates(r))).c_str(), runs.empty() ? "-" : runs.c_str(),
           res.empty() ? "-" : res.c_str(), cpu.empty() ? "-" : fmt("%.2f", median(cpu)).c_str(),
           load.empty() ? "-" : load.c_str(), status.c_str());
  }
  printf("\nGB/s = 1e9 bytes/s over the whole file; * = stopped at --run-seconds-max (partial); resident b/a = share of\n"
         "the file in the page cache before the run (after eviction; worst run) and after it; CPU s/GB = this\n"
         "process's user+system seconds per GB read (median); load 1m = /proc/loadavg before the first run and after\n"
         "the last.\n");
  if (warm_seen)
    printf("Some runs found the file resident after eviction (tmpfs, gVisor's page cache, or pages locked):\n"
           "their figures are not cold reads.\n");
}

void usage(FILE* to) {
  fprintf(to,
          "usage: cold_read_modes FILE [--make SIZE] [--seconds-max N] [--json OUT] [--quick] [--repeats N]\n"
          "                            [--run-seconds-max N]\n"
          "  cold sequential reads of FILE by mode (buffered/O_DIRECT pread by threads and I/O size,\n"
          "  readahead hints, io_uring by queue depth); see the comment at the top of the source.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, json_out;
  double seconds_max = 240, run_seconds_max = 30;
  int repeats = 2;
  bool quick = false;
  uint64_t make_size = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", name);
        usage(stderr);
        exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const char* name, double lo) {
      const char* v = value(name);
      char* end = nullptr;
      const double d = strtod(v, &end);
      if (end == v || *end || d < lo) {
        fprintf(stderr, "%s: not a number >= %g: %s\n", name, lo, v);
        exit(2);
      }
      return d;
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--seconds-max") {
      seconds_max = number("--seconds-max", 0);
    } else if (a == "--run-seconds-max") {
      run_seconds_max = number("--run-seconds-max", 0);
    } else if (a == "--repeats") {
      repeats = static_cast<int>(number("--repeats", 1));
    } else if (a == "--json") {
      json_out = value("--json");
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--make") {
      const char* v = value("--make");
      if (!parse_size(v, &make_size) || make_size == 0) {
        fprintf(stderr, "--make: not a size (e.g. 4G, 32M): %s\n", v);
        return 2;
      }
    } else if (!a.empty() && a[0] == '-') {
      fprintf(stderr, "unknown option %s\n", a.c_str());
      usage(stderr);
      return 2;
    } else if (path.empty()) {
      path = a;
    } else {
      fprintf(stderr, "one FILE only (got %s and %s)\n", path.c_str(), a.c_str());
      return 2;
    }
  }
  if (path.empty()) {
    usage(stderr);
    return 2;
  }
  if (make_size && !make_file(path, make_size)) return 1;

  Report R;
  R.machine = machine_info();
  R.seconds_max = seconds_max;
  R.run_seconds_max = run_seconds_max;
  R.repeats = repeats;
  R.quick = quick;
  R.file.path = path;
  const int evict_fd = open(path.c_str(), O_RDONLY);
  if (evict_fd < 0) {
    fprintf(stderr, "%s\n", errno_text(("open " + path).c_str(), errno).c_str());
    return 1;
  }
  struct stat st {};
  if (fstat(evict_fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    fprintf(stderr, "%s: not a regular file with data\n", path.c_str());
    return 1;
  }
  R.file.size = static_cast<uint64_t>(st.st_size);
  describe_file(evict_fd, &R.file);
  probe(R.file, &R.probes);
  resident_fraction(evict_fd, R.file.size, &R.probes.residency_method);
  fprintf(stderr, "file %s: %" PRIu64 " bytes, %s; residency by %s; O_DIRECT: %s%s; io_uring: %s\n", path.c_str(),
          R.file.size, R.file.fs_type.c_str(), R.probes.residency_method.c_str(),
          R.probes.direct_ok ? "ok" : "refused: ", R.probes.direct_reason.c_str(), R.probes.uring_status.c_str());

  for (const Config& c : quick ? quick_matrix() : full_matrix()) {
    Result r;
    r.cfg = c;
    if ((c.mode == Mode::Direct || c.mode == Mode::Uring) && !R.probes.direct_ok) {
      r.status = "skipped";
      r.reason = "O_DIRECT refused: " + R.probes.direct_reason;
    } else if (c.mode == Mode::Uring && !R.probes.uring_ok) {
      r.status = "skipped";
      r.reason = "io_uring: " + R.probes.uring_status;
    }
    R.results.push_back(r);
  }
  // One arena, touched before any timer: thread t's buffer (or io_uring slot t) at t * io.
  uint64_t arena_bytes = kAlign;
  for (const Result& r : R.results) {
    const uint64_t blocks = (R.file.size + r.cfg.io - 1) / r.cfg.io;
    const uint64_t users = r.cfg.qd ? std::min<uint64_t>(r.cfg.qd, blocks) : std::min<uint64_t>(r.cfg.threads, blocks);
    if (r.status != "skipped") arena_bytes = std::max(arena_bytes, users * r.cfg.io);
  }
  void* arena_map = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (arena_map == MAP_FAILED) {
    fprintf(stderr, "%s\n", errno_text("mmap of the buffers", errno).c_str());
    return 1;
  }
  char* arena = static_cast<char*>(arena_map);
  memset(arena, 1, arena_bytes);

  const double start = now_s();
  int ok_runs = 0;
  int max_group = 0;
  for (const Result& r : R.results) max_group = std::max(max_group, r.cfg.group);
  for (int g = 1; g <= max_group && !R.budget_hit; ++g) {
    for (int rep = 0; rep < repeats && !R.budget_hit; ++rep) {
      for (Result& r : R.results) {
        if (r.cfg.group != g || r.status == "skipped" || r.status == "error") continue;
        if (now_s() - start >= seconds_max) {
          R.budget_hit = true;
          break;
        }
        std::string err;
        int err_no = 0;
        Run x = run_once(r.cfg, R.file, evict_fd, arena, run_seconds_max, &err, &err_no, &R.probes);
        const bool direct = r.cfg.mode == Mode::Direct || r.cfg.mode == Mode::Uring;
        if (err_no) {
          // A file system that refuses O_DIRECT only at the read says EINVAL on the first one.
          r.status = direct && err_no == EINVAL && r.runs.empty() && x.bytes == 0 ? "skipped" : "error";
          r.reason = (r.status == "skipped" ? "O_DIRECT refused: " : "") + err;
          fprintf(stderr, "[%6.1f s] %-28s run %d/%d: %s: %s\n", now_s() - start, r.cfg.name.c_str(), rep + 1, repeats,
                  r.status.c_str(), r.reason.c_str());
        } else {
          r.status = "ok";
          r.runs.push_back(x);
          ++ok_runs;
          fprintf(stderr,
                  "[%6.1f s] %-28s run %d/%d: %6.2f GB/s in %.2f s%s (resident %s -> %s, cpu %.2f s, load %.2f -> "
                  "%.2f)\n",
                  now_s() - start, r.cfg.name.c_str(), rep + 1, repeats, x.gbps, x.seconds, x.partial ? " PARTIAL" : "",
                  pct(x.resident_before).c_str(), pct(x.resident_after).c_str(), x.cpu_s, x.load_before, x.load_after);
        }
        R.elapsed = now_s() - start;
        R.loadavg_end = read_text("/proc/loadavg");
        write_json(R, json_out);
      }
    }
  }
  for (Result& r : R.results) {
    if (r.status == "not run" && R.budget_hit) r.reason = "--seconds-max reached before it started";
    if (r.status == "ok" && static_cast<int>(r.runs.size()) < repeats && R.budget_hit)
      r.reason = fmt("%zu of %d runs before --seconds-max", r.runs.size(), repeats);
  }
  R.elapsed = now_s() - start;
  R.loadavg_end = read_text("/proc/loadavg");
  R.finished = true;
  write_json(R, json_out);
  munmap(arena_map, arena_bytes);
  close(evict_fd);
  print_table(R);
  if (!json_out.empty()) printf("JSON: %s\n", json_out.c_str());
  bool attempted = false;
  for (const Result& r : R.results) attempted = attempted || r.status == "ok" || r.status == "error";
  return attempted && ok_runs == 0 ? 3 : 0;
}
