// CK(call): a driver call in the GPU explorers (explore_*.cpp); prints which failed and exits.
// open_gpu(): what every explorer starts with.
#pragma once
#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                              \
  do {                                                                     \
    CUresult r_ = (x);                                                     \
    if (r_ != CUDA_SUCCESS) {                                              \
      fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)r_, __LINE__); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

// Makes device 0's primary context current in this thread; returns it, and a non-blocking stream.
inline CUcontext open_gpu(CUstream* stream) {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(stream, CU_STREAM_NON_BLOCKING));
  return ctx;
}
