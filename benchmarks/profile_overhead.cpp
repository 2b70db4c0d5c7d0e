// 10^5 small host-to-device copies through cuMemcpyHtoD_v2, best of 3 passes, printed as ns per
// copy: run with and without CMT_PROFILE_DIR under the preloaded library, the difference is what
// `cmt profile`'s recording costs each copy. Built by benchmarks/profile_overhead.py (real driver)
// and by tests/test_profile.py (the stand-in driver).
//   profile_overhead N BYTES
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cmt/cuda_types.hpp"

extern "C" {
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
}

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  size_t bytes = argc > 2 ? strtoull(argv[2], nullptr, 10) : 0;
  CUcontext ctx;
  CUdeviceptr dev;
  if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuMemAlloc_v2(&dev, bytes + 1)) {
    fprintf(stderr, "CUDA setup failed\n");
    return 90;
  }
  std::vector<char> host(bytes + 1, 1);
  double best = 1e9;
  for (int pass = 0; pass < 3; ++pass) {
    double t = now();
    for (int i = 0; i < n; ++i) {
      if (cuMemcpyHtoD_v2(dev, host.data(), bytes)) {
        fprintf(stderr, "copy failed\n");
        return 91;
      }
    }
    best = std::min(best, (now() - t) / n);
  }
  printf("%.1f\n", best * 1e9);
}
