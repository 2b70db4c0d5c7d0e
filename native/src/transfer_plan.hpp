// The geometry of one staged copy: how it is cut into DMA blocks and the blocks into pieces of CPU
// work, and where each block lies in its staging buffer. Pure computation: no CUDA, no threads,
// no clock. The engine runs a copy along it; `cmt tune`'s model reads the same blocks through the
// C API (cmt_transfer_blocks), so the two never disagree.
//
// A copy is cut into blocks of `chunk` bytes, one DMA each. The first blocks ramp up from chunk/8
// and, device-to-host, the last ones halve what is left down to chunk/8: the pipeline's fill (the
// first block must be staged before its DMA starts) and drain (the last copy-out runs alone) then
// cost an eighth as much, while most DMAs stay large enough that the copy engine's per-command cost
// stays small. Host-to-device copies do not ramp down: their lanes run ahead of the copy engine, so
// the last DMAs never wait for them (docs/engine-findings.md has the measurements behind each rule).
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "types.hpp"

namespace cmt {

constexpr size_t kMinChunk = 4096;
constexpr size_t kMaxChunk = size_t(256) << 20;
constexpr size_t kMinPiece = 64 << 10;  // per-piece costs (claiming, a slot's counter) stay small

struct TransferPlan {
  Direction dir = Direction::HtoD;
  size_t bytes = 0;
  size_t blocks = 0;
  size_t pieces = 0;
  // Block b covers bytes [block_off[b], block_off[b+1]) and pieces [piece_off[b], piece_off[b+1]),
  // each piece_len[b] bytes (the last one shorter).
  std::vector<size_t> block_off, piece_off, piece_len;
  size_t ramp_up_blocks = 0;  // the first blocks, smaller than a chunk
  // Where the blocks lie in the staging buffers (place()): the copy uses [window, window +
  // window_bytes) of every slot, and blocks before tail_below lie at the end of that window.
  size_t window = 0, window_bytes = 0, tail_below = 0;

  size_t block_len(size_t b) const { return block_off[b + 1] - block_off[b]; }
  int pieces_in(size_t b) const { return static_cast<int>(piece_off[b + 1] - piece_off[b]); }
  size_t piece_start(size_t p, size_t b) const { return (p - piece_off[b]) * piece_len[b]; }  // in block b
  size_t block_of(size_t p) const {
    return static_cast<size_t>(std::upper_bound(piece_off.begin(), piece_off.end(), p) - piece_off.begin()) - 1;
  }
  size_t slot_offset(size_t b) const {
    return window + (b < tail_below ? (window_bytes - block_len(b)) & ~size_t(4095) : 0);
  }
};

// Cuts a copy of `bytes` into blocks of up to `chunk` bytes, each shared out over `lanes` lanes
// (fixed_piece > 0: pieces of that size instead, for the tests).
TransferPlan cut_transfer(Direction dir, size_t bytes, size_t chunk, int lanes, size_t fixed_piece = 0);

// Places the blocks in staging buffers of slot_bytes each. `flipped` is the engine's memory of
// which end of the buffers the last device-to-host copy used; it is turned over when this one
// uses the other end.
void place_transfer(TransferPlan& plan, size_t slot_bytes, size_t chunk, bool* flipped);

}  // namespace cmt
