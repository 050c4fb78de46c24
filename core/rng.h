// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). Every draw is a
// pure function of (key, counter), so a value depends only on logical coordinates
// (seed, parameter name, element index; seed, epoch) and never on rank or layout.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace weft::core {

using PhiloxKey = std::array<uint32_t, 2>;
using PhiloxCounter = std::array<uint32_t, 4>;

// Ten rounds of Philox4x32: four independent 32-bit uniform words per counter.
PhiloxCounter philox4x32(PhiloxCounter counter, PhiloxKey key);

// Stable 64-bit hash of a name (FNV-1a), used to key streams by parameter name.
uint64_t stable_hash(std::string_view s);

// A stream of draws keyed by (seed, stream id). Element i of the stream is a function
// of i alone, so any shard of a tensor can be generated without the others.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream);
  // Uniform 32-bit word number `i` of the stream.
  uint32_t u32(uint64_t i) const;
  // Uniform in [0, 1) with 24 bits of resolution.
  float uniform(uint64_t i) const;
  // Standard normal number `i` (Box-Muller on the pair of words at 2i, 2i+1).
  float normal(uint64_t i) const;

 private:
  PhiloxKey key_;
  uint32_t stream_hi_;
};

}  // namespace weft::core
