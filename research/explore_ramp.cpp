// Why the first DMAs of an engine copy run slowly (timeline.json, 2026-12-03: a 64 MiB copy's
// first 512 KiB-2 MiB blocks at 7-35 GB/s, in both directions, against 50-54 for later blocks).
// Queues the engine's block pattern (a ramp 512K 1M 2M, then 4 MiB blocks, each at the start of one
// of 4 pinned staging slots) on one stream, with GPU events around every DMA, after the CPU did
// one thing to the slots: nothing, wrote them (cached or streaming stores, by 8 threads), read
// them (plainly or behind non-temporal prefetches), wrote then flushed them, or nothing but a 2 ms
// idle GPU. Prints per-block GB/s medians (results: benchmarks/results/h200-2026-12-03/ramp*.jsonl).
// Then ("split"): blocks just written with cached stores, each DMA'd as 1, 2 or 4 parts at once on
// as many streams, joined before the next block: do several copy engines read lines the CPU still
// holds dirty faster than one (results/h200-2026-12-03/ramp-split.jsonl)?
//
//   nvcc -O2 -Xcompiler -mavx2,-mclflushopt -o /tmp/explore_ramp research/explore_ramp.cpp -lcuda -lpthread && /tmp/explore_ramp
#include <cuda.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"

static const size_t KIB = 1024, MIB = KIB * KIB;
static const int kSlots = 4, kThreads = 8, kRounds = 9;
static const std::vector<size_t> kBlocks = {512 * KIB, 1 * MIB, 2 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB};

static char* g_slot[kSlots];
static volatile long g_sink;

// Runs fn(start, length) over every block's slot region, split over kThreads threads.
template <class F>
static void on_slots(F fn) {
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (size_t b = 0; b < kBlocks.size(); ++b) {
        size_t part = kBlocks[b] / kThreads;
        fn(g_slot[b % kSlots] + t * part, part);
      }
    });
  for (auto& th : ts) th.join();
}

static void touch(const std::string& how) {
  if (how == "write") on_slots([](char* p, size_t n) { memset(p, 7, n); });
  if (how == "write-nt")
    on_slots([](char* p, size_t n) {
      __m256i v = _mm256_set1_epi8(7);
      for (size_t i = 0; i < n; i += 32) _mm256_stream_si256(reinterpret_cast<__m256i*>(p + i), v);
      _mm_sfence();
    });
  if (how == "write-flush")
    on_slots([](char* p, size_t n) {
      memset(p, 7, n);
      for (size_t i = 0; i < n; i += 64) _mm_clflushopt(p + i);
      _mm_sfence();
    });
  if (how == "read")
    on_slots([](char* p, size_t n) {
      long s = 0;
      for (size_t i = 0; i < n; i += 64) s += p[i];
      g_sink = s;
    });
  if (how == "read-nta")  // as the engine's CMT_COPY_OUT_NTA copy-out reads
    on_slots([](char* p, size_t n) {
      long s = 0;
      for (size_t i = 0; i < n; i += 64) {
        _mm_prefetch(p + i + 2048, _MM_HINT_NTA);
        s += p[i];
      }
      g_sink = s;
    });
  if (how == "idle-2ms") std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// kRounds + 1 rounds (the first not counted) of: touch(how), then every block's DMAs queued by
// queue(b, device_offset, slot) between two events on `stream`. Returns each block's GB/s per round.
template <class Queue>
static std::vector<std::vector<double>> block_rates(CUstream stream, const char* how, const std::vector<CUevent>& ev,
                                                    Queue queue) {
  std::vector<std::vector<double>> gbps(kBlocks.size());
  for (int r = 0; r < kRounds + 1; ++r) {
    CK(cuStreamSynchronize(stream));
    touch(how);
    size_t off = 0;
    for (size_t b = 0; b < kBlocks.size(); ++b) {
      CK(cuEventRecord(ev[2 * b], stream));
      queue(b, off, g_slot[b % kSlots]);
      CK(cuEventRecord(ev[2 * b + 1], stream));
      off += kBlocks[b];
    }
    CK(cuStreamSynchronize(stream));
    for (size_t b = 0; r && b < kBlocks.size(); ++b) {
      float ms;
      CK(cuEventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1]));
      gbps[b].push_back(kBlocks[b] / (ms * 1e6));
    }
  }
  return gbps;
}

// Ends a JSON line: each block's median GB/s, then "]}".
static void print_medians(std::vector<std::vector<double>>& gbps) {
  for (size_t b = 0; b < kBlocks.size(); ++b) {
    std::sort(gbps[b].begin(), gbps[b].end());
    printf("%s%.1f", b ? ", " : "", gbps[b][gbps[b].size() / 2]);
  }
  printf("]}\n");
}

// Each block as `parts` DMAs at once on parts streams (forked from and joined to `main`), the
// block's time taken on `main`: GB/s medians per block after the CPU wrote the slots (cached).
static void split_test(CUdeviceptr d, const std::vector<CUevent>& ev) {
  CUstream main;
  CK(cuStreamCreate(&main, CU_STREAM_NON_BLOCKING));
  const int kMaxParts = 4;
  CUstream side[kMaxParts];
  CUevent join[kMaxParts];
  for (int k = 0; k < kMaxParts; ++k) {
    CK(cuStreamCreate(&side[k], CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&join[k], CU_EVENT_DISABLE_TIMING));
  }
  for (const char* how : {"write", "write-nt"}) {
    for (int parts : {1, 2, 4}) {
      auto gbps = block_rates(main, how, ev, [&](size_t b, size_t off, char* slot) {
        size_t part = kBlocks[b] / parts;
        for (int k = 0; k < parts; ++k) {
          CK(cuStreamWaitEvent(side[k], ev[2 * b], 0));
          CK(cuMemcpyHtoDAsync(d + off + k * part, slot + k * part, part, side[k]));
          CK(cuEventRecord(join[k], side[k]));
          CK(cuStreamWaitEvent(main, join[k], 0));
        }
      });
      printf("{\"test\": \"split\", \"direction\": \"h2d\", \"before\": \"%s\", \"parts\": %d, \"gbps\": [", how, parts);
      print_medians(gbps);
      fflush(stdout);
    }
  }
}

int main() {
  CUstream stream;
  open_gpu(&stream);
  size_t total = 0;
  for (size_t n : kBlocks) total += n;
  CUdeviceptr d;
  CK(cuMemAlloc(&d, total));
  for (auto& s : g_slot) {
    CK(cuMemHostAlloc(reinterpret_cast<void**>(&s), 4 * MIB, CU_MEMHOSTALLOC_PORTABLE));
    memset(s, 1, 4 * MIB);
  }
  std::vector<CUevent> ev(2 * kBlocks.size());
  for (auto& e : ev) CK(cuEventCreate(&e, 0));
  const char* hows[] = {"none", "idle-2ms", "write", "write-nt", "write-flush", "read", "read-nta"};
  for (int h2d = 1; h2d >= 0; --h2d) {
    for (const char* how : hows) {
      auto gbps = block_rates(stream, how, ev, [&](size_t b, size_t off, char* slot) {
        if (h2d) CK(cuMemcpyHtoDAsync(d + off, slot, kBlocks[b], stream));
        else CK(cuMemcpyDtoHAsync(slot, d + off, kBlocks[b], stream));
      });
      printf("{\"test\": \"ramp\", \"direction\": \"%s\", \"before\": \"%s\", \"block_kib\": [", h2d ? "h2d" : "d2h", how);
      for (size_t b = 0; b < kBlocks.size(); ++b) printf("%s%zu", b ? ", " : "", kBlocks[b] / KIB);
      printf("], \"gbps\": [");
      print_medians(gbps);
      fflush(stdout);
    }
  }
  split_test(d, ev);
  return 0;
}
