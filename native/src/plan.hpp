// The copy plan: per direction and copy-size range, pass through or stage with T threads,
// B staging buffers and chunk size C. Python turns a tuned file into the compact string form
// (CMT_PLAN), so the native side never parses JSON.
//
//   plan  := rule (';' rule)*
//   rule  := dir ':' min_bytes '=' ( 'pass' | threads ',' buffers ',' chunk_bytes [ ',stream' ] )
//   dir   := 'h2d' | 'd2h'
// A rule applies from its min_bytes up to the next rule's min_bytes of the same direction.
// Sizes below the first rule pass through.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace cmt {

enum class Direction : int { HtoD = 0, DtoH = 1 };
constexpr int kDirections = 2;
inline const char* direction_name(Direction d) { return d == Direction::HtoD ? "h2d" : "d2h"; }

struct Settings {
  int threads = 0;    // worker lanes (the calling thread is one of them)
  int buffers = 0;    // pinned staging buffers in the ring (blocks in flight)
  size_t chunk = 0;   // bytes per staging buffer and per DMA
  bool stream_stores = false;  // fill/drain buffers with non-temporal stores (fast_copy.hpp)
};

struct Rule {
  size_t min_bytes = 0;
  bool pass = true;
  Settings settings;
};

constexpr int kMaxThreads = 64;
constexpr int kMaxBuffers = 64;
constexpr size_t kMinChunk = 4096;
constexpr size_t kMaxChunk = size_t(256) << 20;

class Plan {
 public:
  // Parses the string form; on error returns false and says why in *error.
  bool parse(const char* text, std::string* error);
  // The built-in plan for this machine (used when no tuned file is given).
  static Plan defaults();
  // The rule for a copy of n bytes (a pass rule when none applies).
  const Rule& lookup(Direction d, size_t n) const;
  std::string to_string() const;
  size_t max_chunk() const;

 private:
  std::vector<Rule> rules_[kDirections];  // sorted by min_bytes
};

// The plan in force: CMT_PLAN if set and valid, else the defaults. Replaced by cmt_configure().
const Plan& active_plan();
bool set_active_plan(const char* text, std::string* error);

}  // namespace cmt
