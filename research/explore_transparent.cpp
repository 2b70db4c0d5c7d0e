// Transparent storage (native/src/mapped_copy.hpp, large_read.hpp): what cmt's choices cost and gain,
// one JSON line per measurement. Linked with -lcuda (the real driver, or tests/fake_cuda's stand-in,
// whose "device" memory is host memory: then only the CPU side is measured).
//   probe                      the decision's system calls: PROCMAP_QUERY, cachestat, pagemap
//   mapped FILE MIB cold|warm  one cuMemcpyHtoD of a shared mapping of FILE's first MIB MiB
//   read FILE MIB cold|warm    one read() of FILE's first MIB MiB into touched memory
// FILE is made (pattern bytes) when it is shorter than MIB MiB. Run the same mode plainly, under
// LD_PRELOAD=libcmt.so, and with CMT_FROM_FILE=0 / CMT_READ_THRESHOLD=0, and compare (the shell
// loop in research/README.md).
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../native/include/cmt/cuda_types.hpp"

extern "C" {
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice*, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
CUresult cuCtxSynchronize(void);
}

static double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const size_t MIB = 1 << 20;

static int prepare(const char* path, size_t bytes, bool cold) {
  int fd = open(path, O_RDWR | O_CREAT, 0644);
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) < bytes) {
    std::vector<unsigned char> buf(64 * MIB);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
    for (size_t at = 0; at < bytes; at += buf.size()) {
      if (syscall(SYS_pwrite64, fd, buf.data(), buf.size(), at) < 0) exit(2);
    }
    fsync(fd);
  }
  if (cold) {
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  } else {
    std::vector<unsigned char> buf(64 * MIB);
    for (size_t at = 0; at < bytes; at += buf.size()) syscall(SYS_pread64, fd, buf.data(), buf.size(), at);
  }
  return fd;
}

struct ProcmapQuery {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};

static void probe() {
  const int rounds = 2000;
  std::vector<unsigned char> anon(256 * MIB, 1);
  int maps = open("/proc/self/maps", O_RDONLY);
  double t = now();
  for (int i = 0; i < rounds; ++i) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = reinterpret_cast<uintptr_t>(anon.data());
    ioctl(maps, _IOWR('f', 17, ProcmapQuery), &q);
  }
  printf("{\"probe\": \"procmap_query\", \"us\": %.2f}\n", (now() - t) / rounds * 1e6);
  int fd = prepare("/tmp/explore_transparent.probe", 256 * MIB, false);
  for (size_t mib : {16, 256}) {
    struct {
      uint64_t off, len;
    } range{0, mib * MIB};
    uint64_t cs[5];
    t = now();
    for (int i = 0; i < 200; ++i) syscall(451, fd, &range, cs, 0);
    printf("{\"probe\": \"cachestat\", \"mib\": %zu, \"us\": %.2f}\n", mib, (now() - t) / 200 * 1e6);
  }
  int pm = open("/proc/self/pagemap", O_RDONLY);
  uint64_t entries[512];
  t = now();
  for (int i = 0; i < 200; ++i) {
    for (size_t p = 0; p < 16 * MIB / 4096; p += 512) {
      pread(pm, entries, sizeof entries, static_cast<off_t>((reinterpret_cast<uintptr_t>(anon.data()) / 4096 + p) * 8));
    }
  }
  printf("{\"probe\": \"pagemap\", \"mib\": 16, \"us\": %.2f}\n", (now() - t) / 200 * 1e6);
}

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "probe")) return probe(), 0;
  if (argc < 5) {
    fprintf(stderr, "usage: probe | mapped|read FILE MIB cold|warm\n");
    return 1;
  }
  const size_t bytes = strtoull(argv[3], nullptr, 10) * MIB;
  const bool cold = !strcmp(argv[4], "cold");
  const char* env_from = getenv("CMT_FROM_FILE");
  const char* env_read = getenv("CMT_READ_THRESHOLD");
  const char* pre = getenv("LD_PRELOAD");
  const char* how = !pre || !strstr(pre, "cmt") ? "plain" : env_from && !strcmp(env_from, "0") ? "cmt, from_file off"
                    : env_read && !strcmp(env_read, "0")                                     ? "cmt, reads off"
                                                                                               : "cmt";
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 3;
  int fd = prepare(argv[2], bytes, cold);
  double seconds = 0;
  if (!strcmp(argv[1], "mapped")) {
    CUdeviceptr d;
    if (cuMemAlloc_v2(&d, bytes)) return 4;
    void* m = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> warm(64 * MIB, 1);  // the pipeline's first copy, not measured
    cuMemcpyHtoD_v2(d, warm.data(), warm.size());
    const double t = now();
    if (cuMemcpyHtoD_v2(d, m, bytes) != CUDA_SUCCESS) return 5;
    cuCtxSynchronize();
    seconds = now() - t;
  } else {
    std::vector<unsigned char> buf(bytes, 1);
    const double t = now();
    if (read(fd, buf.data(), bytes) != static_cast<ssize_t>(bytes)) return 6;
    seconds = now() - t;
  }
  printf("{\"mode\": \"%s\", \"how\": \"%s\", \"mib\": %zu, \"cache\": \"%s\", \"gbps\": %.2f}\n", argv[1], how,
         bytes / MIB, argv[4], bytes / seconds / 1e9);
  return 0;
}
