#include "engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "context_ends.hpp"
#include "dma_streams.hpp"
#include "env.hpp"
#include "host_copy.hpp"
#include "job.hpp"
#include "lane_pool.hpp"
#include "log.hpp"
#include "plan.hpp"
#include "prefault.hpp"
#include "rate_guard.hpp"
#include "recorder.hpp"
#include "setup_pacing.hpp"
#include "staging_memory.hpp"
#include "staging_ring.hpp"
#include "timeline.hpp"

namespace cmt {
namespace {

// A host-to-device copy returns once its lanes have staged every byte, while up to a ring of
// blocks still waits for the copy engine: 150-350 µs at 64 MiB on the H200 host. A program that
// waits for its copy before the next one (a synchronising loop, PyTorch's copy_) would call again
// after the workers' spin has run out, and every copy would pay their wake-up before its first
// DMA. So after a host-to-device copy the workers also spin through the DMAs that may still be
// queued, estimated at kTailGBps and capped at kMaxTailSpin.
constexpr double kTailGBps = 25;  // below the Gen5 links' rate: the spin rather outlasts the DMAs
constexpr std::chrono::microseconds kMaxTailSpin{2000};

// A destination still to be faulted in gets at least this many lanes: the kernel zeroes every page
// they fault in, work the tuned thread counts did not include (docs/engine-findings.md).
int fresh_memory_threads() {
  static const int n = static_cast<int>(std::min(16L, usable_cpus()));
  return n;
}

// A pipeline carries one copy at a time for one context (GPU): its own staging ring, DMA stream and
// events, and its place in the lane pool; all pipelines share one pool of lanes. Copies to
// different GPUs run at once, each on its GPU's pipeline. Copies to one GPU take their turns first
// come first served, and a small one does not wait for its turn (kPassWhenBusy). Up to four
// pipelines per GPU, for copies from several threads at once, measured no better: 8 threads x 64
// MiB at 51-52% of pinned on the H100 (2026-12-06) against 55-62% taking turns; both directions at
// once gained nothing either (45-54 GB/s against 53.5 taking turns on the H200): several staging
// rings outgrow the last-level cache, and staged copies are bound by the CPUs' memory bandwidth
// (docs/engine-findings.md, "Copies at once").
// A copy up to this size that finds its GPU's pipeline busy goes to the driver, which does it in
// well under a millisecond, rather than wait behind a large copy.
constexpr size_t kPassWhenBusy = 4u << 20;

// A copy that finds its pipeline's setup running waits for it, rather than go to the driver, when it
// is large: for up to half the time the driver would take for it (at the plan's figure, or
// kAssumedDriverGBps; real pageable copies run at a third of that on the hosts measured), or, once
// the program has passed more bytes to the driver during this setup than the setup pins (a program
// that copies a lot, whose passed copies also hold the setup's driver calls back), for whatever is
// left of the budget; all the copies that wait for one setup together for at most
// kSetupWaitBudgetNs, which bounds what a setup slower than hoped can cost a program. A waiting
// copy does not hold the setup back as a passed one does (its pauses, and the driver's calls
// waiting for a passed copy's): on the H100 of 2026-12-06 a from_pretrained's 30 copies of 4-128
// MiB, 430 ms, and CuPy's two 256 MiB get()s all went to the driver while the setup ran.
// It does not wait where the setup will not be done by then at kSetupGBps (80 MiB of staging took
// 41 ms to set up, 1.9 GB/s, on the H100 host of 2026-12-06 when one thread faulted it in; 33.6 ms,
// 2.5 GB/s, on the H200 when several did, staging_ring.cpp), or at kRegisterGBps where the staging
// was faulted in ahead (staging_memory.hpp: 112 MiB registered in 6.9-7.1 ms, H100, 2026-12-07);
// nor while the staging still being faulted in ahead takes longer than its share at kSetupGBps (the
// first copies right after torch made the context came then, and the first 64 MiB device-to-host
// copy took 9.3 ms under cmt against 4.9 plain, H100, 2026-12-07).
constexpr size_t kWaitForSetupMinBytes = 4u << 20;
constexpr uint64_t kSetupWaitBudgetNs = 40'000'000;
constexpr double kAssumedDriverGBps = 12;
constexpr double kSetupGBps = 2.5;
constexpr double kRegisterGBps = 16;

// A copy's settings as the engine uses them: within the engine's limits.
size_t chunk_of(const Settings& st) { return std::clamp(static_cast<size_t>(st.chunk_bytes), kMinChunk, kMaxChunk); }
int threads_of(const Settings& st) { return static_cast<int>(std::clamp<int64_t>(st.threads, 1, kMaxThreads)); }
int buffers_of(const Settings& st) { return static_cast<int>(std::clamp<int64_t>(st.buffers, 1, kMaxBuffers)); }

struct Pipeline {
  enum State { Preparing, Ready, Failed };
  CUcontext ctx = nullptr;
  std::atomic<int> state{Preparing};  // set once by the setup thread (Engine::prepare)
  // What the setup sizes the ring and workers for: the largest rule in force, or the settings of the
  // copy that made the pipeline (CopyRequest::setup_for_these: a cmt.io transfer, which waits for
  // the setup). Pinning costs milliseconds per 16 MiB; the H200 plan's largest asks
  // for 144 MiB.
  std::optional<Settings> first;
  bool in_use = false;  // a copy runs on it (under Engine::pipelines_mutex_)
  // Recorded after the DMAs of its last host-to-device copy, which returned with DMAs still in
  // flight (under Engine::pipelines_mutex_; nullptr until the first).
  CUevent tail = nullptr;
  // What copies may still wait for its setup, in all (kSetupWaitBudgetNs; under pipelines_mutex_).
  uint64_t setup_wait_left_ns = kSetupWaitBudgetNs;
  uint64_t setup_start_ns = 0;  // when its setup began
  uint64_t setup_paused_at_start_ns = 0;  // setup_paused_ns() then
  uint64_t setup_bytes = 0;     // the staging its setup pins
  uint64_t setup_expected_ns = 0;  // how long that should take (kSetupGBps, kRegisterGBps)
  uint64_t resources_ns = 0;  // what its streams and events took to make (the debug log)
  uint64_t passed_bytes = 0;  // what its copies passed to the driver during the setup (pipelines_mutex_)
  StagingRing ring;
  DmaStreams dma;
  LanePool::Run run;
  NumaPlace place;  // the GPU's NUMA node, where its staging and workers sit (numa_place.hpp)
  Job job;

  Settings setup_settings() const { return first ? *first : active_plan().largest(); }

  // Its context ended, and the streams, events and staging it had there with it: emptied, it waits
  // to serve the next context's setup (its lane-pool run stays registered). No copy may be on it.
  void retire() {
    ring.abandon();
    dma.forget_contexts();
    tail = nullptr;
    setup_wait_left_ns = kSetupWaitBudgetNs;
    place = NumaPlace{};
    run.place = nullptr;
    state.store(Preparing, std::memory_order_relaxed);
  }
};

class Engine {
 public:
  CUresult copy(const CopyRequest& req, uint64_t* ran_ns, Pass* pass);
  bool add_run(LanePool::Run* run) { return !pool_.forgotten() && pool_.add(run); }
  void run_job(LanePool::Run& run, Job& job, int lanes) {
    InsideCmt inside;
    pool_.run(run, lanes, &Engine::lane, &job, Clock::duration{});
  }
  bool host_lanes(int lanes, LanePool::Work work, void* arg);
  void prepare_for(CUcontext ctx);
  void forget() { pool_.forget(); }
  void context_ended(CUcontext ctx);
  std::string dma_gpu_times();

 private:
  static void lane(void* job, int index);
  // The pipeline of req.ctx for this copy alone (in_use), first come first served; a context's first
  // copy makes it, its setup in the background. nullptr: the copy goes to the driver (*pass says
  // why, when the caller gave `pass`; else the pipeline could not be set up); *tail: for Pass::Busy,
  // the pipeline's `tail`, which the driver's copy must follow.
  Pipeline* claim(const CopyRequest& req, Pass* pass, CUevent* tail);
  // `tail`: recorded after the copy's DMAs, if they may still be in flight.
  void release(Pipeline* p, CUevent tail);
  // ctx's pipeline, or nullptr (a context has at most one). Under pipelines_mutex_.
  Pipeline* find(CUcontext ctx) const;
  // A new pipeline for ctx, its setup started in the background; false if the pool takes no more.
  // Under pipelines_mutex_.
  bool make(CUcontext ctx, const std::optional<Settings>& first);
  // A copy that found p's setup running: whether it waits for it (until *deadline, set on its first
  // call from what it may wait, taken from p's budget). Under pipelines_mutex_.
  static bool may_wait_for_setup(Pipeline* p, const CopyRequest& req, uint64_t* deadline);
  // Under the copy's claim: the DMA events (*res) and staging for `slots` slots of `chunk` bytes.
  // Returns the slots the copy can have: fewer when short of pinned memory; 0 if none.
  // `before_each`: runs before each buffer it pins (the setup's pause for copies passed meanwhile).
  static int fit(Pipeline* p, CUcontext ctx, int slots, size_t chunk, ContextResources** res,
                 void (*before_each)() = nullptr);
  // The setup thread: the ring, stream, events and workers for the largest rule in force (or the
  // first copy's settings).
  void prepare(Pipeline* p);

  std::mutex host_mutex_;  // held by the host copy on host_run_; others take the plain path meanwhile
  LanePool::Run host_run_;
  bool host_run_added_ = false;
  std::mutex pipelines_mutex_;  // the pipelines (never shrinks: copies hold pointers), who uses them
  std::condition_variable changed_;  // a pipeline was released or finished its setup
  std::vector<Pipeline*> pipelines_;
  // Pipelines whose context ended while none of their copies ran, emptied: the next context's
  // pipeline reuses one, and with it its lane-pool run (LanePool::kMaxRuns).
  std::vector<Pipeline*> retired_;
  // Copies waiting for their context's pipeline, by context and ticket: the earliest goes first.
  std::vector<std::pair<CUcontext, uint64_t>> waiting_;
  uint64_t tickets_ = 0;
  LanePool pool_;
  // CMT_TRACE: copies run one at a time, so that the timeline and the DMA times are one copy's.
  std::mutex trace_mutex_;
  Pipeline* traced_ = nullptr;
};

bool Engine::make(CUcontext ctx, const std::optional<Settings>& first) {
  Pipeline* p = nullptr;
  if (!retired_.empty()) {  // one whose context ended (Pipeline::retire)
    p = retired_.back();
    retired_.pop_back();
  } else {
    p = new Pipeline();
    if (!pool_.add(&p->run)) {
      delete p;
      return false;
    }
  }
  p->ctx = ctx;
  p->first = first;
  const Settings most = p->setup_settings();
  p->setup_start_ns = monotonic_ns();
  p->setup_paused_at_start_ns = setup_paused_ns();
  p->setup_bytes = static_cast<uint64_t>(buffers_of(most) + kSpareSlots) * chunk_of(most);
  const double gbps = staging_ahead().waiting ? kRegisterGBps : kSetupGBps;  // GB/s = bytes per ns
  p->setup_expected_ns = static_cast<uint64_t>(static_cast<double>(p->setup_bytes) / gbps);
  if (env().test_setup_expected_ms >= 0) {
    p->setup_expected_ns = static_cast<uint64_t>(env().test_setup_expected_ms) * 1'000'000;
  }
  p->passed_bytes = 0;
  pipelines_.push_back(p);
  setup_begins();
  std::thread([this, p] { prepare(p); }).detach();
  return true;
}

Pipeline* Engine::claim(const CopyRequest& req, Pass* pass, CUevent* tail) {
  std::unique_lock<std::mutex> lock(pipelines_mutex_);
  uint64_t ticket = 0;  // this copy's place in line once it waits
  auto leave_line = [&] {
    auto mine = std::find(waiting_.begin(), waiting_.end(), std::make_pair(req.ctx, ticket));
    if (mine != waiting_.end()) waiting_.erase(mine);
  };
  auto first_in_line = [&] {
    for (const auto& w : waiting_) {
      if (w.first == req.ctx && (ticket == 0 || w.second < ticket)) return false;
    }
    return true;
  };
  Pipeline* waited_for = nullptr;  // the pipeline whose setup this copy may wait for, until `deadline`
  uint64_t deadline = 0;
  auto give_back_wait = [&] {  // what it did not wait of its share goes back to the pipeline's budget
    const uint64_t now = monotonic_ns();
    if (waited_for && now < deadline) waited_for->setup_wait_left_ns += deadline - now;
    waited_for = nullptr;
  };
  for (;;) {
    Pipeline* p = find(req.ctx);
    if (!p) {
      std::optional<Settings> first;
      if (req.setup_for_these) first = req.settings;
      if (!make(req.ctx, first)) break;
      continue;
    }
    const int state = p->state.load(std::memory_order_acquire);
    if (state == Pipeline::Failed) break;  // the driver copies
    Pass why = Pass::No;
    if (state == Pipeline::Preparing) {
      // (CMT_TEST_HOOKS wait_setup=1: the tests' copies wait)
      if (pass && !env().test_wait_setup && !may_wait_for_setup(p, req, &deadline)) why = Pass::Warming;
      if (deadline && !waited_for) waited_for = p;
    } else if (!p->in_use && first_in_line()) {
      give_back_wait();
      leave_line();
      p->in_use = true;
      return p;
    } else if (req.bytes <= kPassWhenBusy) {
      why = Pass::Busy;
    }
    if (pass && why != Pass::No) {
      *pass = why;
      if (why == Pass::Warming) p->passed_bytes += req.bytes;
      if (why == Pass::Busy) *tail = p->tail;
      break;
    }
    if (ticket == 0) waiting_.emplace_back(req.ctx, ticket = ++tickets_);
    NotInFlight waiting;  // while it waits (for the setup, or its turn), it holds no pinning back
    const uint64_t now = monotonic_ns();
    if (state == Pipeline::Preparing && deadline) {  // its wait for the setup: never past the deadline
      if (deadline > now) changed_.wait_for(lock, std::chrono::nanoseconds(deadline - now));
    } else {
      changed_.wait(lock);
    }
  }
  give_back_wait();
  leave_line();
  changed_.notify_all();  // the next in line may go now
  return nullptr;
}

bool Engine::may_wait_for_setup(Pipeline* p, const CopyRequest& req, uint64_t* deadline) {
  const uint64_t now = monotonic_ns();
  if (*deadline) return now < *deadline;
  if (req.bytes < kWaitForSetupMinBytes || p->setup_wait_left_ns == 0) return false;
  const double gbps = req.driver_gbps > 0 ? req.driver_gbps : kAssumedDriverGBps;  // GB/s = bytes per ns
  const bool copies_a_lot = p->passed_bytes >= p->setup_bytes;
  const uint64_t share = copies_a_lot ? p->setup_wait_left_ns
      : std::min(static_cast<uint64_t>(static_cast<double>(req.bytes) / gbps / 2), p->setup_wait_left_ns);
  // The setup's progress is its time so far less what it paused for copies passed meanwhile. (The
  // first 64 MiB device-to-host copy after a context took 8 ms under cmt against 5 plain: the setup
  // had paused 5 ms for the copy before it, which the wait counted as progress; it waited its 3.4 ms
  // share for a setup not done, then went to the driver. H100, 2026-12-07.)
  const uint64_t elapsed = now - p->setup_start_ns;
  const uint64_t paused = setup_paused_ns() - p->setup_paused_at_start_ns;
  const uint64_t worked = elapsed > paused ? elapsed - paused : 0;
  uint64_t left = p->setup_expected_ns > worked ? p->setup_expected_ns - worked : 0;
  // Once it has pinned a buffer, its own pace says what is left. The driver registers more slowly
  // while the program's copies run in it: 14 x 8 MiB took 14.9 ms beside the first two passed
  // copies against 7 alone, and the device-to-host copy that came at 8.5 ms of the 7.3 expected
  // waited its 3.4 ms for nothing (8.8-10 ms against 5 plain; H100, 2026-12-07).
  const StagingRing::Progress pr = p->ring.progress();
  if (pr.pinned > 0) {
    left = static_cast<uint64_t>(pr.pins - pr.pinned) * (pr.pin_ns / static_cast<uint64_t>(pr.pinned));
  }
  if (left > share) return false;  // not done by then
  // Nor while more staging is still being faulted in ahead than can be in its share.
  if (static_cast<double>(staging_ahead().pending_bytes) / kSetupGBps > static_cast<double>(share)) return false;
  p->setup_wait_left_ns -= share;
  *deadline = now + share;
  log::debug_once(copies_a_lot ? 0x5e7b : 0x5e7a, "a large copy came while the staging was being set up%s: it "
                  "waits for it up to %.1f ms (copies may wait %.0f ms in all; the setup's work so far %.1f ms "
                  "of %.1f expected, %.1f ms paused, %d of %d buffers pinned)",
                  copies_a_lot ? ", after the program had passed more than the staging to the driver" : "",
                  static_cast<double>(share) / 1e6, static_cast<double>(kSetupWaitBudgetNs) / 1e6,
                  static_cast<double>(worked) / 1e6, static_cast<double>(p->setup_expected_ns) / 1e6,
                  static_cast<double>(paused) / 1e6, pr.pinned, pr.pins);
  return true;
}

void Engine::release(Pipeline* p, CUevent tail) {
  {
    std::lock_guard<std::mutex> lock(pipelines_mutex_);
    p->in_use = false;
    if (tail) p->tail = tail;
  }
  changed_.notify_all();
}

void Engine::prepare(Pipeline* p) {
  mark_cmt_thread();
  const Driver& d = driver();
  bool ok = d.cuCtxSetCurrent(p->ctx) == CUDA_SUCCESS;
  if (ok) {
    // Like the workers: never an unsafe call in another thread's global-mode graph capture.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    d.cuThreadExchangeStreamCaptureMode(&mode);
    CUdevice dev = 0;
    if (d.cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
      p->place = numa_place_for(dev);
      p->ring.set_device(dev, !p->place.placed());  // its staging may be faulted in ahead (staging_memory.hpp)
    }
    numa_move_setup_thread(p->place);  // before the ring: its pinned pages come from the GPU's node
    if (p->place.placed()) p->run.place = &p->place;
    const Settings most = p->setup_settings();
    // Short of pinned memory (the node's budget), the ring keeps what it got: copies use fewer slots.
    ContextResources* res = nullptr;
    const uint64_t t0 = monotonic_ns();
    if (env().test_setup_delay_us) std::this_thread::sleep_for(std::chrono::microseconds(env().test_setup_delay_us));
    ok = fit(p, p->ctx, buffers_of(most), chunk_of(most), &res, let_copies_through) > 0;  // no copy runs before it is Ready
    const uint64_t t1 = monotonic_ns();
    pool_.prestart(threads_of(most) - 1);
    log::write(log::Level::Debug, "staging pipeline set up: %d buffers of %zu bytes in %.1f ms (%d faulted in ahead; "
               "streams and events %.1f ms, pages faulted in %.1f ms, the driver's part %.1f ms; %.1f ms paused for "
               "copies passed meanwhile; done %.1f ms after it was asked for), %d workers started in %.1f ms",
               p->ring.count(), p->ring.slot_bytes(), static_cast<double>(t1 - t0) / 1e6, p->ring.reserved(),
               static_cast<double>(p->resources_ns) / 1e6, static_cast<double>(p->ring.map_ns()) / 1e6,
               static_cast<double>(p->ring.pin_ns()) / 1e6,
               static_cast<double>(setup_paused_ns() - p->setup_paused_at_start_ns) / 1e6,
               static_cast<double>(t1 - p->setup_start_ns) / 1e6, threads_of(most) - 1,
               static_cast<double>(monotonic_ns() - t1) / 1e6);
  }
  if (recording()) {  // (`cmt profile`: when copies found it still running, and for how long)
    record_copy(CopyRecord{p->setup_start_ns, monotonic_ns(), static_cast<uint64_t>(p->ring.count()) * p->ring.slot_bytes(),
                           0, ok ? 0 : 1, 0, 0, 0, 0, kSetupEntry, static_cast<uint32_t>(p->ring.count())});
  }
  {
    std::lock_guard<std::mutex> lock(pipelines_mutex_);
    p->state.store(ok ? Pipeline::Ready : Pipeline::Failed, std::memory_order_release);
  }
  setup_ends();
  changed_.notify_all();
  if (!ok) log::write(log::Level::Debug, "the staging pipeline could not be set up; copies go to the driver");
}

int Engine::fit(Pipeline* p, CUcontext ctx, int slots, size_t chunk, ContextResources** res,
                void (*before_each)()) {
  const uint64_t t0 = monotonic_ns();
  if (!(*res = p->dma.for_context(ctx, slots + kSpareSlots))) return 0;
  p->resources_ns = monotonic_ns() - t0;
  // The spares stand in for slots a late lane may still touch (job.hpp).
  if (!p->ring.ensure(slots + kSpareSlots, chunk, before_each)) {  // fewer slots, or none
    slots = std::min(slots, p->ring.count() - kSpareSlots);
    if (slots < 1 || p->ring.slot_bytes() < chunk) return 0;
  }
  return slots;
}

// Runs one lane of the job; a worker first makes the job's context current in its thread.
void Engine::lane(void* arg, int index) {
  Job& job = *static_cast<Job*>(arg);
  thread_local CUcontext current = nullptr;
  thread_local uint64_t ended_seen = 0;
  if (contexts_ended_since(&ended_seen)) current = nullptr;  // a new context may have an old handle
  // A job whose DMAs are queued on a stream already makes no driver call: no context either.
  if (index > 0 && !job.words && current != job.res->ctx) {
    const bool first = current == nullptr;
    CUresult r = driver().cuCtxSetCurrent(job.res->ctx);
    if (r != CUDA_SUCCESS) {
      CUresult expected = CUDA_SUCCESS;
      job.error.compare_exchange_strong(expected, r);
      job.next.store(job.plan.pieces, std::memory_order_relaxed);
      return;
    }
    current = job.res->ctx;
    if (first) {
      // Never count as an unsafe call in another thread's global-mode graph capture.
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      driver().cuThreadExchangeStreamCaptureMode(&mode);
    }
  }
  job.run_lane(index);
}

Pipeline* Engine::find(CUcontext ctx) const {
  for (Pipeline* q : pipelines_) {
    if (q->ctx == ctx) return q;
  }
  return nullptr;
}

void Engine::prepare_for(CUcontext ctx) {
  std::lock_guard<std::mutex> lock(pipelines_mutex_);
  if (!find(ctx)) make(ctx, std::nullopt);
}

bool Engine::host_lanes(int lanes, LanePool::Work work, void* arg) {
  if (pool_.forgotten()) return false;
  std::unique_lock<std::mutex> lock(host_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (!host_run_added_) {
    host_run_.follows_shares = false;  // a host copy's lanes do not take lanes up mid-copy (host_copy.cpp)
    if (!(host_run_added_ = pool_.add(&host_run_))) return false;
  }
  pool_.run(host_run_, lanes, work, arg, Clock::duration{});
  return true;
}

// The context is gone (the driver's call returned): its pipeline's streams, events and staging went
// with it. The pipeline leaves the list, so that a later context, which may have the same handle,
// sets up one of its own (reusing this one, emptied, where no copy held it).
void Engine::context_ended(CUcontext ctx) {
  std::vector<Pipeline*> dropped;
  std::unique_lock<std::mutex> lock(pipelines_mutex_);
  for (size_t i = 0; i < pipelines_.size(); ++i) {
    Pipeline* p = pipelines_[i];
    if (p->ctx != ctx) continue;
    // A copy still on it (the program ended the context while copying in it: the copy fails as
    // the driver's would) or its setup: they end soon, with errors; until then it stays.
    const bool idle = changed_.wait_for(lock, std::chrono::seconds(2), [&] {
      return !p->in_use && p->state.load(std::memory_order_acquire) != Pipeline::Preparing;
    });
    pipelines_.erase(pipelines_.begin() + static_cast<long>(i));
    --i;
    if (idle) {
      p->retire();
      retired_.push_back(p);
    }  // (else it is left as it is: a lane may still touch its memory)
    dropped.push_back(p);
    log::write(log::Level::Debug, "a context ended: its staging pipeline is dropped (%s)",
               idle ? "its staging unmapped" : "a copy still held it: its staging is left as it is");
  }
  lock.unlock();  // (a traced copy takes trace_mutex_ before pipelines_mutex_)
  std::lock_guard<std::mutex> traced(trace_mutex_);
  for (Pipeline* p : dropped) {
    if (traced_ == p) traced_ = nullptr;
  }
}

std::string Engine::dma_gpu_times() {
  std::lock_guard<std::mutex> lock(trace_mutex_);
  return traced_ ? traced_->dma.trace_gpu_times(traced_->job.plan.blocks) : std::string();
}

CUresult Engine::copy(const CopyRequest& req, uint64_t* ran_ns, Pass* pass) {
  InsideCmt inside;  // the lanes' own large memcpy calls are libc's (host_copy.hpp)
  const uint64_t entered = monotonic_ns();
  const Driver& d = driver();
  if (pool_.forgotten() || !d.ok) return CUDA_ERROR_NOT_READY;
  const Settings& st = req.settings;
  const size_t chunk = chunk_of(st);
  int threads = threads_of(st);
  const bool prefault = !req.end && req.dir == Direction::DtoH && prepare_fresh_destination(req.host, req.bytes);
  if (prefault) threads = std::max(threads, fresh_memory_threads());

  std::unique_lock<std::mutex> traced;
  if (timeline::enabled()) traced = std::unique_lock<std::mutex>(trace_mutex_);
  const uint64_t waits = monotonic_ns();
  CUevent tail = nullptr;
  Pipeline* p = claim(req, pass, &tail);
  if (!p && tail) {
    // A small copy for the driver while another thread's copy has the pipeline: it follows the DMAs
    // still in flight of the copies that returned before it, as it would on the pipeline (another
    // stream's copy may rely on them without saying so). If the stream cannot wait, it takes its turn.
    if (d.cuStreamWaitEvent(req.stream, tail, 0) != CUDA_SUCCESS) {
      *pass = Pass::No;
      p = claim(req, nullptr, &tail);
    }
  }
  if (!p) return CUDA_ERROR_NOT_READY;
  struct Held {
    Engine* e;
    Pipeline* p;
    CUevent tail = nullptr;
    ~Held() { e->release(p, tail); }
  } held{this, p};
  // The copy's own time: all of it but its wait for a pipeline (other threads' copies, the setup).
  // Its checks before (a fresh destination's) count, as the driver's copy counts all of its own.
  const uint64_t start = monotonic_ns() - (waits - entered);
  // The calling thread works as lane 0; keep it out of other threads' global-mode captures too.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged = d.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  struct Restore {
    const Driver& d;
    bool exchanged;
    CUstreamCaptureMode& mode;
    ~Restore() {
      if (exchanged) d.cuThreadExchangeStreamCaptureMode(&mode);
    }
  } restore{d, exchanged, mode};

  Job& j = p->job;
  p->dma.trace_forget();  // the last copy's DMA times describe its blocks, about to be replaced
  j.plan = cut_transfer(req.dir, req.bytes, chunk, threads, env().test_piece);
  // The setup sized the ring for every rule in force, or for the cmt.io transfer that made the
  // pipeline; only copies beyond that (the tuner's trials, a plan replaced since, a program's copies
  // after a cmt.io transfer) make it grow here.
  ContextResources* res = nullptr;
  const int wanted = req.max_in_flight > 0 ? std::min(buffers_of(st), req.max_in_flight) : buffers_of(st);
  const int slots = fit(p, req.ctx, static_cast<int>(std::min<size_t>(wanted, j.plan.blocks)), chunk, &res);
  if (slots < 1) return CUDA_ERROR_NOT_READY;
  const int buffers = slots + kSpareSlots;
  if (timeline::enabled()) {
    p->dma.trace_begin(res, j.plan.blocks);
    traced_ = p;
  }

  place_transfer(j.plan, p->ring.slot_bytes(), chunk, p->ring.flipped());
  HostMemory memory(req.host, req.bytes, prefault);
  j.slots = slots;
  j.buffers = buffers;
  j.streamed = st.stores == kStoresStream;
  j.device = req.device;
  j.host = req.end ? req.end : &memory;
  j.ring = &p->ring;
  j.dma = &p->dma;
  j.res = res;
  j.start();
  Clock::duration spin_tail{};
  if (req.dir == Direction::HtoD) {
    spin_tail = std::min<Clock::duration>(
        std::chrono::nanoseconds(static_cast<long>(j.last_ring_bytes() / kTailGBps)), kMaxTailSpin);
  }
  const int lanes = static_cast<int>(std::min<size_t>(threads, j.plan.pieces));
  if (timeline::enabled()) {
    timeline::begin(static_cast<int>(req.dir), req.bytes, j.plan.block_off,
                    std::vector<int>(j.plan.blocks, j.streamed ? 1 : 0), lanes);
  }
  if (req.dir == Direction::DtoH) {
    // The first round of DMAs goes out before any lane starts; lanes queue the rest.
    if (CUresult r = j.queue_first_round(); r != CUDA_SUCCESS) return r;
  }
  pool_.run(p->run, lanes, &Engine::lane, &j, spin_tail);  // returns once every lane that took part is done
  j.host = nullptr;

  CUresult err = j.error.load(std::memory_order_relaxed);
  if (req.dir == Direction::HtoD && err == CUDA_SUCCESS) {
    // Later work on the caller's stream waits for the DMAs still in flight.
    err = d.cuEventRecord(res->done, res->stream);
    if (err == CUDA_SUCCESS) held.tail = res->done;
    if (err == CUDA_SUCCESS) err = d.cuStreamWaitEvent(req.stream, res->done, 0);
  }
  if (timeline::enabled()) timeline::note(timeline::Step::CopyEnd);
  if (ran_ns) *ran_ns = monotonic_ns() - start;
  return err;
}

Engine* g_engine = nullptr;
std::once_flag g_engine_once;

}  // namespace

CUresult engine_copy(const CopyRequest& req, uint64_t* ran_ns, Pass* pass) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });  // never destroyed: workers live on
  return g_engine->copy(req, ran_ns, pass);
}

void engine_prepare(CUcontext ctx) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });
  g_engine->prepare_for(ctx);
}

bool engine_add_run(LanePool::Run* run) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });
  return g_engine->add_run(run);
}

void engine_run_job(LanePool::Run& run, Job& job, int lanes) { g_engine->run_job(run, job, lanes); }

std::string engine_dma_gpu_times() { return g_engine ? g_engine->dma_gpu_times() : std::string(); }

bool engine_host_lanes(int lanes, void (*work)(void*, int), void* arg) {
  std::call_once(g_engine_once, [] { g_engine = new Engine(); });
  return g_engine->host_lanes(lanes, work, arg);
}

void engine_context_starting(CUdevice dev) {
  const Plan& plan = active_plan();
  if (!plan.stages_device_copies()) return;
  const Settings most = plan.largest();
  staging_reserve_start(dev, buffers_of(most) + kSpareSlots, chunk_of(most));
}

void engine_forget_after_fork() {
  staging_reserve_forget_after_fork();
  if (g_engine) g_engine->forget();
}

void engine_context_ended(CUcontext ctx) {
  if (!ctx) return;
  note_context_ended(ctx);  // (its events went with it: per-thread caches start again, copy_path.cpp)
  if (g_engine) g_engine->context_ended(ctx);
}

}  // namespace cmt
