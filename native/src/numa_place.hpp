// Where a GPU's copy threads and staging sit. On a machine of several NUMA nodes the copy engine
// reads and writes the staging through the GPU's own node, and the threads that fill and drain it
// should run there too: a remote node adds a socket hop to every byte, both ways. So a GPU's
// pipeline is set up from a thread running on the GPU's node, with its pinned staging preferred
// there, and a worker that enters a copy for that GPU moves to the node's CPUs (only when it
// changes node: one sched_setaffinity). The program's own thread (lane 0) is never moved.
//
// The node comes from sysfs: the GPU's PCI device's numa_node. Nothing is placed on a machine of
// one node, when the node is unknown (-1), or when none of the node's CPUs is allowed to us.
#pragma once
#include <sched.h>

#include "cmt/cuda_types.hpp"

namespace cmt {

struct NumaPlace {
  int node = -1;  // -1: not placed
  cpu_set_t cpus;  // the node's CPUs this process may use
  bool placed() const { return node >= 0; }
};

// Whether the machine has one NUMA node (or says nothing of its nodes): nothing is placed then.
bool numa_one_node();
// The place of a device's pipeline (its node and CPUs), or an unplaced one.
NumaPlace numa_place_for(CUdevice dev);
// The calling thread runs on the place's CPUs and prefers its node for new memory (the setup
// thread, before it allocates the staging ring). False if either call was refused.
bool numa_move_setup_thread(const NumaPlace& place);
// A worker entering a copy: moves it to `place` (nullptr or unplaced: the process's own CPUs) if
// that differs from where it is. `*current`: the worker's node, -1 for the process's CPUs; a new
// worker starts with kNumaUnknown (it inherits the mask of whichever thread started it) and the
// default memory policy (numa_worker_start).
constexpr int kNumaUnknown = -2;
void numa_follow(const NumaPlace* place, int* current);
void numa_worker_start();

}  // namespace cmt
