// CMT_TRACE=1: the engine notes when each step of a copy happened, so that its pipeline (lane
// wake-ups, buffer fills, DMAs) can be seen and tuned on a real machine; the C API hands out the
// last copy's steps (cmt_last_timeline). Off by default: one predictable branch per step.
#pragma once
#include <cstddef>
#include <string>

namespace cmt::timeline {

enum class Step : int { CopyStart, LaneStart, DmaQueued, DmaDone, LaneEnd, CopyEnd };

bool enabled();
// Starts the timeline of a new copy (under the engine's one-copy-at-a-time lock).
void begin(int direction, size_t bytes, size_t blocks, int lanes);
// The lane number of the calling thread, for the steps it notes (0: the caller's thread).
void set_lane(int lane);
void note(Step step, long block = -1);
// The last copy's steps as JSON: {"direction", "bytes", "blocks", "lanes", "steps": [[ns, lane, step, block]...]}
// with ns on CLOCK_MONOTONIC (Python's time.monotonic_ns).
std::string last_json();

}  // namespace cmt::timeline
