// Stand-in libcuda.so.1 for tests without a GPU ("fake driver").
//
// Host memory plays device memory, but device pointers (CUdeviceptr) live in a large PROT_NONE
// reservation, so any CPU dereference of a device pointer crashes; the bytes are kept in separate
// backing memory found through an allocation table. Every stream has a worker thread that runs its
// operations strictly in FIFO order; the legacy default stream follows the documented
// "legacy waits for blocking streams / blocking streams wait for legacy" rules. cuGetProcAddress
// emulates the real resolver and returns exactly the addresses of this library's exported symbols.
//
// After fork(): the child runs every stream operation inline in the calling thread (ignoring work
// that was pending in the parent at fork time); only pointer queries and copies are meant to be used
// there.
//
// Build: g++ -O2 -g -std=c++17 -shared -fPIC -pthread -Wl,-soname,libcuda.so.1 -I native/include
//        -o <dir>/libcuda.so.1 tests/fake_cuda/fake_cuda.cpp
#include "cmt/cuda_types.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Every exported cu* entry point: X(name). Used for call counters and the cuGetProcAddress table.
// ---------------------------------------------------------------------------------------------
#define FAKE_EXPORTS(X)                 \
  X(cuInit)                             \
  X(cuDriverGetVersion)                 \
  X(cuGetErrorString)                   \
  X(cuGetErrorName)                     \
  X(cuDeviceGet)                        \
  X(cuDeviceGetCount)                   \
  X(cuDeviceGetName)                    \
  X(cuDeviceGetAttribute)               \
  X(cuDeviceGetPCIBusId)                \
  X(cuDeviceTotalMem_v2)                \
  X(cuDevicePrimaryCtxRetain)           \
  X(cuDevicePrimaryCtxRelease_v2)       \
  X(cuDevicePrimaryCtxGetState)         \
  X(cuDevicePrimaryCtxReset_v2)         \
  X(cuCtxCreate_v2)                     \
  X(cuCtxDestroy_v2)                    \
  X(cuCtxSetCurrent)                    \
  X(cuCtxGetCurrent)                    \
  X(cuCtxPushCurrent_v2)                \
  X(cuCtxPopCurrent_v2)                 \
  X(cuCtxGetDevice)                     \
  X(cuCtxSynchronize)                   \
  X(cuCtxGetStreamPriorityRange)        \
  X(cuMemGetInfo_v2)                    \
  X(cuMemAlloc_v2)                      \
  X(cuMemFree_v2)                       \
  X(cuMemGetAddressRange_v2)            \
  X(cuMemsetD8_v2)                      \
  X(cuMemsetD8_v2_ptds)                 \
  X(cuMemsetD8Async)                    \
  X(cuMemsetD8Async_ptsz)               \
  X(cuMemHostAlloc)                     \
  X(cuMemAllocHost_v2)                  \
  X(cuMemFreeHost)                      \
  X(cuMemHostRegister_v2)               \
  X(cuMemHostUnregister)                \
  X(cuMemHostGetDevicePointer_v2)       \
  X(cuMemAllocManaged)                  \
  X(cuPointerGetAttribute)              \
  X(cuPointerGetAttributes)             \
  X(cuMemcpyHtoD_v2)                    \
  X(cuMemcpyHtoD_v2_ptds)               \
  X(cuMemcpyDtoH_v2)                    \
  X(cuMemcpyDtoH_v2_ptds)               \
  X(cuMemcpyHtoDAsync_v2)               \
  X(cuMemcpyHtoDAsync_v2_ptsz)          \
  X(cuMemcpyDtoHAsync_v2)               \
  X(cuMemcpyDtoHAsync_v2_ptsz)          \
  X(cuMemcpy)                           \
  X(cuMemcpy_ptds)                      \
  X(cuMemcpyAsync)                      \
  X(cuMemcpyAsync_ptsz)                 \
  X(cuMemcpyDtoD_v2)                    \
  X(cuMemcpyDtoD_v2_ptds)               \
  X(cuMemcpyDtoDAsync_v2)               \
  X(cuMemcpyDtoDAsync_v2_ptsz)          \
  X(cuMemcpyHtoD)                       \
  X(cuMemcpyDtoH)                       \
  X(cuMemcpyHtoDAsync)                  \
  X(cuMemcpyDtoHAsync)                  \
  X(cuStreamCreate)                     \
  X(cuStreamCreateWithPriority)         \
  X(cuStreamDestroy_v2)                 \
  X(cuStreamSynchronize)                \
  X(cuStreamSynchronize_ptsz)           \
  X(cuStreamQuery)                      \
  X(cuStreamQuery_ptsz)                 \
  X(cuStreamWaitEvent)                  \
  X(cuStreamWaitEvent_ptsz)             \
  X(cuStreamGetCtx)                     \
  X(cuStreamGetCtx_ptsz)                \
  X(cuStreamGetCtx_v2)                  \
  X(cuStreamGetCtx_v2_ptsz)             \
  X(cuStreamGetFlags)                   \
  X(cuStreamGetFlags_ptsz)              \
  X(cuLaunchHostFunc)                   \
  X(cuLaunchHostFunc_ptsz)              \
  X(cuStreamWaitValue32_v2)             \
  X(cuStreamWriteValue32_v2)            \
  X(cuStreamBatchMemOp_v2)              \
  X(cuStreamBeginCapture_v2)            \
  X(cuStreamBeginCapture_v2_ptsz)       \
  X(cuStreamEndCapture)                 \
  X(cuStreamEndCapture_ptsz)            \
  X(cuStreamIsCapturing)                \
  X(cuStreamIsCapturing_ptsz)           \
  X(cuThreadExchangeStreamCaptureMode)  \
  X(cuGraphDestroy)                     \
  X(cuEventCreate)                      \
  X(cuEventDestroy_v2)                  \
  X(cuEventRecord)                      \
  X(cuEventRecord_ptsz)                 \
  X(cuEventRecordWithFlags)             \
  X(cuEventRecordWithFlags_ptsz)        \
  X(cuEventSynchronize)                 \
  X(cuEventQuery)                       \
  X(cuEventElapsedTime)                 \
  X(cuEventElapsedTime_v2)              \
  X(cuGetProcAddress)                   \
  X(cuGetProcAddress_v2)                \
  X(cuGetProcAddress_v2_ptsz)

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Extra driver constants not in cmt/cuda_types.hpp.
constexpr CUresult kErrIllegalState = 401;            // CUDA_ERROR_ILLEGAL_STATE
constexpr CUresult kErrContextIsDestroyed = 709;      // CUDA_ERROR_CONTEXT_IS_DESTROYED
constexpr CUresult kErrHostAlreadyRegistered = 712;   // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr CUresult kErrHostNotRegistered = 713;       // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
constexpr int kDriverVersion = 13000;
constexpr size_t kDevSpan = 128ULL << 30;             // VA reserved per device
constexpr size_t kDevTotalMem = 80ULL << 30;          // reported total memory per device
constexpr size_t kAlign = 512;
constexpr int kMaxDevices = 16;

enum Idx : int {
#define FAKE_IDX(n) IDX_##n,
  FAKE_EXPORTS(FAKE_IDX)
#undef FAKE_IDX
  IDX_COUNT
};

const char* const kNames[] = {
#define FAKE_NAME(n) #n,
    FAKE_EXPORTS(FAKE_NAME)
#undef FAKE_NAME
};

std::atomic<unsigned long long> g_counts[IDX_COUNT];
#define COUNT(n) (driver_gate(), g_counts[IDX_##n].fetch_add(1, std::memory_order_relaxed))

// The real driver can hold a lock while it waits for every stream of the context: a kernel launch
// that loads its module lazily does, and other threads' driver calls then wait for it. A stream
// that waits on memory which cmt's own threads release, after driver calls of theirs, then never
// moves again (seen on the H100/H200 driver). fakecuda_launch_loading() is such a launch: while it
// waits, every driver call from another thread waits with it.
std::atomic<unsigned long long> g_loading_thread{0};  // the tid of the launch in progress, 0 if none
thread_local unsigned long long t_gate_tid = 0;
std::atomic<unsigned long long> g_gate_tids{1};
void driver_gate() {
  if (g_loading_thread.load(std::memory_order_acquire) == 0) return;
  if (!t_gate_tid) t_gate_tid = g_gate_tids.fetch_add(1);
  while (g_loading_thread.load(std::memory_order_acquire) != 0 &&
         g_loading_thread.load(std::memory_order_acquire) != t_gate_tid) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

using Clock = std::chrono::steady_clock;

struct Context;
struct Stream;
using SP = std::shared_ptr<Stream>;

struct Op {
  uint64_t seq = 0;
  std::vector<std::pair<SP, uint64_t>> prereqs;
  std::function<void()> fn;
};

enum class SKind { LEGACY, PTDS, USER };

struct Stream {
  Context* ctx = nullptr;
  SKind kind = SKind::USER;
  unsigned flags = 0;
  int priority = 0;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Op> q;
  uint64_t enq_seq = 0;   // written under ctx->mu and m
  uint64_t done_seq = 0;  // written under m
  bool closing = false;
  int cap_status = CU_STREAM_CAPTURE_STATUS_NONE;  // under ctx->mu
  bool blocking() const { return kind != SKind::USER || (flags & CU_STREAM_NON_BLOCKING) == 0; }
};

struct Context {
  int dev = 0;
  bool primary = false;
  bool alive = true;
  std::mutex mu;
  SP legacy;
  std::vector<SP> user;                       // streams created by cuStreamCreate*
  std::unordered_map<uint64_t, SP> ptds;      // per-thread default streams, by thread id
};

enum class MKind { PAGEABLE = 0, DEVICE, MANAGED, PINNED, REGISTERED };

struct Alloc {
  uintptr_t start = 0;   // the address the user sees
  size_t size = 0;       // requested size
  size_t va_len = 0;     // device VA consumed (device allocations)
  MKind kind = MKind::PAGEABLE;
  Context* ctx = nullptr;
  int dev = 0;
  unsigned long long id = 0;
  char* mem = nullptr;   // where the bytes are (backing for device, the host memory otherwise)
  size_t map_len = 0;    // >0: mem was mmapped by us
  ~Alloc() {
    if (map_len) munmap(mem, map_len);
  }
};
using AP = std::shared_ptr<Alloc>;

struct Event {
  Context* ctx = nullptr;  // where it was created (a primary context's reset destroys it)
  unsigned flags = 0;
  std::mutex m;
  bool recorded = false;
  SP stream;
  uint64_t seq = 0;
  uint64_t gen = 0;
  bool t_valid = false;
  int64_t t_ns = 0;
};
using EP = std::shared_ptr<Event>;

struct Device {
  Context* primary = nullptr;
  int retain = 0;
  uintptr_t base = 0;
  std::map<uintptr_t, size_t> free_ranges;  // device VA free list, first fit
  size_t used = 0;
};

struct Global {
  std::once_flag init_once;
  std::atomic<bool> inited{false};
  CUresult init_result = CUDA_SUCCESS;
  int ndev = 1;
  std::atomic<double> copy_gbps{0}, pageable_gbps{0};  // set at init, or by fakecuda_set_copy_gbps
  bool no_stream_memops = false;  // FAKE_CUDA_NO_STREAM_MEMOPS=1: a device that cannot wait on memory
  // FAKE_CUDA_REUSE_CONTEXTS=1: cuCtxCreate gives the handle of a destroyed context again, as a
  // real driver's allocator may (under reg_mu).
  bool reuse_contexts = false;
  std::vector<Context*> destroyed;
  double host_alloc_us = 0;  // FAKE_CUDA_HOST_ALLOC_US: pinning (alloc or register) takes time (a real driver's: ms)
  // While pinning takes that time, the driver's pageable copies wait, a MiB piece at a time, and so
  // do pointer queries: a real driver's do (H100, 2026-12-06: a first 64 MiB device-to-host copy took 80 ms, against 9 plain,
  // while another thread pinned 100 MiB of staging).
  std::mutex pin_mu;
  std::condition_variable pin_cv;
  int pinning = 0;
  // FAKE_CUDA_FIRST_PAGEABLE_US: a real driver's first pageable copy of a process also sets up its
  // own staging; here it takes this much longer.
  double first_pageable_us = 0;
  std::atomic<bool> pageable_copied{false};
  // FAKE_CUDA_EVENT_WAKE_US: cuEventSynchronize returns this long after its event completed, as a
  // thread asleep in a real driver's blocking wait wakes some time after the GPU's work is done.
  double event_wake_us = 0;
  uintptr_t va_base = 0;
  size_t va_len = 0;
  std::mutex dev_mu;  // devices' VA lists + retain counts
  std::vector<Device> devices;
  std::shared_mutex table_mu;
  std::map<uintptr_t, AP> table;  // every known allocation by start address
  std::atomic<unsigned long long> next_alloc_id{1};
  std::mutex reg_mu;  // handle registries
  std::unordered_set<Context*> contexts;
  std::unordered_map<void*, SP> streams;
  std::unordered_map<void*, EP> events;
  std::unordered_set<void*> graphs;
  std::atomic<int> live_user_streams{0};
  std::atomic<uint64_t> next_tid{1};
};

Global& G() {
  static Global* g = new Global;  // never destroyed: detached workers may outlive exit handlers
  return *g;
}

std::atomic<bool> g_child{false};  // set in the child after fork(): run ops inline

thread_local std::vector<Context*> t_ctx_stack;
thread_local uint64_t t_tid = 0;
thread_local int t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

uint64_t thread_id() {
  if (!t_tid) t_tid = G().next_tid.fetch_add(1);
  return t_tid;
}

Context* current_ctx() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// fork handling
// ---------------------------------------------------------------------------------------------
void atfork_prepare() {
  Global& g = G();
  g.reg_mu.lock();
  for (Context* c : g.contexts) c->mu.lock();
  g.dev_mu.lock();
  g.table_mu.lock();
}
void atfork_parent() {
  Global& g = G();
  g.table_mu.unlock();
  g.dev_mu.unlock();
  for (Context* c : g.contexts) c->mu.unlock();
  g.reg_mu.unlock();
}
void atfork_child() {
  // Re-create the locks instead of unlocking them: threads of the parent that were queued on them
  // leave waiter state behind that the child's lone thread would trip over.
  g_child.store(true);
  Global& g = G();
  new (&g.table_mu) std::shared_mutex;
  new (&g.dev_mu) std::mutex;
  for (Context* c : g.contexts) new (&c->mu) std::mutex;
  new (&g.reg_mu) std::mutex;
}

// ---------------------------------------------------------------------------------------------
// init
// ---------------------------------------------------------------------------------------------
double env_double(const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) return 0;
  double d = atof(v);
  return d > 0 ? d : 0;
}

void do_init() {
  Global& g = G();
  const char* nd = getenv("FAKE_CUDA_DEVICES");
  int n = nd && *nd ? atoi(nd) : 1;
  if (n < 0) n = 0;
  if (n > kMaxDevices) n = kMaxDevices;
  g.ndev = n;
  g.copy_gbps = env_double("FAKE_CUDA_COPY_GBPS");
  // Like a real driver's, copies from pageable memory are slower than the link (FAKE_CUDA_PAGEABLE_GBPS,
  // default 0.5 GB/s; 0: as fast as memcpy): cmt's guard compares its staged copies with them.
  const char* pageable = getenv("FAKE_CUDA_PAGEABLE_GBPS");
  g.pageable_gbps = pageable && *pageable ? env_double("FAKE_CUDA_PAGEABLE_GBPS") : 0.5;
  const char* memops = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
  g.no_stream_memops = memops && *memops && strcmp(memops, "0") != 0;
  const char* reuse = getenv("FAKE_CUDA_REUSE_CONTEXTS");
  g.reuse_contexts = reuse && *reuse && strcmp(reuse, "0") != 0;
  g.host_alloc_us = env_double("FAKE_CUDA_HOST_ALLOC_US");
  g.first_pageable_us = env_double("FAKE_CUDA_FIRST_PAGEABLE_US");
  g.event_wake_us = env_double("FAKE_CUDA_EVENT_WAKE_US");
  if (n == 0) {
    g.init_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  g.va_len = kDevSpan * n;
  void* va = mmap(nullptr, g.va_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (va == MAP_FAILED) {
    g.init_result = CUDA_ERROR_OUT_OF_MEMORY;
    return;
  }
  g.va_base = reinterpret_cast<uintptr_t>(va);
  g.devices.resize(n);
  for (int i = 0; i < n; ++i) {
    Device& d = g.devices[i];
    d.base = g.va_base + kDevSpan * i;
    // Start at +64 KiB so that no device pointer is ever the reservation's first byte.
    d.free_ranges[d.base + 65536] = kDevSpan - 65536;
    auto* c = new Context;
    c->dev = i;
    c->primary = true;
    d.primary = c;
    std::lock_guard<std::mutex> lk(g.reg_mu);
    g.contexts.insert(c);
  }
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  g.init_result = CUDA_SUCCESS;
}

inline bool inited() { return G().inited.load(std::memory_order_acquire); }
#define NEED_INIT() \
  do {              \
    if (!inited()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

bool ctx_valid(Context* c) {
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.reg_mu);
  return g.contexts.count(c) && c->alive;
}

// ---------------------------------------------------------------------------------------------
// streams
// ---------------------------------------------------------------------------------------------
void worker_loop(const SP& s) {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(s->m);
      s->cv.wait(lk, [&] { return !s->q.empty() || s->closing; });
      if (s->q.empty()) return;
      op = std::move(s->q.front());
      s->q.pop_front();
    }
    for (auto& p : op.prereqs) {
      Stream* o = p.first.get();
      std::unique_lock<std::mutex> lk(o->m);
      o->cv.wait(lk, [&] { return o->done_seq >= p.second; });
    }
    op.prereqs.clear();
    if (op.fn) op.fn();
    op.fn = nullptr;
    {
      std::lock_guard<std::mutex> lk(s->m);
      s->done_seq = op.seq;
    }
    s->cv.notify_all();
  }
}

SP new_stream(Context* c, SKind kind, unsigned flags, int prio) {
  auto s = std::make_shared<Stream>();
  s->ctx = c;
  s->kind = kind;
  s->flags = flags;
  s->priority = prio;
  if (!g_child.load()) std::thread([s] { worker_loop(s); }).detach();
  return s;
}

void close_stream(const SP& s) {
  if (g_child.load()) {
    s->closing = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lk(s->m);
    s->closing = true;
  }
  s->cv.notify_all();
}

// The thread's per-thread default streams are retired when the thread exits.
struct PtdsOwner {
  std::vector<Context*> ctxs;
  ~PtdsOwner() {
    if (g_child.load() || !t_tid) return;
    for (Context* c : ctxs) {
      SP s;
      {
        std::lock_guard<std::mutex> lk(c->mu);
        auto it = c->ptds.find(t_tid);
        if (it == c->ptds.end()) continue;
        s = it->second;
        c->ptds.erase(it);
      }
      close_stream(s);
    }
  }
};
thread_local PtdsOwner t_ptds_owner;

SP legacy_of(Context* c) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (!c->legacy) c->legacy = new_stream(c, SKind::LEGACY, 0, 0);
  return c->legacy;
}

SP ptds_of(Context* c) {
  uint64_t tid = thread_id();
  bool created = false;
  SP s;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    auto it = c->ptds.find(tid);
    if (it != c->ptds.end()) return it->second;
    s = new_stream(c, SKind::PTDS, 0, 0);
    c->ptds[tid] = s;
    created = true;
  }
  if (created) t_ptds_owner.ctxs.push_back(c);
  return s;
}

// Resolve a stream handle in the calling thread. per_thread: what handle 0 means.
CUresult resolve_stream(CUstream h, bool per_thread, SP& out) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == nullptr) h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    Context* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->alive) return kErrContextIsDestroyed;
    out = h == CU_STREAM_LEGACY ? legacy_of(c) : ptds_of(c);
    return CUDA_SUCCESS;
  }
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.reg_mu);
  auto it = g.streams.find(reinterpret_cast<void*>(h));
  if (it == g.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  out = it->second;
  return CUDA_SUCCESS;
}

// Streams the legacy stream synchronizes with (caller holds c->mu).
template <class F>
void for_each_blocking(Context* c, F f) {
  for (auto& s : c->user)
    if (s->blocking()) f(s);
  for (auto& kv : c->ptds) f(kv.second);
}

// Enqueue fn on s. capturable: whether the op may be recorded into a capture (otherwise a capture
// of s is invalidated and CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED returned). *seq_out = 0 when the
// op was captured (dropped) or ran inline.
CUresult enqueue(const SP& s, std::function<void()> fn, std::vector<std::pair<SP, uint64_t>> extra,
                 bool capturable, uint64_t* seq_out) {
  if (seq_out) *seq_out = 0;
  if (g_child.load()) {
    if (fn) fn();
    return CUDA_SUCCESS;
  }
  Context* c = s->ctx;
  std::lock_guard<std::mutex> lk(c->mu);
  if (!c->alive) return kErrContextIsDestroyed;
  if (s->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) {
    if (s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!capturable) {
      s->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;  // recorded into the graph; graphs are never launched here
  }
  Op op;
  op.prereqs = std::move(extra);
  if (s->kind == SKind::LEGACY) {
    bool implicit = false;
    for_each_blocking(c, [&](const SP& b) {
      if (b->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) {
        b->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        implicit = true;
      }
    });
    if (implicit) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    for_each_blocking(c, [&](const SP& b) {
      if (b->enq_seq) op.prereqs.emplace_back(b, b->enq_seq);
    });
  } else if (s->blocking() && c->legacy && c->legacy->enq_seq) {
    op.prereqs.emplace_back(c->legacy, c->legacy->enq_seq);
  }
  op.fn = std::move(fn);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> sl(s->m);
    seq = ++s->enq_seq;
    op.seq = seq;
    s->q.push_back(std::move(op));
  }
  s->cv.notify_all();
  if (seq_out) *seq_out = seq;
  return CUDA_SUCCESS;
}

void wait_done(const SP& s, uint64_t seq) {
  if (!seq || g_child.load()) return;
  std::unique_lock<std::mutex> lk(s->m);
  s->cv.wait(lk, [&] { return s->done_seq >= seq; });
}

bool is_done(const SP& s, uint64_t seq) {
  if (!seq || g_child.load()) return true;
  std::lock_guard<std::mutex> lk(s->m);
  return s->done_seq >= seq;
}

uint64_t last_seq(const SP& s) {
  if (g_child.load()) return 0;
  std::lock_guard<std::mutex> lk(s->m);
  return s->enq_seq;
}

// Capture status checks for synchronizing calls on s (sync/query).
CUresult capture_blocks_sync(const SP& s) {
  if (g_child.load()) return CUDA_SUCCESS;
  Context* c = s->ctx;
  std::lock_guard<std::mutex> lk(c->mu);
  if (s->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) {
    s->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (s->kind == SKind::LEGACY) {
    bool implicit = false;
    for_each_blocking(c, [&](const SP& b) {
      if (b->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) {
        b->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        implicit = true;
      }
    });
    if (implicit) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// memory
// ---------------------------------------------------------------------------------------------
struct Resolved {
  MKind kind = MKind::PAGEABLE;
  char* host = nullptr;  // CPU-usable address of the first byte
  AP a;
};

AP find_alloc(uintptr_t p) {
  Global& g = G();
  std::shared_lock<std::shared_mutex> lk(g.table_mu);
  auto it = g.table.upper_bound(p);
  if (it == g.table.begin()) return nullptr;
  --it;
  const AP& a = it->second;
  if (p >= a->start && p - a->start < a->size) return a;
  return nullptr;
}

bool in_device_va(uintptr_t p) {
  Global& g = G();
  return g.va_len && p >= g.va_base && p - g.va_base < g.va_len;
}

// Classify [p, p+n). A known allocation must contain the whole range; an address inside the device
// reservation that is not allocated is invalid; anything else is pageable host memory.
CUresult resolve_ptr(uintptr_t p, size_t n, Resolved& r) {
  AP a = find_alloc(p);
  if (a) {
    if (n > a->size - (p - a->start)) return CUDA_ERROR_INVALID_VALUE;
    r.kind = a->kind;
    r.host = a->mem + (p - a->start);
    r.a = std::move(a);
    return CUDA_SUCCESS;
  }
  if (in_device_va(p)) return CUDA_ERROR_INVALID_VALUE;
  if (n && p + n < p) return CUDA_ERROR_INVALID_VALUE;
  r.kind = MKind::PAGEABLE;
  r.host = reinterpret_cast<char*>(p);
  return CUDA_SUCCESS;
}

void table_insert(const AP& a) {
  Global& g = G();
  std::unique_lock<std::shared_mutex> lk(g.table_mu);
  g.table[a->start] = a;
}

char* map_bytes(size_t n, size_t* len) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t l = (n + pg - 1) / pg * pg;
  if (!l) l = pg;
  void* p = mmap(nullptr, l, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  *len = l;
  return static_cast<char*>(p);
}

CUresult alloc_host_kind(void** out, size_t n, MKind kind, Context* c) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  size_t len = 0;
  char* m = map_bytes(n, &len);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  auto a = std::make_shared<Alloc>();
  a->start = reinterpret_cast<uintptr_t>(m);
  a->size = n;
  a->kind = kind;
  a->ctx = c;
  a->dev = c->dev;
  a->id = G().next_alloc_id.fetch_add(1);
  a->mem = m;
  a->map_len = len;
  table_insert(a);
  *out = m;
  return CUDA_SUCCESS;
}

CUresult need_ctx(Context** out) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = current_ctx();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return kErrContextIsDestroyed;
  *out = c;
  return CUDA_SUCCESS;
}

// FAKE_CUDA_HOST_ALLOC_US: pinning (cuMemHostAlloc, cuMemHostRegister) takes that long, during which
// other threads' pageable copies and pointer queries wait.
void pinning_takes_time(Global& g) {
  if (g.host_alloc_us <= 0) return;
  { std::lock_guard<std::mutex> lock(g.pin_mu); ++g.pinning; }
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(g.host_alloc_us)));
  { std::lock_guard<std::mutex> lock(g.pin_mu); --g.pinning; }
  g.pin_cv.notify_all();
}

// A pageable copy's piece waits while another thread pins memory (Global::pinning).
void wait_for_pinning(Global& g) {
  std::unique_lock<std::mutex> lock(g.pin_mu);
  g.pin_cv.wait(lock, [&g] { return g.pinning == 0; });
}

void throttle(Clock::time_point start, size_t n, bool pageable) {
  Global& g = G();
  double gbps = (pageable && g.pageable_gbps > 0) ? g.pageable_gbps : g.copy_gbps;
  if (pageable && g.first_pageable_us > 0 && !g.pageable_copied.exchange(true)) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(g.first_pageable_us)));
  }
  if (pageable && g.host_alloc_us > 0) {
    constexpr size_t kPiece = size_t(1) << 20;
    for (size_t done = 0; done < n; done += kPiece) {
      wait_for_pinning(g);
      if (gbps > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<int64_t>(std::min(kPiece, n - done) / gbps)));
    }
    return;
  }
  if (gbps <= 0) return;
  auto dur = std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(n) / gbps));
  std::this_thread::sleep_until(start + dur);
}

enum class Dir { HTOD, DTOH, DTOD, ANY };

// The core of every copy entry point.
CUresult do_copy(uintptr_t dst, uintptr_t src, size_t n, CUstream h, bool per_thread, bool sync_entry,
                 Dir dir) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  if (n == 0) return CUDA_SUCCESS;
  Resolved d, sr;
  if ((rc = resolve_ptr(dst, n, d))) return rc;
  if ((rc = resolve_ptr(src, n, sr))) return rc;
  if ((dir == Dir::HTOD || dir == Dir::DTOD) && d.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  if ((dir == Dir::DTOH || dir == Dir::DTOD) && sr.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  bool pageable = d.kind == MKind::PAGEABLE || sr.kind == MKind::PAGEABLE;
  char* dp = d.host;
  const char* sp = sr.host;
  AP keep1 = d.a, keep2 = sr.a;
  uint64_t seq = 0;
  rc = enqueue(
      s,
      [dp, sp, n, pageable, keep1, keep2] {
        auto t0 = Clock::now();
        memmove(dp, sp, n);
        throttle(t0, n, pageable);
      },
      {}, !pageable && !sync_entry, &seq);
  if (rc) return rc;
  if (sync_entry || pageable) wait_done(s, seq);
  return CUDA_SUCCESS;
}

CUresult do_memset(CUdeviceptr dst, unsigned char v, size_t n, CUstream h, bool per_thread, bool sync) {
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  if (!n) return CUDA_SUCCESS;
  Resolved d;
  if ((rc = resolve_ptr(dst, n, d))) return rc;
  if (d.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  char* dp = d.host;
  AP keep = d.a;
  uint64_t seq = 0;
  rc = enqueue(s, [dp, v, n, keep] { memset(dp, v, n); }, {}, !sync, &seq);
  if (rc) return rc;
  if (sync) wait_done(s, seq);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// pointer attributes
// ---------------------------------------------------------------------------------------------
size_t attr_size(int attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: return sizeof(void*);
    case 7: return sizeof(unsigned long long);  // BUFFER_ID
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return sizeof(size_t);
    default: return 0;
  }
}

// Write attribute attr of p (a: its allocation, or null for unknown memory). strict: the
// cuPointerGetAttribute flavour (errors for unknown pointers / inapplicable attributes).
CUresult write_attr(int attr, void* data, uintptr_t p, const Alloc* a, bool strict) {
  size_t sz = attr_size(attr);
  if (!sz || !data) return CUDA_ERROR_INVALID_VALUE;
  if (!a) {
    if (strict) return CUDA_ERROR_INVALID_VALUE;
    memset(data, 0, sz);
    return CUDA_SUCCESS;
  }
  bool host_kind = a->kind == MKind::PINNED || a->kind == MKind::REGISTERED;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: {
      CUcontext c = reinterpret_cast<CUcontext>(a->ctx);
      memcpy(data, &c, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
      unsigned int t = host_kind ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      memcpy(data, &t, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: {
      CUdeviceptr v = p;
      memcpy(data, &v, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: {
      if (a->kind == MKind::DEVICE) {
        if (strict) return CUDA_ERROR_INVALID_VALUE;
        memset(data, 0, sz);
      } else {
        void* v = reinterpret_cast<void*>(p);
        memcpy(data, &v, sz);
      }
      break;
    }
    case 7: {
      unsigned long long v = a->id;
      memcpy(data, &v, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: {
      unsigned int v = a->kind == MKind::MANAGED ? 1 : 0;
      memcpy(data, &v, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: {
      int v = a->dev;
      memcpy(data, &v, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
      CUdeviceptr v = a->start;
      memcpy(data, &v, sz);
      break;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      size_t v = a->size;
      memcpy(data, &v, sz);
      break;
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// events
// ---------------------------------------------------------------------------------------------
CUresult find_event(CUevent h, EP& out) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.reg_mu);
  auto it = g.events.find(reinterpret_cast<void*>(h));
  if (it == g.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  out = it->second;
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent he, CUstream hs, bool per_thread) {
  EP e;
  CUresult rc = find_event(he, e);
  if (rc) return rc;
  SP s;
  if ((rc = resolve_stream(hs, per_thread, s))) return rc;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(e->m);
    gen = ++e->gen;
    e->t_valid = false;
  }
  bool timing = !(e->flags & CU_EVENT_DISABLE_TIMING);
  uint64_t seq = 0;
  rc = enqueue(
      s,
      [e, gen, timing] {
        int64_t t = now_ns();
        std::lock_guard<std::mutex> lk(e->m);
        if (e->gen == gen) {
          e->t_ns = t;
          e->t_valid = timing;
        }
      },
      {}, true, &seq);
  if (rc) return rc;
  std::lock_guard<std::mutex> lk(e->m);
  if (e->gen == gen) {  // the op itself sets the timestamp when it runs (inline in a fork child)
    e->recorded = true;
    e->stream = s;
    e->seq = seq;
  }
  return CUDA_SUCCESS;
}

CUresult event_snapshot(const EP& e, SP& s, uint64_t& seq, bool& recorded) {
  std::lock_guard<std::mutex> lk(e->m);
  s = e->stream;
  seq = e->seq;
  recorded = e->recorded;
  return CUDA_SUCCESS;
}

CUresult stream_wait_event(CUstream hs, CUevent he, bool per_thread) {
  SP s;
  CUresult rc = resolve_stream(hs, per_thread, s);
  if (rc) return rc;
  EP e;
  if ((rc = find_event(he, e))) return rc;
  SP es;
  uint64_t seq;
  bool recorded;
  event_snapshot(e, es, seq, recorded);
  std::vector<std::pair<SP, uint64_t>> extra;
  if (recorded && seq) extra.emplace_back(es, seq);
  return enqueue(s, nullptr, std::move(extra), true, nullptr);
}

CUresult elapsed(float* ms, CUevent a, CUevent b) {
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  EP ea, eb;
  CUresult rc = find_event(a, ea);
  if (rc) return rc;
  if ((rc = find_event(b, eb))) return rc;
  SP sa, sb;
  uint64_t qa, qb;
  bool ra, rb;
  event_snapshot(ea, sa, qa, ra);
  event_snapshot(eb, sb, qb, rb);
  if (!ra || !rb) return CUDA_ERROR_INVALID_HANDLE;
  if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!is_done(sa, qa) || !is_done(sb, qb)) return CUDA_ERROR_NOT_READY;
  int64_t ta, tb;
  bool va, vb;
  {
    std::lock_guard<std::mutex> lk(ea->m);
    ta = ea->t_ns;
    va = ea->t_valid;
  }
  {
    std::lock_guard<std::mutex> lk(eb->m);
    tb = eb->t_ns;
    vb = eb->t_valid;
  }
  if (!va || !vb) return CUDA_ERROR_INVALID_HANDLE;
  *ms = static_cast<float>(static_cast<double>(tb - ta) / 1e6);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// stream helpers used by the entry points
// ---------------------------------------------------------------------------------------------
CUresult stream_sync(CUstream h, bool per_thread) {
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  if ((rc = capture_blocks_sync(s))) return rc;
  wait_done(s, last_seq(s));
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream h, bool per_thread) {
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  if ((rc = capture_blocks_sync(s))) return rc;
  return is_done(s, last_seq(s)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult stream_get_ctx(CUstream h, CUcontext* pctx, bool per_thread) {
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  *pctx = reinterpret_cast<CUcontext>(s->ctx);
  return CUDA_SUCCESS;
}

CUresult stream_get_flags(CUstream h, unsigned* flags, bool per_thread) {
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  *flags = s->flags;
  return CUDA_SUCCESS;
}

CUresult launch_host_func(CUstream h, void (*fn)(void*), void* ud, bool per_thread) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  return enqueue(s, [fn, ud] { fn(ud); }, {}, true, nullptr);
}

// cuStreamWaitValue32_v2: the stream's later work waits until the 32-bit word at addr (pinned,
// registered or device memory) meets the condition; the stream's worker polls it.
CUresult wait_value32(CUstream h, CUdeviceptr addr, uint32_t value, unsigned flags) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (G().no_stream_memops) return CUDA_ERROR_NOT_SUPPORTED;
  SP s;
  CUresult rc = resolve_stream(h, false, s);
  if (rc) return rc;
  Resolved r;
  if ((rc = resolve_ptr(addr, sizeof(uint32_t), r))) return rc;
  if (r.kind == MKind::PAGEABLE || r.kind == MKind::MANAGED || addr % sizeof(uint32_t)) return CUDA_ERROR_INVALID_VALUE;
  const unsigned cond = flags & ~(1u << 30);  // CU_STREAM_WAIT_VALUE_FLUSH changes nothing here
  if (cond > 3) return CUDA_ERROR_INVALID_VALUE;
  auto* word = reinterpret_cast<uint32_t*>(r.host);
  AP keep = r.a;
  return enqueue(
      s,
      [word, value, cond, keep] {
        for (;;) {
          const uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
          const bool met = cond == 0   ? static_cast<int32_t>(v - value) >= 0  // GEQ, cyclic
                           : cond == 1 ? v == value                            // EQ
                           : cond == 2 ? (v & value) != 0                      // AND
                                       : ~(v | value) != 0;                    // NOR
          if (met) return;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      },
      {}, true, nullptr);
}

// cuStreamWriteValue32_v2: once the stream's earlier work is done, the 32-bit word at addr (pinned,
// registered or device memory) is set to value.
CUresult write_value32(CUstream h, CUdeviceptr addr, uint32_t value, unsigned flags) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (G().no_stream_memops) return CUDA_ERROR_NOT_SUPPORTED;
  SP s;
  CUresult rc = resolve_stream(h, false, s);
  if (rc) return rc;
  Resolved r;
  if ((rc = resolve_ptr(addr, sizeof(uint32_t), r))) return rc;
  if (r.kind == MKind::PAGEABLE || r.kind == MKind::MANAGED || addr % sizeof(uint32_t) || flags > 1) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* word = reinterpret_cast<uint32_t*>(r.host);
  AP keep = r.a;
  return enqueue(s, [word, value, keep] { __atomic_store_n(word, value, __ATOMIC_RELEASE); }, {}, true, nullptr);
}

// cuStreamBatchMemOp_v2: 32-bit waits and writes (cuda.h's CUstreamBatchMemOpParams, 48 bytes
// each), queued in order. Other operations, or a bad one, queue none of them.
struct BatchMemOp {
  unsigned operation;
  CUdeviceptr address;
  uint64_t value;
  unsigned flags;
  CUdeviceptr alias;
  uint64_t pad[1];
};
static_assert(sizeof(BatchMemOp) == 48, "cuda.h's CUstreamBatchMemOpParams");

CUresult batch_mem_op(CUstream h, unsigned count, const BatchMemOp* ops, unsigned flags) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (G().no_stream_memops) return CUDA_ERROR_NOT_SUPPORTED;
  if (!ops || count == 0 || count > 256 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    if (ops[i].operation != 1 && ops[i].operation != 2) return CUDA_ERROR_NOT_SUPPORTED;
    Resolved r;
    if (CUresult rc = resolve_ptr(ops[i].address, sizeof(uint32_t), r)) return rc;
    if (r.kind == MKind::PAGEABLE || r.kind == MKind::MANAGED || ops[i].address % sizeof(uint32_t)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    const auto value = static_cast<uint32_t>(ops[i].value);
    CUresult rc = ops[i].operation == 1 ? wait_value32(h, ops[i].address, value, ops[i].flags)
                                        : write_value32(h, ops[i].address, value, ops[i].flags);
    if (rc) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult begin_capture(CUstream h, int mode, bool per_thread) {
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
  if (s->kind == SKind::LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::lock_guard<std::mutex> lk(s->ctx->mu);
  if (s->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) return kErrIllegalState;
  s->cap_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult end_capture(CUstream h, void** graph, bool per_thread) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  int st;
  {
    std::lock_guard<std::mutex> lk(s->ctx->mu);
    st = s->cap_status;
    s->cap_status = CU_STREAM_CAPTURE_STATUS_NONE;
  }
  if (st == CU_STREAM_CAPTURE_STATUS_NONE) return kErrIllegalState;
  if (st == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  void* gph = malloc(16);
  {
    std::lock_guard<std::mutex> lk(G().reg_mu);
    G().graphs.insert(gph);
  }
  *graph = gph;
  return CUDA_SUCCESS;
}

CUresult is_capturing(CUstream h, CUstreamCaptureStatus* st, bool per_thread) {
  if (!st) return CUDA_ERROR_INVALID_VALUE;
  SP s;
  CUresult rc = resolve_stream(h, per_thread, s);
  if (rc) return rc;
  std::lock_guard<std::mutex> lk(s->ctx->mu);
  if (s->kind == SKind::LEGACY) {
    bool any = false;
    for_each_blocking(s->ctx, [&](const SP& b) {
      if (b->cap_status != CU_STREAM_CAPTURE_STATUS_NONE) any = true;
    });
    if (any) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  *st = static_cast<CUstreamCaptureStatus>(s->cap_status);
  return CUDA_SUCCESS;
}

CUresult ctx_sync(Context* c) {
  std::vector<std::pair<SP, uint64_t>> waits;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    auto add = [&](const SP& s) {
      if (s) waits.emplace_back(s, s->enq_seq);
    };
    add(c->legacy);
    for (auto& s : c->user) add(s);
    for (auto& kv : c->ptds) add(kv.second);
  }
  for (auto& w : waits) wait_done(w.first, w.second);
  return CUDA_SUCCESS;
}

const char* err_name(CUresult e) {
  switch (e) {
    case 0: return "CUDA_SUCCESS";
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 4: return "CUDA_ERROR_DEINITIALIZED";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    case 400: return "CUDA_ERROR_INVALID_HANDLE";
    case 401: return "CUDA_ERROR_ILLEGAL_STATE";
    case 500: return "CUDA_ERROR_NOT_FOUND";
    case 600: return "CUDA_ERROR_NOT_READY";
    case 708: return "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE";
    case 709: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case 712: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case 713: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    case 801: return "CUDA_ERROR_NOT_SUPPORTED";
    case 900: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case 901: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case 903: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case 906: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case 908: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}
const char* err_string(CUresult e) {
  switch (e) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 3: return "initialization error";
    case 4: return "driver shutting down";
    case 100: return "no CUDA-capable device is detected";
    case 101: return "invalid device ordinal";
    case 201: return "invalid device context";
    case 400: return "invalid resource handle";
    case 401: return "the operation cannot be performed in the present state";
    case 500: return "named symbol not found";
    case 600: return "device not ready";
    case 708: return "primary context active";
    case 709: return "context is destroyed";
    case 712: return "part or all of the requested memory range is already mapped";
    case 713: return "pointer does not correspond to a registered memory region";
    case 801: return "operation not supported";
    case 900: return "operation not permitted when stream is capturing";
    case 901: return "operation failed due to a previous error during capture";
    case 903: return "capture was not initiated in this stream";
    case 906: return "operation would make the legacy stream depend on a capturing blocking stream";
    case 908: return "attempt to terminate a thread-local capture sequence from another thread";
    case 999: return "unknown error";
    default: return nullptr;
  }
}

}  // namespace

// =============================================================================================
// Exported entry points
// =============================================================================================
FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  COUNT(cuInit);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Global& g = G();
  std::call_once(g.init_once, [&] {
    do_init();
    if (g.init_result == CUDA_SUCCESS) g.inited.store(true, std::memory_order_release);
  });
  return g.init_result;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* v) {
  COUNT(cuDriverGetVersion);
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = kDriverVersion;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult e, const char** s) {
  COUNT(cuGetErrorString);
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = err_string(e);
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult e, const char** s) {
  COUNT(cuGetErrorName);
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = err_name(e);
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#define CHECK_DEV(d)                                      \
  do {                                                    \
    if ((d) < 0 || (d) >= G().ndev) return CUDA_ERROR_INVALID_DEVICE; \
  } while (0)

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  COUNT(cuDeviceGet);
  NEED_INIT();
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(ordinal);
  *d = ordinal;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  COUNT(cuDeviceGetCount);
  NEED_INIT();
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = G().ndev;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  COUNT(cuDeviceGetName);
  NEED_INIT();
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  snprintf(name, static_cast<size_t>(len), "%s", "Fake CUDA Device");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int* pi, int attrib, CUdevice d) {
  COUNT(cuDeviceGetAttribute);
  NEED_INIT();
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  int v = 0;
  switch (attrib) {
    case 1: v = 1024; break;        // MAX_THREADS_PER_BLOCK
    case 2: v = 1024; break;        // MAX_BLOCK_DIM_X
    case 3: v = 1024; break;
    case 4: v = 64; break;
    case 5: v = 2147483647; break;  // MAX_GRID_DIM_X
    case 6: v = 65535; break;
    case 7: v = 65535; break;
    case 8: v = 49152; break;       // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: v = 65536; break;       // TOTAL_CONSTANT_MEMORY
    case 10: v = 32; break;         // WARP_SIZE
    case 11: v = 2147483647; break; // MAX_PITCH
    case 12: v = 65536; break;      // MAX_REGISTERS_PER_BLOCK
    case 13: v = 1980000; break;    // CLOCK_RATE
    case 14: v = 512; break;        // TEXTURE_ALIGNMENT
    case 15: v = 1; break;          // GPU_OVERLAP
    case 16: v = 132; break;        // MULTIPROCESSOR_COUNT
    case 19: v = 1; break;          // CAN_MAP_HOST_MEMORY
    case 31: v = 1; break;          // CONCURRENT_KERNELS
    case 32: v = 1; break;          // ECC_ENABLED
    case 33: v = 0x10 + d; break;   // PCI_BUS_ID
    case 36: v = 2619000; break;    // MEMORY_CLOCK_RATE
    case 37: v = 5120; break;       // GLOBAL_MEMORY_BUS_WIDTH
    case 38: v = 52428800; break;   // L2_CACHE_SIZE
    case 39: v = 2048; break;       // MAX_THREADS_PER_MULTIPROCESSOR
    case 40: v = 3; break;          // ASYNC_ENGINE_COUNT
    case 41: v = 1; break;          // UNIFIED_ADDRESSING
    case 75: v = 9; break;          // COMPUTE_CAPABILITY_MAJOR
    case 76: v = 0; break;          // COMPUTE_CAPABILITY_MINOR
    case 83: v = 1; break;          // MANAGED_MEMORY
    case 89: v = 1; break;          // CONCURRENT_MANAGED_ACCESS
    default: v = 0; break;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char* buf, int len, CUdevice d) {
  COUNT(cuDeviceGetPCIBusId);
  NEED_INIT();
  if (!buf || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  snprintf(buf, static_cast<size_t>(len), "00000000:%02X:00.0", 0x10 + d);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  COUNT(cuDeviceTotalMem_v2);
  NEED_INIT();
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  *bytes = kDevTotalMem;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice d) {
  COUNT(cuDevicePrimaryCtxRetain);
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.dev_mu);
  g.devices[d].retain++;
  *pctx = reinterpret_cast<CUcontext>(g.devices[d].primary);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  COUNT(cuDevicePrimaryCtxRelease_v2);
  NEED_INIT();
  CHECK_DEV(d);
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.dev_mu);
  if (g.devices[d].retain <= 0) return kErrIllegalState;
  g.devices[d].retain--;  // the context itself stays usable (simplification)
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  COUNT(cuDevicePrimaryCtxGetState);
  NEED_INIT();
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.dev_mu);
  *flags = 0;
  *active = g.devices[d].retain > 0;
  return CUDA_SUCCESS;
}

namespace {
// The context's streams, taken from it (with its legacy stream when the context itself ends).
std::vector<SP> take_streams(Context* c, bool ending) {
  std::vector<SP> streams;
  std::lock_guard<std::mutex> lk(c->mu);
  if (ending) {
    c->alive = false;
    if (c->legacy) streams.push_back(c->legacy);
    c->legacy = nullptr;  // (made again on first use, should the handle be given again)
  }
  for (auto& s : c->user) streams.push_back(s);
  for (auto& kv : c->ptds) streams.push_back(kv.second);
  c->user.clear();
  c->ptds.clear();
  return streams;
}
// Their handles are no longer valid (under reg_mu).
void forget_streams(Global& g, const std::vector<SP>& streams) {
  for (auto& s : streams) {
    if (g.streams.erase(s.get())) g.live_user_streams.fetch_sub(1);
  }
}
}  // namespace

FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice d) {
  COUNT(cuCtxCreate_v2);
  (void)flags;
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  CHECK_DEV(d);
  Context* c = nullptr;
  {
    std::lock_guard<std::mutex> lk(G().reg_mu);
    if (!G().destroyed.empty()) {
      c = G().destroyed.back();
      G().destroyed.pop_back();
      c->alive = true;
    } else {
      c = new Context;
    }
    c->dev = d;
    G().contexts.insert(c);
  }
  t_ctx_stack.push_back(c);
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext h) {
  COUNT(cuCtxDestroy_v2);
  NEED_INIT();
  auto* c = reinterpret_cast<Context*>(h);
  Global& g = G();
  {
    std::lock_guard<std::mutex> lk(g.reg_mu);
    if (!c || !g.contexts.count(c) || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  }
  ctx_sync(c);
  std::vector<SP> streams = take_streams(c, /*ending=*/true);
  {
    std::lock_guard<std::mutex> lk(g.reg_mu);
    forget_streams(g, streams);
    g.contexts.erase(c);  // the object itself is leaked on purpose (stale handles stay harmless)
    if (g.reuse_contexts) g.destroyed.push_back(c);
  }
  for (auto& s : streams) close_stream(s);
  if (!t_ctx_stack.empty() && t_ctx_stack.back() == c) t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext h) {
  COUNT(cuCtxSetCurrent);
  NEED_INIT();
  auto* c = reinterpret_cast<Context*>(h);
  if (!c) {
    if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx_stack.empty()) t_ctx_stack.push_back(c);
  else t_ctx_stack.back() = c;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  COUNT(cuCtxGetCurrent);
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current_ctx());
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext h) {
  COUNT(cuCtxPushCurrent_v2);
  NEED_INIT();
  auto* c = reinterpret_cast<Context*>(h);
  if (!c || !ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
  t_ctx_stack.push_back(c);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  COUNT(cuCtxPopCurrent_v2);
  NEED_INIT();
  if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(t_ctx_stack.back());
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  COUNT(cuCtxGetDevice);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  *d = c->dev;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void) {
  COUNT(cuCtxSynchronize);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  return ctx_sync(c);
}

FAKE_EXPORT CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  COUNT(cuCtxGetStreamPriorityRange);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total) {
  COUNT(cuMemGetInfo_v2);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.dev_mu);
  size_t used = g.devices[c->dev].used;
  if (free_b) *free_b = kDevTotalMem - used;
  if (total) *total = kDevTotalMem;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t n) {
  COUNT(cuMemAlloc_v2);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!dptr || !n) return CUDA_ERROR_INVALID_VALUE;
  Global& g = G();
  size_t va_len = (n + kAlign - 1) / kAlign * kAlign + kAlign;  // + a gap between allocations
  if (va_len < n) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t addr = 0;
  {
    std::lock_guard<std::mutex> lk(g.dev_mu);
    Device& d = g.devices[c->dev];
    if (n > kDevTotalMem - d.used) return CUDA_ERROR_OUT_OF_MEMORY;
    for (auto it = d.free_ranges.begin(); it != d.free_ranges.end(); ++it) {
      if (it->second >= va_len) {
        addr = it->first;
        size_t rest = it->second - va_len;
        d.free_ranges.erase(it);
        if (rest) d.free_ranges[addr + va_len] = rest;
        break;
      }
    }
    if (!addr) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += n;
  }
  size_t len = 0;
  char* m = map_bytes(n, &len);
  auto a = std::make_shared<Alloc>();
  a->start = addr;
  a->size = n;
  a->va_len = va_len;
  a->kind = MKind::DEVICE;
  a->ctx = c;
  a->dev = c->dev;
  a->id = g.next_alloc_id.fetch_add(1);
  a->mem = m;
  a->map_len = m ? len : 0;
  if (!m) {
    std::lock_guard<std::mutex> lk(g.dev_mu);
    g.devices[c->dev].free_ranges[addr] = va_len;
    g.devices[c->dev].used -= n;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  table_insert(a);
  *dptr = addr;
  return CUDA_SUCCESS;
}

namespace {
// Remove the allocation that starts exactly at p and has one of the kinds; returns it or null.
AP table_remove(uintptr_t p, std::initializer_list<MKind> kinds) {
  Global& g = G();
  std::unique_lock<std::shared_mutex> lk(g.table_mu);
  auto it = g.table.find(p);
  if (it == g.table.end()) return nullptr;
  if (std::find(kinds.begin(), kinds.end(), it->second->kind) == kinds.end()) return nullptr;
  AP a = it->second;
  g.table.erase(it);
  return a;
}
}  // namespace

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  COUNT(cuMemFree_v2);
  NEED_INIT();
  if (!p) return CUDA_SUCCESS;
  AP a = table_remove(p, {MKind::DEVICE, MKind::MANAGED});
  if (!a) return CUDA_ERROR_INVALID_VALUE;
  if (a->kind == MKind::DEVICE) {
    Global& g = G();
    std::lock_guard<std::mutex> lk(g.dev_mu);
    Device& d = g.devices[a->dev];
    d.used -= a->size;
    uintptr_t s = a->start;
    size_t l = a->va_len;
    auto nx = d.free_ranges.lower_bound(s);
    if (nx != d.free_ranges.end() && s + l == nx->first) {
      l += nx->second;
      nx = d.free_ranges.erase(nx);
    }
    if (nx != d.free_ranges.begin()) {
      auto pv = std::prev(nx);
      if (pv->first + pv->second == s) {
        pv->second += l;
        return CUDA_SUCCESS;
      }
    }
    d.free_ranges[s] = l;
  }
  return CUDA_SUCCESS;  // backing memory goes when the last in-flight op lets go of it
}

FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  COUNT(cuMemGetAddressRange_v2);
  NEED_INIT();
  AP a = find_alloc(p);
  if (!a) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = a->start;
  if (size) *size = a->size;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  COUNT(cuMemsetD8_v2);
  return do_memset(d, v, n, nullptr, false, true);
}
FAKE_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) {
  COUNT(cuMemsetD8_v2_ptds);
  return do_memset(d, v, n, nullptr, true, true);
}
FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  COUNT(cuMemsetD8Async);
  return do_memset(d, v, n, s, false, false);
}
FAKE_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  COUNT(cuMemsetD8Async_ptsz);
  return do_memset(d, v, n, s, true, false);
}

FAKE_EXPORT CUresult cuMemHostAlloc(void** pp, size_t n, unsigned int flags) {
  COUNT(cuMemHostAlloc);
  (void)flags;
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  pinning_takes_time(G());
  return alloc_host_kind(pp, n, MKind::PINNED, c);
}

FAKE_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t n) {
  COUNT(cuMemAllocHost_v2);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  return alloc_host_kind(pp, n, MKind::PINNED, c);
}

FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  COUNT(cuMemFreeHost);
  NEED_INIT();
  if (!p) return CUDA_SUCCESS;
  AP a = table_remove(reinterpret_cast<uintptr_t>(p), {MKind::PINNED});
  return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t n, unsigned int flags) {
  COUNT(cuMemHostRegister_v2);
  (void)flags;
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t s = reinterpret_cast<uintptr_t>(p);
  if (in_device_va(s)) return CUDA_ERROR_INVALID_VALUE;
  pinning_takes_time(G());
  Global& g = G();
  std::unique_lock<std::shared_mutex> lk(g.table_mu);
  auto it = g.table.lower_bound(s);
  if (it != g.table.end() && it->first < s + n) return kErrHostAlreadyRegistered;
  if (it != g.table.begin()) {
    auto pv = std::prev(it);
    if (pv->second->start + pv->second->size > s) return kErrHostAlreadyRegistered;
  }
  auto a = std::make_shared<Alloc>();
  a->start = s;
  a->size = n;
  a->kind = MKind::REGISTERED;
  a->ctx = c;
  a->dev = c->dev;
  a->id = g.next_alloc_id.fetch_add(1);
  a->mem = static_cast<char*>(p);
  g.table[s] = a;
  return CUDA_SUCCESS;
}

// cudaDeviceReset's driver call: every stream, event and allocation of the device's primary context
// is destroyed (pinned host memory freed, registrations of host memory undone). A real driver's
// destroys the context, and the next retain makes a new one under the same handle (H100, driver
// 580); here the context simply goes on under it. A library that kept objects of it finds them gone.
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  COUNT(cuDevicePrimaryCtxReset_v2);
  NEED_INIT();
  CHECK_DEV(d);
  Global& g = G();
  Context* c = g.devices[d].primary;
  ctx_sync(c);
  std::vector<SP> streams = take_streams(c, /*ending=*/false);
  {
    std::lock_guard<std::mutex> lk(g.reg_mu);
    forget_streams(g, streams);
    for (auto it = g.events.begin(); it != g.events.end();) it = it->second->ctx == c ? g.events.erase(it) : std::next(it);
  }
  for (auto& s : streams) close_stream(s);
  std::vector<std::pair<uintptr_t, MKind>> gone;
  {
    std::shared_lock<std::shared_mutex> lk(g.table_mu);
    for (auto& kv : g.table) {
      if (kv.second->ctx == c) gone.emplace_back(kv.first, kv.second->kind);
    }
  }
  for (auto& [start, kind] : gone) {
    if (kind == MKind::DEVICE || kind == MKind::MANAGED) cuMemFree_v2(start);
    else table_remove(start, {kind});
  }
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostUnregister(void* p) {
  COUNT(cuMemHostUnregister);
  NEED_INIT();
  AP a = table_remove(reinterpret_cast<uintptr_t>(p), {MKind::REGISTERED});
  return a ? CUDA_SUCCESS : kErrHostNotRegistered;
}

FAKE_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  COUNT(cuMemHostGetDevicePointer_v2);
  NEED_INIT();
  if (!dptr || flags) return CUDA_ERROR_INVALID_VALUE;
  AP a = find_alloc(reinterpret_cast<uintptr_t>(p));
  if (!a || (a->kind != MKind::PINNED && a->kind != MKind::REGISTERED)) return CUDA_ERROR_INVALID_VALUE;
  *dptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t n, unsigned int flags) {
  COUNT(cuMemAllocManaged);
  (void)flags;
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  rc = alloc_host_kind(&p, n, MKind::MANAGED, c);
  if (rc) return rc;
  *dptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuPointerGetAttribute(void* data, int attr, CUdeviceptr p) {
  COUNT(cuPointerGetAttribute);
  NEED_INIT();
  AP a = find_alloc(p);
  return write_attr(attr, data, p, a.get(), true);
}

FAKE_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attrs, void** data,
                                            CUdeviceptr p) {
  COUNT(cuPointerGetAttributes);
  NEED_INIT();
  if (G().host_alloc_us > 0) wait_for_pinning(G());  // a real driver's query waits too (cmt's checks)
  if (count && (!attrs || !data)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i)
    if (!attr_size(attrs[i]) || !data[i]) return CUDA_ERROR_INVALID_VALUE;
  AP a = find_alloc(p);
  for (unsigned i = 0; i < count; ++i) {
    CUresult rc = write_attr(attrs[i], data[i], p, a.get(), false);
    if (rc) return rc;
  }
  return CUDA_SUCCESS;
}

// ---- copies -------------------------------------------------------------------------------
#define U(p) reinterpret_cast<uintptr_t>(p)
FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  COUNT(cuMemcpyHtoD_v2);
  return do_copy(dst, U(src), n, nullptr, false, true, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  COUNT(cuMemcpyHtoD_v2_ptds);
  return do_copy(dst, U(src), n, nullptr, true, true, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpyDtoH_v2);
  return do_copy(U(dst), src, n, nullptr, false, true, Dir::DTOH);
}
FAKE_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpyDtoH_v2_ptds);
  return do_copy(U(dst), src, n, nullptr, true, true, Dir::DTOH);
}
FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  COUNT(cuMemcpyHtoDAsync_v2);
  return do_copy(dst, U(src), n, s, false, false, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  COUNT(cuMemcpyHtoDAsync_v2_ptsz);
  return do_copy(dst, U(src), n, s, true, false, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyDtoHAsync_v2);
  return do_copy(U(dst), src, n, s, false, false, Dir::DTOH);
}
FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyDtoHAsync_v2_ptsz);
  return do_copy(U(dst), src, n, s, true, false, Dir::DTOH);
}
FAKE_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpy);
  return do_copy(dst, src, n, nullptr, false, true, Dir::ANY);
}
FAKE_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpy_ptds);
  return do_copy(dst, src, n, nullptr, true, true, Dir::ANY);
}
FAKE_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyAsync);
  return do_copy(dst, src, n, s, false, false, Dir::ANY);
}
FAKE_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyAsync_ptsz);
  return do_copy(dst, src, n, s, true, false, Dir::ANY);
}
FAKE_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpyDtoD_v2);
  return do_copy(dst, src, n, nullptr, false, true, Dir::DTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  COUNT(cuMemcpyDtoD_v2_ptds);
  return do_copy(dst, src, n, nullptr, true, true, Dir::DTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyDtoDAsync_v2);
  return do_copy(dst, src, n, s, false, false, Dir::DTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  COUNT(cuMemcpyDtoDAsync_v2_ptsz);
  return do_copy(dst, src, n, s, true, false, Dir::DTOD);
}
// CUDA 2.0 ABI (32-bit device pointers, unsigned int sizes). Our device pointers never fit in
// 32 bits, so these only validate and fail; they exist as distinct addresses for resolver tests.
FAKE_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 dst, const void* src, unsigned int n) {
  COUNT(cuMemcpyHtoD);
  NEED_INIT();
  if (n == 0) return CUDA_SUCCESS;
  if (!find_alloc(dst)) return CUDA_ERROR_NOT_SUPPORTED;
  return do_copy(dst, U(src), n, nullptr, false, true, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr_v1 src, unsigned int n) {
  COUNT(cuMemcpyDtoH);
  NEED_INIT();
  if (n == 0) return CUDA_SUCCESS;
  if (!find_alloc(src)) return CUDA_ERROR_NOT_SUPPORTED;
  return do_copy(U(dst), src, n, nullptr, false, true, Dir::DTOH);
}
FAKE_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dst, const void* src, unsigned int n, CUstream s) {
  COUNT(cuMemcpyHtoDAsync);
  NEED_INIT();
  if (n == 0) return CUDA_SUCCESS;
  if (!find_alloc(dst)) return CUDA_ERROR_NOT_SUPPORTED;
  return do_copy(dst, U(src), n, s, false, false, Dir::HTOD);
}
FAKE_EXPORT CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr_v1 src, unsigned int n, CUstream s) {
  COUNT(cuMemcpyDtoHAsync);
  NEED_INIT();
  if (n == 0) return CUDA_SUCCESS;
  if (!find_alloc(src)) return CUDA_ERROR_NOT_SUPPORTED;
  return do_copy(U(dst), src, n, s, false, false, Dir::DTOH);
}
#undef U

// ---- streams ------------------------------------------------------------------------------
namespace {
CUresult stream_create(CUstream* ph, unsigned flags, int prio) {
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!ph || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  SP s = new_stream(c, SKind::USER, flags, prio);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->user.push_back(s);
  }
  {
    std::lock_guard<std::mutex> lk(G().reg_mu);
    G().streams[s.get()] = s;
  }
  G().live_user_streams.fetch_add(1);
  *ph = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  COUNT(cuStreamCreate);
  return stream_create(ph, flags, 0);
}
FAKE_EXPORT CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int prio) {
  COUNT(cuStreamCreateWithPriority);
  return stream_create(ph, flags, prio);
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
  COUNT(cuStreamDestroy_v2);
  NEED_INIT();
  Global& g = G();
  SP s;
  {
    std::lock_guard<std::mutex> lk(g.reg_mu);
    auto it = g.streams.find(reinterpret_cast<void*>(h));
    if (it == g.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    s = it->second;
    g.streams.erase(it);
  }
  g.live_user_streams.fetch_sub(1);
  {
    std::lock_guard<std::mutex> lk(s->ctx->mu);
    auto& v = s->ctx->user;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
  }
  close_stream(s);  // pending work still runs, then the worker exits (like the real driver)
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream h) {
  COUNT(cuStreamSynchronize);
  return stream_sync(h, false);
}
FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h) {
  COUNT(cuStreamSynchronize_ptsz);
  return stream_sync(h, true);
}
FAKE_EXPORT CUresult cuStreamQuery(CUstream h) {
  COUNT(cuStreamQuery);
  return stream_query(h, false);
}
FAKE_EXPORT CUresult cuStreamQuery_ptsz(CUstream h) {
  COUNT(cuStreamQuery_ptsz);
  return stream_query(h, true);
}
FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  COUNT(cuStreamWaitEvent);
  (void)flags;
  return stream_wait_event(h, e, false);
}
FAKE_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent e, unsigned int flags) {
  COUNT(cuStreamWaitEvent_ptsz);
  (void)flags;
  return stream_wait_event(h, e, true);
}
FAKE_EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  COUNT(cuStreamGetCtx);
  return stream_get_ctx(h, pctx, false);
}
FAKE_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext* pctx) {
  COUNT(cuStreamGetCtx_ptsz);
  return stream_get_ctx(h, pctx, true);
}
FAKE_EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext* pctx, void** pgreen) {
  COUNT(cuStreamGetCtx_v2);
  if (pgreen) *pgreen = nullptr;
  return stream_get_ctx(h, pctx, false);
}
FAKE_EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext* pctx, void** pgreen) {
  COUNT(cuStreamGetCtx_v2_ptsz);
  if (pgreen) *pgreen = nullptr;
  return stream_get_ctx(h, pctx, true);
}
FAKE_EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int* flags) {
  COUNT(cuStreamGetFlags);
  return stream_get_flags(h, flags, false);
}
FAKE_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream h, unsigned int* flags) {
  COUNT(cuStreamGetFlags_ptsz);
  return stream_get_flags(h, flags, true);
}
FAKE_EXPORT CUresult cuLaunchHostFunc(CUstream h, void (*fn)(void*), void* ud) {
  COUNT(cuLaunchHostFunc);
  return launch_host_func(h, fn, ud, false);
}
FAKE_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream h, void (*fn)(void*), void* ud) {
  COUNT(cuLaunchHostFunc_ptsz);
  return launch_host_func(h, fn, ud, true);
}
FAKE_EXPORT CUresult cuStreamWaitValue32_v2(CUstream h, CUdeviceptr addr, unsigned int value, unsigned int flags) {
  COUNT(cuStreamWaitValue32_v2);
  return wait_value32(h, addr, static_cast<uint32_t>(value), flags);
}
FAKE_EXPORT CUresult cuStreamWriteValue32_v2(CUstream h, CUdeviceptr addr, unsigned int value, unsigned int flags) {
  COUNT(cuStreamWriteValue32_v2);
  return write_value32(h, addr, static_cast<uint32_t>(value), flags);
}
FAKE_EXPORT CUresult cuStreamBatchMemOp_v2(CUstream h, unsigned int count, void* ops, unsigned int flags) {
  COUNT(cuStreamBatchMemOp_v2);
  return batch_mem_op(h, count, static_cast<const BatchMemOp*>(ops), flags);
}
FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, int mode) {
  COUNT(cuStreamBeginCapture_v2);
  return begin_capture(h, mode, false);
}
FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, int mode) {
  COUNT(cuStreamBeginCapture_v2_ptsz);
  return begin_capture(h, mode, true);
}
FAKE_EXPORT CUresult cuStreamEndCapture(CUstream h, void** graph) {
  COUNT(cuStreamEndCapture);
  return end_capture(h, graph, false);
}
FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, void** graph) {
  COUNT(cuStreamEndCapture_ptsz);
  return end_capture(h, graph, true);
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* st) {
  COUNT(cuStreamIsCapturing);
  return is_capturing(h, st, false);
}
FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* st) {
  COUNT(cuStreamIsCapturing_ptsz);
  return is_capturing(h, st, true);
}
FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  COUNT(cuThreadExchangeStreamCaptureMode);
  NEED_INIT();
  if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
  int old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = static_cast<CUstreamCaptureMode>(old);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphDestroy(void* graph) {
  COUNT(cuGraphDestroy);
  NEED_INIT();
  {
    std::lock_guard<std::mutex> lk(G().reg_mu);
    if (!G().graphs.erase(graph)) return CUDA_ERROR_INVALID_VALUE;
  }
  free(graph);
  return CUDA_SUCCESS;
}

// ---- events -------------------------------------------------------------------------------
FAKE_EXPORT CUresult cuEventCreate(CUevent* ph, unsigned int flags) {
  COUNT(cuEventCreate);
  Context* c;
  CUresult rc = need_ctx(&c);
  if (rc) return rc;
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_shared<Event>();
  e->ctx = c;
  e->flags = flags;
  {
    std::lock_guard<std::mutex> lk(G().reg_mu);
    G().events[e.get()] = e;
  }
  *ph = reinterpret_cast<CUevent>(e.get());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent h) {
  COUNT(cuEventDestroy_v2);
  NEED_INIT();
  std::lock_guard<std::mutex> lk(G().reg_mu);
  return G().events.erase(reinterpret_cast<void*>(h)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  COUNT(cuEventRecord);
  return event_record(e, s, false);
}
FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) {
  COUNT(cuEventRecord_ptsz);
  return event_record(e, s, true);
}
FAKE_EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  COUNT(cuEventRecordWithFlags);
  (void)flags;
  return event_record(e, s, false);
}
FAKE_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags) {
  COUNT(cuEventRecordWithFlags_ptsz);
  (void)flags;
  return event_record(e, s, true);
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent h) {
  COUNT(cuEventSynchronize);
  EP e;
  CUresult rc = find_event(h, e);
  if (rc) return rc;
  SP s;
  uint64_t seq;
  bool rec;
  event_snapshot(e, s, seq, rec);
  if (rec) wait_done(s, seq);
  if (G().event_wake_us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(G().event_wake_us));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventQuery(CUevent h) {
  COUNT(cuEventQuery);
  EP e;
  CUresult rc = find_event(h, e);
  if (rc) return rc;
  SP s;
  uint64_t seq;
  bool rec;
  event_snapshot(e, s, seq, rec);
  if (!rec) return CUDA_SUCCESS;
  return is_done(s, seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  COUNT(cuEventElapsedTime);
  return elapsed(ms, a, b);
}
FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  COUNT(cuEventElapsedTime_v2);
  return elapsed(ms, a, b);
}

// ---- cuGetProcAddress -----------------------------------------------------------------------
FAKE_EXPORT CUresult cuGetProcAddress(const char* sym, void** pfn, int ver, cuuint64_t flags);
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* sym, void** pfn, int ver, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* st);
FAKE_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char* sym, void** pfn, int ver, cuuint64_t flags,
                                              CUdriverProcAddressQueryResult* st);

// Hidden local aliases of every export: taking their address needs no GOT/PLT, so it is the
// address of this library's own definition even when another object (an LD_PRELOAD library)
// defines the same name.
#define FAKE_ALIAS(n) \
  extern "C" __attribute__((visibility("hidden"), alias(#n))) decltype(n) fakeint_##n;
FAKE_EXPORTS(FAKE_ALIAS)
#undef FAKE_ALIAS

namespace {
struct ProcEntry {
  std::string name;  // exported name
  void* addr;
  int min_ver;
  bool per_thread;
  std::string legacy_twin;  // for per-thread entries: the name without the _ptds/_ptsz suffix
};

int min_version(const std::string& name, bool versioned) {
  static const std::unordered_map<std::string, int> ov = {
      {"cuMemcpy", 4000},
      {"cuMemcpyAsync", 4000},
      {"cuGetProcAddress", 11030},
      {"cuLaunchHostFunc", 10000},
      {"cuStreamIsCapturing", 10000},
      {"cuStreamEndCapture", 10000},
      {"cuThreadExchangeStreamCaptureMode", 10010},
      {"cuGraphDestroy", 10000},
      {"cuMemAllocManaged", 6000},
      {"cuDevicePrimaryCtxRetain", 7000},
      {"cuDevicePrimaryCtxGetState", 7000},
      {"cuEventRecordWithFlags", 11010},
      {"cuStreamGetCtx", 9020},
      {"cuStreamGetFlags", 5050},
      {"cuMemHostAlloc", 2020},
      {"cuStreamCreateWithPriority", 5050},
      {"cuCtxGetStreamPriorityRange", 5050},
      {"cuCtxSetCurrent", 4000},
      {"cuCtxGetCurrent", 4000},
      {"cuPointerGetAttribute", 4000},
      {"cuPointerGetAttributes", 7000},
      {"cuGetErrorString", 6000},
      {"cuGetErrorName", 6000},
      {"cuMemsetD8Async", 3020},
      {"cuCtxDestroy_v2", 4000},
      {"cuCtxPopCurrent_v2", 4000},
      {"cuCtxPushCurrent_v2", 4000},
      {"cuStreamDestroy_v2", 4000},
      {"cuEventDestroy_v2", 4000},
      {"cuMemHostRegister_v2", 6050},
      {"cuDevicePrimaryCtxRelease_v2", 11000},
      {"cuStreamBeginCapture_v2", 10010},
      {"cuGetProcAddress_v2", 12000},
      {"cuEventElapsedTime_v2", 12080},
      {"cuStreamGetCtx_v2", 12050},
      {"cuStreamWaitValue32_v2", 11070},
      {"cuStreamWriteValue32_v2", 11070},
      {"cuStreamBatchMemOp_v2", 11070},
  };
  auto it = ov.find(name);
  if (it != ov.end()) return it->second;
  return versioned ? 3020 : 2000;
}

bool ends_with(const std::string& s, const char* suf) {
  size_t n = strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

using ProcTable = std::unordered_map<std::string, std::vector<ProcEntry>>;

const ProcTable& proc_table() {
  static const ProcTable* t = [] {
    auto* tab = new ProcTable;
    const std::pair<const char*, void*> all[] = {
#define FAKE_PAIR(n) {#n, reinterpret_cast<void*>(&fakeint_##n)},
        FAKE_EXPORTS(FAKE_PAIR)
#undef FAKE_PAIR
    };
    for (auto& kv : all) {
      std::string name = kv.first, base = name, twin;
      bool pt = false;
      if (ends_with(base, "_ptds") || ends_with(base, "_ptsz")) {
        pt = true;
        base.resize(base.size() - 5);
        twin = base;
      }
      bool versioned = false;
      size_t us = base.rfind("_v");
      if (us != std::string::npos && us + 2 < base.size() &&
          base.find_first_not_of("0123456789", us + 2) == std::string::npos) {
        versioned = true;
      }
      int mv = min_version(pt ? twin : name, versioned);
      if (pt) mv = std::max(mv, 7000);
      if (versioned) base.resize(us);
      (*tab)[base].push_back(ProcEntry{name, kv.second, mv, pt, twin});
    }
    return tab;
  }();
  return *t;
}

CUresult get_proc(const char* sym, void** pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult* st,
                  bool default_per_thread) {
  if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  if (flags & ~3ULL) return CUDA_ERROR_INVALID_VALUE;
  bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ||
                    (default_per_thread && !(flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  const ProcTable& tab = proc_table();
  auto it = tab.find(sym);
  if (it == tab.end()) return CUDA_SUCCESS;
  const ProcEntry* best = nullptr;
  for (const auto& e : it->second)
    if (!e.per_thread && e.min_ver <= ver && (!best || e.min_ver > best->min_ver)) best = &e;
  if (!best) {
    if (st) *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_SUCCESS;
  }
  if (per_thread) {
    for (const auto& e : it->second)
      if (e.per_thread && e.legacy_twin == best->name && e.min_ver <= ver) {
        best = &e;
        break;
      }
  }
  *pfn = best->addr;
  if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress(const char* sym, void** pfn, int ver, cuuint64_t flags) {
  COUNT(cuGetProcAddress);
  return get_proc(sym, pfn, ver, flags, nullptr, false);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* sym, void** pfn, int ver, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* st) {
  COUNT(cuGetProcAddress_v2);
  return get_proc(sym, pfn, ver, flags, st, false);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char* sym, void** pfn, int ver, cuuint64_t flags,
                                              CUdriverProcAddressQueryResult* st) {
  COUNT(cuGetProcAddress_v2_ptsz);
  return get_proc(sym, pfn, ver, flags, st, true);
}

// =============================================================================================
// Test-only hooks
// =============================================================================================
FAKE_EXPORT long long fakecuda_call_count(const char* name) {
  if (!name) return -1;
  for (int i = 0; i < IDX_COUNT; ++i)
    if (strcmp(kNames[i], name) == 0) return static_cast<long long>(g_counts[i].load());
  return -1;
}

FAKE_EXPORT void fakecuda_reset_counts(void) {
  for (auto& c : g_counts) c.store(0);
}

// A kernel launch that loads its module lazily: it holds the driver (every other thread's driver
// calls wait) until every stream of every context has drained. CUDA_ERROR_LAUNCH_TIMEOUT when they
// have not after timeout_ms: on a real driver, a hang.
FAKE_EXPORT CUresult fakecuda_launch_loading(unsigned int timeout_ms) {
  if (!t_gate_tid) t_gate_tid = g_gate_tids.fetch_add(1);
  unsigned long long none = 0;
  while (!g_loading_thread.compare_exchange_weak(none, t_gate_tid)) {
    none = 0;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  CUresult rc = static_cast<CUresult>(702);  // CUDA_ERROR_LAUNCH_TIMEOUT
  while (Clock::now() < deadline) {
    bool drained = true;
    std::vector<SP> all;
    std::vector<Context*> ctxs;
    {
      std::lock_guard<std::mutex> lk(G().reg_mu);
      for (auto& kv : G().streams) all.push_back(kv.second);
      ctxs.assign(G().contexts.begin(), G().contexts.end());
    }
    for (Context* c : ctxs) {
      std::lock_guard<std::mutex> ck(c->mu);
      if (c->legacy) all.push_back(c->legacy);
      for (auto& kv : c->ptds) all.push_back(kv.second);
    }
    for (const SP& st : all) {
      std::lock_guard<std::mutex> sl(st->m);
      if (st->done_seq < st->enq_seq) drained = false;
    }
    if (drained) {
      rc = CUDA_SUCCESS;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  g_loading_thread.store(0, std::memory_order_release);
  return rc;
}

// A "kernel": an op on the stream (same ordering rules as copies) that sleeps, then memsets.
FAKE_EXPORT CUresult fakecuda_enqueue_delayed_write(CUstream h, CUdeviceptr dst, unsigned char value, size_t n,
                                                   unsigned int delay_us) {
  SP s;
  CUresult rc = resolve_stream(h, false, s);
  if (rc) return rc;
  Resolved d;
  if (n && (rc = resolve_ptr(dst, n, d))) return rc;
  if (n && d.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  char* p = d.host;
  AP keep = d.a;
  return enqueue(
      s,
      [p, value, n, delay_us, keep] {
        if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        if (n) memset(p, value, n);
      },
      {}, true, nullptr);
}

// Streams created with cuStreamCreate* and not yet destroyed (contexts destroyed included).
FAKE_EXPORT int fakecuda_live_streams(void) { return G().live_user_streams.load(); }

// Direct access to device/managed/pinned bytes, bypassing streams (synchronous, no ordering).
FAKE_EXPORT CUresult fakecuda_peek(void* dst, CUdeviceptr src, size_t n) {
  NEED_INIT();
  Resolved r;
  CUresult rc = resolve_ptr(src, n, r);
  if (rc) return rc;
  if (r.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  memcpy(dst, r.host, n);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult fakecuda_poke(CUdeviceptr dst, const void* src, size_t n) {
  NEED_INIT();
  Resolved r;
  CUresult rc = resolve_ptr(dst, n, r);
  if (rc) return rc;
  if (r.kind == MKind::PAGEABLE) return CUDA_ERROR_INVALID_VALUE;
  memcpy(r.host, src, n);
  return CUDA_SUCCESS;
}

// The FAKE_CUDA_COPY_GBPS limit in effect (0 = unlimited).
FAKE_EXPORT double fakecuda_copy_gbps(void) { return G().copy_gbps; }

// Changes the link's speed from now on (FAKE_CUDA_COPY_GBPS, FAKE_CUDA_PAGEABLE_GBPS; 0 = unlimited).
FAKE_EXPORT void fakecuda_set_copy_gbps(double pinned, double pageable) {
  G().copy_gbps = pinned;
  G().pageable_gbps = pageable;
}
