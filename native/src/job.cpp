#include "job.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "env.hpp"
#include "fast_copy.hpp"
#include "lane_pool.hpp"
#include "log.hpp"
#include "spin.hpp"
#include "stats.hpp"
#include "timeline.hpp"

namespace cmt {
namespace {

// Host-to-device lanes, once out of pieces, demote the staging lines they wrote with cached stores
// into the copy's last `slots` blocks. The lanes run ahead of the copy engine, and the blocks they
// fill last stay in their cores' L2 until a DMA reads them, slowly; earlier blocks are pushed out
// of L2 by the lanes' later writes.
thread_local std::vector<std::pair<char*, size_t>> t_lane_tail;

// A piece is taken over once its lane has had it this long without finishing: at least kMinStallNs
// (a scheduler's wake-up is tens of µs), and at least what a slow lane (2 bytes/ns) needs for it.
constexpr uint64_t kMinStallNs = 200000;
constexpr uint64_t kSlowLaneBytesPerNs = 2;

// CMT_TEST_HOOKS park_piece/park_us: the lane that claims that piece first in this process sleeps,
// before (park_before=1) or after it begins the host's side of it, as a descheduled lane would.
void park_if_asked(size_t piece, bool before) {
  static std::atomic<bool> parked{false};
  const Env& e = env();
  if (!e.test_park_us || piece != e.test_park_piece || before != e.test_park_before) return;
  if (parked.exchange(true)) return;
  std::this_thread::sleep_for(std::chrono::microseconds(e.test_park_us));
}

}  // namespace

void Job::start() {
  if (block_capacity_ < plan.blocks) {
    blocks_.reset(new Block[plan.blocks]);
    block_capacity_ = plan.blocks;
  }
  if (piece_capacity_ < plan.pieces) {
    pieces_.reset(new std::atomic<uint8_t>[plan.pieces]);
    piece_capacity_ = plan.pieces;
  }
  size_t largest_piece = 0;
  for (size_t b = 0; b < plan.blocks; ++b) {
    blocks_[b].slot.store(-1, std::memory_order_relaxed);
    blocks_[b].use = 0;
    blocks_[b].pending.store(plan.pieces_in(b), std::memory_order_relaxed);
    largest_piece = std::max(largest_piece, plan.piece_len[b]);
  }
  for (size_t p = 0; p < plan.pieces; ++p) pieces_[p].store(Open, std::memory_order_relaxed);
  for (auto& l : lanes_) l.piece.store(kNoPiece, std::memory_order_relaxed);
  stall_ns_ = std::max<uint64_t>(kMinStallNs, largest_piece / kSlowLaneBytesPerNs);
  next.store(0, std::memory_order_relaxed);
  error.store(CUDA_SUCCESS, std::memory_order_relaxed);
  blocks_done_.store(0, std::memory_order_relaxed);
  next_unslotted_.store(static_cast<size_t>(slots), std::memory_order_relaxed);
  ring->start_copy(slots, buffers);
  if (plan.dir == Direction::HtoD) {
    // The first blocks wait only for their slots' DMAs of the copy before (DMA 0).
    for (int s = 0; s < slots; ++s) blocks_[s].slot.store(s, std::memory_order_release);
  }
}

void Job::fail(CUresult r) {
  CUresult expected = CUDA_SUCCESS;
  error.compare_exchange_strong(expected, r);
  next.store(plan.pieces, std::memory_order_relaxed);  // the other lanes stop claiming
}

// Slot sl's DMAs up to `use` are finished (`known`: what the caller last read of known_done). The time
// it became known starts the clock of a lane that waited for it (take_over).
static void mark_known_done(Slot& sl, long known, long use) {
  while (known < use) {
    if (sl.known_done.compare_exchange_weak(known, use, std::memory_order_acq_rel)) {
      sl.known_at.store(monotonic_ns(), std::memory_order_release);
      return;
    }
  }
}

// Whether DMA `use` of slot s is finished, asking the driver if nobody knows yet (a lane that took
// on the wait in the driver may itself be descheduled).
bool Job::slot_ready(int s, long use) {
  if (words) return gpu_done(s, use);
  Slot& sl = (*ring)[s];
  long known = sl.known_done.load(std::memory_order_acquire);
  if (known >= use) return true;
  if (sl.uses.load(std::memory_order_acquire) != use) return false;
  if (CUevent e = sl.last_event; e && driver().cuEventQuery(e) != CUDA_SUCCESS) return false;
  mark_known_done(sl, known, use);
  return true;
}

// Waits until DMA `use` of slot s has finished. One lane waits in the driver; the others watch
// known_done (many threads waiting on one event in the driver at once were measured to be slow).
bool Job::wait_done(int s, long use) {
  if (words) {  // the stream's DMA: a few µs to a block's transfer time; naps after a while
    Backoff backoff(kMinStallNs);
    while (!gpu_done(s, use)) {
      if (failed()) return false;
      backoff.pause();
    }
    return true;
  }
  Slot& sl = (*ring)[s];
  if (sl.known_done.load(std::memory_order_acquire) >= use) return true;
  long claimed = sl.sync_claimed.load(std::memory_order_relaxed);
  bool syncer = false;
  while (claimed < use) {
    if (sl.sync_claimed.compare_exchange_weak(claimed, use)) {
      syncer = true;
      break;
    }
  }
  if (!syncer) {
    Backoff backoff;
    const uint64_t start = monotonic_ns();
    uint64_t next_query = start + stall_ns_;
    while (sl.known_done.load(std::memory_order_acquire) < use) {
      if (failed()) return false;
      if (monotonic_ns() >= next_query) {
        if (slot_ready(s, use)) break;
        next_query = monotonic_ns() + stall_ns_;
      }
      backoff.pause();
    }
    return true;
  }
  if (CUevent e = sl.last_event) {
    CUresult r = driver().cuEventSynchronize(e);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
  }
  if (timeline::enabled()) timeline::note(timeline::Step::DmaDone, sl.last_block.load(std::memory_order_relaxed));
  mark_known_done(sl, sl.known_done.load(std::memory_order_relaxed), use);
  return true;
}

CUresult Job::queue_dma(size_t b, int s) {
  Slot& sl = (*ring)[s];
  if (words) {  // the DMA waits on the stream for this word
    const long use = sl.uses.fetch_add(1, std::memory_order_acq_rel) + 1;
    __atomic_store_n(&words->host[s], words->base[s] + static_cast<uint32_t>(use), __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
  }
  CUresult r = dma->queue(res, plan.dir, device + plan.block_off[b], staging(b, s), plan.block_len(b), sl, s, b);
  if (r == CUDA_SUCCESS) {
    sl.last_block.store(static_cast<long>(b), std::memory_order_relaxed);
    sl.uses.fetch_add(1, std::memory_order_acq_rel);
  }
  return r;
}

CUresult Job::queue_first_round() {
  for (int s = 0; s < slots; ++s) {
    CUresult r = queue_dma(static_cast<size_t>(s), s);
    if (r != CUDA_SUCCESS) return r;
    blocks_[s].use = (*ring)[s].uses.load(std::memory_order_relaxed);
    blocks_[s].slot.store(s, std::memory_order_release);
  }
  return CUDA_SUCCESS;
}

// The slot for the next block: the one a done block freed, unless a late lane may still touch it;
// then a spare. Without a free spare it waits for the late lane to leave, as it would without spares.
int Job::choose_slot(int s) {
  Slot& mine = (*ring)[s];
  if (mine.late.load(std::memory_order_acquire) == 0) return s;
  {
    std::lock_guard<std::mutex> lock(spare_mutex_);
    for (int q = 0; q < buffers; ++q) {
      Slot& c = (*ring)[q];
      if (!c.in_chain && c.late.load(std::memory_order_acquire) == 0) {
        c.in_chain = true;
        mine.in_chain = false;  // quarantined: a spare once its late lane has left
        log::debug_once(0x51a7e, "a slot that a descheduled lane may still touch is set aside; a spare takes its place");
        return q;
      }
    }
  }
  Backoff backoff;
  while (mine.late.load(std::memory_order_acquire) != 0) {
    if (failed()) return -1;
    backoff.pause();
  }
  return s;
}

// Block b's pieces are all done: host-to-device, queue its DMA and give its slot to the next block
// without one; device-to-host, queue the DMA of the next block of its chain into a slot.
bool Job::complete_block(size_t b, int s) {
  const size_t nb = slots_to_any_block() ? next_unslotted_.fetch_add(1, std::memory_order_acq_rel)
                                         : b + static_cast<size_t>(slots);
  CUresult r = CUDA_SUCCESS;
  if (plan.dir == Direction::HtoD) r = queue_dma(b, s);
  if (r == CUDA_SUCCESS && nb < plan.blocks) {
    const int q = choose_slot(s);
    if (q < 0) return false;
    if (plan.dir == Direction::DtoH) r = queue_dma(nb, q);
    blocks_[nb].use = (*ring)[q].uses.load(std::memory_order_acquire);
    if (r == CUDA_SUCCESS) blocks_[nb].slot.store(q, std::memory_order_release);
  }
  if (r != CUDA_SUCCESS) {
    fail(r);
    return false;
  }
  blocks_done_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

// Waits until block b has a slot (a block before it is done: any, or the one before it in its
// chain), taking over stalled pieces of those blocks.
int Job::await_slot(size_t b, int lane) {
  int s = blocks_[b].slot.load(std::memory_order_acquire);
  if (s >= 0) return s;
  Backoff backoff;
  const uint64_t start = monotonic_ns();
  const size_t before = slots_to_any_block() ? kNoPiece : b - static_cast<size_t>(slots);
  while ((s = blocks_[b].slot.load(std::memory_order_acquire)) < 0) {
    if (failed()) return -1;
    if (monotonic_ns() - start > stall_ns_ && take_over(before, lane)) continue;
    backoff.pause();
  }
  return s;
}

// Runs the host's side of piece p of block b in slot s: by its own lane (own), or by a lane that
// took it over.
bool Job::do_piece(size_t p, size_t b, int s, bool own, int lane) {
  const size_t off = plan.piece_start(p, b), len = std::min(plan.piece_len[b], plan.block_len(b) - off);
  char* buf = staging(b, s) + off;
  const bool h2d = plan.dir == Direction::HtoD;
  if (!h2d) host->prepare_drain(plan.block_off[b] + off + len);
  // Host-to-device: the slot is free once its previous DMA has read it. Device-to-host: the block's
  // DMA has written it.
  if (!wait_done(s, blocks_[b].use)) return false;
  if (own) {
    lanes_[lane].since.store(monotonic_ns(), std::memory_order_release);
    park_if_asked(p, false);
  }
  CUresult r = h2d ? host->fill(buf, plan.block_off[b] + off, len, streamed)
                   : host->drain(buf, plan.block_off[b] + off, len, streamed);
  if (own) {
    uint8_t open = Open;
    if (!pieces_[p].compare_exchange_strong(open, Done, std::memory_order_acq_rel)) {
      (*ring)[s].late.fetch_sub(1, std::memory_order_acq_rel);  // taken over: the other lane finished it
      return true;
    }
  }
  if (r != CUDA_SUCCESS) {
    fail(r);
    return false;
  }
  if (h2d && !streamed && b + slots >= plan.blocks) t_lane_tail.push_back({buf, len});
  if (blocks_[b].pending.fetch_sub(1, std::memory_order_acq_rel) == 1) return complete_block(b, s);
  return true;
}

// Takes over a piece of `block` (kNoPiece: of any block) that another lane claimed a while ago and
// has not finished; its slot stays quarantined until that lane has left it. True if it did one.
bool Job::take_over(size_t block, int lane) {
  if (words) return false;  // the stream's DMAs name their slots already
  const uint64_t now = monotonic_ns();
  for (int l = 0; l < kMaxThreads; ++l) {
    if (l == lane) continue;
    const size_t p = lanes_[l].piece.load(std::memory_order_acquire);
    if (p >= plan.pieces || pieces_[p].load(std::memory_order_acquire) != Open) continue;
    const size_t b = plan.block_of(p);
    const int s = blocks_[b].slot.load(std::memory_order_acquire);
    if ((block != kNoPiece && b != block) || s < 0) continue;
    const uint64_t since = lanes_[l].since.load(std::memory_order_acquire);
    // A lane that has not begun its piece is stalled only if its slot has been ready a while: it
    // may have waited for the slot's DMA, which this very check may be the first to see done (cold
    // reads, whose lanes wait long for their blocks' slots, had 176-183 pieces of 7,460 taken over
    // from lanes that were only waiting; H100, 2026-12-07). (A fresh clock: slot_ready may have set
    // known_at after `now`.)
    const bool stalled = since ? now - since > stall_ns_
                               : now - lanes_[l].claimed.load(std::memory_order_acquire) > stall_ns_ &&
                                     slot_ready(s, blocks_[b].use) &&
                                     monotonic_ns() - (*ring)[s].known_at.load(std::memory_order_acquire) > stall_ns_;
    if (!stalled) continue;
    if (since && host->in_disk_io(plan.block_off[b] + plan.piece_start(p, b))) continue;  // a disk read or write under way: only waiting
    Slot& sl = (*ring)[s];
    sl.late.fetch_add(1, std::memory_order_acq_rel);  // before the piece is ours: its lane gives it back
    uint8_t open = Open;
    if (!pieces_[p].compare_exchange_strong(open, TakenOver, std::memory_order_acq_rel)) {
      sl.late.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    count_taken_over();
    log::debug_once(0x7a4e, "a copy lane stalled in its piece (descheduled?); another lane did it");
    return do_piece(p, b, s, /*own=*/false, lane);
  }
  return false;
}

// Lane 0, out of pieces: waits until every block is done, taking over pieces whose lanes stall, so
// that the copy's last DMAs go out without waiting for a descheduled lane.
void Job::wait_for_all_blocks(int lane) {
  Backoff backoff;
  const uint64_t start = monotonic_ns();
  while (blocks_done_.load(std::memory_order_acquire) < plan.blocks && !failed()) {
    if (monotonic_ns() - start > stall_ns_ && take_over(kNoPiece, lane)) continue;
    backoff.pause();
  }
}

void Job::run_lane(int lane) {
  const bool trace = timeline::enabled();
  if (trace) {
    timeline::set_lane(lane);
    timeline::note(timeline::Step::LaneStart);
  }
  LaneRecord& me = lanes_[lane];
  for (;;) {
    if (!LanePool::between_pieces(lane)) break;  // the node's budget wants this lane elsewhere
    const size_t p = next.fetch_add(1, std::memory_order_relaxed);
    if (p >= plan.pieces) break;
    me.since.store(0, std::memory_order_relaxed);
    me.claimed.store(monotonic_ns(), std::memory_order_relaxed);
    me.piece.store(p, std::memory_order_release);
    park_if_asked(p, true);
    const size_t b = plan.block_of(p);
    const int s = await_slot(b, lane);
    if (s < 0 || !do_piece(p, b, s, /*own=*/true, lane)) break;
  }
  me.piece.store(kNoPiece, std::memory_order_release);
  if (lane == 0) wait_for_all_blocks(lane);
  for (auto& [p, n] : t_lane_tail) demote_lines(p, n);
  t_lane_tail.clear();
  if (trace) timeline::note(timeline::Step::LaneEnd);
}

}  // namespace cmt
