// Large reads under LD_PRELOAD=libcmt.so (native/src/large_read.hpp) in a program that uses the
// (stand-in) CUDA driver: each case makes the same call through cmt (read, pread, readv, ...) and as
// the plain system call on a second descriptor of the same file placed alike, and compares the
// results, errno, the bytes and the file positions after. Prints per case
//   case <name> split=<reads split over the lanes> alone=<reads done by the calling thread alone>
// then "done". argv[1]: a directory on a disk-backed file system.
// argv[2] "fault", argv[3] read|pread, argv[4] START (with CMT_TEST_HOOKS read_eio=...): one read of
// 16 MiB from START into a buffer filled with 0x5a, printed as
//   fault ret=<r> errno=<e> pos=<file position after> exact=<returned bytes are the file's: 0|1>
//         past=<the buffer past them: unchanged|file (some bytes are the file's at their offsets)|other>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cmt/cuda_types.hpp"

extern "C" CUresult cuInit(unsigned);
extern "C" ssize_t __read_chk(int, void*, size_t, size_t);
extern "C" ssize_t __pread64_chk(int, void*, size_t, off_t, size_t);

static const size_t MIB = 1 << 20;
static const size_t kFile = 20 * MIB + 321;
static std::string g_path;

static unsigned char pattern(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

static void die(const char* what) {
  printf("FAILED %s\n", what);
  fflush(stdout);
  exit(1);
}

static unsigned long long reads(const char* kind) {
  using StatsFn = int (*)(char*, size_t);
  static auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "cmt_stats_json"));
  static char json[1 << 16];
  if (!stats || stats(json, sizeof json) <= 0) return 0;
  std::string key = std::string("\"") + kind + "\":[";
  const char* at = strstr(json, "\"reads\":");
  at = at ? strstr(at, key.c_str()) : nullptr;
  return at ? strtoull(at + key.size(), nullptr, 10) : 0;
}

struct Result {
  ssize_t ret;
  int err;
  off_t pos;
};

// One read through `fn` on a descriptor at `pos` (-1: no lseek) opened with `flags`.
static Result one(const std::function<ssize_t(int)>& fn, int flags, off_t pos) {
  int fd = open(g_path.c_str(), flags);
  if (fd < 0) die("open");
  if (pos >= 0) lseek(fd, pos, SEEK_SET);
  errno = 0;
  Result r{fn(fd), errno, 0};
  r.pos = lseek(fd, 0, SEEK_CUR);
  close(fd);
  return r;
}

// The case: `cmt_call` through the interposed function, `plain_call` as the system call, each with
// its own buffer (`a` and `b`, compared over the bytes returned).
static void compare(const char* name, const std::function<ssize_t(int)>& cmt_call,
                    const std::function<ssize_t(int)>& plain_call, const unsigned char* a, const unsigned char* b,
                    off_t pos, int flags = O_RDONLY, bool cold = false) {
  const unsigned long long s0 = reads("split"), l0 = reads("alone");
  if (cold) {
    int fd = open(g_path.c_str(), O_RDONLY);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  Result c = one(cmt_call, flags, pos);
  const unsigned long long s1 = reads("split"), l1 = reads("alone");
  Result p = one(plain_call, flags, pos);
  if (c.ret != p.ret || (c.ret < 0 && c.err != p.err) || c.pos != p.pos) {
    fprintf(stderr, "%s: cmt %zd (errno %d) at %lld, plain %zd (errno %d) at %lld\n", name, c.ret, c.err,
            static_cast<long long>(c.pos), p.ret, p.err, static_cast<long long>(p.pos));
    die(name);
  }
  if (c.ret > 0 && a && b && memcmp(a, b, static_cast<size_t>(c.ret))) die(name);
  printf("case %s split=%llu alone=%llu\n", name, s1 - s0, l1 - l0);
  fflush(stdout);
}

static int g_sig_fd = -1;
static unsigned char* g_sig_buf;
static volatile sig_atomic_t g_sig_reads = 0, g_sig_bad = 0;

static void on_signal(int) {  // a large read in a handler: errno is the interrupted code's
  const int saved = errno;
  const ssize_t r = pread(g_sig_fd, g_sig_buf, 6 * MIB, 0);
  if (r != static_cast<ssize_t>(6 * MIB) || g_sig_buf[6 * MIB - 1] != pattern(6 * MIB - 1)) g_sig_bad = 1;
  g_sig_reads = g_sig_reads + 1;
  errno = saved;
}

static bool whole_file_reads_back(unsigned char* buf) {
  int fd = open(g_path.c_str(), O_RDONLY);
  const ssize_t r = read(fd, buf, 24 * MIB);
  close(fd);
  if (r != static_cast<ssize_t>(kFile)) return false;
  for (size_t i = 0; i < kFile; ++i) {
    if (buf[i] != pattern(i)) return false;
  }
  return true;
}

static unsigned char* fresh(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  return static_cast<unsigned char*>(p);
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage");
  cuInit(0);  // a process that uses CUDA: its large reads are cmt's
  g_path = std::string(argv[1]) + "/data.bin";
  {
    int fd = open(g_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    std::vector<unsigned char> buf(kFile);
    for (size_t i = 0; i < kFile; ++i) buf[i] = pattern(i);
    if (fd < 0 || syscall(SYS_pwrite64, fd, buf.data(), kFile, 0) != static_cast<ssize_t>(kFile)) die("write");
    fsync(fd);
    close(fd);
  }
  const size_t big = 24 * MIB;
  unsigned char* a = fresh(big);
  unsigned char* b = fresh(big);
  if (argc > 4 && !strcmp(argv[2], "fault")) {
    const bool positional = !strcmp(argv[3], "pread");
    const off_t start = strtoll(argv[4], nullptr, 10);
    memset(a, 0x5a, big);
    int fd = open(g_path.c_str(), O_RDONLY);
    lseek(fd, positional ? 0 : start, SEEK_SET);
    errno = 0;
    const ssize_t r = positional ? pread(fd, a, 16 * MIB, start) : read(fd, a, 16 * MIB);
    const int err = errno;
    const off_t pos = lseek(fd, 0, SEEK_CUR);
    const size_t got = r > 0 ? static_cast<size_t>(r) : 0;
    bool exact = true, file = false, other = false;
    for (size_t i = 0; i < got; ++i) exact = exact && a[i] == pattern(static_cast<uint64_t>(start) + i);
    for (size_t i = got; i < big; ++i) {
      if (a[i] == 0x5a) continue;
      if (i < 16 * MIB && a[i] == pattern(static_cast<uint64_t>(start) + i)) file = true;
      else other = true;
    }
    printf("fault ret=%zd errno=%d pos=%lld exact=%d past=%s\n", r, r < 0 ? err : 0, static_cast<long long>(pos),
           exact ? 1 : 0, other ? "other" : file ? "file" : "unchanged");
    printf("done\n");
    return 0;
  }
  auto sys_read = [&](unsigned char* buf, size_t n) {
    return [=](int fd) { return static_cast<ssize_t>(syscall(SYS_read, fd, buf, n)); };
  };
  auto sys_pread = [&](unsigned char* buf, size_t n, off_t off) {
    return [=](int fd) { return static_cast<ssize_t>(syscall(SYS_pread64, fd, buf, n, off)); };
  };

  compare("read, whole file into a larger buffer", [&](int fd) { return read(fd, a, big); }, sys_read(b, big), a, b, 0);
  compare("read, whole file, cold", [&](int fd) { return read(fd, a, big); }, sys_read(b, big), a, b, 0, O_RDONLY,
          true);
  compare("read from an odd offset", [&](int fd) { return read(fd, a, 9 * MIB + 3); }, sys_read(b, 9 * MIB + 3), a, b,
          12345);
  compare("read to the end of the file", [&](int fd) { return read(fd, a, 8 * MIB); }, sys_read(b, 8 * MIB), a, b,
          static_cast<off_t>(kFile - 5 * MIB - 7));
  compare("read near the end (below the threshold)", [&](int fd) { return read(fd, a, 8 * MIB); },
          sys_read(b, 8 * MIB), a, b, static_cast<off_t>(kFile - 100));
  compare("read at the end", [&](int fd) { return read(fd, a, 8 * MIB); }, sys_read(b, 8 * MIB), a, b,
          static_cast<off_t>(kFile));
  compare("read past the end", [&](int fd) { return read(fd, a, 8 * MIB); }, sys_read(b, 8 * MIB), a, b,
          static_cast<off_t>(kFile + 4096));
  compare("pread at an odd offset", [&](int fd) { return pread(fd, a, 11 * MIB + 1, 777); },
          sys_pread(b, 11 * MIB + 1, 777), a, b, 4096);
  compare("pread64 to the end", [&](int fd) { return pread64(fd, a, big, 3 * MIB); }, sys_pread(b, big, 3 * MIB), a, b,
          -1);
  compare("pread, negative offset", [&](int fd) { return pread(fd, a, big, -5); }, sys_pread(b, big, -5), a, b, -1);
  compare("__read_chk", [&](int fd) { return __read_chk(fd, a, 6 * MIB, big); }, sys_read(b, 6 * MIB), a, b, 1);
  compare("__pread64_chk", [&](int fd) { return __pread64_chk(fd, a, 6 * MIB, 5, big); }, sys_pread(b, 6 * MIB, 5), a,
          b, -1);

  // Several iovecs, one empty, odd sizes; the bytes land across all of them.
  const size_t lens[] = {3 * MIB + 5, 0, 1, 2 * MIB - 1, 7 * MIB + 4093, 4 * MIB};
  auto iovs = [&](unsigned char* base) {
    std::vector<iovec> v;
    size_t at = 0;
    for (size_t len : lens) {
      v.push_back({base + at, len});
      at += len + 11;  // gaps between them, which no read may touch
    }
    return v;
  };
  std::vector<iovec> va = iovs(a), vb = iovs(b);
  memset(a, 0x5a, big);
  memset(b, 0x5a, big);
  compare("readv, several iovecs", [&](int fd) { return readv(fd, va.data(), static_cast<int>(va.size())); },
          [&](int fd) { return static_cast<ssize_t>(syscall(SYS_readv, fd, vb.data(), static_cast<int>(vb.size()))); },
          a, b, 1000);
  if (memcmp(a, b, big)) die("readv: the buffers differ (gaps included)");
  compare("preadv at the end of the file", [&](int fd) { return preadv(fd, va.data(), 6, kFile - 9 * MIB); },
          [&](int fd) { return static_cast<ssize_t>(syscall(SYS_preadv, fd, vb.data(), 6, kFile - 9 * MIB, 0)); }, a,
          b, -1);
  compare("preadv64", [&](int fd) { return preadv64(fd, va.data(), 6, 1); },
          [&](int fd) { return static_cast<ssize_t>(syscall(SYS_preadv, fd, vb.data(), 6, 1, 0)); }, a, b, -1);

  // Errors: a bad descriptor, a write-only one, a directory, a buffer unmapped at its start or half way.
  compare("bad descriptor", [&](int) { return read(-1, a, big); }, [&](int) { return (ssize_t)syscall(SYS_read, -1, b, big); },
          nullptr, nullptr, -1);
  compare("write-only descriptor", [&](int fd) { return read(fd, a, big); }, sys_read(b, big), nullptr, nullptr, -1,
          O_WRONLY);
  {
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    errno = 0;
    const ssize_t r = read(dir, a, big);
    if (r != -1 || errno != EISDIR) die("directory");
    close(dir);
  }
  unsigned char* ha = fresh(16 * MIB);
  unsigned char* hb = fresh(16 * MIB);
  munmap(ha + 9 * MIB + 8192, 7 * MIB - 8192);
  munmap(hb + 9 * MIB + 8192, 7 * MIB - 8192);
  compare("buffer unmapped half way", [&](int fd) { return read(fd, ha, 16 * MIB); }, sys_read(hb, 16 * MIB), ha, hb, 0);
  compare("buffer unmapped half way, pread", [&](int fd) { return pread(fd, ha, 16 * MIB, 100); },
          sys_pread(hb, 16 * MIB, 100), ha, hb, -1);
  munmap(ha, 9 * MIB);
  munmap(hb, 9 * MIB);
  compare("buffer unmapped at its start", [&](int fd) { return read(fd, ha + 4096, 8 * MIB); },
          sys_read(hb + 4096, 8 * MIB), nullptr, nullptr, 0);

  // O_DIRECT: aligned requests are split in aligned pieces; unaligned ones go to the kernel as they are.
  void* ra = nullptr;
  void* rb = nullptr;
  if (posix_memalign(&ra, 4096, big) || posix_memalign(&rb, 4096, big)) die("memalign");
  auto* da = static_cast<unsigned char*>(ra);
  auto* db = static_cast<unsigned char*>(rb);
  compare("O_DIRECT, aligned, to the end", [&](int fd) { return read(fd, da, 16 * MIB); }, sys_read(db, 16 * MIB), da,
          db, 8 * MIB, O_RDONLY | O_DIRECT);
  compare("O_DIRECT, unaligned buffer", [&](int fd) { return read(fd, da + 512, 8 * MIB); },
          sys_read(db + 512, 8 * MIB), da + 512, db + 512, 0, O_RDONLY | O_DIRECT);
  compare("O_DIRECT, unaligned offset", [&](int fd) { return pread(fd, da, 8 * MIB, 100); },
          sys_pread(db, 8 * MIB, 100), da, db, 0, O_RDONLY | O_DIRECT);

  // Flags that do not change what a read of a regular file does: read and position as ever.
  compare("O_APPEND descriptor", [&](int fd) { return read(fd, a, 9 * MIB); }, sys_read(b, 9 * MIB), a, b, 4321,
          O_RDWR | O_APPEND);
  compare("O_NONBLOCK descriptor", [&](int fd) { return read(fd, a, 9 * MIB); }, sys_read(b, 9 * MIB), a, b, 99,
          O_RDONLY | O_NONBLOCK);
  // A descriptor number closed and opened again on another file: nothing is kept per descriptor.
  {
    const std::string other = std::string(argv[1]) + "/other.bin";
    int w = open(other.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    std::vector<unsigned char> buf(8 * MIB);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(~pattern(i));
    if (w < 0 || syscall(SYS_pwrite64, w, buf.data(), buf.size(), 0) != static_cast<ssize_t>(buf.size())) {
      die("write other");
    }
    close(w);
    int first = open(g_path.c_str(), O_RDONLY);
    if (first < 0 || read(first, a, 6 * MIB) != static_cast<ssize_t>(6 * MIB)) die("reused descriptor: first");
    close(first);
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    int second = open(other.c_str(), O_RDONLY);
    if (second != first) die("reused descriptor: another number");
    if (read(second, a, big) != static_cast<ssize_t>(buf.size()) || memcmp(a, buf.data(), buf.size())) {
      die("reused descriptor: bytes");
    }
    close(second);
    printf("case a descriptor number reused for another file split=%llu alone=%llu\n", reads("split") - s0,
           reads("alone") - l0);
  }
  // A character device, a socket and a terminal: the plain call (the same result as the system call).
  {
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    int z = open("/dev/zero", O_RDONLY);
    memset(a, 1, 8 * MIB);
    if (z < 0 || read(z, a, 8 * MIB) != static_cast<ssize_t>(8 * MIB) || a[0] || a[8 * MIB - 1]) die("/dev/zero");
    close(z);
    printf("case a character device split=%llu alone=%llu\n", reads("split") - s0, reads("alone") - l0);
  }
  {
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair");
    std::thread writer([&] {
      std::vector<unsigned char> buf(6 * MIB);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(i);
      size_t at = 0;
      while (at < buf.size()) at += static_cast<size_t>(write(sv[1], buf.data() + at, buf.size() - at));
      close(sv[1]);
    });
    size_t got = 0;
    for (;;) {
      const ssize_t r = read(sv[0], a + got, big - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    writer.join();
    close(sv[0]);
    if (got != 6 * MIB) die("socket length");
    for (size_t i = 0; i < got; ++i) {
      if (a[i] != pattern(i)) die("socket bytes");
    }
    printf("case a socket split=%llu alone=%llu\n", reads("split") - s0, reads("alone") - l0);
  }
  {
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_NONBLOCK);
    if (m >= 0) {  // nothing written to it: EAGAIN, as the system call says
      errno = 0;
      const ssize_t r = read(m, a, 8 * MIB);
      const int e = errno;
      const ssize_t p = syscall(SYS_read, m, b, 8 * MIB);
      if (r != -1 || r != p || e != errno) die("terminal");
      close(m);
    } else {
      fprintf(stderr, "no pseudo-terminal here (%s): the terminal case is not run\n", strerror(errno));
    }
    printf("case a terminal split=%llu alone=%llu\n", reads("split") - s0, reads("alone") - l0);
  }
  // A pipe is not split: what arrives is what a plain read gives, in the writer's order.
  {
    int p[2];
    if (pipe(p)) die("pipe");
    const unsigned long long s0 = reads("split");
    std::thread writer([&] {
      std::vector<unsigned char> buf(6 * MIB);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(i);
      size_t at = 0;
      while (at < buf.size()) at += static_cast<size_t>(write(p[1], buf.data() + at, buf.size() - at));
      close(p[1]);
    });
    size_t got = 0;
    for (;;) {
      const ssize_t r = read(p[0], a + got, big - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    writer.join();
    close(p[0]);
    for (size_t i = 0; i < got; ++i) {
      if (a[i] != pattern(i)) die("pipe bytes");
    }
    if (got != 6 * MIB) die("pipe length");
    printf("case pipe split=%llu alone=0\n", reads("split") - s0);
  }
  // Two threads reading one open file: each gets its own range, together the file from the start.
  {
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    int fd = open(g_path.c_str(), O_RDONLY);
    std::vector<unsigned char> x(6 * MIB), y(6 * MIB);
    ssize_t rx = 0, ry = 0;
    std::thread t1([&] { rx = read(fd, x.data(), x.size()); });
    std::thread t2([&] { ry = read(fd, y.data(), y.size()); });
    t1.join();
    t2.join();
    const off_t end = lseek(fd, 0, SEEK_CUR);
    close(fd);
    if (rx != static_cast<ssize_t>(6 * MIB) || ry != rx || end != static_cast<off_t>(12 * MIB)) die("two readers");
    const bool x_first = x[0] == pattern(0) && y[0] == pattern(6 * MIB);
    for (size_t i = 0; i < 6 * MIB; ++i) {
      if (x[i] != pattern(i + (x_first ? 0 : 6 * MIB)) || y[i] != pattern(i + (x_first ? 6 * MIB : 0))) {
        die("two readers: bytes");
      }
    }
    printf("case two readers of one open file split=%llu alone=%llu\n", reads("split") - s0, reads("alone") - l0);
  }
  // Too many iovecs: the kernel's EINVAL.
  {
    std::vector<iovec> many(IOV_MAX + 1, iovec{a, 8192});
    compare("readv, more than IOV_MAX iovecs", [&](int fd) { return readv(fd, many.data(), IOV_MAX + 1); },
            [&](int fd) { return static_cast<ssize_t>(syscall(SYS_readv, fd, many.data(), IOV_MAX + 1)); }, nullptr,
            nullptr, 0);
  }
  // In a forked child (the pool's threads do not exist there): the plain call, exact.
  {
    const unsigned long long s0 = reads("split");
    pid_t pid = fork();
    if (pid == 0) _exit(whole_file_reads_back(b) && reads("split") == s0 ? 0 : 3);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("forked child");
    printf("case in a forked child split=0 alone=0\n");
  }
  // Large reads in signal handlers, raised here and delivered by a timer while this thread reads.
  {
    const unsigned long long s0 = reads("split"), l0 = reads("alone");
    g_sig_fd = open(g_path.c_str(), O_RDONLY);
    g_sig_buf = fresh(6 * MIB);
    signal(SIGALRM, on_signal);
    raise(SIGALRM);
    itimerval every{{0, 3000}, {0, 3000}};
    setitimer(ITIMER_REAL, &every, nullptr);
    bool good = true;
    for (int i = 0; i < 30 && good; ++i) good = whole_file_reads_back(a);
    itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    if (!good || g_sig_bad || g_sig_reads < 1) die("signal handlers");
    printf("case reads interrupted by a handler that reads split=%llu alone=%llu\n", reads("split") - s0,
           reads("alone") - l0);
  }
  printf("done\n");
  return 0;
}
