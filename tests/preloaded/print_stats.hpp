// For the test programs run under LD_PRELOAD=libcmt.so: prints cmt's statistics (cmt_stats_json,
// found through the global scope) as one JSON line, "{}" where the library is not loaded.
#pragma once
#include <dlfcn.h>

#include <cstdio>

inline void print_cmt_stats() {
  using StatsFn = int (*)(char*, size_t);
  auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "cmt_stats_json"));
  static char json[1 << 16];
  if (stats) stats(json, sizeof json);
  printf("%s\n", stats ? json : "{}");
}
