#include "engine.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "driver.hpp"
#include "env.hpp"
#include "fast_copy.hpp"
#include "log.hpp"
#include "timeline.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cmt {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A lane waiting for another lane's work spins briefly, then yields its CPU on every round: with
// as many lanes as CPUs, a lane preempted by any other thread would otherwise leave the spinning
// ones burning whole scheduler time slices (measured on the H200 machine: copies of 1 MiB taking
// milliseconds now and then).
struct Backoff {
  int spins = 0;
  void pause() {
    if (++spins < 512) cpu_relax();  // some µs, then a yield per round
    else sched_yield();
  }
};

using Clock = std::chrono::steady_clock;

// How long idle workers spin before sleeping: back-to-back copies (a model's tensors) then start
// without a futex wake-up per worker (13-40 µs on the H200 host, against 2.5-12 spinning).
std::chrono::microseconds spin_time() {
  static const long us = std::max(0L, env::number("CMT_SPIN_US", 200));
  return std::chrono::microseconds(us);
}

// A host-to-device copy returns once its lanes have staged every byte, while up to a ring of
// blocks still waits for the copy engine: 150-350 µs at 64 MiB on the H200 host. A program that
// waits for its copy before the next one (a synchronising loop, PyTorch's copy_) thus calls again
// after the lanes' spin_time() has run out, and every copy paid the workers' wake-up before its
// first DMA. So after a host-to-device copy the workers also spin through the DMAs that may still
// be queued, estimated at kTailGBps and capped at kMaxTailSpin (CMT_SPIN_TAIL=0: they do not).
constexpr double kTailGBps = 25;  // below the Gen5 links' rate: the spin rather outlasts the DMAs
constexpr std::chrono::microseconds kMaxTailSpin{2000};
bool spin_through_tail() {
  static const bool on = env::number("CMT_SPIN_TAIL", 1) != 0;
  return on;
}

// Spinning workers offer their CPU to other threads every kSpinYield (CMT_SPIN_YIELD=0: never).
constexpr std::chrono::microseconds kSpinYield{50};
bool spin_yields() {
  static const bool on = env::number("CMT_SPIN_YIELD", 1) != 0;
  return on;
}

// CMT_TEST_LATE_START_US (for the tests): every worker starts that late on each copy, as one the
// scheduler leaves waiting would.
std::chrono::microseconds late_start() {
  static const long us = std::max(0L, env::number("CMT_TEST_LATE_START_US", 0));
  return std::chrono::microseconds(us);
}

// ---- destination pre-faulting ---------------------------------------------------------------
// Device-to-host into never-touched pages would take one page fault per 4 KiB inside the copy,
// serialised in the kernel. Instead the lanes fault the destination in ahead of the copy-out,
// 2 MiB per madvise(MADV_POPULATE_WRITE), in parallel with each other and with the DMAs. By
// default the range's 2 MiB-aligned interior is first made eligible for transparent huge pages
// (it is about to be written entirely): 512 times fewer faults, measured on the H200 machine at
// 23 GB/s into fresh memory against 11 with small pages. CMT_PREFAULT=populate keeps small pages,
// CMT_PREFAULT=none faults inside the copy as CUDA does.
enum class Prefault { None, Populate, HugePopulate };

Prefault prefault_mode() {
  static const Prefault mode = [] {
    if (env::is("CMT_PREFAULT", "none")) return Prefault::None;
    if (env::is("CMT_PREFAULT", "populate")) return Prefault::Populate;
    return Prefault::HugePopulate;
  }();
  return mode;
}

std::atomic<bool> g_populate_ok{true};
const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
constexpr size_t kFaultUnit = size_t(2) << 20;       // one huge page, or 512 small ones per madvise
constexpr size_t kFaultLookahead = size_t(16) << 20;  // how far ahead of the copy-out faulting runs

bool page_resident(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  unsigned char resident = 0;
  return mincore(reinterpret_cast<void*>(a), kPage, &resident) == 0 && (resident & 1);
}

void populate(char* p, size_t len) {
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(kPage - 1);
  if (e <= a || !g_populate_ok.load(std::memory_order_relaxed)) return;
  if (madvise(reinterpret_cast<void*>(a), e - a, MADV_POPULATE_WRITE) != 0 &&
      (errno == EINVAL || errno == ENOSYS)) {
    g_populate_ok.store(false, std::memory_order_relaxed);
    log::write(log::Level::Debug, "MADV_POPULATE_WRITE unsupported (kernel < 5.14); faults stay in the copy");
  }
}

// Makes the destination's whole 2 MiB-aligned interior eligible for transparent huge pages.
void advise_huge_pages(char* p, size_t len) {
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kFaultUnit - 1) & ~(kFaultUnit - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + len) & ~(kFaultUnit - 1);
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

// How many CPUs this thread may run on (1 if the kernel will not say).
long usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// Host-to-device lanes, once out of pieces, demote the staging lines they wrote with cached stores
// into the copy's last `slots` blocks (CMT_DEMOTE_TAIL=0: they leave them). The lanes run ahead of
// the copy engine, and the blocks they fill last stay in their cores' L2 until a DMA reads them,
// slowly (explore_ramp.cpp); earlier blocks are pushed out of L2 by the lanes' later writes.
// Demoting every block, or every piece written before a wait for a slot, cost the CPU far more
// than it gave (2026-12-03: 51-66% of pinned, timeline-demote.json, ab-demote-idle/).
bool demote_tail() {
  static const bool on = env::number("CMT_DEMOTE_TAIL", 1) != 0;
  return on;
}
thread_local std::vector<std::pair<char*, size_t>> t_lane_tail;  // this lane's cached pieces of those blocks

// ---- engine state -----------------------------------------------------------------------------

constexpr int kMaxSlots = kMaxBuffers;

struct ContextResources {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;  // every DMA of this context, in order
  CUevent slot_event[kMaxSlots] = {};
  CUevent done = nullptr;
  std::vector<CUevent> timing;  // CMT_TRACE only: a base event, then start and end of each block's DMA
};

struct Slot {
  void* mem = nullptr;
  CUevent last_event = nullptr;        // the slot's most recent DMA (any context)
  std::atomic<long> issued{-1};        // last round of this copy whose DMA was queued
  std::atomic<long> known_done{-1};    // last round whose DMA is known finished
  std::atomic<long> sync_claimed{-1};  // last round a lane has taken on to wait for in the driver
  std::atomic<int> pending{0};         // pieces of the current round still to fill / drain
};

// How a block's staging lines are written (host-to-device) or read (device-to-host) by the lanes:
// with the CPU's cached stores or its streaming stores. The values are the timeline's "block_fill"
// codes.
enum class Fill : int { Cached = 0, Streamed = 1 };

struct Job {
  Direction dir = Direction::HtoD;
  CUcontext ctx = nullptr;
  ContextResources* res = nullptr;
  char* host = nullptr;
  CUdeviceptr device = 0;
  size_t bytes = 0;
  size_t fixed_piece = 0;  // CMT_PIECE: bytes per unit of CPU work; 0: each block shared out over the lanes
  size_t blocks = 0;
  size_t pieces = 0;
  int slots = 0;
  // Block b covers bytes [block_off[b], block_off[b+1]) and pieces [piece_off[b], piece_off[b+1]),
  // each piece_len[b] bytes (the last one shorter).
  std::vector<size_t> block_off, piece_off, piece_len;
  std::atomic<size_t> next{0};
  std::atomic<size_t> fault_next{0};  // destination bytes below this are faulted in or being so
  bool prefault = false;              // device-to-host into memory not faulted in yet
  bool stream_stores = false;         // Settings::stream_stores
  std::vector<Fill> fills;            // per block, how the lanes write or read its staging lines (Job::cut)
  size_t ramp_up_blocks = 0;          // the first blocks, smaller than a chunk (Job::cut)
  size_t tail_below = 0;              // blocks before this one are staged at the end of their window
  size_t window = 0;                  // the part of every slot this copy uses: [window, window + window_bytes)
  size_t window_bytes = 0;
  std::atomic<CUresult> error{CUDA_SUCCESS};
  Clock::duration spin_tail{};  // how long the workers spin beyond spin_time() (spin_through_tail)

  size_t block_len(size_t b) const { return block_off[b + 1] - block_off[b]; }
  int slot_index(size_t b) const { return static_cast<int>(b % slots); }
  // Where block b lies in its slot: at the start of the copy's window, or (tail_below) at its end.
  size_t slot_offset(size_t b) const {
    return window + (b < tail_below ? (window_bytes - block_len(b)) & ~size_t(4095) : 0);
  }
  int pieces_in(size_t b) const { return static_cast<int>(piece_off[b + 1] - piece_off[b]); }
  size_t block_of(size_t p) const {
    return static_cast<size_t>(std::upper_bound(piece_off.begin(), piece_off.end(), p) - piece_off.begin()) - 1;
  }
  void cut(size_t chunk, bool ramp, int lanes);
  void choose_fills(bool ramp, size_t up_end, size_t down_from);
  void place(size_t slot_bytes, size_t chunk, bool& flipped);
};

constexpr size_t kMinPiece = 64 << 10;  // per-piece costs (claiming, a slot's counter) stay small

// Cuts the copy into DMA blocks of `chunk` bytes. With `ramp`, the first blocks grow from chunk/8
// and the last ones halve what is left down to chunk/8: the pipeline's fill (the first block must
// be copied before its DMA starts) and drain (the last DMA, or copy-out, runs alone) then cost an
// eighth as much, while most DMAs stay large enough that the copy engine's per-command cost stays
// small. Every block is shared out over all lanes, so a small block fills as fast as a large one.
void Job::cut(size_t chunk, bool ramp, int lanes) {
  block_off.assign(1, 0);
  const size_t first = ramp ? std::min(chunk, std::max(chunk / 8, kMinPiece)) : chunk;
  size_t rem = bytes;
  auto take = [&](size_t n) {
    n = std::min(n, rem);
    block_off.push_back(block_off.back() + n);
    rem -= n;
  };
  // Host-to-device copies do not ramp down (CMT_RAMP_DOWN=1: they do). Their lanes run ahead of the
  // copy engine, so the last DMAs never wait for them, and small DMAs only cost more each; the last
  // blocks' lines are demoted instead (demote_tail). Side by side on the H200 host, cmt / pinned over
  // 4 processes each (ab-split/, 2026-12-03): 64 MiB 89% (82-91) against 86% (77-88), 256 MiB 95%
  // against 93%, 16 MiB and 1 GiB the same (74%, 97%). Device-to-host copies keep theirs: their
  // last copy-out runs alone after the last DMA.
  static const bool h2d_down = env::number("CMT_RAMP_DOWN", 0) != 0;
  const bool down = ramp && (h2d_down || dir != Direction::HtoD);
  size_t last_step = 0;
  for (size_t s = first; s < chunk && rem; s *= 2) take(last_step = s);  // ramp up
  // CMT_RAMP_REPEAT=1 (an experiment): host-to-device ramps take their last step twice. With 8
  // lanes, which fill about as fast as the link drains, the copy engine sat idle 14-160 µs after the
  // last ramp block, waiting for the first full one (timeline-door.json): a second half-size block
  // gives the lanes that time. Not conclusive on the H200 host (2026-12-03, 64 MiB, cmt / pinned):
  // timeline 86, 92% against 82, 89% and PyTorch's copy_ 82-89% against 81-86% (entry-ramp-repeat.json),
  // but cmt bench copy 87% against 87% over three processes each (ab-ramp-repeat/).
  static const bool repeat_last = env::number("CMT_RAMP_REPEAT", 0) != 0;
  if (repeat_last && last_step && dir == Direction::HtoD && rem) take(last_step);
  const size_t ramp_up_end = block_off.size() - 1;
  ramp_up_blocks = ramp ? ramp_up_end : 0;
  while (rem > (down ? 2 * chunk : 0)) take(chunk);           // full blocks
  const size_t full_end = block_off.size() - 1;
  while (down && rem > first) take(std::min(chunk, (rem / 2 + kMinPiece - 1) & ~(kMinPiece - 1)));  // ramp down
  if (rem) take(rem);
  blocks = block_off.size() - 1;
  choose_fills(ramp, ramp_up_end, full_end);
  piece_off.assign(1, 0);
  piece_len.clear();
  for (size_t b = 0; b < blocks; ++b) {
    size_t len = block_len(b);
    size_t piece = fixed_piece ? fixed_piece : std::max(kMinPiece, (len / lanes + 4095) & ~size_t(4095));
    piece_len.push_back(std::min(piece, len));
    piece_off.push_back(piece_off.back() + (len + piece_len.back() - 1) / piece_len.back());
  }
  pieces = piece_off.back();
}

// How the lanes write or read each block's staging lines: the rule's stores, except for the ramps
// of host-to-device copies ([0, up_end) and [down_from, blocks) with `ramp`).
void Job::choose_fills(bool ramp, size_t up_end, size_t down_from) {
  fills.assign(blocks, stream_stores ? Fill::Streamed : Fill::Cached);
  if (!ramp || stream_stores || dir != Direction::HtoD) return;
  // CMT_RAMP_STREAM fills host-to-device ramp blocks with streaming stores whatever the rule says:
  // 0 none (default), 1 the ramp down, 2 both ramps, 3 the ramp up. A DMA reading lines the CPU
  // holds dirty runs at half the link or less on the H200 host (explore_ramp.cpp), and streamed
  // ramp-down blocks ran at 29-53 GB/s against 17-41 cached; but their stores go to DRAM while the
  // last full block's DMA runs, which then ran at 34-46 GB/s against 54 (timeline-fill.json,
  // timeline-demote-tail.json). With the lanes' last blocks demoted at the end (demote_tail), cached
  // ramps won, cmt / pinned at 64 MiB over 3 processes each: 84% (77-85) against 78% (77-81) for
  // the streamed ramp down (ab-demote-tail/, 2026-12-03; without demote_tail, 75% against 81%,
  // ab-ramp/). CMT_RAMP_STREAM_FULL=K streams the last K full blocks too (no gain,
  // timeline-ramp-full.json).
  static const long ramp_stream = env::number("CMT_RAMP_STREAM", 0);
  static const bool stream_up = ramp_stream == 2 || ramp_stream == 3;
  static const bool stream_down = ramp_stream == 1 || ramp_stream == 2;
  static const size_t full_streamed = static_cast<size_t>(std::max(0L, env::number("CMT_RAMP_STREAM_FULL", 0)));
  const size_t streamed_from = stream_down ? down_from - std::min(full_streamed, down_from - up_end) : blocks;
  for (size_t b = 0; b < blocks; ++b) {
    if ((stream_up && b < up_end) || b >= streamed_from) fills[b] = Fill::Streamed;
  }
}

// Where the blocks lie in the slots (slot_bytes each, blocks of up to `chunk`); `flipped` is the
// engine's memory of which end of the slots the last device-to-host copy used.
void Job::place(size_t slot_bytes, size_t chunk, bool& flipped) {
  // Consecutive device-to-host copies whose blocks fit twice in a slot use its two ends in turn
  // (CMT_WINDOW_FLIP=0: always the start), so that none of a copy's DMAs (not only the ramp's)
  // writes lines its predecessor's copy-out has just read. Two whole rings in turn (an experiment,
  // removed) did that, and made 64 MiB copies faster (first DMAs 39-43 / 51 / 53 GB/s against
  // 25 / 32 / 38) but 1 GiB ones 5-10% slower (timeline-alt.json, ab-alt-ring/); this needs
  // no more memory and leaves copies with blocks as large as the slots alone. Side by side on the
  // H200 host (ab-final/, 2 processes each): d2h 16 MiB 77% of pinned against 73%, 64 MiB 87% both.
  static const bool flip = env::number("CMT_WINDOW_FLIP", 1) != 0;
  const size_t span = (chunk + 4095) & ~size_t(4095);
  window = 0;
  window_bytes = slot_bytes;
  if (flip && dir == Direction::DtoH && slot_bytes >= 2 * span) {
    flipped = !flipped;
    window = flipped ? (slot_bytes - span) & ~size_t(4095) : 0;
    window_bytes = span;
  }
  // Device-to-host ramp-up blocks are staged at the end of their window (CMT_RAMP_TAIL=0: at the
  // start). A DMA writing staging lines the CPU still caches runs at half the link or less
  // (explore_ramp.cpp), and a copy's first DMAs would otherwise write the slots' first bytes, which
  // the last copy's last copy-outs have just read; the end of a window is the ring memory the last
  // copy touched least recently. Side by side (ab-ramp/, 2026-12-03), cmt / pinned: 16 MiB 73-77%
  // against 70%, 64 MiB 85-87% against 84%, larger copies unchanged.
  static const bool tail = env::number("CMT_RAMP_TAIL", 1) != 0;
  tail_below = tail && dir == Direction::DtoH ? ramp_up_blocks : 0;
}

class Engine {
 public:
  CUresult copy(const CopyRequest& req);
  void forget() { forked_ = true; }
  std::string dma_gpu_times();

 private:
  ContextResources* resources_for(CUcontext ctx, int slots);
  bool ensure_slots(int slots, size_t bytes);
  void start_worker(int index);
  void worker_main(int index, uint64_t seen);
  void run_lane(int lane);
  bool process_htod(size_t p);
  bool process_dtoh(size_t p);
  void fault_ahead(size_t upto);
  CUresult queue_dma(size_t b);
  void trace_gpu_begin(ContextResources* res, size_t blocks);
  char* staging(size_t b) { return static_cast<char*>(slots_[job_.slot_index(b)].mem) + job_.slot_offset(b); }
  bool wait_issued(Slot& s, long round);
  bool wait_done(Slot& s, long round);
  void fail(CUresult r);

  const Driver& d_ = driver();
  std::mutex job_mutex_;  // one copy at a time: copies are bound by the one link anyway
  std::vector<ContextResources*> contexts_;
  CUcontext last_ctx_ = nullptr;
  Slot slots_[kMaxSlots];
  int slot_count_ = 0;
  size_t slot_bytes_ = 0;
  bool window_flipped_ = false;  // CMT_WINDOW_FLIP: the last device-to-host copy used the slots' other end
  CUcontext thread_ctx_[kMaxThreads] = {};  // context current in each worker thread
  int workers_ = 0;                        // worker threads started (lanes 1..workers_)
  Job job_;
  std::atomic<uint64_t> ticket_{0};  // (generation << 8) | lanes of the current job
  // Which workers a copy waits for: (generation << 16) | workers inside | kDoorClosed. A worker
  // enters its copy only while the door is open; the caller closes it once every piece is claimed
  // and then waits for the workers inside alone. A worker the scheduler wakes late thus finds the
  // door closed and never holds a copy up (measured on the H200 host: lanes starting 2.5 ms late,
  // and their copies waiting for them, in whole processes).
  std::atomic<uint64_t> door_{0};
  static constexpr uint64_t kDoorClosed = uint64_t(1) << 15;
  bool enter(uint64_t gen);
  void leave() { door_.fetch_sub(1, std::memory_order_release); }
  std::atomic<Clock::rep> returned_at_{0};  // when the copy of generation returned_gen_ returned
  std::atomic<uint64_t> returned_gen_{0};
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  std::atomic<bool> forked_{false};
  // CMT_TRACE: the context whose timing events hold the last copy's (job_'s) DMA times, else nullptr.
  ContextResources* trace_res_ = nullptr;
  std::mutex trace_order_;  // one DMA queued at a time, so that its timing events bracket it alone
};

void Engine::fail(CUresult r) {
  CUresult expected = CUDA_SUCCESS;
  job_.error.compare_exchange_strong(expected, r);
  job_.next.store(job_.pieces, std::memory_order_relaxed);  // the other lanes stop claiming
}

ContextResources* Engine::resources_for(CUcontext ctx, int slots) {
  ContextResources* res = nullptr;
  for (auto* c : contexts_) {
    if (c->ctx == ctx) res = c;
  }
  if (!res) {
    auto* c = new ContextResources();
    c->ctx = ctx;
    if (d_.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        d_.cuEventCreate(&c->done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      delete c;  // handles created so far are leaked; this only happens when the driver is failing
      return nullptr;
    }
    contexts_.push_back(c);
    res = c;
  }
  for (int s = 0; s < slots; ++s) {
    if (!res->slot_event[s] && d_.cuEventCreate(&res->slot_event[s], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      return nullptr;
    }
  }
  return res;
}

bool Engine::ensure_slots(int slots, size_t bytes) {
  if (slot_bytes_ < bytes) {  // larger blocks than before: replace the buffers
    for (int s = 0; s < slot_count_; ++s) {
      if (slots_[s].last_event) d_.cuEventSynchronize(slots_[s].last_event);
      slots_[s].last_event = nullptr;
      d_.cuMemFreeHost(slots_[s].mem);
    }
    slot_count_ = 0;
    slot_bytes_ = bytes;
  }
  while (slot_count_ < slots) {
    // Portable: one ring serves every context and device. (Slots of the engine's own memory on
    // transparent huge pages, registered, were tried on 2026-12-03: no change, ab-staging-huge/.)
    if (d_.cuMemHostAlloc(&slots_[slot_count_].mem, slot_bytes_, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
      return false;
    }
    ++slot_count_;
  }
  return true;
}

void Engine::start_worker(int index) {
  // Workers take no signals: the program's handlers run on its own threads, as without cmt.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  uint64_t seen = ticket_.load(std::memory_order_relaxed) >> 8;
  std::thread([this, index, seen] { worker_main(index, seen); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Engine::worker_main(int index, uint64_t seen) {
  char name[16];
  snprintf(name, sizeof name, "cmt-copy-%d", index);
  pthread_setname_np(pthread_self(), name);
  bool spin = false;  // only a worker the last copy used spins for the next: idle ones leave the CPUs to the lanes
  Clock::duration tail{};  // the last copy's Job::spin_tail
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if ((t >> 8) == seen) {
      // Spin until spin_time() + tail after the copy returned (which it does once every lane is done),
      // offering the CPU to any other thread every kSpinYield: a thread of the program, or a lane of
      // the next copy, that the scheduler put on this CPU would otherwise wait for the whole spin.
      Clock::time_point next_yield = Clock::now() + kSpinYield;
      while (spin && (ticket_.load(std::memory_order_acquire) >> 8) == seen) {
        Clock::time_point now = Clock::now();
        if (returned_gen_.load(std::memory_order_acquire) == seen &&
            now >= Clock::time_point(Clock::duration(returned_at_.load(std::memory_order_relaxed))) + spin_time() + tail) {
          break;
        }
        if (now >= next_yield && spin_yields()) {
          sched_yield();
          next_yield = now + kSpinYield;
        }
        cpu_relax();
      }
      spin = false;
      std::unique_lock<std::mutex> lock(wake_mutex_);
      wake_cv_.wait(lock, [&] { return (ticket_.load(std::memory_order_acquire) >> 8) != seen; });
      continue;
    }
    seen = t >> 8;
    spin = index < static_cast<int>(t & 0xff);
    if (spin && late_start().count()) std::this_thread::sleep_for(late_start());
    if (!spin || !enter(seen)) continue;  // not needed for this copy, or it no longer needs this worker
    if (thread_ctx_[index] != job_.ctx) {
      bool first = thread_ctx_[index] == nullptr;
      CUresult r = d_.cuCtxSetCurrent(job_.ctx);
      if (r != CUDA_SUCCESS) {
        fail(r);
        leave();
        continue;
      }
      thread_ctx_[index] = job_.ctx;
      if (first) {
        // Never count as an unsafe call in another thread's global-mode graph capture.
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        d_.cuThreadExchangeStreamCaptureMode(&mode);
      }
    }
    run_lane(index);
    tail = job_.spin_tail;  // read before the copy may end and the next one replace job_
    leave();
  }
}

bool Engine::enter(uint64_t gen) {
  uint64_t d = door_.load(std::memory_order_acquire);
  while ((d >> 16) == (gen << 16 >> 16) && !(d & kDoorClosed)) {
    if (door_.compare_exchange_weak(d, d + 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

// Spins until the slot's DMA for `round` has been queued; false if the copy failed meanwhile.
bool Engine::wait_issued(Slot& s, long round) {
  Backoff backoff;
  while (s.issued.load(std::memory_order_acquire) < round) {
    if (job_.error.load(std::memory_order_relaxed) != CUDA_SUCCESS) return false;
    backoff.pause();
  }
  return true;
}

// Waits until the slot's DMA for `round` (or, for round -1, an earlier copy's) has finished.
// One lane waits in the driver; the others watch known_done (many threads waiting on one event
// in the driver at once were measured to be slow).
bool Engine::wait_done(Slot& s, long round) {
  if (s.known_done.load(std::memory_order_acquire) >= round) return true;
  long claimed = s.sync_claimed.load(std::memory_order_relaxed);
  bool syncer = false;
  while (claimed < round) {
    if (s.sync_claimed.compare_exchange_weak(claimed, round)) {
      syncer = true;
      break;
    }
  }
  if (!syncer) {
    Backoff backoff;
    while (s.known_done.load(std::memory_order_acquire) < round) {
      if (job_.error.load(std::memory_order_relaxed) != CUDA_SUCCESS) return false;
      backoff.pause();
    }
    return true;
  }
  if (CUevent e = s.last_event) {
    CUresult r = d_.cuEventSynchronize(e);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
  }
  if (timeline::enabled()) timeline::note(timeline::Step::DmaDone, round * job_.slots + (&s - slots_));
  s.known_done.store(round, std::memory_order_release);
  return true;
}

// Queues the DMA of block b into or out of its slot (by whoever completed the slot's last round).
CUresult Engine::queue_dma(size_t b) {
  int si = job_.slot_index(b);
  Slot& s = slots_[si];
  CUdeviceptr dev = job_.device + job_.block_off[b];
  CUstream stream = job_.res->stream;
  std::unique_lock<std::mutex> traced;
  if (trace_res_) {
    traced = std::unique_lock<std::mutex>(trace_order_);
    d_.cuEventRecord(trace_res_->timing[1 + 2 * b], stream);
  }
  char* buf = staging(b);
  CUresult r = job_.dir == Direction::HtoD ? d_.cuMemcpyHtoDAsync(dev, buf, job_.block_len(b), stream)
                                           : d_.cuMemcpyDtoHAsync(buf, dev, job_.block_len(b), stream);
  if (trace_res_ && r == CUDA_SUCCESS) d_.cuEventRecord(trace_res_->timing[2 + 2 * b], stream);
  if (r == CUDA_SUCCESS) r = d_.cuEventRecord(job_.res->slot_event[si], stream);
  if (r != CUDA_SUCCESS) return r;
  s.last_event = job_.res->slot_event[si];
  if (timeline::enabled()) timeline::note(timeline::Step::DmaQueued, static_cast<long>(b));
  return CUDA_SUCCESS;
}

bool Engine::process_htod(size_t p) {
  size_t b = job_.block_of(p), i = p - job_.piece_off[b];
  long round = static_cast<long>(b / job_.slots);
  Slot& s = slots_[job_.slot_index(b)];
  // The slot is free once the DMA of its previous round (or of an earlier copy) has read it.
  if (!wait_issued(s, round - 1) || !wait_done(s, round - 1)) return false;
  size_t off = i * job_.piece_len[b], len = std::min(job_.piece_len[b], job_.block_len(b) - off);
  char* buf = staging(b) + off;
  bool cached = job_.fills[b] == Fill::Cached;
  copy_stream(buf, job_.host + job_.block_off[b] + off, len, !cached);
  if (cached && b + job_.slots >= job_.blocks && demote_tail()) t_lane_tail.push_back({buf, len});
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // this lane completed the block
    CUresult r = queue_dma(b);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
    size_t next = b + job_.slots;
    if (next < job_.blocks) s.pending.store(job_.pieces_in(next), std::memory_order_relaxed);
    s.issued.store(round, std::memory_order_release);
  }
  return true;
}

// Faults in the destination up to `upto` in 2 MiB units, each claimed by one lane, ahead of the
// copy-out: the faults overlap the DMAs and no two lanes fault the same pages.
void Engine::fault_ahead(size_t upto) {
  upto = std::min(upto, job_.bytes);
  size_t u = job_.fault_next.load(std::memory_order_relaxed);
  while (u < upto) {
    if (job_.fault_next.compare_exchange_weak(u, u + kFaultUnit)) {
      populate(job_.host + u, std::min(kFaultUnit, job_.bytes - u));
      u += kFaultUnit;
    }
  }
}

bool Engine::process_dtoh(size_t p) {
  size_t b = job_.block_of(p), i = p - job_.piece_off[b];
  long round = static_cast<long>(b / job_.slots);
  Slot& s = slots_[job_.slot_index(b)];
  size_t off = i * job_.piece_len[b], len = std::min(job_.piece_len[b], job_.block_len(b) - off);
  char* dst = job_.host + job_.block_off[b] + off;
  if (job_.prefault) fault_ahead(job_.block_off[b] + off + len + kFaultLookahead);
  if (!wait_issued(s, round) || !wait_done(s, round)) return false;
  copy_stream(dst, staging(b) + off, len, job_.fills[b] == Fill::Streamed);
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // slot drained: refill it
    size_t next = b + job_.slots;
    if (next < job_.blocks) {
      s.pending.store(job_.pieces_in(next), std::memory_order_relaxed);
      CUresult r = queue_dma(next);
      if (r != CUDA_SUCCESS) {
        fail(r);
        return false;
      }
      s.issued.store(round + 1, std::memory_order_release);
    }
  }
  return true;
}

// CMT_TRACE: GPU timestamps before and after every DMA of this copy, relative to a base event
// recorded now, tell a DMA slowed by the CPU's memory traffic from a DMA starved of filled blocks.
void Engine::trace_gpu_begin(ContextResources* res, size_t blocks) {
  if (!d_.cuEventElapsedTime) return;
  while (res->timing.size() < 1 + 2 * blocks) {
    CUevent e = nullptr;
    if (d_.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return;
    res->timing.push_back(e);
  }
  if (d_.cuEventRecord(res->timing[0], res->stream) != CUDA_SUCCESS) return;
  trace_res_ = res;
}

// The last traced copy's DMAs as JSON [[start_us, end_us], ...] from its base event; waits for them.
std::string Engine::dma_gpu_times() {
  std::lock_guard<std::mutex> lock(job_mutex_);
  if (!trace_res_) return {};
  const std::vector<CUevent>& ev = trace_res_->timing;
  std::string s = "[";
  for (size_t b = 0; b < job_.blocks; ++b) {
    float start = 0, end = 0;
    if (d_.cuEventSynchronize(ev[2 + 2 * b]) != CUDA_SUCCESS ||
        d_.cuEventElapsedTime(&start, ev[0], ev[1 + 2 * b]) != CUDA_SUCCESS ||
        d_.cuEventElapsedTime(&end, ev[0], ev[2 + 2 * b]) != CUDA_SUCCESS) {
      return {};
    }
    s += (b ? ",[" : "[") + std::to_string(start * 1e3) + "," + std::to_string(end * 1e3) + "]";
  }
  return s + "]";
}

void Engine::run_lane(int lane) {
  const bool trace = timeline::enabled();
  if (trace) {
    timeline::set_lane(lane);
    timeline::note(timeline::Step::LaneStart);
  }
  for (;;) {
    size_t p = job_.next.fetch_add(1, std::memory_order_relaxed);
    if (p >= job_.pieces) break;
    if (!(job_.dir == Direction::HtoD ? process_htod(p) : process_dtoh(p))) break;
  }
  for (auto& [p, n] : t_lane_tail) demote_lines(p, n);
  t_lane_tail.clear();
  if (trace) timeline::note(timeline::Step::LaneEnd);
}

CUresult Engine::copy(const CopyRequest& req) {
  if (forked_.load(std::memory_order_relaxed) || !d_.ok) return CUDA_ERROR_NOT_READY;
  const Settings& st = req.settings;
  size_t block = std::clamp(st.chunk, kMinChunk, kMaxChunk);
  int threads = std::clamp(st.threads, 1, kMaxThreads);
  // Fresh memory? Probe the middle of the range: malloc writes its chunk header into the first
  // page of a new mapping, so the first page says nothing (PyTorch's .cpu() output is such memory).
  const bool prefault = req.dir == Direction::DtoH && prefault_mode() != Prefault::None &&
                        !page_resident(req.host + req.bytes / 2);
  // A destination still to be faulted in gets at least CMT_FRESH_THREADS lanes (default: the CPUs
  // this process may use, at most 16): the kernel zeroes every page the lanes fault in, work the
  // tuned thread counts did not include. On the H200 host, cmt / never-touched GB/s with 16 lanes
  // against the rules' 6-10: 16 MiB 27.3 / 24.4, 64 MiB 35.7 / 27.3, 1 GiB 29.7 / 24.8 (ab-final/).
  static const int fresh_threads = static_cast<int>(
      std::clamp(env::number("CMT_FRESH_THREADS", std::min(16L, usable_cpus())), 0L, static_cast<long>(kMaxThreads)));
  if (prefault) threads = std::max(threads, fresh_threads);
  // The environment is read once, not on every copy.
  static const size_t piece_override = static_cast<size_t>(std::max(0L, env::number("CMT_PIECE", 0)));
  static const bool ramp = env::number("CMT_RAMP", 1) != 0;

  std::lock_guard<std::mutex> lock(job_mutex_);
  // The calling thread works as lane 0; keep it out of other threads' global-mode captures too.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged = d_.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  auto restore = [&] {
    if (exchanged) d_.cuThreadExchangeStreamCaptureMode(&mode);
  };
  Job& j = job_;
  j.bytes = req.bytes;
  j.dir = req.dir;
  j.fixed_piece = piece_override;
  j.stream_stores = st.stream_stores;
  trace_res_ = nullptr;  // the last copy's DMA times describe its blocks, about to be replaced
  j.cut(block, ramp, threads);
  int slots = static_cast<int>(std::min<size_t>(std::clamp(st.buffers, 1, kMaxSlots), j.blocks));
  ContextResources* res = resources_for(req.ctx, slots);
  if (!res || !ensure_slots(slots, std::max(block, active_plan().max_chunk()))) {
    restore();
    return CUDA_ERROR_NOT_READY;
  }
  if (last_ctx_ && last_ctx_ != req.ctx) {
    // Another context's DMAs may still use the slots, on a stream this context cannot order after.
    for (auto* c : contexts_) {
      if (c->ctx == last_ctx_) d_.cuStreamSynchronize(c->stream);
    }
  }
  last_ctx_ = req.ctx;
  if (req.after && d_.cuStreamWaitEvent(res->stream, req.after, 0) != CUDA_SUCCESS) {
    restore();
    return CUDA_ERROR_NOT_READY;  // nothing copied yet: the driver's own copy takes over
  }
  if (timeline::enabled()) trace_gpu_begin(res, j.blocks);

  j.place(slot_bytes_, block, window_flipped_);
  j.ctx = req.ctx;
  j.res = res;
  j.host = req.host;
  j.device = req.device;
  j.slots = slots;
  j.next.store(0, std::memory_order_relaxed);
  j.error.store(CUDA_SUCCESS, std::memory_order_relaxed);
  for (int s = 0; s < slots; ++s) {
    Slot& slot = slots_[s];
    slot.issued.store(-1, std::memory_order_relaxed);
    slot.known_done.store(-2, std::memory_order_relaxed);
    slot.sync_claimed.store(-2, std::memory_order_relaxed);
    slot.pending.store(j.pieces_in(s), std::memory_order_relaxed);
  }
  j.fault_next.store(0, std::memory_order_relaxed);
  j.prefault = prefault;
  j.spin_tail = {};
  if (req.dir == Direction::HtoD && spin_through_tail()) {
    // at most the last ring's blocks still wait for the copy engine when the lanes end
    const size_t queued = j.bytes - j.block_off[j.blocks - static_cast<size_t>(slots)];
    j.spin_tail = std::min<Clock::duration>(std::chrono::nanoseconds(static_cast<long>(queued / kTailGBps)), kMaxTailSpin);
  }
  int lanes = static_cast<int>(std::min<size_t>(threads, j.pieces));
  if (timeline::enabled()) {
    std::vector<int> fill;  // Fill's values are the timeline's codes
    for (Fill f : j.fills) fill.push_back(static_cast<int>(f));
    timeline::begin(static_cast<int>(req.dir), req.bytes, j.block_off, fill, lanes);
  }
  if (j.prefault) {
    log::debug_once(4000, "d2h into memory not faulted in yet: the lanes fault it in ahead of the copy");
    if (prefault_mode() == Prefault::HugePopulate) advise_huge_pages(req.host, req.bytes);
  }
  if (req.dir == Direction::DtoH) {
    // The first round of DMAs goes out before any lane starts; lanes queue the rest.
    for (int s = 0; s < slots; ++s) {
      CUresult r = queue_dma(static_cast<size_t>(s));
      if (r != CUDA_SUCCESS) {
        restore();
        return r;
      }
      slots_[s].issued.store(0, std::memory_order_relaxed);
    }
  }
  while (workers_ < lanes - 1) start_worker(++workers_);
  if (lanes > 1) {
    uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> 8) + 1;
    door_.store(gen << 16, std::memory_order_release);  // open, nobody inside
    ticket_.store((gen << 8) | static_cast<uint64_t>(lanes), std::memory_order_release);
    { std::lock_guard<std::mutex> wake(wake_mutex_); }
    wake_cv_.notify_all();
  }
  run_lane(0);  // returns once every piece is claimed (or the copy failed)
  if (lanes > 1) {
    door_.fetch_or(kDoorClosed, std::memory_order_acq_rel);
    Backoff backoff;
    while ((door_.load(std::memory_order_acquire) & (kDoorClosed - 1)) != 0) backoff.pause();
    // the workers' spin runs from now
    returned_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    returned_gen_.store(ticket_.load(std::memory_order_relaxed) >> 8, std::memory_order_release);
  }
  restore();

  CUresult err = j.error.load(std::memory_order_relaxed);
  if (req.dir == Direction::HtoD && err == CUDA_SUCCESS) {
    // Later work on the caller's stream waits for the DMAs still in flight.
    err = d_.cuEventRecord(res->done, res->stream);
    if (err == CUDA_SUCCESS) err = d_.cuStreamWaitEvent(req.stream, res->done, 0);
  }
  if (timeline::enabled()) timeline::note(timeline::Step::CopyEnd);
  return err;
}

Engine* g_engine = nullptr;
std::once_flag g_engine_once;

}  // namespace

CUresult engine_copy(const CopyRequest& req) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });  // never destroyed: workers live on
  return g_engine->copy(req);
}

std::string engine_dma_gpu_times() {
  return g_engine ? g_engine->dma_gpu_times() : std::string();
}

void engine_forget_after_fork() {
  if (g_engine) g_engine->forget();
}

}  // namespace cmt
