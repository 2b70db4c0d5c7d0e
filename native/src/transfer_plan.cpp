#include "transfer_plan.hpp"

namespace cmt {

TransferPlan cut_transfer(Direction dir, size_t bytes, size_t chunk, int lanes, size_t fixed_piece) {
  TransferPlan t;
  t.dir = dir;
  t.bytes = bytes;
  t.block_off.assign(1, 0);
  const size_t first = std::min(chunk, std::max(chunk / 8, kMinPiece));
  size_t rem = bytes;
  auto take = [&](size_t n) {
    n = std::min(n, rem);
    t.block_off.push_back(t.block_off.back() + n);
    rem -= n;
  };
  const bool down = dir == Direction::DtoH;
  for (size_t s = first; s < chunk && rem; s *= 2) take(s);  // ramp up
  t.ramp_up_blocks = t.block_off.size() - 1;
  while (rem > (down ? 2 * chunk : 0)) take(chunk);  // full blocks
  while (down && rem > first) take(std::min(chunk, (rem / 2 + kMinPiece - 1) & ~(kMinPiece - 1)));  // ramp down
  if (rem) take(rem);
  t.blocks = t.block_off.size() - 1;
  t.piece_off.assign(1, 0);
  for (size_t b = 0; b < t.blocks; ++b) {
    size_t len = t.block_len(b);
    size_t piece = fixed_piece ? fixed_piece : std::max(kMinPiece, (len / lanes + 4095) & ~size_t(4095));
    t.piece_len.push_back(std::min(piece, len));
    t.piece_off.push_back(t.piece_off.back() + (len + t.piece_len.back() - 1) / t.piece_len.back());
  }
  t.pieces = t.piece_off.back();
  return t;
}

void place_transfer(TransferPlan& t, size_t slot_bytes, size_t chunk, bool* flipped) {
  // Consecutive device-to-host copies whose blocks fit twice in a slot use its two ends in turn, so
  // that none of a copy's DMAs writes lines its predecessor's copy-out has just read (such a DMA
  // runs at half the link). Host-to-device copies use the slots from their start.
  const size_t span = (chunk + 4095) & ~size_t(4095);
  t.window = 0;
  t.window_bytes = slot_bytes;
  if (t.dir == Direction::DtoH && slot_bytes >= 2 * span) {
    *flipped = !*flipped;
    t.window = *flipped ? (slot_bytes - span) & ~size_t(4095) : 0;
    t.window_bytes = span;
  }
  // Device-to-host ramp-up blocks lie at the end of their window: the ring memory the last copy's
  // copy-outs touched least recently.
  t.tail_below = t.dir == Direction::DtoH ? t.ramp_up_blocks : 0;
}

}  // namespace cmt
