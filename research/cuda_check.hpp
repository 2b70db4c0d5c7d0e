// CK(call): a driver call in the GPU explorers (explore_*.cpp); prints which failed and exits.
// open_gpu(): what every explorer starts with. host_pages(): their pageable test buffers.
#pragma once
#include <cuda.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// A 2 MiB-aligned anonymous buffer of n bytes, on transparent huge pages or (huge false) never,
// written once so that its pages exist.
inline char* host_pages(size_t n, bool huge) {
  const size_t align = size_t(2) << 20;
  void* p = mmap(nullptr, n + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  char* q = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + align - 1) & ~(align - 1));
  madvise(q, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(q, 1, n);
  return q;
}
