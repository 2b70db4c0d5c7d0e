// What it costs to page-lock a program's own pageable buffer for the length of one copy
// (cuMemHostRegister, DMA straight from / into it, cuMemHostUnregister) against staging it: the
// question is whether a copy of 16-256 MiB could skip the CPU's staging copy altogether.
//
//   nvcc -O2 -o /tmp/explore_register research/explore_register.cpp -lcuda -lpthread && /tmp/explore_register
//
// Prints one JSON object per line; times in microseconds, medians of 7 rounds.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"

static const size_t MIB = size_t(1) << 20;
using Clock = std::chrono::steady_clock;

static double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static CUstream g_stream;
static CUdeviceptr g_dev;

static void dma(char* host, size_t n, bool h2d) {
  if (h2d) CK(cuMemcpyHtoDAsync(g_dev, host, n, g_stream));
  else CK(cuMemcpyDtoHAsync(host, g_dev, n, g_stream));
}

int main() {
  CUcontext ctx = open_gpu(&g_stream);
  const size_t big = 256 * MIB;
  CK(cuMemAlloc(&g_dev, big));
  void* pinned;
  CK(cuMemHostAlloc(&pinned, big, CU_MEMHOSTALLOC_PORTABLE));
  memset(pinned, 2, big);

  // 1. Register, one DMA, unregister, by size and page size; the pinned DMA of the same size.
  for (bool huge : {false, true}) {
    char* host = host_pages(big, huge);
    for (size_t n : {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB})
      for (bool h2d : {true, false}) {
        std::vector<double> reg, copy, unreg, pin;
        for (int r = 0; r < 8; ++r) {
          auto t0 = Clock::now();
          CK(cuMemHostRegister(host, n, h2d ? CU_MEMHOSTREGISTER_READ_ONLY : 0));
          double a = us_since(t0);
          t0 = Clock::now();
          dma(host, n, h2d);
          CK(cuStreamSynchronize(g_stream));
          double b = us_since(t0);
          t0 = Clock::now();
          CK(cuMemHostUnregister(host));
          double c = us_since(t0);
          t0 = Clock::now();
          dma(static_cast<char*>(pinned), n, h2d);
          CK(cuStreamSynchronize(g_stream));
          double d = us_since(t0);
          if (r) reg.push_back(a), copy.push_back(b), unreg.push_back(c), pin.push_back(d);
        }
        double total = median(reg) + median(copy) + median(unreg);
        printf("{\"test\": \"register-once\", \"huge\": %d, \"dir\": \"%s\", \"bytes\": %zu, \"register_us\": %.1f, "
               "\"dma_us\": %.1f, \"unregister_us\": %.1f, \"pinned_us\": %.1f, \"total_gbps\": %.2f, "
               "\"pinned_gbps\": %.2f}\n",
               huge, h2d ? "h2d" : "d2h", n, median(reg), median(copy), median(unreg), median(pin),
               n / total / 1e3, n / median(pin) / 1e3);
        fflush(stdout);
      }
    munmap(host, big);  // (the 2 MiB alignment slack leaks; a test program)
  }

  // 2. Pipelined: register piece k, queue its DMA, register piece k+1 while it runs; unregister
  //    every piece after the last DMA. The wall time of a whole 64 MiB copy.
  for (bool huge : {false, true}) {
    char* host = host_pages(big, huge);
    for (size_t n : {16 * MIB, 64 * MIB})
      for (size_t piece : {1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB})
        for (bool h2d : {true, false}) {
          if (piece >= n) continue;
          std::vector<double> wall;
          for (int r = 0; r < 8; ++r) {
            auto t0 = Clock::now();
            for (size_t o = 0; o < n; o += piece) {
              CK(cuMemHostRegister(host + o, piece, h2d ? CU_MEMHOSTREGISTER_READ_ONLY : 0));
              dma(host + o, piece, h2d);
            }
            CK(cuStreamSynchronize(g_stream));
            for (size_t o = 0; o < n; o += piece) CK(cuMemHostUnregister(host + o));
            if (r) wall.push_back(us_since(t0));
          }
          printf("{\"test\": \"register-pipelined\", \"huge\": %d, \"dir\": \"%s\", \"bytes\": %zu, \"piece\": %zu, "
                 "\"wall_us\": %.1f, \"gbps\": %.2f}\n",
                 huge, h2d ? "h2d" : "d2h", n, piece, median(wall), n / median(wall) / 1e3);
          fflush(stdout);
        }
    // 3. Registration from several threads at once (is it serialised in the driver?).
    for (int threads : {1, 2, 4, 8}) {
      size_t n = 64 * MIB, part = n / threads;
      std::vector<double> wall;
      for (int r = 0; r < 6; ++r) {
        auto t0 = Clock::now();
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            CK(cuCtxSetCurrent(ctx));
            CK(cuMemHostRegister(host + t * part, part, CU_MEMHOSTREGISTER_READ_ONLY));
          });
        for (auto& t : ts) t.join();
        double w = us_since(t0);
        for (int t = 0; t < threads; ++t) CK(cuMemHostUnregister(host + t * part));
        if (r) wall.push_back(w);
      }
      printf("{\"test\": \"register-threads\", \"huge\": %d, \"threads\": %d, \"bytes\": %zu, \"register_us\": %.1f}\n",
             huge, threads, n, median(wall));
      fflush(stdout);
    }
    munmap(host, big);
  }
  return 0;
}
