// The real CUDA driver, found at run time (no toolkit at build time, no DT_NEEDED on libcuda):
// the real dlsym, the libcuda handle, the helper entry points the engine calls, and the real
// address of every intercepted entry point (entry_points.def).
#pragma once
#include "cmt/cuda_types.hpp"

namespace cmt {

enum class EntryId : int {
#define ENTRY_COPY(name, shape, stream) name,
#define ENTRY_RESOLVER(name, abi) name,
#define ENTRY_CONTEXT(name, shape) name,
#define ENTRY_PIN(name, shape) name,
#include "entry_points.def"
#undef ENTRY_COPY
#undef ENTRY_RESOLVER
#undef ENTRY_CONTEXT
#undef ENTRY_PIN
  Count
};
constexpr int kEntryCount = static_cast<int>(EntryId::Count);
const char* entry_name(EntryId id);
// Id of an intercepted entry point by exact name, or -1.
int entry_by_name(const char* name);

// The storage path's stream-ordered calls (stream_io.cpp); not in every driver, so optional.
extern "C" {
typedef void (*CUhostFn)(void*);
typedef CUresult (*PFN_cuLaunchHostFunc)(CUstream, CUhostFn, void*);
typedef CUresult (*PFN_cuCtxSynchronize)(void);
typedef CUresult (*PFN_cuStreamWaitValue32_v2)(CUstream, CUdeviceptr, unsigned int, unsigned int);
typedef CUresult (*PFN_cuMemHostGetDevicePointer_v2)(CUdeviceptr*, void*, unsigned int);
// CUstreamBatchMemOpParams: one operation of cuStreamBatchMemOp, a 48-byte union tagged by its first
// field. cmt uses only 32-bit waits and writes, whose fields are laid out alike.
union StreamMemOp {
  unsigned int operation;
  struct {
    unsigned int operation;
    CUdeviceptr address;
    union {
      uint32_t value;
      uint64_t value64;
    };
    unsigned int flags;
    CUdeviceptr alias;
  } value;
  uint64_t pad[6];
};
typedef CUresult (*PFN_cuStreamBatchMemOp_v2)(CUstream, unsigned int, StreamMemOp*, unsigned int);
}
static_assert(sizeof(StreamMemOp) == 48, "cuda.h's CUstreamBatchMemOpParams");
constexpr unsigned int kMemOpWaitValue32 = 1;   // CU_STREAM_MEM_OP_WAIT_VALUE_32
constexpr unsigned int kMemOpWriteValue32 = 2;  // CU_STREAM_MEM_OP_WRITE_VALUE_32
constexpr unsigned int kMemHostAllocDeviceMap = 0x2;  // CU_MEMHOSTALLOC_DEVICEMAP
constexpr unsigned int kStreamWaitValueGeq = 0x0;     // CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0

// glibc's dlsym, never our interposed one (safe before libcuda is loaded).
void* real_dlsym(void* handle, const char* name);

struct Driver {
  bool ok = false;  // every helper below was found
  PFN_cuInit cuInit = nullptr;
  PFN_cuGetErrorString cuGetErrorString = nullptr;
  PFN_cuCtxGetCurrent cuCtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent cuCtxSetCurrent = nullptr;
  PFN_cuCtxGetDevice cuCtxGetDevice = nullptr;
  PFN_cuStreamCreate cuStreamCreate = nullptr;
  PFN_cuStreamSynchronize cuStreamSynchronize = nullptr;
  PFN_cuStreamWaitEvent cuStreamWaitEvent = nullptr;
  PFN_cuStreamIsCapturing cuStreamIsCapturing = nullptr;
  PFN_cuEventCreate cuEventCreate = nullptr;
  PFN_cuEventRecord cuEventRecord = nullptr;
  PFN_cuEventSynchronize cuEventSynchronize = nullptr;
  PFN_cuEventQuery cuEventQuery = nullptr;
  PFN_cuMemHostAlloc cuMemHostAlloc = nullptr;
  PFN_cuMemFreeHost cuMemFreeHost = nullptr;
  // The staging's pinning (staging_ring.cpp); without them it is cuMemHostAlloc's.
  PFN_cuMemHostRegister cuMemHostRegister = nullptr;
  PFN_cuMemHostUnregister cuMemHostUnregister = nullptr;
  PFN_cuPointerGetAttributes cuPointerGetAttributes = nullptr;
  PFN_cuThreadExchangeStreamCaptureMode cuThreadExchangeStreamCaptureMode = nullptr;
  // The engine's DMA calls (explicit non-blocking streams, pinned memory).
  PFN_cuMemcpyHtoDAsync cuMemcpyHtoDAsync = nullptr;
  PFN_cuMemcpyDtoHAsync cuMemcpyDtoHAsync = nullptr;
  // Optional (not part of `ok`): only CMT_TRACE's GPU timestamps use it.
  PFN_cuEventElapsedTime cuEventElapsedTime = nullptr;
  // Optional: the storage path's stream-ordered reads and writes (without waits on memory, the
  // call waits for the stream and transfers synchronously; stream_pipeline.hpp).
  PFN_cuLaunchHostFunc cuLaunchHostFunc = nullptr;
  PFN_cuStreamWaitValue32_v2 cuStreamWaitValue32 = nullptr;
  PFN_cuStreamBatchMemOp_v2 cuStreamBatchMemOp = nullptr;
  PFN_cuMemHostGetDevicePointer_v2 cuMemHostGetDevicePointer = nullptr;
  // Optional: settling a context after a failed copy from a mapped file (mapped_copy.cpp).
  PFN_cuCtxSynchronize cuCtxSynchronize = nullptr;
  // Optional: which NUMA node a GPU sits on (numa_place.hpp); without it nothing is placed.
  PFN_cuDeviceGetPCIBusId cuDeviceGetPCIBusId = nullptr;
  // Optional: the primary context that a reset or release of a device ends (hooks.cpp).
  PFN_cuDevicePrimaryCtxGetState cuDevicePrimaryCtxGetState = nullptr;
  PFN_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain = nullptr;
};

// Loads the driver table once. With `load_if_absent` false (the interposer), only a libcuda that
// the program itself already loaded is used; the C API (benchmarks) may load it.
const Driver& driver(bool load_if_absent = false);

// The real address of an intercepted entry point in libcuda, or nullptr if libcuda is not loaded
// or lacks it.
void* real_entry(EntryId id);

// Whether `p` is the real libcuda address of entry `id` (used to route resolver answers).
int entry_by_real_address(void* p);

}  // namespace cmt
