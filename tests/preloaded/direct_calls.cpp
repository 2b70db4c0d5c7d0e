// A program linked with -lcuda that calls every accelerated entry point by its exported name (the
// PLT door), each with a pageable buffer large enough to be staged, and checks every byte.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "driver_api.hpp"

#define CK(x)                                       \
  do {                                              \
    CUresult r_ = (x);                              \
    if (r_) {                                       \
      printf("FAIL %s returned %d\n", #x, (int)r_); \
      return 1;                                     \
    }                                               \
  } while (0)

static const size_t n = (3u << 20) + 5;

static int check(const char* what, const char* a, const char* b) {
  if (memcmp(a, b, n)) {
    printf("FAIL bytes differ after %s\n", what);
    return 1;
  }
  return 0;
}

int main() {
  CUdevice dev;
  CUcontext ctx;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUstream s;
  CK(cuStreamCreate(&s, 0));
  CUdeviceptr d;
  CK(cuMemAlloc_v2(&d, n));
  char* src = (char*)malloc(n);
  char* out = (char*)malloc(n);
  int bad = 0;
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < n; ++i) src[i] = (char)(i * 31 + round * 7 + 1);
    memset(out, 0, n);
    CUdeviceptr hsrc = (CUdeviceptr)(uintptr_t)src, hout = (CUdeviceptr)(uintptr_t)out;
    switch (round) {
      case 0: CK(cuMemcpyHtoD_v2(d, src, n)); CK(cuMemcpyDtoH_v2(out, d, n)); break;
      case 1: CK(cuMemcpyHtoD_v2_ptds(d, src, n)); CK(cuMemcpyDtoH_v2_ptds(out, d, n)); break;
      case 2: CK(cuMemcpyHtoDAsync_v2(d, src, n, s)); CK(cuMemcpyDtoHAsync_v2(out, d, n, s)); break;
      case 3: CK(cuMemcpyHtoDAsync_v2_ptsz(d, src, n, 0)); CK(cuMemcpyDtoHAsync_v2_ptsz(out, d, n, 0)); break;
      case 4: CK(cuMemcpy(d, hsrc, n)); CK(cuMemcpy_ptds(hout, d, n)); break;
      case 5: CK(cuMemcpyAsync(d, hsrc, n, s)); CK(cuMemcpyAsync_ptsz(hout, d, n, 0)); break;
    }
    CK(cuStreamSynchronize(s));
    char what[32];
    snprintf(what, sizeof what, "round %d", round);
    bad |= check(what, src, out);
  }
  if (!bad) printf("OK\n");
  return bad;
}
