// Diagnostics: CMT_LOG=debug explains each decision once; warnings always go to stderr.
#pragma once
#include <cstdarg>

namespace cmt::log {

enum class Level { Quiet = 0, Warn = 1, Info = 2, Debug = 3 };

Level level();
void write(Level lvl, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Logs fmt at debug level the first time `key` (a small integer id < 4096) is seen.
void debug_once(unsigned key, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace cmt::log
