// Which mapping of the process an address lies in, and for a file mapping which file (device and
// inode, its path) and at which file offset: what the copy path needs to read a copy's source from
// the file instead of faulting the mapping in (mapped_copy.hpp).
//
// Linux 6.11 answers one address with one ioctl on /proc/self/maps (PROCMAP_QUERY), always current.
// Older kernels: /proc/self/maps is parsed into an interval map, kept, and parsed again on a miss
// or when it is older than 100 ms; a caller that is about to trust an entry (read the file in place
// of the memory) asks for a fresh answer, since the program may have unmapped and mapped again since
// the last parse. (A kept answer that is out of date can only make a copy come from memory.)
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace cmt {

// A /proc file of this process that cmt keeps open between calls (its maps, its pagemap). Opened on
// first use; a program that closes descriptors it did not open (close_range) lets the number go to
// another file, so `check` compares device and inode (one fstat) and opens the file again, leaving
// the number, now the program's, alone.
class KeptFd {
 public:
  explicit KeptFd(const char* path) : path_(path) {}
  int get(bool check);  // -1 when it cannot be opened
 private:
  const char* path_;
  std::mutex mutex_;
  int fd_ = -1;
  uint64_t dev_ = 0, ino_ = 0;
};

struct Mapping {
  uintptr_t start = 0, end = 0;
  uint64_t offset = 0;         // the file offset of `start`
  uint64_t dev = 0, ino = 0;   // the file's device (makedev) and inode; ino 0: not a file
  bool readable = false, shared = false;
  std::string path;            // the file's path as the kernel names it ("" when anonymous)
  bool file() const { return ino != 0 && !path.empty() && path[0] == '/'; }
};

// The mapping that contains `addr`; false if none contains it or the kernel would not say.
// `fresh`: never a kept answer (the interval map is parsed again; PROCMAP_QUERY always is fresh).
bool find_mapping(uintptr_t addr, Mapping* out, bool fresh);

// Whether the answers are fresh ones (PROCMAP_QUERY) or kept ones (the parsed interval map).
bool mapping_answers_fresh();

}  // namespace cmt
