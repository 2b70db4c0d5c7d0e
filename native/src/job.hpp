// One staged copy in flight: its geometry (transfer_plan.hpp), where it stands (the next piece to
// claim, each block's slot and pieces left, the first error), and the lanes' work on it.
//   host-to-device: lanes fill pieces of a block into its slot from the host end; the lane that
//     completes a block queues its DMA. A slot is refilled once its previous DMA finished.
//   device-to-host: blocks are DMAed into slots ahead; lanes wait for a block's DMA and drain their
//     piece to the host end; the lane that drains a block queues the DMA of the next one into a slot.
// All lanes work on the same blocks, claiming pieces in order, so a block fills (or drains) at the
// speed of all lanes together while the copy engine works on the blocks before it.
//   A host-to-device block gets the slot of whichever block was done first, not that of the block
//   a ring before it: a slow piece (a cold disk read) then holds up its own slot only, where a
//   chain would idle every lane that reached the next block of that chain.
//
// A descheduled lane must not hold the copy up. A lane that waits for a block whose piece another
// lane claimed and has not finished in a while does that piece itself (it "takes it over"). The
// late lane may wake at any moment and finish its copy into or out of the slot, with the same
// bytes; so the slot is quarantined until the late lane has left, and a spare slot carries the
// blocks that would have reused it. The copy returns only when every lane has left the host's
// memory (lane_pool.hpp).
//
// A stream-ordered file transfer (stream_pipeline.hpp) runs the same job with its DMAs already
// queued on the caller's stream, each gated by a word in pinned memory: the job then makes no driver
// call. Queuing a DMA becomes setting the slot's host word; a DMA is known finished once the word
// the stream writes after it says so. No piece is taken over there: the DMAs' slots were fixed when
// they were queued, so a slot cannot be set aside.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "dma_streams.hpp"
#include "host_end.hpp"
#include "staging_ring.hpp"
#include "transfer_plan.hpp"

namespace cmt {

// The words that gate a slot's DMAs on a stream (both count the slot's DMAs, from `base`): `host[s]`
// is set by the lanes (h2d: the slot holds its next block; d2h: it may take its next block), and
// `gpu[s]` by the stream after each DMA of slot s.
struct SlotWords {
  uint32_t* host = nullptr;
  const uint32_t* gpu = nullptr;
  uint32_t base[kMaxSlots] = {};
};

struct Job {
  TransferPlan plan;
  int slots = 0;    // chains of blocks: block b follows block b - slots into the same slot
  int buffers = 0;  // the slots the copy may use: its chains and the spares
  bool streamed = false;  // the lanes write (h2d) or read (d2h) staging lines with streaming stores
  CUdeviceptr device = 0;
  HostEnd* host = nullptr;
  StagingRing* ring = nullptr;
  DmaStreams* dma = nullptr;
  ContextResources* res = nullptr;
  SlotWords* words = nullptr;  // set: the DMAs are queued on a stream already, gated by these words
  std::atomic<size_t> next{0};
  std::atomic<CUresult> error{CUDA_SUCCESS};

  // Readies the blocks' and pieces' state for the plan (and the ring's slots).
  void start();
  // Claims and runs pieces until none is left or the copy failed; lane 0 (the caller) then waits for
  // the blocks still in other lanes' hands, taking over any that stall. Last, demotes what this lane
  // wrote into the copy's last blocks (their DMAs then read them from the shared cache).
  void run_lane(int lane);
  // Device-to-host: queues the first round of DMAs, one per slot, before any lane starts.
  CUresult queue_first_round();
  // With `words`: whether the stream has done DMA `use` of slot s (use counts from 1 within the job).
  bool gpu_done(int s, long use) const {
    return static_cast<int32_t>(__atomic_load_n(&words->gpu[s], __ATOMIC_ACQUIRE) -
                                (words->base[s] + static_cast<uint32_t>(use))) >= 0;
  }
  // The bytes that may still wait for the copy engine when a host-to-device copy's lanes are done:
  // the last ring's blocks.
  size_t last_ring_bytes() const { return plan.bytes - plan.block_off[plan.blocks - static_cast<size_t>(slots)]; }

 private:
  static constexpr size_t kNoPiece = ~size_t(0);
  struct Block {
    std::atomic<int> slot{-1};     // set once its slot is free to fill (h2d) or its DMA queued (d2h)
    long use = 0;                  // the slot's DMA to wait for before filling (h2d) / draining (d2h)
    std::atomic<int> pending{0};   // pieces not finished
  };
  struct LaneRecord {                    // what a lane is doing, for the others to see it stall
    std::atomic<size_t> piece{kNoPiece};
    std::atomic<uint64_t> claimed{0};    // when it claimed the piece
    std::atomic<uint64_t> since{0};      // when it began the host's side of it; 0 while it waits
  };
  enum PieceState : uint8_t { Open = 0, Done = 1, TakenOver = 2 };

  bool do_piece(size_t p, size_t b, int s, bool own, int lane);
  bool complete_block(size_t b, int s);
  CUresult queue_dma(size_t b, int s);
  int choose_slot(int freed);
  // Host-to-device (not stream-ordered): a done block's slot goes to the next block without one.
  bool slots_to_any_block() const { return plan.dir == Direction::HtoD && !words; }
  int await_slot(size_t b, int lane);
  bool wait_done(int s, long use);
  bool slot_ready(int s, long use);
  bool take_over(size_t block, int lane);
  void wait_for_all_blocks(int lane);
  void fail(CUresult r);
  bool failed() const { return error.load(std::memory_order_relaxed) != CUDA_SUCCESS; }
  char* staging(size_t b, int s) { return static_cast<char*>((*ring)[s].mem) + plan.slot_offset(b); }

  std::unique_ptr<Block[]> blocks_;
  size_t block_capacity_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> pieces_;
  size_t piece_capacity_ = 0;
  LaneRecord lanes_[kMaxThreads];
  std::atomic<size_t> blocks_done_{0};
  std::atomic<size_t> next_unslotted_{0};  // slots_to_any_block: the next block to get a freed slot
  uint64_t stall_ns_ = 0;  // a piece claimed this long ago and not finished may be taken over
  std::mutex spare_mutex_;
};

}  // namespace cmt
