// A large memset of never-touched memory, then of the same memory again, three times: run plainly and
// under LD_PRELOAD=libcmt.so (with a CUDA driver, or the stand-in, loaded) to compare.
//   gcc -O2 -o /tmp/fill_bench research/fill_bench.c -l:libcuda.so.1 && /tmp/fill_bench 256
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
int cuInit(unsigned);
static void* (*volatile fill)(void*, int, size_t) = memset;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  size_t n = (size_t)atoi(argv[1]) << 20;
  cuInit(0);
  for (int i = 0; i < 3; ++i) {
    char* p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double t = now(); fill(p, 0, n); t = now() - t;
    double t2 = now(); fill(p, 1, n); t2 = now() - t2;
    printf("fresh %.1f ms (%.2f GB/s), touched %.1f ms\n", t * 1e3, n / t / 1e9, t2 * 1e3);
    munmap(p, n);
  }
  return 0;
}
