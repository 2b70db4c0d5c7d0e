// Large host memcpy/memmove calls under LD_PRELOAD=libcmt.so (native/src/host_copy.hpp), in a
// program that has the (stand-in) CUDA driver loaded: every byte checked against a pattern, in each
// of the cases cmt must get right. Prints "ok <case>" per case, then cmt's statistics as JSON.
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

static unsigned char pattern(size_t i, unsigned seed) { return static_cast<unsigned char>((i * 2654435761u + seed) >> 13); }

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}

static bool check(const unsigned char* p, size_t n, unsigned seed, size_t from = 0) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(from + i, seed)) {
      fprintf(stderr, "byte %zu: %u, expected %u\n", i, p[i], pattern(from + i, seed));
      return false;
    }
  }
  return true;
}

static unsigned char* fresh(size_t n) {  // never-touched pages
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  return static_cast<unsigned char*>(p);
}

static void ok(const char* what, bool good) {
  printf("%s %s\n", good ? "ok" : "FAILED", what);
  fflush(stdout);
  if (!good) exit(1);
}

// The copy under test, through a pointer so that the compiler cannot inline or elide it.
static void* (*volatile copy_fn)(void*, const void*, size_t) = memcpy;
static void* (*volatile move_fn)(void*, const void*, size_t) = memmove;

static bool copy_case(size_t n, bool into_fresh, unsigned seed) {
  std::vector<unsigned char> src(n);
  fill(src.data(), n, seed);
  unsigned char* dst = into_fresh ? fresh(n) : static_cast<unsigned char*>(malloc(n));
  if (!into_fresh) memset(dst, 0, n);
  copy_fn(dst, src.data(), n);
  bool good = check(dst, n, seed);
  if (into_fresh) munmap(dst, n); else free(dst);
  return good;
}

// memmove within one buffer by `shift` bytes (either way): the moved range holds the source's old
// bytes, the rest is untouched.
static bool move_case(size_t n, long shift) {
  const size_t total = n + static_cast<size_t>(labs(shift)) + 8192;
  std::vector<unsigned char> buf(total);
  fill(buf.data(), total, 3);
  const size_t src = shift > 0 ? 4096 : 4096 + static_cast<size_t>(-shift), dst = src + shift;
  move_fn(buf.data() + dst, buf.data() + src, n);
  for (size_t i = 0; i < total; ++i) {
    const unsigned char want = (i >= dst && i < dst + n) ? pattern(src + (i - dst), 3) : pattern(i, 3);
    if (buf[i] != want) {
      fprintf(stderr, "memmove shift %ld: byte %zu\n", shift, i);
      return false;
    }
  }
  return true;
}

static unsigned char* g_sig_src;
static unsigned char* g_sig_dst;
static volatile sig_atomic_t g_sig_copies = 0;
static size_t g_sig_n;

static void on_signal(int) {
  copy_fn(g_sig_dst, g_sig_src, g_sig_n);
  g_sig_copies = g_sig_copies + 1;
}

int main(int argc, char** argv) {
  const size_t big = argc > 1 ? strtoull(argv[1], nullptr, 10) : size_t(32) << 20;
  const size_t threshold = argc > 2 ? strtoull(argv[2], nullptr, 10) : 0;
  cuInit(0);  // a process that uses CUDA: its host copies are cmt's

  ok("small", copy_case(4096, false, 1));
  ok("large", copy_case(big, false, 2));
  ok("large into never-touched pages", copy_case(big, true, 4));
  ok("large, odd size and alignment", copy_case(big + 4097, false, 5));
  if (threshold) {
    ok("just below the threshold", copy_case(threshold - 1, false, 6));
    ok("at the threshold", copy_case(threshold, false, 7));
  }
  ok("memmove, apart", move_case(big, static_cast<long>(big) + 64));
  ok("memmove, overlapping forward", move_case(big, 1 << 20));
  ok("memmove, overlapping backward", move_case(big, -(1 << 20) - 7));

  // Many threads at once: one has the pool, the others copy on their own; all exact.
  {
    std::vector<std::thread> threads;
    std::vector<int> good(8, 0);
    for (int t = 0; t < 8; ++t) threads.emplace_back([&, t] { good[t] = copy_case(big, t % 2, 10 + t); });
    for (auto& th : threads) th.join();
    bool all = true;
    for (int g : good) all = all && g;
    ok("eight threads at once", all);
  }

  // From a signal handler: raised here, and delivered by a timer while this thread copies.
  g_sig_n = big;
  g_sig_src = static_cast<unsigned char*>(malloc(big));
  g_sig_dst = static_cast<unsigned char*>(malloc(big));
  fill(g_sig_src, big, 21);
  signal(SIGALRM, on_signal);
  raise(SIGALRM);
  ok("in a signal handler", g_sig_copies == 1 && check(g_sig_dst, big, 21));
  memset(g_sig_dst, 0, big);
  itimerval every{{0, 2000}, {0, 2000}};
  setitimer(ITIMER_REAL, &every, nullptr);
  bool good = true;
  for (int i = 0; i < 40 && good; ++i) good = copy_case(big, false, 30 + i);
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  ok("copies interrupted by a handler that copies", good && check(g_sig_dst, big, 21));

  // In a forked child (the pool's threads do not exist there).
  pid_t pid = fork();
  if (pid == 0) _exit(copy_case(big, false, 40) && copy_case(big, true, 41) ? 0 : 3);
  int status = 0;
  waitpid(pid, &status, 0);
  ok("in a forked child", WIFEXITED(status) && WEXITSTATUS(status) == 0);

  print_cmt_stats();
  return 0;
}
