// The profiler's recording of intercepted copies (`cmt profile`): one more consumer of the same
// hook that `cmt run` uses. Costs one relaxed load per copy when not recording.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cmt {

struct CopyRecord {  // on-disk layout: see the format comment in recorder.cpp
  uint64_t start_ns;  // CLOCK_MONOTONIC around the whole intercepted call
  uint64_t end_ns;
  uint64_t bytes;
  uint64_t stream;    // as passed; 0 means the entry point's default stream (h2h: the call site)
  int32_t result;     // CUresult returned to the program
  uint32_t tid;       // filled in by record_copy (cached per thread)
  uint8_t dir;        // Direction
  uint8_t host_kind;  // HostKind
  uint8_t outcome;    // Outcome
  uint8_t entry;      // EntryId, or kEntryCount + HostCall (host_copy_record.hpp)
  uint32_t reserved;  // h2h: the calling object's id (0: unknown)
};
static_assert(sizeof(CopyRecord) == 48, "on-disk record layout");

// A record with this entry is a name slot, not a copy: bytes [0, kNameSlotBytes) hold part of the
// path of a calling object (zero-padded), `dir` the slot's index in that path, `reserved` the id
// that h2h records name it by. (The tid after them is the recorder's to fill in.)
constexpr uint8_t kNameSlotEntry = 0xFE;
// A record with this entry is a pinning call (pin_record.hpp): `dir` says which, `reserved` names
// its calling object as h2h records do, `stream` the call site.
constexpr uint8_t kPinEntry = 0xFD;
// A record with this entry is the engine's setup of a GPU's staging (engine.cpp): from the copy that
// started it to its end; `bytes` the staging it pinned, `reserved` its buffers, `result` 0 if it
// succeeded (else the driver copies).
constexpr uint8_t kSetupEntry = 0xFC;
constexpr size_t kNameSlotBytes = 36;

bool recording();
uint64_t now_ns();
void record_copy(const CopyRecord& r);
// Writes what was recorded before the process ends through _exit() (no atexit handlers run then,
// e.g. multiprocessing's forked workers).
void flush_before_exit();

}  // namespace cmt
