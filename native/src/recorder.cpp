// The profiler's recorder (`cmt profile`): on when CMT_PROFILE_DIR is set.
//
// Hot path: each recording thread appends CopyRecords to its own Block (no lock, no syscall);
// a full block is handed to a lock-free retired list and a fresh one is allocated. A flusher
// thread, started at the first recorded copy, writes every ~50 ms what was appended since (of
// retired blocks and of each thread's current block) so a killed program loses little, and
// frees retired blocks. Exit, thread exit, fork and SIGTERM/SIGINT/SIGHUP are handled below.
//
// The file it writes: recording_file.hpp.
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

#include "env.hpp"
#include "copy_path.hpp"
#include "driver.hpp"
#include "log.hpp"
#include "recording_file.hpp"
#include "stats.hpp"

#ifndef PROJECT_VERSION
#define PROJECT_VERSION "0.0.0"
#endif

namespace cmt {
namespace {

using namespace recfile;

constexpr uint8_t kMarkerEntry = 0xFF;
constexpr uint32_t kBlockRecords = 1024;      // 48 KiB per block
constexpr long kMaxBlocks = 1400;             // ~64 MiB unflushed before records are dropped
constexpr long kFlushIntervalNs = 50000000;   // 50 ms
constexpr int kTermWaitMs = 500;              // how long a fatal signal waits for the last flush


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
bool g_process_hooks = false;  // atexit/atfork/signals: registered once, inherited by fork children

thread_local ThreadSlot* t_slot = nullptr;
thread_local unsigned t_gen = 0;

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
  const char* dir = env().profile_dir.c_str();
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
