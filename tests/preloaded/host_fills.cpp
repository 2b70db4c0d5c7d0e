// Large memset calls under LD_PRELOAD=libcmt.so (native/src/host_copy.cpp, staged_fill), in a
// program that has the (stand-in) CUDA driver loaded: every byte of each fill and of its
// surroundings checked, in each of the cases cmt must get right. Prints "ok <case>" per case, then
// cmt's statistics as JSON.
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cmt/cuda_types.hpp"
#include "print_stats.hpp"

extern "C" CUresult cuInit(unsigned int);
extern "C" CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
extern "C" CUresult cuCtxSetCurrent(CUcontext);
extern "C" CUresult cuMemAllocHost_v2(void**, size_t);
extern "C" CUresult cuMemFreeHost(void*);
extern "C" void* __memset_chk(void*, int, size_t, size_t);

static void ok(const char* what, bool good) {
  printf("%s %s\n", good ? "ok" : "FAILED", what);
  fflush(stdout);
  if (!good) exit(1);
}

// The fill under test, through a pointer so that the compiler cannot inline or elide it.
static void* (*volatile fill_fn)(void*, int, size_t) = memset;

static bool all_are(const unsigned char* p, size_t n, unsigned char c) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != c) {
      fprintf(stderr, "byte %zu: %u, expected %u\n", i, p[i], c);
      return false;
    }
  }
  return true;
}

// Fills [off, off + n) of a region of never-touched pages (or, `touched`, of pages written with 0x11
// first) with `c`; the bytes around it keep what they had.
static bool fill_case(size_t n, size_t off, unsigned char c, bool touched, bool checked = false) {
  const size_t total = off + n + 8192;
  auto* p = static_cast<unsigned char*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) abort();
  const unsigned char around = touched ? 0x11 : 0;
  if (touched) {
    for (size_t i = 0; i < total; i += 1) p[i] = 0x11;
  }
  if (checked) __memset_chk(p + off, c, n, total - off);
  else fill_fn(p + off, c, n);
  const bool good = all_are(p, off, around) && all_are(p + off, n, c) && all_are(p + off + n, total - off - n, around);
  munmap(p, total);
  return good;
}

static volatile sig_atomic_t g_sig_fills = 0;
static size_t g_sig_n;
static unsigned char* g_sig_dst;

static void on_signal(int) {
  fill_fn(g_sig_dst, 0x77, g_sig_n);
  g_sig_fills = g_sig_fills + 1;
}

int main(int argc, char** argv) {
  const size_t big = argc > 1 ? strtoull(argv[1], nullptr, 10) : size_t(32) << 20;
  cuInit(0);  // a process that uses CUDA: its large fills are cmt's

  ok("small", fill_case(4096, 0, 0x5a, false));
  ok("large into never-touched pages", fill_case(big, 0, 0x5a, false));
  ok("large zero fill of never-touched pages", fill_case(big, 0, 0, false));
  ok("large, odd size and alignment", fill_case(big + 4097, 3, 0xa5, false));
  ok("large into touched pages", fill_case(big, 0, 0x5a, true));
  ok("__memset_chk", fill_case(big + 1, 5, 0x3c, false, true));

  {  // many threads at once: one has the pool, the others fill on their own; all exact
    std::vector<std::thread> threads;
    std::vector<int> good(8, 0);
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] { good[t] = fill_case(big, t * 64, static_cast<unsigned char>(t + 1), t % 3 == 0); });
    }
    for (auto& th : threads) th.join();
    bool all = true;
    for (int g : good) all = all && g;
    ok("eight threads at once", all);
  }

  // From a signal handler: raised here, and delivered by a timer while this thread fills.
  g_sig_n = big;
  g_sig_dst = static_cast<unsigned char*>(mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (g_sig_dst == MAP_FAILED) abort();
  signal(SIGALRM, on_signal);
  raise(SIGALRM);  // into never-touched pages
  ok("in a signal handler", g_sig_fills == 1 && all_are(g_sig_dst, big, 0x77));
  itimerval every{{0, 2000}, {0, 2000}};
  setitimer(ITIMER_REAL, &every, nullptr);
  bool good = true;
  for (int i = 0; i < 20 && good; ++i) good = fill_case(big, 0, static_cast<unsigned char>(i + 1), false);
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  signal(SIGALRM, SIG_DFL);
  ok("fills interrupted by a handler that fills", good && all_are(g_sig_dst, big, 0x77));

  {  // memory the driver knows (pinned): libc's memset, exact
    CUcontext ctx = nullptr;
    void* pinned = nullptr;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuMemAllocHost_v2(&pinned, big)) abort();
    fill_fn(pinned, 0x6b, big);
    ok("pinned memory", all_are(static_cast<unsigned char*>(pinned), big, 0x6b));
    cuMemFreeHost(pinned);
  }

  // In a forked child (the pool's threads do not exist there).
  pid_t pid = fork();
  if (pid == 0) _exit(fill_case(big, 0, 0x42, false) && fill_case(big, 0, 0x43, true) ? 0 : 3);
  int status = 0;
  waitpid(pid, &status, 0);
  ok("in a forked child", WIFEXITED(status) && WEXITSTATUS(status) == 0);

  print_cmt_stats();
  return 0;
}
