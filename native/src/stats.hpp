// What happened to each host<->device copy cmt saw: accelerated, or passed through and why.
#pragma once
#include <cstddef>
#include <string>

#include "types.hpp"

namespace cmt {

const char* outcome_name(Outcome o);
const char* outcome_text(Outcome o);

// Counts a copy; logs the outcome once per direction at debug level.
void record(Direction d, Outcome o, size_t bytes);

// {"h2d": {"accelerated": [copies, bytes], ...}, "d2h": {...},
//  "reads": {"split": [calls, bytes], "alone": [calls, bytes]}  (large_read.hpp),
//  "events": {"backed_off": n, "staged_again": n, "taken_over": n}}  (rate_guard.hpp, job.hpp)
std::string stats_json();

// Counts a piece of a copy that one lane took over from another that had stalled in it (job.hpp).
void count_taken_over();

// Prints the counters to stderr at exit when CMT_STATS=1 (registered on first use).
void enable_exit_report();

}  // namespace cmt
