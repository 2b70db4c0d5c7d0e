// The copy plan: per direction and copy-size range, pass through or stage with the given settings.
// Python turns a tuned file into the plan's text form (CMT_PLAN), so the native side never parses
// JSON:
//   plan  := rule (';' rule)*
//   rule  := dir ':' min_bytes '=' ( 'pass' | settings [ '|driver:' gbps ] )   settings: settings.hpp
//   dir   := 'h2d' | 'd2h' | 'h2h'
// `driver:` is the driver's own (pageable) rate for the rule's copies, in GB/s, as `cmt tune`
// measured it: the rate guard (rate_guard.hpp) checks staging against it from a process's start.
// A rule applies from its min_bytes up to the next rule's min_bytes of the same direction.
// Sizes below the first rule pass through.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "types.hpp"

namespace cmt {

struct Rule {
  size_t min_bytes = 0;
  bool pass = true;
  Settings settings;
  double driver_gbps = 0;  // the driver's own rate for these copies (0: unknown)
};

class Plan {
 public:
  // Parses the text form; on error returns false and says why in *error.
  bool parse(const char* text, std::string* error);
  // The built-in plan for this machine (used when no tuned file is given).
  static Plan defaults();
  // The rule for a copy of n bytes (a pass rule when none applies).
  const Rule& lookup(Direction d, size_t n) const;
  std::string to_string() const;
  // The most of each setting any staging rule asks for: a pipeline's ring and workers are made for
  // it once, ahead of its first copy. All zero when every rule passes copies through.
  Settings largest() const;
  // The smallest copy in direction d that some rule stages (SIZE_MAX: none).
  size_t stages_from(Direction d) const;
  // Whether some rule stages copies between host and device (a pipeline is worth setting up).
  bool stages_device_copies() const {
    return stages_from(Direction::HtoD) != SIZE_MAX || stages_from(Direction::DtoH) != SIZE_MAX;
  }

 private:
  std::vector<Rule> rules_[kDirections];  // sorted by min_bytes
};

// The plan in force: CMT_PLAN if set and valid, else the defaults. Replaced by cmt_configure().
const Plan& active_plan();
bool set_active_plan(const char* text, std::string* error);

}  // namespace cmt
