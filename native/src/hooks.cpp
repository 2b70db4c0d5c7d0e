// The three doors into the driver, all generated from entry_points.def (copies, the calls that start
// or end a context, the calls that pin host memory, the resolvers):
//  1. exported wrappers named like the driver's functions (programs linked with -lcuda);
//  2. dlsym: a lookup of an intercepted name that finds libcuda's function gets the wrapper
//     (static and dynamic cudart, XLA, ctypes users);
//  3. the cuGetProcAddress resolvers: the driver answers first, and an answer that is exactly one
//     of the intercepted functions is swapped for the wrapper of that same variant.
#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "cmt/cuda_types.hpp"
#include "copy_path.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "host_copy.hpp"
#include "large_read.hpp"
#include "env.hpp"
#include "log.hpp"
#include "pin_record.hpp"
#include "rate_guard.hpp"
#include "recorder.hpp"
#include "setup_pacing.hpp"
#include "stats.hpp"

#define API_EXPORT __attribute__((visibility("default")))

using namespace cmt;

namespace {

constexpr DefaultStream LEGACY = DefaultStream::Legacy;
constexpr DefaultStream PER_THREAD = DefaultStream::PerThread;

template <typename F>
F real(EntryId id) {
  return reinterpret_cast<F>(real_entry(id));
}

// Every intercepted host<->device copy comes here: stage it, or run the driver's own function
// (call_real) with the caller's arguments. While `cmt profile` records, the call is also timed.
template <typename CallReal>
CUresult intercept(EntryId id, Direction dir, const void* host, CUdeviceptr dev, size_t n, CUstream s,
                   DefaultStream ds, CallReal call_real) {
  CopyCall call{dir, const_cast<char*>(static_cast<const char*>(host)), dev, n, s, ds};
  CopyInFlight in_flight;  // a pipeline's setup pins no staging meanwhile
  CUresult r = CUDA_SUCCESS;
  if (!recording()) {
    Outcome o = try_accelerate(call, &r);
    return copied_by_cmt(o) ? r : driver_copy(o, dir, n, call_real);
  }
  uint64_t start = now_ns();
  HostKind kind = HostKind::Unknown;
  Outcome o = try_accelerate(call, &r, &kind);
  if (!copied_by_cmt(o)) {
    r = driver_copy(o, dir, n, call_real);
    if (kind == HostKind::Unknown) kind = classify_host(host);
  }
  // tid 0: the recorder fills in its cached thread id (gettid() is a system call).
  record_copy(CopyRecord{start, now_ns(), n, reinterpret_cast<uint64_t>(s), r, 0,
                         static_cast<uint8_t>(dir), static_cast<uint8_t>(kind), static_cast<uint8_t>(o),
                         static_cast<uint8_t>(id), 0});
  return r;
}

// cuMemcpy[Async] carry no direction: classify both pointers (two driver queries; programs seen
// on the H200 never used these entry points for host<->device copies, so this costs nothing there).
template <typename CallReal>
CUresult intercept_uva(EntryId id, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, DefaultStream ds,
                       CallReal call_real) {
  Direction dir;
  if (!classify_uva(dst, src, &dir)) return call_real();  // host<->host or device<->device
  return dir == Direction::HtoD ? intercept(id, dir, reinterpret_cast<void*>(src), dst, n, s, ds, call_real)
                                : intercept(id, dir, reinterpret_cast<void*>(dst), src, n, s, ds, call_real);
}

}  // namespace

#define REAL_CALL(name, PFN, ...)                                                   \
  [&]() -> CUresult {                                                               \
    auto f = real<PFN>(EntryId::name);                                              \
    return f ? f(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED;                         \
  }

#define WRAP_HTOD(name, ds)                                                                 \
  extern "C" API_EXPORT CUresult name(CUdeviceptr dst, const void* src, size_t n) {             \
    return intercept(EntryId::name, Direction::HtoD, src, dst, n, nullptr, ds,                  \
                     REAL_CALL(name, PFN_cuMemcpyHtoD, dst, src, n));                            \
  }
#define WRAP_DTOH(name, ds)                                                                 \
  extern "C" API_EXPORT CUresult name(void* dst, CUdeviceptr src, size_t n) {                   \
    return intercept(EntryId::name, Direction::DtoH, dst, src, n, nullptr, ds,                  \
                     REAL_CALL(name, PFN_cuMemcpyDtoH, dst, src, n));                            \
  }
#define WRAP_HTOD_ASYNC(name, ds)                                                           \
  extern "C" API_EXPORT CUresult name(CUdeviceptr dst, const void* src, size_t n, CUstream s) { \
    return intercept(EntryId::name, Direction::HtoD, src, dst, n, s, ds,                        \
                     REAL_CALL(name, PFN_cuMemcpyHtoDAsync, dst, src, n, s));                    \
  }
#define WRAP_DTOH_ASYNC(name, ds)                                                           \
  extern "C" API_EXPORT CUresult name(void* dst, CUdeviceptr src, size_t n, CUstream s) {       \
    return intercept(EntryId::name, Direction::DtoH, dst, src, n, s, ds,                        \
                     REAL_CALL(name, PFN_cuMemcpyDtoHAsync, dst, src, n, s));                    \
  }
#define WRAP_UVA(name, ds)                                                                  \
  extern "C" API_EXPORT CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t n) {             \
    return intercept_uva(EntryId::name, dst, src, n, nullptr, ds, REAL_CALL(name, PFN_cuMemcpy, dst, src, n)); \
  }
#define WRAP_UVA_ASYNC(name, ds)                                                            \
  extern "C" API_EXPORT CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { \
    return intercept_uva(EntryId::name, dst, src, n, s, ds,                                     \
                         REAL_CALL(name, PFN_cuMemcpyAsync, dst, src, n, s));                    \
  }

// ---- calls that start or end a context ---------------------------------------------------------

// The device's staging starts being faulted in first: the driver's making of the context (100 ms or
// more) and the faulting run side by side (engine_context_starting). Once the process has its first
// context, the setup registers that staging in the background, before the program's first copies
// (which would hold the driver meanwhile).
#define WRAP_PRIMARY_RETAIN(name)                                                 \
  extern "C" API_EXPORT CUresult name(CUcontext* pctx, CUdevice dev) {             \
    auto f = reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(real_entry(EntryId::name)); \
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                     \
    if (pctx) engine_context_starting(dev);                                        \
    const CUresult r = f(pctx, dev);                                               \
    if (r == CUDA_SUCCESS && pctx) prepare_staging_early(*pctx);                   \
    return r;                                                                      \
  }

namespace {

// The device's primary context if it is active, else nullptr. A retain and a release of the
// driver's own leave its count as it was.
CUcontext active_primary(CUdevice dev) {
  const Driver& d = driver();
  auto release = real<PFN_cuDevicePrimaryCtxRelease>(EntryId::cuDevicePrimaryCtxRelease_v2);
  unsigned int flags = 0;
  int active = 0;
  CUcontext ctx = nullptr;
  if (!d.cuDevicePrimaryCtxGetState || !d.cuDevicePrimaryCtxRetain || !release ||
      d.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active ||
      d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) {
    return nullptr;
  }
  release(dev);
  return ctx;
}

// cuDevicePrimaryCtxReset or cuDevicePrimaryCtxRelease (one signature): the driver's call, then
// the engine drops what it kept for the primary context if the call ended it.
CUresult primary_call(EntryId id, CUdevice dev, bool ends_it) {
  auto f = real<PFN_cuDevicePrimaryCtxRelease>(id);
  if (!f) return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = active_primary(dev);
  CUresult r = f(dev);
  if (r == CUDA_SUCCESS && ctx && (ends_it || !active_primary(dev))) engine_context_ended(ctx);
  return r;
}

}  // namespace

#define WRAP_DESTROY(name)                                                           \
  extern "C" API_EXPORT CUresult name(CUcontext ctx) {                               \
    auto f = real<PFN_cuCtxDestroy>(EntryId::name);                                  \
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                       \
    CUresult r = f(ctx);                                                             \
    if (r == CUDA_SUCCESS) engine_context_ended(ctx);                                \
    return r;                                                                        \
  }
// cudaDeviceReset's reset ends the primary context (the next retain makes a new one, with the same
// handle on the H100's driver 580); a release ends it when it was the last.
#define WRAP_PRIMARY_RESET(name) \
  extern "C" API_EXPORT CUresult name(CUdevice dev) { return primary_call(EntryId::name, dev, true); }
#define WRAP_PRIMARY_RELEASE(name) \
  extern "C" API_EXPORT CUresult name(CUdevice dev) { return primary_call(EntryId::name, dev, false); }

// ---- calls that pin host memory or let it go ---------------------------------------------------
// The driver's function; while `cmt profile` records, timed and recorded with the caller's object.

#define PIN_WRAPPER(name, call, params, args, ptr, bytes)                                    \
  extern "C" API_EXPORT CUresult name params {                                                \
    auto f = reinterpret_cast<CUresult (*) params>(real_entry(EntryId::name));                \
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                \
    if (!recording()) return f args;                                                          \
    const uint64_t start = now_ns();                                                          \
    const CUresult r = f args;                                                                \
    record_pin_call(PinCall::call, start, now_ns(), ptr, bytes, r, __builtin_return_address(0)); \
    return r;                                                                                 \
  }
#define WRAP_HOST_ALLOC(name) \
  PIN_WRAPPER(name, HostAlloc, (void** pp, size_t n, unsigned int flags), (pp, n, flags), pp ? *pp : nullptr, n)
#define WRAP_ALLOC_HOST(name) PIN_WRAPPER(name, AllocHost, (void** pp, size_t n), (pp, n), pp ? *pp : nullptr, n)
#define WRAP_REGISTER(name) \
  PIN_WRAPPER(name, Register, (void* p, size_t n, unsigned int flags), (p, n, flags), p, n)
#define WRAP_FREE_HOST(name) PIN_WRAPPER(name, FreeHost, (void* p), (p), p, 0)
#define WRAP_UNREGISTER(name) PIN_WRAPPER(name, Unregister, (void* p), (p), p, 0)

#define ENTRY_COPY(name, shape, ds) WRAP_##shape(name, ds)
#define ENTRY_RESOLVER(name, abi)
#define ENTRY_CONTEXT(name, shape) WRAP_##shape(name)
#define ENTRY_PIN(name, shape) WRAP_##shape(name)
#include "entry_points.def"
#undef ENTRY_COPY
#undef ENTRY_RESOLVER
#undef ENTRY_CONTEXT
#undef ENTRY_PIN

namespace {

void* wrapper_for(int id);

// Swaps a resolver's answer for our wrapper when it is exactly one of the intercepted functions.
void substitute(void** pfn) {
  if (!pfn || !*pfn) return;
  int id = entry_by_real_address(*pfn);
  if (id >= 0) *pfn = wrapper_for(id);
}

}  // namespace

extern "C" API_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  auto f = real<PFN_cuGetProcAddress_v1>(EntryId::cuGetProcAddress);
  if (!f) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = f(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS) substitute(pfn);
  return r;
}

#define RESOLVER_V2(name)                                                                    \
  extern "C" API_EXPORT CUresult name(const char* symbol, void** pfn, int version, cuuint64_t flags, \
                                      CUdriverProcAddressQueryResult* status) {                  \
    auto f = real<PFN_cuGetProcAddress_v2>(EntryId::name);                                      \
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                   \
    CUresult r = f(symbol, pfn, version, flags, status);                                         \
    if (r == CUDA_SUCCESS && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS)) substitute(pfn); \
    return r;                                                                                    \
  }
RESOLVER_V2(cuGetProcAddress_v2)
RESOLVER_V2(cuGetProcAddress_v2_ptsz)

namespace {

void* const kWrappers[] = {
#define ENTRY_COPY(name, shape, ds) reinterpret_cast<void*>(&name),
#define ENTRY_RESOLVER(name, abi) reinterpret_cast<void*>(&name),
#define ENTRY_CONTEXT(name, shape) reinterpret_cast<void*>(&name),
#define ENTRY_PIN(name, shape) reinterpret_cast<void*>(&name),
#include "entry_points.def"
#undef ENTRY_COPY
#undef ENTRY_RESOLVER
#undef ENTRY_CONTEXT
#undef ENTRY_PIN
};
static_assert(sizeof(kWrappers) / sizeof(kWrappers[0]) == kEntryCount, "one wrapper per entry");

void* wrapper_for(int id) { return kWrappers[id]; }

}  // namespace

// ---- dlsym ----------------------------------------------------------------------------------
// dlsym(RTLD_NEXT, ...) is answered relative to its caller's return address, so the exported
// dlsym is a few instructions of assembly (dlsym_entry.S) that tail-jump to glibc's for
// RTLD_NEXT and call cmt_dlsym_dispatch for every other handle.

extern "C" {
__attribute__((visibility("hidden"))) void* cmt_dlsym_dispatch(void* handle, const char* name) {
  void* res = real_dlsym(handle, name);
  if (!res) return res;
  int id = entry_by_name(name);
  if (id < 0) return res;
  // Only libcuda's own function is replaced (not a same-named symbol of another library).
  if (res != real_entry(static_cast<EntryId>(id))) return res;
  return wrapper_for(id);
}

#if !defined(__x86_64__)
// Without the assembly entry, RTLD_NEXT lookups resolve relative to this library.
API_EXPORT void* dlsym(void* handle, const char* name) { return cmt_dlsym_dispatch(handle, name); }
#endif
}  // extern "C"

// ---- process lifecycle ----------------------------------------------------------------------

// _exit skips atexit handlers, so `cmt profile` would lose a process's last records (Python's
// os._exit in multiprocessing workers). Flush them, then end the process as _exit does.
extern "C" API_EXPORT __attribute__((noreturn)) void _exit(int status) {
  flush_before_exit();
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

extern "C" API_EXPORT __attribute__((noreturn)) void _Exit(int status) { _exit(status); }

namespace {

void on_fork_child() { mark_forked_child(); }

// No CUDA calls and no threads here: a CPU-only child of `cmt run` must pay nothing.
__attribute__((constructor)) void cmt_library_init() {
  bool disabled = env().disable;
  set_disabled(disabled);
  if (disabled) log::write(log::Level::Debug, "CMT_DISABLE set: every copy passes through");
  pthread_atfork(nullptr, nullptr, on_fork_child);
  host_copy_init();
  large_read_init();
  enable_exit_report();
}

}  // namespace
