// The node's budgets of copy threads and of pinned staging memory, shared by every process of one
// user on the machine through a small shared-memory segment (/dev/shm/cmt-budget4-<uid>): `torchrun`,
// vLLM and Ray start a process per GPU, and each would otherwise start as many copy threads as the
// machine has CPUs and pin its own staging rings.
//
// Each process counts the worker lanes its copies hold, and the staging it pinned, in a slot of its
// own, and the segment keeps the totals; a copy takes what the budget leaves, up to a fair share
// (the budget over the processes copying at that moment; on a busy host, the CPUs that other
// programs leave, cpu_load.hpp), and its calling thread always works (it is the program's own).
// Shares follow the processes copying while copies run: a process above its share lets lanes go
// between two pieces when another lacks them, and the short copy takes them up. A staging ring
// that the budget cannot hold is not made (its copies go to the driver). No broker: a process that
// ended, however it ended, is found by its pid being gone, and its share is given back. The
// budgets are the usable CPUs (or CMT_NODE_THREADS) and a quarter of the memory (or
// CMT_NODE_PINNED_MB). Without shared memory they are this process's alone.
#pragma once
#include <cstddef>

namespace cmt {

// Worker lanes a copy may have of the `wanted` ones: 0..wanted, within the node's budget; *short_by:
// what it lacks of its fair share because other processes hold the budget (nullptr: a copy that
// does not take lanes up while it runs). Every take is followed by a give of what the copy holds at
// its end and what it still lacks.
int take_lanes(int wanted, int* short_by);
void give_lanes(int taken, int short_by);
// While a copy runs (between two pieces): the lanes, up to short_by, that came free for a copy that
// lacks its share (its caller asks); and whether a worker lane of this process, which holds more
// than its share while other processes lack lanes, is to leave its copy (then its lane is given
// back already, and the copy lacks it: it takes it up again once the shares allow).
int take_more_lanes(int short_by);
bool lane_over_share();

// The budget, and the worker lanes all live processes hold now (for the tests and benches).
int node_budget();
int node_lanes_in_use();
int node_lanes_mine();

// Pinned staging memory, counted in MiB (rounded up): false when the node's budget cannot hold it.
bool take_pinned(size_t bytes);
void give_pinned(size_t bytes);
long node_pinned_budget_mib();
long node_pinned_in_use_mib();

}  // namespace cmt
