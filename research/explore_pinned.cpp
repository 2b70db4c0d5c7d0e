// What limits the copy engine's rate from page-locked host memory on a GPU machine: where the
// pinned memory came from (the driver's cuMemHostAlloc, or malloc'd memory registered with
// cuMemHostRegister, with or without transparent huge pages), and how much CPU memory traffic
// running at the same time slows it (the staging engine copies with the CPU while the DMA runs).
//
//   nvcc -O2 -Xcompiler -mavx2,-mcldemote,-mclflushopt -o /tmp/explore_pinned research/explore_pinned.cpp -lcuda -lpthread && /tmp/explore_pinned
//
// Prints one JSON object per line.
#include <cuda.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"

static const size_t MIB = size_t(1) << 20;
static CUstream g_stream;
static CUdeviceptr g_dev;

// Median GB/s of `rounds` timings of `per` back-to-back copies, timed with events.
static double dma_gbps(void* host, size_t n, bool h2d, int rounds = 7, int per = 3) {
  CUevent a, b;
  CK(cuEventCreate(&a, 0));
  CK(cuEventCreate(&b, 0));
  std::vector<double> v;
  for (int r = 0; r < rounds + 1; ++r) {
    CK(cuEventRecord(a, g_stream));
    for (int i = 0; i < per; ++i) {
      if (h2d) CK(cuMemcpyHtoDAsync(g_dev, host, n, g_stream));
      else CK(cuMemcpyDtoHAsync(host, g_dev, n, g_stream));
    }
    CK(cuEventRecord(b, g_stream));
    CK(cuEventSynchronize(b));
    float ms;
    CK(cuEventElapsedTime(&ms, a, b));
    if (r) v.push_back(double(n) * per / (ms * 1e6));
  }
  cuEventDestroy(a);
  cuEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static long anon_huge_kb() {
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

struct Host {
  void* p;
  std::string kind;
  long huge_kb;
};

static Host alloc_host(const std::string& kind, size_t n) {
  Host h{nullptr, kind, 0};
  if (kind == "hostalloc") {
    CK(cuMemHostAlloc(&h.p, n, CU_MEMHOSTALLOC_PORTABLE));
  } else {
    long before = anon_huge_kb();
    char* q = host_pages(n, kind == "register-thp");
    h.huge_kb = anon_huge_kb() - before;
    CK(cuMemHostRegister(q, n, CU_MEMHOSTREGISTER_PORTABLE));
    h.p = q;
  }
  memset(h.p, 2, n);
  return h;
}

// CPU load while the DMA runs: `threads` threads copying between private 256 MiB buffers
// (memory-bound traffic), with cached or streaming stores, or into a small ring that stays in the
// last-level cache (`ring` bytes per thread).
struct Load {
  std::atomic<bool> stop{false};
  std::atomic<long> bytes{0};
  std::vector<std::thread> ts;
  std::atomic<int> ready{0};
  void start(int threads, bool nt, size_t ring) {
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([this, nt, ring] {
        size_t n = 256 * MIB;
        char* src = static_cast<char*>(aligned_alloc(4096, n));
        size_t dn = ring ? ring : n;
        char* dst = static_cast<char*>(aligned_alloc(4096, dn));
        memset(src, 3, n);  // fault every page in before the clock starts
        memset(dst, 4, dn);
        ready++;
        size_t piece = 256 * 1024, off = 0, doff = 0;
        long done = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          if (nt) {
            for (size_t i = 0; i < piece; i += 32)
              _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + doff + i),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off + i)));
          } else {
            memcpy(dst + doff, src + off, piece);
          }
          off = (off + piece) % n;
          doff = (doff + piece) % dn;
          done += piece;
        }
        bytes += done;
        free(src);
        free(dst);
      });
    while (ready.load() < threads) std::this_thread::yield();
  }
  void finish() {
    stop = true;
    for (auto& t : ts) t.join();
  }
};

int main() {
  open_gpu(&g_stream);
  size_t big = 256 * MIB;
  CK(cuMemAlloc(&g_dev, big));

  // 1. Pinned memory by origin: four separate buffers of each kind, 64 MiB and 256 MiB copies.
  std::vector<Host> hosts;
  for (const char* kind : {"hostalloc", "register-thp", "register-4k"})
    for (int i = 0; i < 4; ++i) hosts.push_back(alloc_host(kind, big));
  for (auto& h : hosts)
    for (size_t n : {64 * MIB, big})
      printf("{\"test\": \"origin\", \"kind\": \"%s\", \"huge_kb\": %ld, \"bytes\": %zu, \"h2d\": %.2f, \"d2h\": %.2f}\n",
             h.kind.c_str(), h.huge_kb, n, dma_gbps(h.p, n, true), dma_gbps(h.p, n, false));
  fflush(stdout);

  // 2. The DMA's rate while CPU threads load memory, from the first buffer of each kind.
  for (int hk : {0})
    for (int threads : {4, 8, 12})
      for (int mode = 0; mode < 3; ++mode) {
        bool nt = mode == 1;
        size_t ring = mode == 2 ? 2 * MIB : 0;
        Load load;
        load.start(threads, nt, ring);
        auto t0 = std::chrono::steady_clock::now();
        double h2d = dma_gbps(hosts[hk].p, 64 * MIB, true, 9, 4);
        double d2h = dma_gbps(hosts[hk].p, 64 * MIB, false, 9, 4);
        load.finish();
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("{\"test\": \"contention\", \"kind\": \"%s\", \"threads\": %d, \"load\": \"%s\", \"h2d\": %.2f, "
               "\"d2h\": %.2f, \"cpu_gbps\": %.1f}\n",
               hosts[hk].kind.c_str(), threads, mode == 0 ? "memcpy" : mode == 1 ? "nt" : "memcpy-2MiB-ring", h2d,
               d2h, load.bytes.load() / secs / 1e9);
        fflush(stdout);
      }

  // 3. The DMA's rate reading a buffer that CPU threads have just written (what the staging engine
  //    does), by how they wrote it; and the CPU's rate copying out a buffer the DMA just wrote.
  std::vector<char> src(64 * MIB, 5), dst(64 * MIB, 6);
  char* pin = static_cast<char*>(hosts[0].p);
  for (int threads : {4, 8, 12})
    for (const char* how : {"memcpy", "nt", "memcpy+cldemote", "memcpy+clflushopt", "cold"}) {
      std::string h = how;
      CUevent a, b;
      CK(cuEventCreate(&a, 0));
      CK(cuEventCreate(&b, 0));
      std::vector<double> dma, cpu_out;
      for (int r = 0; r < 8; ++r) {
        auto fill = [&](int t) {
          size_t part = (64 * MIB / threads) & ~size_t(4095), o = t * part;  // aligned for streaming stores
          if (h == "nt") {
            for (size_t i = 0; i < part; i += 32)
              _mm256_stream_si256(reinterpret_cast<__m256i*>(pin + o + i),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src.data() + o + i)));
            _mm_sfence();
            return;
          }
          memcpy(pin + o, src.data() + o, part);
          if (h == "memcpy+cldemote")
            for (size_t i = 0; i < part; i += 64) _cldemote(pin + o + i);
          if (h == "memcpy+clflushopt") {
            for (size_t i = 0; i < part; i += 64) _mm_clflushopt(pin + o + i);
            _mm_sfence();
          }
        };
        if (h != "cold") {
          std::vector<std::thread> ts;
          for (int t = 0; t < threads; ++t) ts.emplace_back(fill, t);
          for (auto& t : ts) t.join();
        }
        CK(cuEventRecord(a, g_stream));
        CK(cuMemcpyHtoDAsync(g_dev, pin, 64 * MIB, g_stream));
        CK(cuEventRecord(b, g_stream));
        CK(cuEventSynchronize(b));
        float ms;
        CK(cuEventElapsedTime(&ms, a, b));
        dma.push_back(64.0 * MIB / (ms * 1e6));
        // the other way: DMA into the buffer, then the threads copy it out
        CK(cuMemcpyDtoH(pin, g_dev, 64 * MIB));
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            size_t part = (64 * MIB / threads) & ~size_t(4095), o = t * part;  // aligned for streaming stores
            memcpy(dst.data() + o, pin + o, part);
          });
        for (auto& t : ts) t.join();
        cpu_out.push_back(64.0 * MIB / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
      }
      std::sort(dma.begin(), dma.end());
      std::sort(cpu_out.begin(), cpu_out.end());
      printf("{\"test\": \"after-write\", \"threads\": %d, \"how\": \"%s\", \"h2d_dma\": %.2f, \"cpu_copy_out_after_dma\": %.2f}\n",
             threads, how, dma[4], cpu_out[4]);
      fflush(stdout);
    }
  return 0;
}
