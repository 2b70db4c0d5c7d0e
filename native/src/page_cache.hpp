// Whether a range of a file is in the page cache: the storage path reads ranges that are with
// buffered pread (a memcpy out of the cache) and ranges that are not with O_DIRECT (no copy through
// the cache, the disk's full parallel rate).
#pragma once
#include <cstddef>
#include <cstdint>

namespace cmt {

// The fraction of the pages of [off, off + len) of `fd` that are in the page cache, 0 to 1; -1
// when it cannot be told (not a regular file, or neither the cachestat syscall nor mmap + mincore
// works on it). Linux >= 6.5 answers through cachestat (one syscall); older kernels through an mmap
// of the range and mincore. Both report only what the caller may know: on a file that this user
// neither owns nor may write, the kernel may report pages as absent.
double resident_fraction(int fd, uint64_t off, size_t len);

}  // namespace cmt
