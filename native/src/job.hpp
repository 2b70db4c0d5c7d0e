// One staged copy in flight: its geometry (transfer_plan.hpp), where it stands (the next piece to
// claim, the first error), and the lanes' work on it.
//   host-to-device: lanes fill pieces of a block into its slot from the host end; the lane that
//     completes a block queues its DMA. A slot is refilled once its previous DMA finished.
//   device-to-host: blocks are DMAed into slots ahead; lanes wait for a block's DMA and drain their
//     piece to the host end; the lane that drains a slot queues the DMA of the next block using it.
// All lanes work on the same blocks, claiming pieces in order, so a block fills (or drains) at the
// speed of all lanes together while the copy engine works on the blocks before it.
#pragma once
#include <atomic>

#include "dma_streams.hpp"
#include "host_end.hpp"
#include "staging_ring.hpp"
#include "transfer_plan.hpp"

namespace cmt {

struct Job {
  TransferPlan plan;
  int slots = 0;
  bool streamed = false;  // the lanes write (h2d) or read (d2h) staging lines with streaming stores
  CUdeviceptr device = 0;
  HostEnd* host = nullptr;
  StagingRing* ring = nullptr;
  DmaStreams* dma = nullptr;
  ContextResources* res = nullptr;
  std::atomic<size_t> next{0};
  std::atomic<CUresult> error{CUDA_SUCCESS};

  // Claims and runs pieces until none is left or the copy failed; then demotes what this lane
  // wrote into the copy's last blocks (their DMAs then read them from the shared cache).
  void run_lane(int lane);
  // Device-to-host: queues the first round of DMAs, one per slot, before any lane starts.
  CUresult queue_first_round();
  // The bytes that may still wait for the copy engine when a host-to-device copy's lanes are done:
  // the last ring's blocks.
  size_t last_ring_bytes() const { return plan.bytes - plan.block_off[plan.blocks - static_cast<size_t>(slots)]; }

 private:
  bool fill_piece(size_t p);
  bool drain_piece(size_t p);
  CUresult queue_dma(size_t b);
  bool wait_issued(Slot& s, long round);
  bool wait_done(Slot& s, long round);
  void fail(CUresult r);
  Slot& slot_of(size_t b) { return (*ring)[static_cast<int>(b % slots)]; }
  char* staging(size_t b) { return static_cast<char*>(slot_of(b).mem) + plan.slot_offset(b); }
};

}  // namespace cmt
