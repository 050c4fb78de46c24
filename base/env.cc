// Environment knobs.
#include "base/env.h"

#include <cstdlib>

#include "base/error.h"

namespace weft {

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0') throw ConfigError(name, std::string("expected an integer, got '") + v + "'");
  return x;
}

}  // namespace weft
