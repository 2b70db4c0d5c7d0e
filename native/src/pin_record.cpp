#include "pin_record.hpp"

#include <pthread.h>

#include <unordered_map>

#include "caller_object.hpp"
#include "recorder.hpp"

namespace cmt {
namespace {

// The size of each pinning recorded and not yet let go, so that its release is counted in bytes.
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::unordered_map<const void*, size_t>* g_sizes = nullptr;
bool g_fork_hook = false;

// A forked child may have been forked while another thread held the table: it starts a new one.
void forget_after_fork() {
  pthread_mutex_init(&g_mu, nullptr);
  g_sizes = nullptr;  // (left to the parent's image)
}

size_t note_size(PinCall call, const void* ptr, size_t bytes, CUresult result) {
  if (!ptr || result != CUDA_SUCCESS) return bytes;
  const bool release = call == PinCall::FreeHost || call == PinCall::Unregister;
  pthread_mutex_lock(&g_mu);
  if (!g_fork_hook) {
    g_fork_hook = true;
    pthread_atfork(nullptr, nullptr, forget_after_fork);
  }
  if (!g_sizes) g_sizes = new std::unordered_map<const void*, size_t>();
  if (release) {
    auto it = g_sizes->find(ptr);
    if (it != g_sizes->end()) {
      bytes = it->second;
      g_sizes->erase(it);
    }
  } else {
    (*g_sizes)[ptr] = bytes;
  }
  pthread_mutex_unlock(&g_mu);
  return bytes;
}

}  // namespace

const char* pin_call_name(PinCall c) {
  static const char* const kNames[kPinCalls] = {"cuMemHostAlloc", "cuMemAllocHost", "cuMemHostRegister",
                                                "cuMemFreeHost", "cuMemHostUnregister"};
  return kNames[static_cast<int>(c)];
}

void record_pin_call(PinCall call, uint64_t start_ns, uint64_t end_ns, const void* ptr, size_t bytes,
                     CUresult result, const void* caller) {
  bytes = note_size(call, ptr, bytes, result);
  uint64_t site = 0;
  const uint32_t id = name_caller(caller, &site);
  // tid 0: the recorder fills it in. `dir` carries the call (the recording's `pin_calls`).
  record_copy(CopyRecord{start_ns, end_ns, bytes, site, result, 0, static_cast<uint8_t>(call), 0, 0,
                         kPinEntry, id});
}

}  // namespace cmt
