// The recording's file (`cmt profile`): one per process, its header, and the writes of records.
//
// On-disk format, version 2 (1 had no host copies): one file per process, <CMT_PROFILE_DIR>/cmt-<pid>.rec (a numeric
// suffix, cmt-<pid>.<n>.rec, if that name exists). Little-endian.
//   offset  size  field
//        0     8  magic "CMTPROF\0"
//        8     4  format version (kFormatVersion)
//       12     4  header_bytes: offset of the first record (8-aligned)
//       16     4  record_bytes: 48 (sizeof CopyRecord, recorder.hpp)
//       20     4  pid
//       24     4  ppid
//       28     4  flags: bit 0 = forked from a recording process (same program image)
//       32     8  CLOCK_MONOTONIC ns when the file was created (records use the same clock)
//       40     8  CLOCK_REALTIME ns at the same moment (wall-clock anchor)
//       48     4  meta_bytes: length of the meta text at offset 64
//       52     4  cmdline_bytes: length of /proc/self/cmdline (NUL-separated argv) after the meta
//       56     8  reserved (0)
//       64        meta text: "key=value\n" lines: cmt_version, clock, directions, h2h_from (the
//                 smallest host copy recorded, or "off"), host_kinds, outcomes, entries
//                 (comma-separated names; a record's byte fields index them; the driver's entry
//                 points, then memcpy, memmove, __memcpy_chk, __memmove_chk),
//                 outcome_text.<outcome> (why cmt passed such copies to the driver)
//                 cmdline, then zero padding to header_bytes
//   header_bytes  CopyRecord[] until the end of the file; a trailing partial record (killed
//                 mid-write) is ignored. A record with entry == 0xFF is a marker, not a copy:
//                 `bytes` records were dropped (buffers over their memory cap). One with entry
//                 == 0xFE is a name slot (recorder.hpp): part of the path of the object that
//                 h2h records with the same id in `reserved` were called from. In h2h records
//                 `stream` is the call site's offset in that object.
#pragma once
#include <limits.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "recorder.hpp"

namespace cmt::recfile {

extern char g_dir[PATH_MAX];  // CMT_PROFILE_DIR
extern int g_fd;              // the file, or -1
extern bool g_forked;         // this process was forked from a recording one
extern bool g_write_failed;   // a write failed: later records are dropped

// Creates the process's file with its header; -1 (warned) if it cannot.
int open_file();
// False once the program closed our descriptor (daemons close every fd): never write into
// whatever file took its number.
bool file_still_ours();

struct Writer {  // batches record ranges into writev calls without allocating
  iovec iov[64];
  int n = 0;
  void add(const CopyRecord* p, size_t count) {
    if (!count) return;
    if (n == 64) drain();
    iov[n++] = {const_cast<CopyRecord*>(p), count * sizeof(CopyRecord)};
  }
  void drain();
};

}  // namespace cmt::recfile
