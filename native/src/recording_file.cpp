#include "recording_file.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "driver.hpp"
#include "host_copy_record.hpp"
#include "pin_record.hpp"
#include "log.hpp"
#include "plan.hpp"
#include "stats.hpp"
#include "types.hpp"

#ifndef PROJECT_VERSION
#define PROJECT_VERSION "0.0.0"
#endif

namespace cmt::recfile {

char g_dir[PATH_MAX];
int g_fd = -1;
bool g_forked = false;
bool g_write_failed = false;

namespace {

constexpr char kMagic[8] = {'C', 'M', 'T', 'P', 'R', 'O', 'F', '\0'};
constexpr uint32_t kFormatVersion = 3;  // 2: host copies (h2h records, name slots); 3: pinning calls

struct FileHeader {
  char magic[8];
  uint32_t format_version, header_bytes, record_bytes, pid, ppid, flags;
  uint64_t monotonic_ns, realtime_ns;
  uint32_t meta_bytes, cmdline_bytes;
  uint64_t reserved;
};
static_assert(sizeof(FileHeader) == 64, "file header layout");

dev_t g_file_dev = 0;  // identity of the file behind g_fd (a program may close and reuse the fd)
ino_t g_file_ino = 0;


std::string meta_text() {
  std::string m = "cmt_version=" PROJECT_VERSION "\nclock=CLOCK_MONOTONIC\ndirections=";
  for (int d = 0; d < kDirections; ++d) m += std::string(d ? "," : "") + direction_name(static_cast<Direction>(d));
  // Host copies are recorded from here up (the plan's first staged h2h rule); "off": none are.
  const size_t from = active_plan().stages_from(Direction::HtoH);
  m += "\nh2h_from=" + (from == SIZE_MAX ? std::string("off") : std::to_string(from)) + "\n";
  static_assert(static_cast<int>(HostKind::Device) == 4, "host_kinds below follow HostKind");
  m += "host_kinds=unknown,pageable,pinned,managed,device\noutcomes=";
  for (int o = 0; o < kOutcomes; ++o) m += std::string(o ? "," : "") + outcome_name(static_cast<Outcome>(o));
  m += "\nentries=";
  for (int e = 0; e < kEntryCount; ++e) m += std::string(e ? "," : "") + entry_name(static_cast<EntryId>(e));
  for (int c = 0; c < kHostCalls; ++c) m += std::string(",") + host_call_name(static_cast<HostCall>(c));
  m += "\npin_calls=";  // a pinning call's `dir` (pin_record.hpp)
  for (int c = 0; c < kPinCalls; ++c) m += std::string(c ? "," : "") + pin_call_name(static_cast<PinCall>(c));
  m += "\n";
  for (int o = 0; o < kOutcomes; ++o) {
    m += std::string("outcome_text.") + outcome_name(static_cast<Outcome>(o)) + "=" + outcome_text(static_cast<Outcome>(o)) + "\n";
  }
  return m;
}

std::string read_cmdline() {
  std::string s;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0) s.assign(buf, static_cast<size_t>(n));
  close(fd);
  return s;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int open_file() {
  mkdir(g_dir, 0777);  // normally made by `cmt profile`; harmless if it exists
  char path[PATH_MAX + 64];
  int fd = -1;
  for (int n = 0; n < 100 && fd < 0; ++n) {
    if (n == 0) snprintf(path, sizeof path, "%s/cmt-%d.rec", g_dir, static_cast<int>(getpid()));
    else snprintf(path, sizeof path, "%s/cmt-%d.%d.rec", g_dir, static_cast<int>(getpid()), n);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    log::write(log::Level::Warn, "profile: cannot create a recording in %s (%s); not recording", g_dir,
               strerror(errno));
    return -1;
  }
  std::string meta = meta_text(), cmdline = read_cmdline();
  FileHeader h{};
  memcpy(h.magic, kMagic, sizeof kMagic);
  h.format_version = kFormatVersion;
  h.header_bytes = static_cast<uint32_t>((sizeof h + meta.size() + cmdline.size() + 7) & ~size_t(7));
  h.record_bytes = sizeof(CopyRecord);
  h.pid = static_cast<uint32_t>(getpid());
  h.ppid = static_cast<uint32_t>(getppid());
  h.flags = g_forked ? 1u : 0u;
  h.monotonic_ns = now_ns();
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  h.realtime_ns = static_cast<uint64_t>(rt.tv_sec) * 1000000000ull + static_cast<uint64_t>(rt.tv_nsec);
  h.meta_bytes = static_cast<uint32_t>(meta.size());
  h.cmdline_bytes = static_cast<uint32_t>(cmdline.size());
  std::string head(reinterpret_cast<const char*>(&h), sizeof h);
  head += meta + cmdline;
  head.resize(h.header_bytes, '\0');
  if (!write_all(fd, head.data(), head.size())) {
    log::write(log::Level::Warn, "profile: cannot write the recording header in %s; not recording", g_dir);
    close(fd);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) == 0) {
    g_file_dev = st.st_dev;
    g_file_ino = st.st_ino;
  }
  return fd;
}

bool file_still_ours() {
  struct stat st;
  if (fstat(g_fd, &st) == 0 && st.st_dev == g_file_dev && st.st_ino == g_file_ino) return true;
  log::write(log::Level::Warn, "profile: the program closed the recording's file; later copies are lost");
  g_fd = -1;
  return false;
}

void Writer::drain() {
  if (g_fd < 0) n = 0;
  int i = 0;
  while (i < n && !g_write_failed) {
    ssize_t w = writev(g_fd, iov + i, n - i);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      g_write_failed = true;
      log::write(log::Level::Warn, "profile: writing the recording failed (%s); later copies are lost",
                 strerror(errno));
      break;
    }
    size_t left = static_cast<size_t>(w);
    for (; i < n && left >= iov[i].iov_len; ++i) left -= iov[i].iov_len;
    if (i < n) {  // a short write ended inside range i: continue from there
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  n = 0;
}

}  // namespace cmt::recfile
