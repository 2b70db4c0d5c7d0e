// How many of this process's usable CPUs other programs keep busy: a copy on a busy host takes no
// more lanes than there are CPUs left, since a lane the scheduler takes off its CPU stalls its
// piece of the copy until another lane takes it over (`cmt bench load`, H100 2026-12-05: with 8
// CPU-burning threads on 16 CPUs, 64 MiB and 1 GiB copies on 10 lanes kept 45-55% of their quiet
// rate; with 12, 24-35%).
//
// Measured, not guessed: the busy time of the CPUs in this process's affinity set (/proc/stat's
// per-CPU lines: user, nice, system, irq, softirq and steal, the time a VM's host gave others) over
// the last interval, less this process's own CPU time. Sampled at most every kSampleNs, by the
// copy that asks first (a read of /proc/stat, tens of µs); 0 until two samples exist.
#pragma once

namespace cmt {

// CPUs that other programs kept busy over the last interval (0 when unknown; CMT_TEST_HOOKS
// busy_cpus=N fixes it for the tests).
double others_busy_cpus();

}  // namespace cmt
