// The node's budget of copy threads, shared by every process of one user on the machine through a
// small shared-memory segment (/dev/shm/cmt-lanes-<uid>): `torchrun`, vLLM and Ray start a process
// per GPU, and each would otherwise start as many copy threads as the machine has CPUs.
//
// Each process counts the worker lanes its copies hold in a slot of its own, and the segment keeps
// their total; a copy takes what the budget leaves (its calling thread always works: it is the
// program's own). No broker: a process that ended, however it ended, is found by its pid being gone,
// and its lanes are given back. The budget is the usable CPUs, or CMT_NODE_THREADS. Without shared
// memory the budget is this process's alone.
#pragma once

namespace cmt {

// Worker lanes a copy may have of the `wanted` ones: 0..wanted, within the node's budget. Every
// take is followed by a give of what it got.
int take_lanes(int wanted);
void give_lanes(int taken);

// The budget, and the worker lanes all live processes hold now (for the tests and benches).
int node_budget();
int node_lanes_in_use();

}  // namespace cmt
