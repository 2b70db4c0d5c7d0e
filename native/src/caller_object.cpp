#include "caller_object.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "recorder.hpp"

namespace cmt {
namespace {

constexpr int kMaxObjects = 256;  // calling objects named per process; later ones are "unknown"

struct Known {
  uintptr_t base;  // where the object is loaded
  uint64_t hash;   // of its path: another object loaded at the same place later is another one
};
Known g_known[kMaxObjects];
int g_count = 0;
bool g_fork_hook = false;
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
// Set while this thread names a caller: a signal handler's copy in between records no caller
// rather than re-entering dladdr or the table.
thread_local bool t_naming = false;

// The child of fork() writes a file of its own, which must name its objects again.
void forget_after_fork() {
  pthread_mutex_init(&g_mu, nullptr);
  g_count = 0;
}

uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

// dladdr names the main program by argv[0], which may be relative or a bare name found on PATH.
const char* object_path(const Dl_info& info, char* buf, size_t len) {
  const char* p = info.dli_fname;
  if (p && *p && strcmp(p, program_invocation_name) != 0) return p;
  const ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  if (n <= 0) return p && *p ? p : "?";
  buf[n] = '\0';
  return buf;
}

// The path as name slots (recorder.hpp): written once per object and process.
void record_name(uint32_t id, const char* path) {
  const size_t len = strlen(path);
  for (size_t slot = 0, off = 0; off < len && slot < 256; ++slot, off += kNameSlotBytes) {
    CopyRecord r{};
    memcpy(&r, path + off, std::min(kNameSlotBytes, len - off));
    r.dir = static_cast<uint8_t>(slot);
    r.entry = kNameSlotEntry;
    r.reserved = id;
    record_copy(r);
  }
}

// The id of the object at `info` (1-based; 0 when the table is full). dladdr has run before: it
// takes the loader's lock, which a thread in dlopen may hold while a constructor copies.
uint32_t object_id(const Dl_info& info) {
  char exe[PATH_MAX];
  const char* path = object_path(info, exe, sizeof exe);
  const Known key{reinterpret_cast<uintptr_t>(info.dli_fbase), fnv1a(path)};
  uint32_t id = 0;
  bool fresh = false;
  pthread_mutex_lock(&g_mu);
  if (!g_fork_hook) {
    g_fork_hook = true;
    pthread_atfork(nullptr, nullptr, forget_after_fork);
  }
  for (int i = 0; i < g_count && !id; ++i) {
    if (g_known[i].base == key.base && g_known[i].hash == key.hash) id = static_cast<uint32_t>(i + 1);
  }
  if (!id && g_count < kMaxObjects) {
    g_known[g_count++] = key;
    id = static_cast<uint32_t>(g_count);
    fresh = true;
  }
  pthread_mutex_unlock(&g_mu);
  if (fresh) record_name(id, path);
  return id;
}

}  // namespace

uint32_t name_caller(const void* caller, uint64_t* site) {
  *site = reinterpret_cast<uintptr_t>(caller);
  uint32_t id = 0;
  if (caller && !t_naming) {
    t_naming = true;
    Dl_info info;
    if (dladdr(caller, &info) && info.dli_fbase) {
      *site -= reinterpret_cast<uintptr_t>(info.dli_fbase);
      id = object_id(info);
    }
    t_naming = false;
  }
  return id;
}

}  // namespace cmt
