#include "job.hpp"

#include <utility>
#include <vector>

#include "fast_copy.hpp"
#include "spin.hpp"
#include "timeline.hpp"

namespace cmt {
namespace {

// Host-to-device lanes, once out of pieces, demote the staging lines they wrote with cached stores
// into the copy's last `slots` blocks. The lanes run ahead of the copy engine, and the blocks they
// fill last stay in their cores' L2 until a DMA reads them, slowly; earlier blocks are pushed out
// of L2 by the lanes' later writes.
thread_local std::vector<std::pair<char*, size_t>> t_lane_tail;

}  // namespace

void Job::fail(CUresult r) {
  CUresult expected = CUDA_SUCCESS;
  error.compare_exchange_strong(expected, r);
  next.store(plan.pieces, std::memory_order_relaxed);  // the other lanes stop claiming
}

// Spins until the slot's DMA for `round` has been queued; false if the copy failed meanwhile.
bool Job::wait_issued(Slot& s, long round) {
  Backoff backoff;
  while (s.issued.load(std::memory_order_acquire) < round) {
    if (error.load(std::memory_order_relaxed) != CUDA_SUCCESS) return false;
    backoff.pause();
  }
  return true;
}

// Waits until the slot's DMA for `round` (or, for round -1, an earlier copy's) has finished.
// One lane waits in the driver; the others watch known_done (many threads waiting on one event
// in the driver at once were measured to be slow).
bool Job::wait_done(Slot& s, long round) {
  if (s.known_done.load(std::memory_order_acquire) >= round) return true;
  long claimed = s.sync_claimed.load(std::memory_order_relaxed);
  bool syncer = false;
  while (claimed < round) {
    if (s.sync_claimed.compare_exchange_weak(claimed, round)) {
      syncer = true;
      break;
    }
  }
  if (!syncer) {
    Backoff backoff;
    while (s.known_done.load(std::memory_order_acquire) < round) {
      if (error.load(std::memory_order_relaxed) != CUDA_SUCCESS) return false;
      backoff.pause();
    }
    return true;
  }
  if (CUevent e = s.last_event) {
    CUresult r = driver().cuEventSynchronize(e);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
  }
  if (timeline::enabled()) timeline::note(timeline::Step::DmaDone, round * slots + (&s - &(*ring)[0]));
  s.known_done.store(round, std::memory_order_release);
  return true;
}

CUresult Job::queue_dma(size_t b) {
  int si = static_cast<int>(b % slots);
  return dma->queue(res, plan.dir, device + plan.block_off[b], staging(b), plan.block_len(b), (*ring)[si], si, b);
}

CUresult Job::queue_first_round() {
  for (int s = 0; s < slots; ++s) {
    CUresult r = queue_dma(static_cast<size_t>(s));
    if (r != CUDA_SUCCESS) return r;
    (*ring)[s].issued.store(0, std::memory_order_relaxed);
  }
  return CUDA_SUCCESS;
}

bool Job::fill_piece(size_t p) {
  size_t b = plan.block_of(p), i = p - plan.piece_off[b];
  long round = static_cast<long>(b / slots);
  Slot& s = slot_of(b);
  // The slot is free once the DMA of its previous round (or of an earlier copy) has read it.
  if (!wait_issued(s, round - 1) || !wait_done(s, round - 1)) return false;
  size_t off = i * plan.piece_len[b], len = std::min(plan.piece_len[b], plan.block_len(b) - off);
  char* buf = staging(b) + off;
  CUresult r = host->fill(buf, plan.block_off[b] + off, len, streamed);
  if (r != CUDA_SUCCESS) {
    fail(r);
    return false;
  }
  if (!streamed && b + slots >= plan.blocks) t_lane_tail.push_back({buf, len});
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // this lane completed the block
    r = queue_dma(b);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
    size_t next_block = b + slots;
    if (next_block < plan.blocks) s.pending.store(plan.pieces_in(next_block), std::memory_order_relaxed);
    s.issued.store(round, std::memory_order_release);
  }
  return true;
}

bool Job::drain_piece(size_t p) {
  size_t b = plan.block_of(p), i = p - plan.piece_off[b];
  long round = static_cast<long>(b / slots);
  Slot& s = slot_of(b);
  size_t off = i * plan.piece_len[b], len = std::min(plan.piece_len[b], plan.block_len(b) - off);
  host->prepare_drain(plan.block_off[b] + off + len);
  if (!wait_issued(s, round) || !wait_done(s, round)) return false;
  CUresult r = host->drain(staging(b) + off, plan.block_off[b] + off, len, streamed);
  if (r != CUDA_SUCCESS) {
    fail(r);
    return false;
  }
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // slot drained: refill it
    size_t next_block = b + slots;
    if (next_block < plan.blocks) {
      s.pending.store(plan.pieces_in(next_block), std::memory_order_relaxed);
      r = queue_dma(next_block);
      if (r != CUDA_SUCCESS) {
        fail(r);
        return false;
      }
      s.issued.store(round + 1, std::memory_order_release);
    }
  }
  return true;
}

void Job::run_lane(int lane) {
  const bool trace = timeline::enabled();
  if (trace) {
    timeline::set_lane(lane);
    timeline::note(timeline::Step::LaneStart);
  }
  for (;;) {
    size_t p = next.fetch_add(1, std::memory_order_relaxed);
    if (p >= plan.pieces) break;
    if (!(plan.dir == Direction::HtoD ? fill_piece(p) : drain_piece(p))) break;
  }
  for (auto& [p, n] : t_lane_tail) demote_lines(p, n);
  t_lane_tail.clear();
  if (trace) timeline::note(timeline::Step::LaneEnd);
}

}  // namespace cmt
