// Device-to-host copies into never-touched pages would take one page fault per 4 KiB inside the
// copy, serialised in the kernel. Instead the lanes fault the destination in ahead of the
// copy-out, 2 MiB per madvise(MADV_POPULATE_WRITE), in parallel with each other and with the DMAs.
// By default the range's 2 MiB-aligned interior is first made eligible for transparent huge pages
// (it is about to be written entirely): 512 times fewer faults (CMT_PREFAULT, env.hpp).
#pragma once
#include <cstddef>

namespace cmt {

constexpr size_t kFaultUnit = size_t(2) << 20;        // one huge page, or 512 small ones per madvise
constexpr size_t kFaultLookahead = size_t(16) << 20;  // how far ahead of the copy-out faulting runs

// Whether a device-to-host copy into [p, p + len) should fault its destination in ahead (probes
// the middle of the range: malloc writes its chunk header into a new mapping's first page, so the
// first page says nothing); if so, and with huge pages allowed, advises them for the range.
bool prepare_fresh_destination(char* p, size_t len);

// Faults [p, p + len) in for writing (whole pages inside it).
void populate(char* p, size_t len);

// How many CPUs this thread may run on (1 if the kernel will not say).
long usable_cpus();

}  // namespace cmt
