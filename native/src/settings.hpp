// The text form of a staged copy's settings, as the plan (CMT_PLAN) and the C API write them:
//   settings := name ':' value (',' name ':' value)*     e.g. threads:8,buffers:4,chunk_bytes:4194304
// with the names and limits of SETTINGS_TABLE (types.hpp); a setting with named choices takes a name
// (stores:stream). A setting with a default may be left out. One parser, one printer, one schema.
#pragma once
#include <string>

#include "types.hpp"

namespace cmt {

// Parses `text` up to its end or a ';' (*end points there); false with the reason in *error.
bool parse_settings(const char* text, Settings* out, const char** end, std::string* error);
std::string settings_to_string(const Settings& s);
// Whether every setting lies within its limits; else false with the reason in *error.
bool check_settings(const Settings& s, std::string* error);
// The settings' names, limits and choices as JSON, for Python's tuned-file validation:
// [{"name": "threads", "min": 1, "max": 64, "what": "..."},
//  {"name": "stores", "choices": ["cached", "stream"], "default": "cached", "what": "..."}, ...]
std::string settings_schema_json();

}  // namespace cmt
