// Large reads of regular files, split over the engine's lanes. Under `cmt run` the program's read,
// pread, pread64, readv, preadv, preadv64 (and the fortified __read_chk, __pread_chk, __pread64_chk)
// are cmt's:
//   - below the threshold (CMT_READ_THRESHOLD, 4 MiB; 0 turns this off): one compare, then libc's;
//   - above it, on a regular file: the range is cut into pieces that the lane pool (host_copy.hpp's,
//     the calling thread is lane 0) reads with pread at once: a file in the page cache arrives at the
//     memory's bandwidth, a cold one at the disk's rate for many requests in flight.
// What the single call would do is kept: the bytes returned are the file's from the start up to the
// first piece that came back short (the end of the file, or an error: -1 with its errno when nothing
// was read before it); read and readv leave the file position just after them, and take their range
// of it at once (lseek SEEK_CUR), so that another reader of the same open file reads after it; a
// request is cut to what one call may return (0x7ffff000 bytes); an O_DIRECT descriptor is split
// only where its buffers, length and offset are aligned, in pieces that keep them so.
// A piece reads on over short reads and EINTR; an error, or the file's end before its size said
// (cut meanwhile), ends it, and the calling thread then reads on once from there (a transient error
// costs nothing). Not quite the same: only if that fails too may pieces further on have filled part
// of the buffer past the bytes returned (with the file's bytes for those offsets; the kernel's own
// O_DIRECT reads do the same on an error), and the call is no pthread cancellation point while the
// lanes read. On a spinning disk only ranges wholly in the page cache are split.
// The plain call serves everything else: before the library is initialised, processes that do not
// use CUDA, cmt's own threads (and signal handlers that interrupt them), forked children, CMT_DISABLE,
// pipes, sockets, terminals and every file that is not regular, and reads the file size says are
// smaller than the threshold (procfs and sysfs files say 0). While another host copy or read holds
// the pool, the calling thread reads the pieces alone. fread and other calls inside libc reach the
// kernel through libc's internal __read, which no preloaded library can replace.
#pragma once
#include <cstdint>

namespace cmt {

// Resolves libc's functions and arms the threshold (the library's constructor).
void large_read_init();

struct ReadCounters {
  uint64_t split_calls = 0, split_bytes = 0;    // reads split over the lanes, and the bytes they returned
  uint64_t alone_calls = 0, alone_bytes = 0;    // the same, read by the calling thread alone (pool busy)
  uint64_t guarded_calls = 0;                    // passed to libc by the rate guard (splitting lost here)
};
ReadCounters read_counters();

}  // namespace cmt
