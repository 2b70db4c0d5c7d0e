// CK(call): a driver call in the GPU explorers (explore_*.cpp); prints which failed and exits.
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
