// One-line environment knobs (NCCL's param.h style): WEFT_<NAME> read once.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

// Returns the value of environment variable `name`, or `fallback` when unset or empty.
std::string env_string(const char* name, const std::string& fallback);
// Parses an integer knob; a malformed value throws ConfigError naming the variable.
int64_t env_int(const char* name, int64_t fallback);

}  // namespace weft
