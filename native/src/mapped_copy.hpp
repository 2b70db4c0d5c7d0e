// Host-to-device copies whose source is a file mapping (a model's weights mmapped by safetensors,
// numpy.memmap, torch.load(mmap=True)): a copy of a range that is not in the page cache would fault
// the mapping in page by page, one readahead window at a time. The storage path reads it instead:
// the engine's lanes pread the file into the staging slots (file_end.hpp: O_DIRECT for pieces not
// in the page cache, buffered for those that are), in parallel, while the copy engine drains them.
//
// The bytes must be exactly the mapping's. The file path is taken only when
//   - the range lies in one readable mapping of a regular file that can be opened again by its
//     path and is the same file (device and inode), and inside the file's current size;
//   - the range is not wholly in the page cache (then the memory is as fast: the usual staged copy);
//   - for a private mapping, no page of the range is the program's own (written: an anonymous
//     copy-on-write page, present or swapped; /proc/self/pagemap). Shared mappings are the file.
// Anything else, or a read that fails, is the usual copy from memory; why is logged once at debug.
#pragma once
#include "cmt/cuda_types.hpp"
#include "engine.hpp"
#include "types.hpp"

namespace cmt {

// Runs `req` (host-to-device, pageable source) from the file behind its source when the rules above
// allow it. True: the copy is done, *result is its result and *outcome says how (FromFile, or
// Accelerated when a failed file read was redone from memory). False: nothing to say for it; the
// caller copies as usual (also rather than wait for the engine: engine_copy's `pass`).
bool copy_from_mapping(const CopyRequest& req, CUresult* result, Outcome* outcome);

// Smaller copies are never looked at: the lookup (about 1 µs for a file mapping) would be a
// measurable part of a warm one, and a cold one faults in few readahead windows.
constexpr size_t kMappedCopyMinBytes = size_t(4) << 20;

}  // namespace cmt
