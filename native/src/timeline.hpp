// CMT_TRACE=1: the engine notes when each step of a copy happened, so that its pipeline (lane
// wake-ups, buffer fills, DMAs) can be seen and tuned on a real machine; the C API hands out the
// last copy's steps (cmt_last_timeline). Off by default: one predictable branch per step.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace cmt::timeline {

enum class Step : int { CopyStart, LaneStart, DmaQueued, DmaDone, LaneEnd, CopyEnd };

bool enabled();
// Starts the timeline of a new copy (under the engine's one-copy-at-a-time lock); block b covers
// bytes [block_off[b], block_off[b + 1]), and fill[b] says how the lanes write or read its staging
// lines (0 cached stores, 1 streaming stores: the engine's Fill).
void begin(int direction, size_t bytes, const std::vector<size_t>& block_off, const std::vector<int>& fill,
           int lanes);
// The lane number of the calling thread, for the steps it notes (0: the caller's thread).
void set_lane(int lane);
void note(Step step, long block = -1);
// The last copy's steps as JSON: {"direction", "bytes", "blocks", "block_bytes", "block_fill" (per block,
// as given to begin), "lanes", "steps": [[ns, lane, step, block]...],
// "dma_gpu": dma_gpu} with ns on CLOCK_MONOTONIC (Python's time.monotonic_ns); dma_gpu is the engine's
// GPU times of the DMAs (engine_dma_gpu_times), left out when empty.
std::string last_json(const std::string& dma_gpu);

}  // namespace cmt::timeline
