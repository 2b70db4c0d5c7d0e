// The setup of a pipeline pins staging while the program's copies run, and a real driver's calls
// wait while another thread pins memory. So the setup paces itself against the program's copies:
// before each buffer it pins, it lets a copy in flight end first (for a few milliseconds at most).
// The engine (engine.cpp) says when a setup begins and ends; the interposer holds CopyInFlight
// around each copy it intercepts.
#pragma once
#include <cstdint>

namespace cmt {

// Held around each intercepted copy, its checks and its driver call included. A real driver's calls
// wait while another thread pins memory (H100, 2026-12-06: the first 64 MiB device-to-host copy took
// 50-80 ms against 9 plain, its checks waiting on the setup's pinning of 112 MiB), so the setup pins
// no further staging buffer while one runs: a copy waits for one buffer's pinning at most. A copy
// that waits for the setup itself does not count meanwhile; nor do copies while no pipeline is being
// set up (a copy already running when another thread's starts a setup is not waited for).
class CopyInFlight {
 public:
  CopyInFlight();
  ~CopyInFlight();
  CopyInFlight(const CopyInFlight&) = delete;
  CopyInFlight& operator=(const CopyInFlight&) = delete;

 private:
  bool owner_ = false;
};

// A copy that waits (for a setup, or its turn on a pipeline) holds no pinning back meanwhile.
class NotInFlight {
 public:
  NotInFlight();
  ~NotInFlight();
  NotInFlight(const NotInFlight&) = delete;
  NotInFlight& operator=(const NotInFlight&) = delete;
};

// A pipeline's setup begins (the copy of this thread that starts it, if any, counts from now) / ends.
void setup_begins();
void setup_ends();
// Before the setup pins a buffer: while the program's copies run, waits until one of them ends (or a
// few milliseconds), then lets the setup pin even if another has started, so that back-to-back
// copies cannot hold it back for long.
void let_copies_through();
// How long the setups paused in let_copies_through, in all, the pause under way included.
uint64_t setup_paused_ns();

}  // namespace cmt
