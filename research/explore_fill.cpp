// How fast the CPU alone can fill the engine's staging ring on a GPU machine, with no DMA running:
// host-to-device at 64 MiB needs the lanes to fill faster than the link drains (55 GB/s on the
// H200), and the engine's timelines show them near 46 GB/s with 10 lanes. What decides the rate:
// the lanes' count, the page size of the staging slots (the driver's cuMemHostAlloc, or registered
// memory on transparent huge pages: a KVM guest pays a nested page walk per TLB miss),
// the source's page size, whether the source is in the CPU's caches, and the copy loop (memcpy,
// memcpy with software prefetch of the source's next pages, streaming stores).
//
// The lanes work as the engine's do: persistent threads, spinning between copies, claim pieces
// (block / lanes bytes) of 8 MiB blocks in order from one counter; block b goes to slot b % 4.
// Each case runs alone, then again while the copy engine runs host-to-device DMAs from another
// pinned buffer without a pause (the engine's lanes share the memory with its DMAs).
//
//   nvcc -O2 -Xcompiler -mavx2 -o /tmp/explore_fill research/explore_fill.cpp -lcuda -lpthread && /tmp/explore_fill
//
// Prints one JSON object per line.
#include <cuda.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"

static const size_t MIB = size_t(1) << 20;
static const size_t kCopy = 64 * MIB, kBlock = 8 * MIB;
static const int kSlots = 4;

static void copy_nt(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i)), b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(s + i + 64)), e = _mm256_loadu_si256((const __m256i*)(s + i + 96));
    _mm256_stream_si256((__m256i*)(d + i), a);
    _mm256_stream_si256((__m256i*)(d + i + 32), b);
    _mm256_stream_si256((__m256i*)(d + i + 64), c);
    _mm256_stream_si256((__m256i*)(d + i + 96), e);
  }
  memcpy(d + i, s + i, n - i);
  _mm_sfence();
}

// memcpy 4 KiB at a time, the source's lines `ahead` bytes on prefetched first: the hardware
// prefetchers stop at every 4 KiB page boundary.
static void copy_prefetch(char* d, const char* s, size_t n, size_t ahead) {
  for (size_t i = 0; i < n; i += 4096) {
    size_t len = std::min<size_t>(4096, n - i);
    if (i + ahead < n)
      for (size_t l = 0; l < 4096 && i + ahead + l < n; l += 64) _mm_prefetch(s + i + ahead + l, _MM_HINT_T0);
    memcpy(d + i, s + i, len);
  }
}

struct Lanes {
  std::vector<std::thread> threads;
  std::atomic<long> gen{0};
  std::atomic<int> running{0};
  std::atomic<size_t> next{0};
  int lanes = 0;
  size_t piece = 0, per_block = 0, pieces = 0;
  char* slots[kSlots] = {};
  const char* src = nullptr;
  std::string how;
  bool stop = false;

  void work() {
    for (;;) {
      size_t p = next.fetch_add(1);
      if (p >= pieces) return;
      size_t b = p / per_block, in = (p % per_block) * piece, off = b * kBlock + in;
      size_t len = std::min(piece, kBlock - in);
      char* d = slots[b % kSlots] + in;
      if (how == "nt") copy_nt(d, src + off, len);
      else if (how == "prefetch8k") copy_prefetch(d, src + off, len, 8192);
      else if (how == "prefetch16k") copy_prefetch(d, src + off, len, 16384);
      else memcpy(d, src + off, len);
    }
  }
  void start(int n) {
    lanes = n;
    for (int i = 1; i < n; ++i)
      threads.emplace_back([this] {
        long seen = 0;
        for (;;) {
          while (gen.load() == seen) _mm_pause();
          seen = gen.load();
          if (stop) return;
          work();
          running.fetch_sub(1);
        }
      });
  }
  double run(const char* s) {  // seconds for one 64 MiB fill
    src = s;
    piece = (kBlock / lanes + 4095) & ~size_t(4095);
    per_block = (kBlock + piece - 1) / piece;
    pieces = kCopy / kBlock * per_block;
    next = 0;
    running = lanes - 1;
    auto t0 = std::chrono::steady_clock::now();
    gen.fetch_add(1);
    work();
    while (running.load()) _mm_pause();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ~Lanes() {
    stop = true;
    gen.fetch_add(1);
    for (auto& t : threads) t.join();
  }
};

// Host-to-device DMAs of a 64 MiB pinned buffer, back to back, while `on`.
struct BackgroundDma {
  std::atomic<bool> on{false}, stop{false};
  std::thread t;
  BackgroundDma(CUcontext ctx, CUstream stream) {
    void* src;
    CUdeviceptr dev;
    CK(cuMemHostAlloc(&src, kCopy, CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemAlloc(&dev, kCopy));
    t = std::thread([=] {
      CK(cuCtxSetCurrent(ctx));
      while (!stop) {
        if (!on) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          continue;
        }
        CK(cuMemcpyHtoDAsync(dev, src, kCopy, stream));
        CK(cuStreamSynchronize(stream));
      }
    });
  }
  ~BackgroundDma() {
    stop = true;
    t.join();
  }
};

int main() {
  CUstream stream;
  CUcontext ctx = open_gpu(&stream);
  BackgroundDma dma(ctx, stream);
  const int kRotate = 8;  // 512 MiB of sources in turn: beyond the L3
  std::vector<char*> src4k, srcthp;
  for (int i = 0; i < kRotate; ++i) src4k.push_back(host_pages(kCopy, false));
  for (int i = 0; i < kRotate; ++i) srcthp.push_back(host_pages(kCopy, true));
  struct Staging {
    std::string kind;
    char* slot[kSlots];
  };
  std::vector<Staging> stagings;
  {
    Staging h{"hostalloc", {}};
    for (auto& s : h.slot) CK(cuMemHostAlloc(reinterpret_cast<void**>(&s), kBlock, CU_MEMHOSTALLOC_PORTABLE));
    stagings.push_back(h);
    Staging r{"register-thp", {}};
    for (auto& s : r.slot) {
      s = host_pages(kBlock, true);
      CK(cuMemHostRegister(s, kBlock, CU_MEMHOSTREGISTER_PORTABLE));
    }
    stagings.push_back(r);
  }
  for (int lanes : {1, 6, 8, 10, 12, 16}) {
    Lanes L;
    L.start(lanes);
    for (bool busy : {false, true}) {
    dma.on = busy;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (const Staging& st : stagings) {
      for (int s = 0; s < kSlots; ++s) L.slots[s] = st.slot[s];
      for (const char* how : {"memcpy", "prefetch8k", "nt"}) {
        L.how = how;
        for (bool thp : {false, true}) {
          for (bool warm : {true, false}) {
            const std::vector<char*>& srcs = thp ? srcthp : src4k;
            std::vector<double> v;
            for (int r = 0; r < 14; ++r) {
              double t = L.run(srcs[warm ? 0 : r % kRotate]);
              if (r >= 2) v.push_back(kCopy / t / 1e9);
            }
            std::sort(v.begin(), v.end());
            printf("{\"lanes\": %d, \"dma\": %s, \"staging\": \"%s\", \"copy\": \"%s\", \"source\": \"%s\", "
                   "\"warm\": %s, \"gbps\": %.1f, \"min\": %.1f, \"max\": %.1f}\n",
                   lanes, busy ? "true" : "false", st.kind.c_str(), how, thp ? "thp" : "4k", warm ? "true" : "false",
                   v[v.size() / 2], v.front(), v.back());
            fflush(stdout);
          }
        }
      }
    }
    }
  }
  dma.on = false;
  return 0;
}
