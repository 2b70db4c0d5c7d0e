// The CMT_* environment switches, each read once by its user (static local): one way to read them.
#pragma once
#include <cstdlib>
#include <cstring>

namespace cmt::env {

// Set, non-empty and not "0".
inline bool flag(const char* name) {
  const char* v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

// Set to exactly `value`.
inline bool is(const char* name, const char* value) {
  const char* v = getenv(name);
  return v && !strcmp(v, value);
}

inline long number(const char* name, long fallback) {
  const char* v = getenv(name);
  return v && *v ? atol(v) : fallback;
}

}  // namespace cmt::env
