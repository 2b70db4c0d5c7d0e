#include "settings.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cmt {
namespace {

struct Field {
  const char* name;
  int64_t lo, hi, dflt;
  const char* choices;  // "" or "a|b|..."
  const char* what;
  int64_t Settings::*member;
};

const Field kFields[] = {
#define X_ITEM(name, lo, hi, dflt, choices, what) {#name, lo, hi, dflt, choices, what, &Settings::name},
    SETTINGS_TABLE(X_ITEM)
#undef X_ITEM
};

// The index of `word` (n bytes) among `choices`, or -1.
int64_t choice_index(const char* choices, const char* word, size_t n) {
  int64_t i = 0;
  for (const char* p = choices; *p; ++i) {
    const char* bar = strchr(p, '|');
    size_t len = bar ? size_t(bar - p) : strlen(p);
    if (len == n && !strncmp(p, word, n)) return i;
    if (!bar) break;
    p = bar + 1;
  }
  return -1;
}

std::string choice_name(const char* choices, int64_t index) {
  const char* p = choices;
  for (int64_t i = 0; i < index && p; ++i) {
    p = strchr(p, '|');
    if (p) ++p;
  }
  if (!p) return std::to_string(index);
  const char* bar = strchr(p, '|');
  return bar ? std::string(p, bar - p) : std::string(p);
}

bool fail(std::string* error, const std::string& what) {
  if (error) *error = what;
  return false;
}

}  // namespace

bool check_settings(const Settings& s, std::string* error) {
  for (const Field& f : kFields) {
    int64_t v = s.*f.member;
    if (v < f.lo || v > f.hi) {
      return fail(error, std::string(f.name) + " must be " + std::to_string(f.lo) + ".." + std::to_string(f.hi) +
                             ", not " + std::to_string(v));
    }
  }
  return true;
}

bool parse_settings(const char* text, Settings* out, const char** end, std::string* error) {
  Settings s;
  bool given[sizeof kFields / sizeof kFields[0]] = {};
  const char* p = text;
  while (*p && *p != ';' && *p != '|') {  // '|': what the plan's rule adds after them (plan.hpp)
    const char* colon = strchr(p, ':');
    if (!colon) return fail(error, std::string("expected name:value at '") + p + "'");
    size_t i = 0;
    while (i < sizeof kFields / sizeof kFields[0] &&
           (strlen(kFields[i].name) != size_t(colon - p) || strncmp(kFields[i].name, p, colon - p))) {
      ++i;
    }
    if (i == sizeof kFields / sizeof kFields[0]) return fail(error, "unknown setting '" + std::string(p, colon) + "'");
    const Field& f = kFields[i];
    if (given[i]) return fail(error, std::string(f.name) + " given twice");
    const char* v = colon + 1;
    size_t n = strcspn(v, ",;|");
    int64_t value;
    if (*f.choices) {
      value = choice_index(f.choices, v, n);
      if (value < 0) return fail(error, std::string(f.name) + " must be one of " + f.choices);
    } else {
      char* stop = nullptr;
      errno = 0;
      long long parsed = strtoll(v, &stop, 10);
      if (stop != v + n || n == 0 || errno) return fail(error, std::string(f.name) + ": not a number");
      value = parsed;
    }
    s.*f.member = value;
    given[i] = true;
    p = v + n;
    if (*p == ',') ++p;
  }
  for (size_t i = 0; i < sizeof kFields / sizeof kFields[0]; ++i) {
    if (given[i]) continue;
    if (kFields[i].dflt == kRequired) return fail(error, std::string("missing setting ") + kFields[i].name);
    s.*kFields[i].member = kFields[i].dflt;
  }
  if (!check_settings(s, error)) return false;
  *out = s;
  if (end) *end = p;
  return true;
}

std::string settings_to_string(const Settings& s) {
  std::string out;
  for (const Field& f : kFields) {
    if (!out.empty()) out += ",";
    int64_t v = s.*f.member;
    out += std::string(f.name) + ":" + (*f.choices ? choice_name(f.choices, v) : std::to_string(v));
  }
  return out;
}

std::string settings_schema_json() {
  std::string out = "[";
  for (const Field& f : kFields) {
    if (out.size() > 1) out += ",";
    out += std::string("{\"name\":\"") + f.name + "\",\"what\":\"" + f.what + "\"";
    if (f.dflt != kRequired) out += ",\"default\":" + (*f.choices ? "\"" + choice_name(f.choices, f.dflt) + "\"" : std::to_string(f.dflt));
    if (*f.choices) {
      out += ",\"choices\":[";
      for (int64_t i = f.lo; i <= f.hi; ++i) out += (i > f.lo ? ",\"" : "\"") + choice_name(f.choices, i) + "\"";
      out += "]";
    } else {
      out += ",\"min\":" + std::to_string(f.lo) + ",\"max\":" + std::to_string(f.hi);
    }
    out += "}";
  }
  return out + "]";
}

}  // namespace cmt
