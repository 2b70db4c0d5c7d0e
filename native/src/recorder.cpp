// The profiler's recorder (`cmt profile`): on when CMT_PROFILE_DIR is set.
//
// Hot path: each recording thread appends CopyRecords to its own Block (no lock, no syscall);
// a full block is handed to a lock-free retired list and a fresh one is allocated. A flusher
// thread, started at the first recorded copy, writes every ~50 ms what was appended since (of
// retired blocks and of each thread's current block) so a killed program loses little, and
// frees retired blocks. Exit, thread exit, fork and SIGTERM/SIGINT/SIGHUP are handled below.
//
// On-disk format, version 1: one file per process, <CMT_PROFILE_DIR>/cmt-<pid>.rec (a numeric
// suffix, cmt-<pid>.<n>.rec, if that name exists). Little-endian.
//   offset  size  field
//        0     8  magic "CMTPROF\0"
//        8     4  format version (kFormatVersion)
//       12     4  header_bytes: offset of the first record (8-aligned)
//       16     4  record_bytes: 48 (sizeof CopyRecord, recorder.hpp)
//       20     4  pid
//       24     4  ppid
//       28     4  flags: bit 0 = forked from a recording process (same program image)
//       32     8  CLOCK_MONOTONIC ns when the file was created (records use the same clock)
//       40     8  CLOCK_REALTIME ns at the same moment (wall-clock anchor)
//       48     4  meta_bytes: length of the meta text at offset 64
//       52     4  cmdline_bytes: length of /proc/self/cmdline (NUL-separated argv) after the meta
//       56     8  reserved (0)
//       64        meta text: "key=value\n" lines: cmt_version, clock, directions, host_kinds,
//                 outcomes, entries (comma-separated names; a record's byte fields index them),
//                 outcome_text.<outcome> (why cmt passed such copies to the driver)
//                 cmdline, then zero padding to header_bytes
//   header_bytes  CopyRecord[] until the end of the file; a trailing partial record (killed
//                 mid-write) is ignored. A record with entry == 0xFF is a marker, not a copy:
//                 `bytes` records were dropped (buffers over their memory cap).
#include "recorder.hpp"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "copy_path.hpp"
#include "driver.hpp"
#include "log.hpp"
#include "stats.hpp"

#ifndef CMT_VERSION
#define CMT_VERSION "0.0.0"
#endif

namespace cmt {
namespace {

constexpr char kMagic[8] = {'C', 'M', 'T', 'P', 'R', 'O', 'F', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint8_t kMarkerEntry = 0xFF;
constexpr uint32_t kBlockRecords = 1024;      // 48 KiB per block
constexpr long kMaxBlocks = 1400;             // ~64 MiB unflushed before records are dropped
constexpr long kFlushIntervalNs = 50000000;   // 50 ms
constexpr int kTermWaitMs = 500;              // how long a fatal signal waits for the last flush

struct FileHeader {
  char magic[8];
  uint32_t format_version, header_bytes, record_bytes, pid, ppid, flags;
  uint64_t monotonic_ns, realtime_ns;
  uint32_t meta_bytes, cmdline_bytes;
  uint64_t reserved;
};
static_assert(sizeof(FileHeader) == 64, "file header layout");

struct Block {
  std::atomic<uint32_t> count{0};  // records appended (owner thread, release)
  uint32_t flushed = 0;            // records already written (flusher only)
  Block* next = nullptr;           // link in the retired list
  CopyRecord recs[kBlockRecords];
};

// One per recording thread; reused after the thread exits (registry is push-only).
struct ThreadSlot {
  std::atomic<Block*> current{nullptr};
  std::atomic<bool> owned{false};
  uint32_t tid = 0;
  ThreadSlot* next = nullptr;
};

enum State : int { kUnknown = 0, kOff = 1, kOn = 2 };
enum Start : int { kNotStarted = 0, kRunning = 1, kFailed = 2 };

std::atomic<int> g_state{kUnknown};
char g_dir[PATH_MAX];

// Per process image; the fork child resets them (reset_after_fork).
std::atomic<unsigned> g_generation{0};
std::atomic<ThreadSlot*> g_slots{nullptr};
std::atomic<Block*> g_retired{nullptr};
std::atomic<long> g_blocks{0};
std::atomic<uint64_t> g_dropped{0};
uint64_t g_dropped_written = 0;  // flusher only
std::atomic<int> g_start{kNotStarted};
std::atomic<bool> g_terminating{false};
std::atomic<uint64_t> g_flush_begun{0}, g_flush_done{0};
pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_flush_mu = PTHREAD_MUTEX_INITIALIZER;
sem_t g_wake;
int g_fd = -1;
dev_t g_file_dev = 0;  // identity of the file behind g_fd (a program may close and reuse the fd)
ino_t g_file_ino = 0;
bool g_forked = false;
bool g_write_failed = false;
bool g_process_hooks = false;  // atexit/atfork/signals: registered once, inherited by fork children

thread_local ThreadSlot* t_slot = nullptr;
thread_local unsigned t_gen = 0;

// ---- the file --------------------------------------------------------------------------------

std::string meta_text() {
  std::string m = "cmt_version=" CMT_VERSION "\nclock=CLOCK_MONOTONIC\ndirections=h2d,d2h\n";
  static_assert(static_cast<int>(HostKind::Device) == 4, "host_kinds below follow HostKind");
  m += "host_kinds=unknown,pageable,pinned,managed,device\noutcomes=";
  for (int o = 0; o < kOutcomes; ++o) m += std::string(o ? "," : "") + outcome_name(static_cast<Outcome>(o));
  m += "\nentries=";
  for (int e = 0; e < kEntryCount; ++e) m += std::string(e ? "," : "") + entry_name(static_cast<EntryId>(e));
  m += "\n";
  for (int o = 0; o < kOutcomes; ++o) {
    m += std::string("outcome_text.") + outcome_name(static_cast<Outcome>(o)) + "=" + outcome_text(static_cast<Outcome>(o)) + "\n";
  }
  return m;
}

std::string read_cmdline() {
  std::string s;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0) s.assign(buf, static_cast<size_t>(n));
  close(fd);
  return s;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int open_file() {
  mkdir(g_dir, 0777);  // normally made by `cmt profile`; harmless if it exists
  char path[PATH_MAX + 64];
  int fd = -1;
  for (int n = 0; n < 100 && fd < 0; ++n) {
    if (n == 0) snprintf(path, sizeof path, "%s/cmt-%d.rec", g_dir, static_cast<int>(getpid()));
    else snprintf(path, sizeof path, "%s/cmt-%d.%d.rec", g_dir, static_cast<int>(getpid()), n);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    log::write(log::Level::Warn, "profile: cannot create a recording in %s (%s); not recording", g_dir,
               strerror(errno));
    return -1;
  }
  std::string meta = meta_text(), cmdline = read_cmdline();
  FileHeader h{};
  memcpy(h.magic, kMagic, sizeof kMagic);
  h.format_version = kFormatVersion;
  h.header_bytes = static_cast<uint32_t>((sizeof h + meta.size() + cmdline.size() + 7) & ~size_t(7));
  h.record_bytes = sizeof(CopyRecord);
  h.pid = static_cast<uint32_t>(getpid());
  h.ppid = static_cast<uint32_t>(getppid());
  h.flags = g_forked ? 1u : 0u;
  h.monotonic_ns = now_ns();
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  h.realtime_ns = static_cast<uint64_t>(rt.tv_sec) * 1000000000ull + static_cast<uint64_t>(rt.tv_nsec);
  h.meta_bytes = static_cast<uint32_t>(meta.size());
  h.cmdline_bytes = static_cast<uint32_t>(cmdline.size());
  std::string head(reinterpret_cast<const char*>(&h), sizeof h);
  head += meta + cmdline;
  head.resize(h.header_bytes, '\0');
  if (!write_all(fd, head.data(), head.size())) {
    log::write(log::Level::Warn, "profile: cannot write the recording header in %s; not recording", g_dir);
    close(fd);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) == 0) {
    g_file_dev = st.st_dev;
    g_file_ino = st.st_ino;
  }
  return fd;
}

// False once the program closed our descriptor (daemons close every fd): never write into
// whatever file took its number.
bool file_still_ours() {
  struct stat st;
  if (fstat(g_fd, &st) == 0 && st.st_dev == g_file_dev && st.st_ino == g_file_ino) return true;
  log::write(log::Level::Warn, "profile: the program closed the recording's file; later copies are lost");
  g_fd = -1;
  return false;
}

// ---- flushing (flusher thread, exit, thread exit) -----------------------------------------------

struct Writer {  // batches record ranges into writev calls without allocating
  iovec iov[64];
  int n = 0;
  void add(const CopyRecord* p, size_t count) {
    if (!count) return;
    if (n == 64) drain();
    iov[n++] = {const_cast<CopyRecord*>(p), count * sizeof(CopyRecord)};
  }
  void drain() {
    if (g_fd < 0) n = 0;
    int i = 0;
    while (i < n && !g_write_failed) {
      ssize_t w = writev(g_fd, iov + i, n - i);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        g_write_failed = true;
        log::write(log::Level::Warn, "profile: writing the recording failed (%s); later copies are lost",
                   strerror(errno));
        break;
      }
      size_t left = static_cast<size_t>(w);
      for (; i < n && left >= iov[i].iov_len; ++i) left -= iov[i].iov_len;
      if (i < n) {  // a short write ended inside range i: continue from there
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
      }
    }
    n = 0;
  }
};

// Writes everything appended since the last flush. `may_free`: false while a fatal signal is
// being handled (the interrupted thread may hold the allocator's lock).
void flush_locked(bool may_free) {
  if (g_fd >= 0) file_still_ours();  // if not, buffers are still drained and freed, unwritten
  Writer w;
  Block* retired = g_retired.exchange(nullptr, std::memory_order_acquire);
  for (Block* b = retired; b; b = b->next) {
    uint32_t c = b->count.load(std::memory_order_acquire);
    w.add(b->recs + b->flushed, c - b->flushed);
    b->flushed = c;
  }
  for (ThreadSlot* s = g_slots.load(std::memory_order_acquire); s; s = s->next) {
    Block* b = s->current.load(std::memory_order_acquire);
    if (!b) continue;
    uint32_t c = b->count.load(std::memory_order_acquire);
    w.add(b->recs + b->flushed, c - b->flushed);
    b->flushed = c;
  }
  uint64_t dropped = g_dropped.load(std::memory_order_relaxed);
  CopyRecord marker{};
  if (dropped != g_dropped_written) {
    marker.bytes = dropped - g_dropped_written;
    marker.entry = kMarkerEntry;
    g_dropped_written = dropped;
    w.add(&marker, 1);
  }
  w.drain();
  if (!may_free) return;
  while (retired) {
    Block* next = retired->next;
    delete retired;
    g_blocks.fetch_sub(1, std::memory_order_relaxed);
    retired = next;
  }
}

void flush_now(bool may_free) {
  g_flush_begun.fetch_add(1, std::memory_order_acq_rel);
  pthread_mutex_lock(&g_flush_mu);
  flush_locked(may_free);
  pthread_mutex_unlock(&g_flush_mu);
  g_flush_done.fetch_add(1, std::memory_order_release);
}

void* flusher_main(void*) {
  for (;;) {
    timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += kFlushIntervalNs;
    if (deadline.tv_nsec >= 1000000000) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1000000000;
    }
    while (sem_timedwait(&g_wake, &deadline) != 0 && errno == EINTR) {
    }
    flush_now(!g_terminating.load(std::memory_order_acquire));
  }
  return nullptr;
}

// ---- process lifecycle ------------------------------------------------------------------------

void at_exit() {
  if (g_start.load(std::memory_order_acquire) == kRunning) flush_now(true);
}

// A fatal signal whose disposition was the default: let the flusher write what was recorded,
// then die of the same signal. Only async-signal-safe calls here.
void on_fatal_signal(int sig) {
  if (g_start.load(std::memory_order_acquire) == kRunning) {
    uint64_t begun = g_flush_begun.load(std::memory_order_acquire);
    g_terminating.store(true, std::memory_order_release);
    sem_post(&g_wake);
    timespec tick{0, 5000000};
    for (int i = 0; i < kTermWaitMs / 5 && g_flush_done.load(std::memory_order_acquire) <= begun; ++i) {
      nanosleep(&tick, nullptr);
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);  // blocked while this handler runs: delivered, with the default action, on return
}

void install_signal_handlers() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa{};
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

// The child of fork() has no flusher and must not write the parent's records: start over.
void reset_after_fork() {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  g_generation.fetch_add(1, std::memory_order_relaxed);
  g_slots.store(nullptr);
  g_retired.store(nullptr);  // the parent's buffers are the parent's to write (leaked here)
  g_blocks.store(0);
  g_dropped.store(0);
  g_dropped_written = 0;
  g_start.store(kNotStarted);
  g_terminating.store(false);
  g_flush_begun.store(0);
  g_flush_done.store(0);
  g_write_failed = false;
  g_forked = true;
  pthread_mutex_init(&g_start_mu, nullptr);
  pthread_mutex_init(&g_flush_mu, nullptr);
  t_slot = nullptr;
}

bool start_flusher() {
  sem_init(&g_wake, 0, 0);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the flusher never takes the program's signals
  pthread_t th;
  int rc = pthread_create(&th, nullptr, flusher_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) return false;
  pthread_setname_np(th, "cmt-profile");
  pthread_detach(th);
  return true;
}

// First recorded copy of this process: open the file, start the flusher.
bool ensure_started() {
  int s = g_start.load(std::memory_order_acquire);
  if (s != kNotStarted) return s == kRunning;
  pthread_mutex_lock(&g_start_mu);
  s = g_start.load(std::memory_order_acquire);
  if (s == kNotStarted) {
    g_fd = open_file();
    bool ok = g_fd >= 0 && start_flusher();
    if (ok && !g_process_hooks) {
      g_process_hooks = true;
      atexit(at_exit);
      pthread_atfork(nullptr, nullptr, reset_after_fork);
      install_signal_handlers();
    }
    if (!ok) g_state.store(kOff, std::memory_order_relaxed);
    s = ok ? kRunning : kFailed;
    g_start.store(s, std::memory_order_release);
  }
  pthread_mutex_unlock(&g_start_mu);
  return s == kRunning;
}

// ---- threads ----------------------------------------------------------------------------------

void retire(Block* b) {
  Block* head = g_retired.load(std::memory_order_relaxed);
  do {
    b->next = head;
  } while (!g_retired.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
}

// A thread's exit hands its last block to the flusher and frees its slot for another thread.
struct ThreadExit {
  ~ThreadExit() {
    ThreadSlot* s = t_slot;
    if (!s || t_gen != g_generation.load(std::memory_order_relaxed)) return;
    t_slot = nullptr;
    // `current` is cleared before the block is retired: the flusher frees retired blocks.
    Block* b = s->current.exchange(nullptr, std::memory_order_acq_rel);
    if (b) retire(b);
    s->owned.store(false, std::memory_order_release);
  }
};

ThreadSlot* attach_thread() {
  if (!ensure_started()) return nullptr;
  ThreadSlot* s = g_slots.load(std::memory_order_acquire);
  for (; s; s = s->next) {
    bool free_slot = false;
    if (s->owned.compare_exchange_strong(free_slot, true, std::memory_order_acq_rel)) break;
  }
  if (!s) {
    s = new ThreadSlot;
    s->owned.store(true, std::memory_order_relaxed);
    ThreadSlot* head = g_slots.load(std::memory_order_relaxed);
    do {
      s->next = head;
    } while (!g_slots.compare_exchange_weak(head, s, std::memory_order_release, std::memory_order_relaxed));
  }
  s->tid = static_cast<uint32_t>(gettid());
  static thread_local ThreadExit exit_hook;  // constructed here: its destructor runs at thread exit
  (void)exit_hook;
  t_slot = s;
  t_gen = g_generation.load(std::memory_order_relaxed);
  return s;
}

// The thread's block is full (or absent): publish the new one, then retire the old one.
Block* next_block(ThreadSlot* s, Block* full) {
  Block* b = nullptr;
  if (g_blocks.load(std::memory_order_relaxed) < kMaxBlocks) {
    b = new Block;
    g_blocks.fetch_add(1, std::memory_order_relaxed);
  }
  s->current.store(b, std::memory_order_release);
  if (full) retire(full);
  return b;
}

int init_state() {
  const char* dir = getenv("CMT_PROFILE_DIR");
  int s = kOff;
  if (dir && *dir && strlen(dir) < sizeof g_dir) {
    strcpy(g_dir, dir);
    s = kOn;
  }
  int expected = kUnknown;
  g_state.compare_exchange_strong(expected, s);
  return g_state.load();
}

// Reads the environment at load; no threads, no files, no CUDA until the first recorded copy.
__attribute__((constructor)) void recorder_init() { init_state(); }

}  // namespace

bool recording() {
  int s = g_state.load(std::memory_order_relaxed);
  if (__builtin_expect(s == kOff, 1)) return false;
  return (s == kUnknown ? init_state() : s) == kOn;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void flush_before_exit() {
  // _exit() may be called anywhere, a signal handler included: only flush if no flush is under
  // way (never wait for the lock), and free nothing.
  if (g_start.load(std::memory_order_acquire) != kRunning || pthread_mutex_trylock(&g_flush_mu) != 0) return;
  flush_locked(false);
  pthread_mutex_unlock(&g_flush_mu);
}

void record_copy(const CopyRecord& r) {
  ThreadSlot* s = t_slot;
  if (__builtin_expect(!s || t_gen != g_generation.load(std::memory_order_relaxed), 0)) {
    s = attach_thread();
    if (!s) return;
  }
  Block* b = s->current.load(std::memory_order_relaxed);
  uint32_t n = b ? b->count.load(std::memory_order_relaxed) : kBlockRecords;
  if (__builtin_expect(n == kBlockRecords, 0)) {
    b = next_block(s, b);
    if (!b) {
      g_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    n = 0;
  }
  b->recs[n] = r;
  b->recs[n].tid = s->tid;  // cached: gettid() is a system call
  b->count.store(n + 1, std::memory_order_release);
}

}  // namespace cmt
