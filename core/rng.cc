// Philox4x32-10 and the draws built on it.
#include "core/rng.h"

#include <cmath>

namespace weft::core {

PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * c[0];
    uint64_t p1 = uint64_t(kM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t stable_hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis (14695981039346656037)
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

CounterRng::CounterRng(uint64_t seed, uint64_t stream)
    : key_{uint32_t(seed), uint32_t(seed >> 32) ^ uint32_t(stream)},
      stream_hi_(uint32_t(stream >> 32)) {}

uint32_t CounterRng::u32(uint64_t i) const {
  PhiloxCounter c{uint32_t(i >> 2), uint32_t(i >> 34), stream_hi_, 0x5745u /* "WE" */};
  return philox4x32(c, key_)[i & 3];
}

float CounterRng::uniform(uint64_t i) const { return float(u32(i) >> 8) * (1.0f / 16777216.0f); }

float CounterRng::normal(uint64_t i) const {
  // u1 in (0, 1] so that log never sees zero.
  double u1 = (double(u32(2 * i) >> 8) + 1.0) / 16777216.0;
  double u2 = double(u32(2 * i + 1) >> 8) / 16777216.0;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace weft::core
