// Host-to-device copies whose source is a file mapping, under LD_PRELOAD=libcmt.so against the
// stand-in driver (native/src/mapped_copy.hpp): every byte that arrives in device memory is checked
// against what the mapping holds, and after each case the outcomes counted for it are printed:
//   case <name> cold=<0|1> from_file=<n> accelerated=<n> direct=<0|1>
// (direct: whether any byte was read with O_DIRECT).
// (cold: whether the file's pages could be dropped from the page cache before the copy). Then "done".
// argv[1]: a directory on a disk-backed file system; argv[2] (optional) "sigbus": only the case of a
// copy past the end of a cut file (the process dies of SIGBUS, as without cmt).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "driver_api.hpp"

static const size_t MIB = 1 << 20;
static const size_t kFile = 24 * MIB + 123;
static CUdeviceptr g_dev;
static CUstream g_stream;
static std::string g_dir;

static unsigned char pattern(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

static void die(const char* what) {
  printf("FAILED %s\n", what);
  fflush(stdout);
  exit(1);
}

// A file of kFile pattern bytes (`inverted`: their complements), written, synced and dropped from the page cache.
static int make_file(const char* name, bool* cold, bool inverted = false) {
  std::string path = g_dir + "/" + name;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("open");
  std::vector<unsigned char> buf(kFile);
  for (size_t i = 0; i < kFile; ++i) buf[i] = static_cast<unsigned char>(inverted ? ~pattern(i) : pattern(i));
  if (pwrite(fd, buf.data(), kFile, 0) != static_cast<ssize_t>(kFile)) die("pwrite");
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  // Dropped? (tmpfs keeps everything: then the copies are from memory, which the test allows.)
  void* probe = mmap(nullptr, kFile, PROT_READ, MAP_SHARED, fd, 0);
  std::vector<unsigned char> vec((kFile + 4095) / 4096);
  *cold = probe != MAP_FAILED && mincore(probe, kFile, vec.data()) == 0 && !(vec[vec.size() / 2] & 1);
  if (probe != MAP_FAILED) munmap(probe, kFile);
  return fd;
}

static unsigned long long outcome(const char* name) {
  using StatsFn = int (*)(char*, size_t);
  static auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "cmt_stats_json"));
  static char json[1 << 16];
  if (!stats || stats(json, sizeof json) <= 0) return 0;
  const char* h2d = strstr(json, "\"h2d\":{");
  std::string key = std::string("\"") + name + "\":[";
  const char* at = h2d ? strstr(h2d, key.c_str()) : nullptr;
  return at ? strtoull(at + key.size(), nullptr, 10) : 0;
}

static long long direct_bytes() {
  using CountersFn = int (*)(int64_t*, int);
  static auto counters = reinterpret_cast<CountersFn>(dlsym(RTLD_DEFAULT, "cmt_io_counters"));
  int64_t c[3] = {};
  if (counters) counters(c, 3);
  return c[0];
}

// Copies [src, src + n) to the device (async on a stream, or sync), back, and compares with `want`.
static void copy_case(const char* name, bool cold, const unsigned char* src, size_t n, const unsigned char* want,
                      bool async) {
  const unsigned long long f0 = outcome("from_file"), a0 = outcome("accelerated");
  const long long d0 = direct_bytes();
  CUresult r = async ? cuMemcpyHtoDAsync_v2(g_dev, src, n, g_stream) : cuMemcpyHtoD_v2(g_dev, src, n);
  if (r != CUDA_SUCCESS) die(name);
  if (async && cuStreamSynchronize(g_stream) != CUDA_SUCCESS) die(name);
  std::vector<unsigned char> back(n);
  if (cuMemcpyDtoH_v2(back.data(), g_dev, n) != CUDA_SUCCESS) die(name);
  for (size_t i = 0; i < n; ++i) {
    if (back[i] != want[i]) {
      fprintf(stderr, "%s: byte %zu is %u, expected %u\n", name, i, back[i], want[i]);
      die(name);
    }
  }
  printf("case %s cold=%d from_file=%llu accelerated=%llu direct=%d\n", name, cold ? 1 : 0,
         outcome("from_file") - f0, outcome("accelerated") - a0, direct_bytes() > d0 ? 1 : 0);
  fflush(stdout);
}

// Closes every descriptor of this process that names `target` (those cmt keeps: a program that
// closes descriptors it did not open); how many.
static size_t close_fds_to(const std::string& target) {
  std::vector<int> found;
  DIR* d = opendir("/proc/self/fd");
  const int dir_fd = d ? dirfd(d) : -1;
  for (dirent* e; d && (e = readdir(d));) {
    char link[4096];
    const int n = atoi(e->d_name);
    const ssize_t len = readlinkat(dir_fd, e->d_name, link, sizeof link - 1);
    if (n != dir_fd && len > 0 && target == std::string(link, static_cast<size_t>(len))) found.push_back(n);
  }
  if (d) closedir(d);
  for (int n : found) close(n);
  return found.size();
}

static unsigned char* map(int fd, int prot, int flags) {
  void* p = mmap(nullptr, kFile, prot, flags, fd, 0);
  if (p == MAP_FAILED) die("mmap");
  return static_cast<unsigned char*>(p);
}

static std::vector<unsigned char> expected(uint64_t off, size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(off + i);
  return v;
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage");
  g_dir = argv[1];
  const bool sigbus = argc > 2 && !strcmp(argv[2], "sigbus");
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) die("init");
  if (cuStreamCreate(&g_stream, 0) || cuMemAlloc_v2(&g_dev, kFile)) die("alloc");
  bool cold = false;

  if (sigbus) {  // a shared mapping cut below the range: the copy faults past the end, as without cmt
    int fd = make_file("cut.bin", &cold);
    unsigned char* m = map(fd, PROT_READ, MAP_SHARED);
    if (ftruncate(fd, 4 * MIB) != 0) die("ftruncate");
    cuMemcpyHtoD_v2(g_dev, m, 16 * MIB);
    die("no SIGBUS");
  }

  {  // shared, read-only: cold, then warm (from memory), then an unaligned range, async, cold again
    int fd = make_file("shared.bin", &cold);
    unsigned char* m = map(fd, PROT_READ, MAP_SHARED);
    copy_case("shared cold", cold, m, 16 * MIB, expected(0, 16 * MIB).data(), false);
    // O_DIRECT left the range cold: read again, it goes through the page cache, and then is warm.
    copy_case("shared cold, the same range again", cold, m, 16 * MIB, expected(0, 16 * MIB).data(), false);
    copy_case("shared warm", false, m, 16 * MIB, expected(0, 16 * MIB).data(), false);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the pages mapped in stay: only the others go
    munmap(m, kFile);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    m = map(fd, PROT_READ, MAP_SHARED);
    const size_t off = 12345, n = 9 * MIB + 7;
    copy_case("shared cold, unaligned offset, async", cold, m + off, n, expected(off, n).data(), true);
    copy_case("shared, to the last byte of the file", cold, m + 20 * MIB, kFile - 20 * MIB,
              expected(20 * MIB, kFile - 20 * MIB).data(), false);
    munmap(m, kFile);
    close(fd);
  }
  {  // shared and written through the mapping: the file's bytes are the written ones (O_DIRECT included)
    int fd = make_file("shared-written.bin", &cold);
    unsigned char* m = map(fd, PROT_READ | PROT_WRITE, MAP_SHARED);
    std::vector<unsigned char> want = expected(0, kFile);
    for (size_t i = 3 * MIB + 10; i < 3 * MIB + 9000; ++i) want[i] = m[i] = static_cast<unsigned char>(~want[i]);
    copy_case("shared, written through the mapping", cold, m, 16 * MIB, want.data(), false);
    munmap(m, kFile);
    close(fd);
  }
  {  // a range over two mappings (of two files, side by side): from memory
    bool cold_b = false;
    int fa = make_file("side-a.bin", &cold);
    int fb = make_file("side-b.bin", &cold_b);
    auto* base = static_cast<unsigned char*>(mmap(nullptr, 16 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED || mmap(base, 8 * MIB, PROT_READ, MAP_SHARED | MAP_FIXED, fa, 0) == MAP_FAILED ||
        mmap(base + 8 * MIB, 8 * MIB, PROT_READ, MAP_SHARED | MAP_FIXED, fb, 0) == MAP_FAILED) {
      die("side by side");
    }
    std::vector<unsigned char> want = expected(4 * MIB, 4 * MIB), second = expected(0, 4 * MIB);
    want.insert(want.end(), second.begin(), second.end());
    copy_case("a range over two mappings", cold, base + 4 * MIB, 8 * MIB, want.data(), false);
    munmap(base, 16 * MIB);
    close(fa);
    close(fb);
  }
  {  // private, read-only
    int fd = make_file("private.bin", &cold);
    unsigned char* m = map(fd, PROT_READ, MAP_PRIVATE);
    copy_case("private read-only cold", cold, m + 4096, 16 * MIB, expected(4096, 16 * MIB).data(), false);
    copy_case("cold, below 4 MiB", cold, m + 20 * MIB, 3 * MIB, expected(20 * MIB, 3 * MIB).data(), false);
    munmap(m, kFile);
    close(fd);
  }
  {  // private, written to: the written pages are the program's, the copies must carry them
    int fd = make_file("written.bin", &cold);
    unsigned char* m = map(fd, PROT_READ | PROT_WRITE, MAP_PRIVATE);
    std::vector<unsigned char> want = expected(0, kFile);
    for (size_t i = 8 * MIB + 100; i < 8 * MIB + 5000; ++i) want[i] = m[i] = static_cast<unsigned char>(~want[i]);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the file's own copy of the written pages goes too
    copy_case("private written, the range holds written pages", cold, m, 16 * MIB, want.data(), false);
    // The copy from memory faulted its range in, and readahead went on past it: drop what is not mapped.
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    copy_case("private written, the range is past them", cold, m + 12 * MIB, 8 * MIB, want.data() + 12 * MIB,
              false);
    munmap(m, kFile);
    close(fd);
  }
  {  // cut after it was mapped: inside the new size from the file; reaching past it from memory
    int fd = make_file("cut.bin", &cold);
    unsigned char* m = map(fd, PROT_READ, MAP_SHARED);
    const size_t cut = 8 * MIB + 100;
    if (ftruncate(fd, static_cast<off_t>(cut)) != 0) die("ftruncate");
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    copy_case("cut file, range inside its new size", cold, m, cut, expected(0, cut).data(), false);
    std::vector<unsigned char> want = expected(0, 8 * MIB + 4096);
    memset(want.data() + cut, 0, 4096 - 100);  // the rest of the last page reads as zeros
    copy_case("cut file, range past its new end", cold, m, 8 * MIB + 4096, want.data(), false);
    munmap(m, kFile);
    close(fd);
  }
  {  // a file replaced by another under its path: the new file's bytes, never those of the file held open
    bool cold_old = false;
    int fd = make_file("replaced.bin", &cold_old);
    unsigned char* m = map(fd, PROT_READ, MAP_SHARED);
    copy_case("replaced: the first file", cold_old, m, 16 * MIB, expected(0, 16 * MIB).data(), false);
    munmap(m, kFile);
    close(fd);
    fd = make_file("replacement.bin", &cold, true);
    if (rename((g_dir + "/replacement.bin").c_str(), (g_dir + "/replaced.bin").c_str()) != 0) die("rename");
    m = map(fd, PROT_READ, MAP_SHARED);
    std::vector<unsigned char> want = expected(0, 16 * MIB);
    for (auto& c : want) c = static_cast<unsigned char>(~c);
    copy_case("replaced: the file now at its path", cold, m, 16 * MIB, want.data(), false);
    munmap(m, kFile);
    close(fd);
  }
  {  // the program closes the descriptors cmt keeps for a file, and opens another file on their numbers
    int fd = make_file("held.bin", &cold);
    unsigned char* m = map(fd, PROT_READ, MAP_SHARED);
    close(fd);
    copy_case("held: the first copy", cold, m, 16 * MIB, expected(0, 16 * MIB).data(), false);
    const size_t closed = close_fds_to(g_dir + "/held.bin");
    bool unused = false;
    int other = make_file("impostor.bin", &unused, true);
    for (size_t i = 0; i < closed; ++i) open((g_dir + "/impostor.bin").c_str(), O_RDONLY);
    std::vector<unsigned char> vec((16 * MIB) / 4096);
    if (cold && mincore(m, 16 * MIB, vec.data()) == 0) {  // (the first copy read O_DIRECT: still cold)
      for (unsigned char v : vec) cold = cold && !(v & 1);
    }
    copy_case("held: its descriptors closed and reused by the program", cold, m, 16 * MIB,
              expected(0, 16 * MIB).data(), false);
    munmap(m, kFile);
    close(other);
  }
  {  // the same with the descriptor of /proc/self/pagemap cmt keeps: the written pages are still seen
    int fd = make_file("written-again.bin", &cold);
    unsigned char* m = map(fd, PROT_READ | PROT_WRITE, MAP_PRIVATE);
    std::vector<unsigned char> want = expected(0, kFile);
    for (size_t i = 8 * MIB + 100; i < 8 * MIB + 5000; ++i) want[i] = m[i] = static_cast<unsigned char>(~want[i]);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const size_t closed = close_fds_to("/proc/" + std::to_string(getpid()) + "/pagemap");
    // On its number, a sparse file of zeros as large as a pagemap: every page would read as "not present".
    std::vector<int> zeros;
    for (size_t i = 0; i < closed; ++i) {
      zeros.push_back(open((g_dir + "/zeros.bin").c_str(), O_RDWR | O_CREAT, 0644));
      if (ftruncate(zeros.back(), static_cast<off_t>(1) << 40) != 0) {
        fprintf(stderr, "no sparse file of 1 TiB here (%s): the pagemap case proves less\n", strerror(errno));
      }
    }
    copy_case("private written, cmt's pagemap descriptor closed and reused", cold, m, 16 * MIB, want.data(), false);
    for (int z : zeros) close(z);
    munmap(m, kFile);
    close(fd);
  }
  printf("done\n");
  return 0;
}
