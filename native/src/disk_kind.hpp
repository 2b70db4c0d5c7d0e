// Whether a file lies on a spinning disk: there, reads of one file at many places at once make the
// head seek between them, and a single sequential read (with the kernel's readahead) is faster than
// parallel pieces (large_read.hpp reads such files in pieces only when they are in the page cache).
#pragma once
#include <sys/types.h>

namespace cmt {

// The block device's queue/rotational (a partition: its disk's), remembered per device; false when
// there is no block device to ask (tmpfs, NFS, FUSE, overlay's anonymous devices).
// CMT_TEST_HOOKS rotational=0|1 answers for every device.
bool rotational_device(dev_t dev);

}  // namespace cmt
