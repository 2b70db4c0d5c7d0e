// Staging memory before it is pinned: anonymous pages mapped and faulted in (the kernel zeroes
// each), which the staging ring then registers with the driver (staging_ring.cpp).
//
// Faulting in is most of a setup's time: 80 MiB took 27-35 ms of a 34-41 ms setup on the lent VMs,
// whose hosts back fresh pages at about 3 GB/s however many threads ask (docs/engine-findings.md,
// "sixth steps"). So a device's staging is faulted in ahead, while the driver makes its primary
// context (cuDevicePrimaryCtxRetain: 100 ms or more), and the setup at the context's first copy
// takes it from there and only registers it. A reserve that no setup takes within a while is let go.
#pragma once
#include <cstddef>

#include "cmt/cuda_types.hpp"

namespace cmt {

// Starts faulting in `slots` slots of `bytes` for `dev` in the background, once per process (for
// its first primary context, whose setup starts once it is made: copy_path.hpp; a process that
// retains 8 GPUs' contexts does not fault in 8 rings it may not use). Called before the driver makes
// the context; does nothing where staging would not be registered (no cuMemHostRegister), in a
// forked child or inside cmt.
// dev = kAnyDevice: for the first setup of whichever device, where the machine has one NUMA node
// (`import cmt.io`, which need not load the driver: cmt_io_prepare); once per process too.
constexpr CUdevice kAnyDevice = -1;
void staging_reserve_start(CUdevice dev, int slots, size_t bytes);

// Fills mem[0..n) with mapped, faulted-in regions of `bytes` (MADV_DONTFORK): first from `dev`'s
// reserve, then (`any`: the setup is not placed on a NUMA node) from the reserve for any device,
// waiting for slots still being faulted in; then newly mapped by several threads; nullptr where
// memory could not be mapped. dev < 0: no reserve. Returns how many came from reserves. A reserve
// taken from is closed: what it did not give is unmapped.
int map_staging(void** mem, int n, size_t bytes, int dev, bool any);

// The staging faulted in ahead that waits for a setup now: whether there is any (a setup then mostly
// registers it), and how many of its bytes are still being faulted in (a setup waits for them).
struct StagingAhead {
  bool waiting = false;
  size_t pending_bytes = 0;
};
StagingAhead staging_ahead();

// A forked child has none of the reserves' pages (MADV_DONTFORK): it forgets them.
void staging_reserve_forget_after_fork();

}  // namespace cmt
