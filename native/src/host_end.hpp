// The host end of a staged copy: where a host-to-device copy's bytes come from and where a
// device-to-host copy's bytes go. The lanes call it for each piece of CPU work, between host and a
// staging slot; everything else about a copy (blocks, slots, DMAs) does not depend on it.
// HostMemory is the program's own memory; a file read with pread is another such end.
#pragma once
#include <atomic>
#include <cstddef>

#include "cmt/cuda_types.hpp"

namespace cmt {

class HostEnd {
 public:
  virtual ~HostEnd() = default;
  // Host-to-device: bytes [off, off + len) of the source into `staging`.
  virtual CUresult fill(char* staging, size_t off, size_t len, bool streaming) = 0;
  // Device-to-host: `staging` into bytes [off, off + len) of the destination. `upto`: how far the
  // lanes have got, so that an end that must prepare its bytes can keep ahead of them.
  virtual CUresult drain(const char* staging, size_t off, size_t len, bool streaming) = 0;
  virtual void prepare_drain(size_t upto) { (void)upto; }
  // Whether the piece at `off` is a disk transfer in progress that another lane could only wait for
  // (it is never done twice): such a piece is not taken over (job.hpp).
  virtual bool in_disk_io(size_t off) { (void)off; return false; }
};

// Pageable memory of the program. A device-to-host destination not faulted in yet is faulted in
// ahead of the copy-out by the lanes together (prefault.hpp), 2 MiB at a time.
class HostMemory final : public HostEnd {
 public:
  HostMemory(char* base, size_t bytes, bool prefault) : base_(base), bytes_(bytes), prefault_(prefault) {}
  CUresult fill(char* staging, size_t off, size_t len, bool streaming) override;
  CUresult drain(const char* staging, size_t off, size_t len, bool streaming) override;
  void prepare_drain(size_t upto) override;

 private:
  char* base_;
  size_t bytes_;
  bool prefault_;
  std::atomic<size_t> fault_next_{0};  // destination bytes below this are faulted in or being so
};

}  // namespace cmt
