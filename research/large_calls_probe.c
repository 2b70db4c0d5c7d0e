// Which calls touch a program's large buffers, and how long they take: an LD_PRELOAD probe for the
// plain program (not beside cmt). Each memset, memcpy and memmove of at least 4 MiB, and each
// malloc, calloc, posix_memalign and aligned_alloc of at least 64 MiB, is timed with the minor page
// faults it took, and summed by call and calling object (dladdr of the return address); the sums
// go to stderr at exit. Made for JAX's np.asarray (docs/engine-findings.md, seventh steps): whether
// the 4 KiB faults of XLA's fresh host buffer are taken in a memset, a copy, or elsewhere.
//
//   gcc -O2 -shared -fPIC -o /tmp/probe.so research/large_calls_probe.c -ldl -lpthread
//   LD_PRELOAD=/tmp/probe.so python3 research/jax_asarray.py
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

enum { kMemset, kMemcpy, kMemmove, kMalloc, kCalloc, kMemalign, kAlignedAlloc, kCalls };
static const char* const kNames[kCalls] = {"memset", "memcpy", "memmove", "malloc", "calloc",
                                           "posix_memalign", "aligned_alloc"};
#define COPY_MIN ((size_t)4 << 20)
#define ALLOC_MIN ((size_t)64 << 20)
#define SLOTS 64

struct Sum {
  int call;
  const char* object;
  long count, faults;
  double bytes, seconds;
};
static struct Sum g_sums[SLOTS];
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_busy;  // the probe's own calls (dladdr, printf) pass straight through

static void* (*real_memset)(void*, int, size_t);
static void* (*real_memcpy)(void*, const void*, size_t);
static void* (*real_memmove)(void*, const void*, size_t);
static void* (*real_malloc)(size_t);
static void* (*real_calloc)(size_t, size_t);
static int (*real_memalign)(void**, size_t, size_t);
static void* (*real_aligned_alloc)(size_t, size_t);
static void (*real_free)(void*);
static void* (*real_realloc)(void*, size_t);

// Before dlsym answers (it allocates and copies itself): byte loops, and a small arena.
static char g_early[1 << 16];
static size_t g_early_used;

__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void* early_set(void* d, int c, size_t n) {
  for (size_t i = 0; i < n; ++i) ((unsigned char*)d)[i] = (unsigned char)c;
  return d;
}
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void* early_move(void* d, const void* s,
                                                                                   size_t n) {
  unsigned char* dp = d;
  const unsigned char* sp = s;
  if (dp <= sp || dp >= sp + n) {
    for (size_t i = 0; i < n; ++i) dp[i] = sp[i];
  } else {
    for (size_t i = n; i-- > 0;) dp[i] = sp[i];
  }
  return d;
}
static int in_early(const void* p) { return (const char*)p >= g_early && (const char*)p < g_early + sizeof g_early; }

static void* early_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (g_early_used + n > sizeof g_early) return NULL;
  void* p = g_early + g_early_used;
  g_early_used += n;
  return p;
}

static void resolve(void) {
  static int resolving;
  if (real_memset || resolving) return;
  resolving = 1;
  real_memset = dlsym(RTLD_NEXT, "memset");
  real_memcpy = dlsym(RTLD_NEXT, "memcpy");
  real_memmove = dlsym(RTLD_NEXT, "memmove");
  real_malloc = dlsym(RTLD_NEXT, "malloc");
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  real_free = dlsym(RTLD_NEXT, "free");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  resolving = 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static long minor_faults(void) {
  struct rusage r;
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_minflt;
}

static void add(int call, const void* ret, size_t bytes, double seconds, long faults) {
  t_busy = 1;
  Dl_info info;
  const char* object = dladdr(ret, &info) && info.dli_fname ? info.dli_fname : "?";
  const char* slash = strrchr(object, '/');
  object = slash ? slash + 1 : object;
  pthread_mutex_lock(&g_mutex);
  for (int i = 0; i < SLOTS; ++i) {
    struct Sum* s = &g_sums[i];
    if (!s->object) {
      s->call = call;
      s->object = object;
    }
    if (s->call == call && s->object == object) {
      s->count += 1;
      s->bytes += (double)bytes;
      s->seconds += seconds;
      s->faults += faults;
      break;
    }
  }
  pthread_mutex_unlock(&g_mutex);
  t_busy = 0;
}

#define TIMED(call, bytes, expr)                                        \
  do {                                                                  \
    const double t0 = now();                                            \
    const long f0 = minor_faults();                                     \
    expr;                                                               \
    add(call, __builtin_return_address(0), bytes, now() - t0, minor_faults() - f0); \
  } while (0)

void* memset(void* d, int c, size_t n) {
  resolve();
  if (!real_memset) return early_set(d, c, n);
  if (n < COPY_MIN || t_busy) return real_memset(d, c, n);
  TIMED(kMemset, n, real_memset(d, c, n));
  return d;
}

// memcpy and memmove: the same wrapper around each.
#define COPY_WRAPPER(name, real, call)                    \
  void* name(void* d, const void* s, size_t n) {          \
    resolve();                                            \
    if (!real) return early_move(d, s, n);                \
    if (n < COPY_MIN || t_busy) return real(d, s, n);     \
    TIMED(call, n, real(d, s, n));                        \
    return d;                                             \
  }
COPY_WRAPPER(memcpy, real_memcpy, kMemcpy)
COPY_WRAPPER(memmove, real_memmove, kMemmove)

void* malloc(size_t n) {
  resolve();
  if (!real_malloc) return early_alloc(n);
  if (n < ALLOC_MIN || t_busy) return real_malloc(n);
  void* p;
  TIMED(kMalloc, n, p = real_malloc(n));
  return p;
}

// What came from the early arena (dlsym's own allocations) is never given to libc's free.
void free(void* p) {
  if (!p || in_early(p)) return;
  resolve();
  if (real_free) real_free(p);
}

void* realloc(void* p, size_t n) {
  resolve();
  if (p && in_early(p)) {
    void* q = real_malloc ? real_malloc(n) : early_alloc(n);
    if (q) early_move(q, p, n < (size_t)(g_early + sizeof g_early - (char*)p) ? n : (size_t)(g_early + sizeof g_early - (char*)p));
    return q;
  }
  return real_realloc ? real_realloc(p, n) : NULL;
}

void* calloc(size_t k, size_t n) {
  resolve();
  if (!real_calloc) return early_set(early_alloc(k * n), 0, k * n);  // (dlsym's own, tiny)
  if (k * n < ALLOC_MIN || t_busy) return real_calloc(k, n);
  void* p;
  TIMED(kCalloc, k * n, p = real_calloc(k, n));
  return p;
}

int posix_memalign(void** out, size_t align, size_t n) {
  resolve();
  if (n < ALLOC_MIN || t_busy || !real_memalign) return real_memalign ? real_memalign(out, align, n) : 12;
  int r;
  TIMED(kMemalign, n, r = real_memalign(out, align, n));
  return r;
}

void* aligned_alloc(size_t align, size_t n) {
  resolve();
  if (n < ALLOC_MIN || t_busy || !real_aligned_alloc) return real_aligned_alloc ? real_aligned_alloc(align, n) : NULL;
  void* p;
  TIMED(kAlignedAlloc, n, p = real_aligned_alloc(align, n));
  return p;
}

__attribute__((destructor)) static void report(void) {
  t_busy = 1;
  fprintf(stderr, "probe: large calls (copies from %zu MiB, allocations from %zu MiB), by call and calling object\n",
          COPY_MIN >> 20, ALLOC_MIN >> 20);
  for (int i = 0; i < SLOTS && g_sums[i].object; ++i) {
    const struct Sum* s = &g_sums[i];
    fprintf(stderr, "probe: %-15s %-40s %5ld calls %9.1f MiB %9.1f ms %9ld minor faults %7.2f GB/s\n",
            kNames[s->call], s->object, s->count, s->bytes / (1 << 20), s->seconds * 1e3, s->faults,
            s->seconds > 0 ? s->bytes / s->seconds / 1e9 : 0.0);
  }
}
