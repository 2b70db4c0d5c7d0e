#include "host_copy_record.hpp"

#include "caller_object.hpp"
#include "driver.hpp"
#include "recorder.hpp"

namespace cmt {

const char* host_call_name(HostCall c) {
  static const char* const kNames[kHostCalls] = {"memcpy", "memmove", "__memcpy_chk", "__memmove_chk",
                                                 "memset", "__memset_chk"};
  return kNames[static_cast<int>(c)];
}

void record_host_copy(uint64_t start_ns, uint64_t end_ns, size_t bytes, Outcome o, HostCall call,
                      const void* caller) {
  // The call site: an offset into its object (for addr2line), or the address if unresolved.
  uint64_t site = 0;
  const uint32_t id = name_caller(caller, &site);
  record_copy(CopyRecord{start_ns, end_ns, bytes, site, 0, 0, static_cast<uint8_t>(Direction::HtoH),
                         static_cast<uint8_t>(HostKind::Unknown), static_cast<uint8_t>(o),
                         static_cast<uint8_t>(kEntryCount + static_cast<int>(call)), id});
}

}  // namespace cmt
