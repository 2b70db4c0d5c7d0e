#include "driver.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <initializer_list>

#include "log.hpp"

namespace cmt {
namespace {

const char* const kEntryNames[] = {
#define ENTRY_COPY(name, shape, stream) #name,
#define ENTRY_RESOLVER(name, abi) #name,
#define ENTRY_CONTEXT(name, shape) #name,
#define ENTRY_PIN(name, shape) #name,
#include "entry_points.def"
#undef ENTRY_COPY
#undef ENTRY_RESOLVER
#undef ENTRY_CONTEXT
#undef ENTRY_PIN
};

using dlsym_fn = void* (*)(void*, const char*);

std::atomic<void*> g_libcuda{nullptr};
std::atomic<void*> g_real[kEntryCount];
std::atomic<bool> g_real_table_done{false};

Driver g_driver;
std::atomic<bool> g_driver_loaded{false};
pthread_mutex_t g_driver_mutex = PTHREAD_MUTEX_INITIALIZER;

void* libcuda_handle(bool load_if_absent) {
  void* h = g_libcuda.load(std::memory_order_acquire);
  if (h) return h;
  // RTLD_NOLOAD: use the libcuda the program loaded; never load a driver into a CPU-only process.
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h && load_if_absent) h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (h) g_libcuda.store(h, std::memory_order_release);  // kept open: cached pointers stay valid
  return h;
}

template <typename F>
bool load(void* h, F& slot, const char* name) {
  slot = reinterpret_cast<F>(real_dlsym(h, name));
  if (!slot) log::write(log::Level::Debug, "driver lacks %s; copies pass through", name);
  return slot != nullptr;
}

// Returns false while libcuda is not in the process (tried again on the next call).
bool load_driver(bool load_if_absent) {
  void* h = libcuda_handle(load_if_absent);
  if (!h) return false;
  Driver d;
  bool ok = true;
  ok &= load(h, d.cuInit, "cuInit");
  ok &= load(h, d.cuGetErrorString, "cuGetErrorString");
  ok &= load(h, d.cuCtxGetCurrent, "cuCtxGetCurrent");
  ok &= load(h, d.cuCtxSetCurrent, "cuCtxSetCurrent");
  ok &= load(h, d.cuCtxGetDevice, "cuCtxGetDevice");
  ok &= load(h, d.cuStreamCreate, "cuStreamCreate");
  ok &= load(h, d.cuStreamSynchronize, "cuStreamSynchronize");
  ok &= load(h, d.cuStreamWaitEvent, "cuStreamWaitEvent");
  ok &= load(h, d.cuStreamIsCapturing, "cuStreamIsCapturing");
  ok &= load(h, d.cuEventCreate, "cuEventCreate");
  ok &= load(h, d.cuEventRecord, "cuEventRecord");
  ok &= load(h, d.cuEventSynchronize, "cuEventSynchronize");
  ok &= load(h, d.cuEventQuery, "cuEventQuery");
  ok &= load(h, d.cuMemHostAlloc, "cuMemHostAlloc");
  ok &= load(h, d.cuMemFreeHost, "cuMemFreeHost");
  ok &= load(h, d.cuPointerGetAttributes, "cuPointerGetAttributes");
  ok &= load(h, d.cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  ok &= load(h, d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  ok &= load(h, d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  d.ok = ok;
  d.cuEventElapsedTime = reinterpret_cast<PFN_cuEventElapsedTime>(real_dlsym(h, "cuEventElapsedTime"));
  d.cuLaunchHostFunc = reinterpret_cast<PFN_cuLaunchHostFunc>(real_dlsym(h, "cuLaunchHostFunc"));
  d.cuStreamWaitValue32 = reinterpret_cast<PFN_cuStreamWaitValue32_v2>(real_dlsym(h, "cuStreamWaitValue32_v2"));
  d.cuStreamBatchMemOp = reinterpret_cast<PFN_cuStreamBatchMemOp_v2>(real_dlsym(h, "cuStreamBatchMemOp_v2"));
  d.cuMemHostGetDevicePointer =
      reinterpret_cast<PFN_cuMemHostGetDevicePointer_v2>(real_dlsym(h, "cuMemHostGetDevicePointer_v2"));
  d.cuCtxSynchronize = reinterpret_cast<PFN_cuCtxSynchronize>(real_dlsym(h, "cuCtxSynchronize"));
  d.cuMemHostRegister = reinterpret_cast<PFN_cuMemHostRegister>(real_dlsym(h, "cuMemHostRegister_v2"));
  d.cuMemHostUnregister = reinterpret_cast<PFN_cuMemHostUnregister>(real_dlsym(h, "cuMemHostUnregister"));
  if (!d.cuMemHostRegister || !d.cuMemHostUnregister) d.cuMemHostRegister = nullptr;
  d.cuDeviceGetPCIBusId = reinterpret_cast<PFN_cuDeviceGetPCIBusId>(real_dlsym(h, "cuDeviceGetPCIBusId"));
  d.cuDevicePrimaryCtxGetState =
      reinterpret_cast<PFN_cuDevicePrimaryCtxGetState>(real_dlsym(h, "cuDevicePrimaryCtxGetState"));
  d.cuDevicePrimaryCtxRetain = reinterpret_cast<PFN_cuDevicePrimaryCtxRetain>(real_dlsym(h, "cuDevicePrimaryCtxRetain"));
  g_driver = d;
  return true;
}

void fill_real_table() {
  if (g_real_table_done.load(std::memory_order_acquire)) return;
  void* h = libcuda_handle(false);
  if (!h) return;
  for (int i = 0; i < kEntryCount; ++i) {
    g_real[i].store(real_dlsym(h, kEntryNames[i]), std::memory_order_relaxed);
  }
  g_real_table_done.store(true, std::memory_order_release);
}

}  // namespace

const char* entry_name(EntryId id) { return kEntryNames[static_cast<int>(id)]; }

int entry_by_name(const char* name) {
  // Cheap reject first: dlsym is called for every symbol of every library.
  if (!name || name[0] != 'c' || name[1] != 'u' || !name[2] || !strchr("MGCD", name[2])) return -1;
  for (int i = 0; i < kEntryCount; ++i) {
    if (!strcmp(name, kEntryNames[i])) return i;
  }
  return -1;
}

}  // namespace cmt

// glibc's dlsym, found by symbol version (once). Also called by dlsym_entry.S, which keeps the
// pointer to tail-jump to for RTLD_NEXT lookups.
extern "C" {
__attribute__((visibility("hidden"))) void* cmt_real_dlsym_ptr = nullptr;

__attribute__((visibility("hidden"))) void* cmt_find_real_dlsym() {
  void* p = __atomic_load_n(&cmt_real_dlsym_ptr, __ATOMIC_ACQUIRE);
  if (p) return p;
  // glibc >= 2.34 versions dlsym GLIBC_2.34; older ones GLIBC_2.2.5 (x86-64) / 2.17 (aarch64).
  for (const char* v : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    p = dlvsym(RTLD_NEXT, "dlsym", v);
    if (p) break;
  }
  __atomic_store_n(&cmt_real_dlsym_ptr, p, __ATOMIC_RELEASE);
  return p;
}
}  // extern "C"

namespace cmt {

void* real_dlsym(void* handle, const char* name) {
  auto f = reinterpret_cast<dlsym_fn>(cmt_find_real_dlsym());
  return f ? f(handle, name) : nullptr;
}

const Driver& driver(bool load_if_absent) {
  if (g_driver_loaded.load(std::memory_order_acquire)) return g_driver;
  pthread_mutex_lock(&g_driver_mutex);
  if (!g_driver_loaded.load(std::memory_order_relaxed) && load_driver(load_if_absent)) {
    g_driver_loaded.store(true, std::memory_order_release);
  }
  pthread_mutex_unlock(&g_driver_mutex);
  return g_driver;
}

void* real_entry(EntryId id) {
  int i = static_cast<int>(id);
  void* p = g_real[i].load(std::memory_order_relaxed);
  if (p) return p;
  fill_real_table();
  return g_real[i].load(std::memory_order_relaxed);
}

int entry_by_real_address(void* p) {
  if (!p) return -1;
  fill_real_table();
  for (int i = 0; i < kEntryCount; ++i) {
    if (g_real[i].load(std::memory_order_relaxed) == p) return i;
  }
  return -1;
}

}  // namespace cmt
