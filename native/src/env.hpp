// Every CMT_* variable the native core reads, read once when the library loads, in one place.
// Each is parsed strictly: a value that is not understood is warned about once on stderr and the
// default is kept. The user settings are the README's; CMT_PLAN, CMT_PROFILE_DIR and
// CMT_TEST_HOOKS are internal (docs/design.md).
#pragma once
#include <cstddef>
#include <string>

namespace cmt {

// How a device-to-host copy into never-touched memory faults its destination in (prefault.hpp).
enum class Prefault { None, Populate, HugePopulate };

struct Env {
  bool disable = false;        // CMT_DISABLE=1: every copy passes through
  int log_level = 1;           // CMT_LOG=quiet|warn|info|debug (log::Level)
  bool stats = false;          // CMT_STATS=1: counters on stderr at exit
  bool trace = false;          // CMT_TRACE=1: the engine's timeline of its last copy
  long spin_us = 200;          // CMT_SPIN_US: how long idle copy threads spin before sleeping
  long node_threads = 0;       // CMT_NODE_THREADS: copy threads of all this user's processes (0: usable CPUs)
  long node_pinned_mb = 0;     // CMT_NODE_PINNED_MB: their pinned staging (0: a quarter of the memory)
  Prefault prefault = Prefault::HugePopulate;  // CMT_PREFAULT=huge|populate|none
  bool from_file = true;       // CMT_FROM_FILE=0: copies from file mappings come from memory (mapped_copy.hpp)
  long read_threshold = 4L << 20;  // CMT_READ_THRESHOLD: reads of files split over the lanes from this size; 0 off
  std::string plan;         // CMT_PLAN (internal): the tuned file's rules, from `cmt run`
  std::string profile_dir;  // CMT_PROFILE_DIR (internal): where `cmt profile` records
  // CMT_TEST_HOOKS (internal, for the tests alone): "piece=BYTES,late_start_us=US,guard=0,wait_setup=1,park_..."
  size_t test_piece = 0;       // every piece of CPU work this many bytes (many pieces in small copies)
  long test_late_start_us = 0;  // every worker starts each copy this late, as a descheduled one would
  long test_busy_cpus = -1;     // busy_cpus=N: other programs keep N CPUs busy (cpu_load.hpp); -1 measure
  bool test_guard = true;       // guard=0: the rate guard never passes a copy through (tests of the engine)
  bool test_wait_setup = false;  // wait_setup=1: copies wait for their pipeline's setup (one copy is staged)
  long test_setup_delay_us = 0;  // setup_delay_us=US: the setup takes US longer, outside the driver (page faults)
  long test_setup_expected_ms = -1;  // setup_expected_ms=MS: what the engine expects a setup to take
  long test_cold_buffers = -1;  // cold_buffers=N: a cold read's blocks in flight (0: all; research/cold_depth.py)
  long test_fault_us = 0;        // fault_us=US: each staging buffer takes US longer to fault in (a slow host)
  long test_reserve_hold_ms = -1;  // reserve_hold_ms=MS: staging faulted in ahead is let go after MS
  bool test_reserve = true;        // reserve=0: no staging is faulted in ahead (A/B runs)
  // park_piece=N,park_us=US[,park_before=1]: the lane that first claims piece N in this process
  // sleeps US µs once it has begun the piece (or, with park_before, as soon as it claimed it).
  size_t test_park_piece = 0;
  long test_park_us = 0;
  bool test_park_before = false;
  bool test_parse_maps = false;  // maps=1: /proc/self/maps is parsed, as on kernels without PROCMAP_QUERY
  bool test_mapped_fail = false;  // mapped_fail=1: copies from mapped files read wrong bytes, then fail
  int test_rotational = -1;      // rotational=0|1: every file's disk spins or not (disk_kind.hpp); -1 ask
  long test_read_eio = -1;       // read_eio=OFFSET: large reads fail with EIO at that file offset (large_read.cpp)
  bool test_read_eio_once = false;  // read_eio_once=1: only the first time
  long test_read_slow_after = 0;   // read_slow_after=K, read_slow_us=N: from the (K+1)th split read on,
  long test_read_slow_us = 0;      //   each piece first sleeps N µs (descheduled lanes; large_read.cpp)
  long test_disk_slow_at = -1;     // disk_slow_at=OFFSET, disk_slow_us=N: the storage path's piece at
  long test_disk_slow_us = 0;      //   that file offset counts as disk I/O and first sleeps N µs (file_end.cpp)
  std::string test_sysfs;  // sysfs=PATH: where the NUMA placement reads sysfs (a made-up tree)
  std::string test_node;   // node=NAME: the node budget's own segment (tests beside each other share none)
};

// The parsed environment (read on first use, which the library's constructor makes its load).
const Env& env();

}  // namespace cmt
