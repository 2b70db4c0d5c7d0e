// The few CUDA driver API types, constants and signatures cmt needs, declared here so
// that the native library builds without a CUDA toolkit (KvikIO's shim does the same).
// Values are the driver ABI's (cuda.h, CUDA 13); tests compare them with cuda.h when present.
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" {

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;     // CUdeviceptr_v2 (64-bit)
typedef unsigned int CUdeviceptr_v1;        // the CUDA 2.0 ABI's 32-bit device pointer
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef unsigned long long cuuint64_t;

enum : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_UNKNOWN = 999,
};

// Stream handles with a special meaning (cuda.h CU_STREAM_LEGACY / CU_STREAM_PER_THREAD).
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

enum : unsigned int {
  CU_STREAM_DEFAULT = 0x0,
  CU_STREAM_NON_BLOCKING = 0x1,
  CU_EVENT_DEFAULT = 0x0,
  CU_EVENT_BLOCKING_SYNC = 0x1,
  CU_EVENT_DISABLE_TIMING = 0x2,
  CU_MEMHOSTALLOC_PORTABLE = 0x1,
  CU_MEMHOSTREGISTER_PORTABLE = 0x1,
  CU_MEM_ATTACH_GLOBAL = 0x1,
};

typedef enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
} CUpointer_attribute;

typedef enum {
  CU_MEMORYTYPE_HOST = 1,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_MEMORYTYPE_ARRAY = 3,
  CU_MEMORYTYPE_UNIFIED = 4,
} CUmemorytype;

typedef enum {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;

typedef enum {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;

// cuGetProcAddress flags
enum : unsigned long long {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1ULL << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1ULL << 1,
};

typedef enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

// Signatures of the entry points cmt calls or wraps (the current ABI of each name).
typedef CUresult (*PFN_cuInit)(unsigned int);
typedef CUresult (*PFN_cuDriverGetVersion)(int*);
typedef CUresult (*PFN_cuGetErrorString)(CUresult, const char**);
typedef CUresult (*PFN_cuCtxGetCurrent)(CUcontext*);
typedef CUresult (*PFN_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_cuCtxGetDevice)(CUdevice*);
typedef CUresult (*PFN_cuCtxDestroy)(CUcontext);
typedef CUresult (*PFN_cuDevicePrimaryCtxReset)(CUdevice);
typedef CUresult (*PFN_cuDevicePrimaryCtxRelease)(CUdevice);
typedef CUresult (*PFN_cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*PFN_cuDevicePrimaryCtxGetState)(CUdevice, unsigned int*, int*);
typedef CUresult (*PFN_cuDeviceGetPCIBusId)(char*, int, CUdevice);
typedef CUresult (*PFN_cuStreamCreate)(CUstream*, unsigned int);
typedef CUresult (*PFN_cuStreamDestroy)(CUstream);
typedef CUresult (*PFN_cuStreamSynchronize)(CUstream);
typedef CUresult (*PFN_cuStreamQuery)(CUstream);
typedef CUresult (*PFN_cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
typedef CUresult (*PFN_cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
typedef CUresult (*PFN_cuStreamGetCtx)(CUstream, CUcontext*);
typedef CUresult (*PFN_cuEventCreate)(CUevent*, unsigned int);
typedef CUresult (*PFN_cuEventDestroy)(CUevent);
typedef CUresult (*PFN_cuEventRecord)(CUevent, CUstream);
typedef CUresult (*PFN_cuEventSynchronize)(CUevent);
typedef CUresult (*PFN_cuEventQuery)(CUevent);
typedef CUresult (*PFN_cuEventElapsedTime)(float*, CUevent, CUevent);
typedef CUresult (*PFN_cuMemHostAlloc)(void**, size_t, unsigned int);
typedef CUresult (*PFN_cuMemFreeHost)(void*);
typedef CUresult (*PFN_cuMemHostRegister)(void*, size_t, unsigned int);
typedef CUresult (*PFN_cuMemHostUnregister)(void*);
typedef CUresult (*PFN_cuPointerGetAttributes)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
typedef CUresult (*PFN_cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode*);

typedef CUresult (*PFN_cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
typedef CUresult (*PFN_cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
typedef CUresult (*PFN_cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);

typedef CUresult (*PFN_cuGetProcAddress_v1)(const char*, void**, int, cuuint64_t);
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char*, void**, int, cuuint64_t,
                                            CUdriverProcAddressQueryResult*);

}  // extern "C"
