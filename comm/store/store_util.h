// Small helpers shared by the Store implementations: error messages that name the keys,
// argument checks every implementation makes the same way, and waits in slices.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/store.h"

namespace weft::comm {

// The longest timeout or TTL honoured (a year): larger values, from a caller or a corrupt
// frame, would overflow steady_clock arithmetic, so they are clamped to this.
inline constexpr Millis kMaxTimeout{int64_t(365) * 24 * 3600 * 1000};
// Clamps to [0, kMaxTimeout].
inline Millis clamp_timeout(Millis t) {
  return t < Millis(0) ? Millis(0) : (t > kMaxTimeout ? kMaxTimeout : t);
}

// "store: timed out after 500 ms waiting for keys [a, b]" (long lists are shortened).
std::string timeout_message(const std::vector<std::string>& keys, Millis timeout);
// wait_gone()'s: every key still existed after `timeout`.
std::string gone_timeout_message(const std::vector<std::string>& keys, Millis timeout);
// Throws CommError when keys and values differ in length.
void check_multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

// For a wait that cannot be ended from another thread: calls wait_slice(t), t at most `slice`,
// until it returns (its result), `timeout` has passed (the last slice's TimeoutError goes up)
// or, after a slice that timed out, stopped() is true (nullopt). wait_slice must return a
// value (a void wait: `return true`).
template <typename WaitSlice, typename Stopped>
auto wait_in_slices(Millis timeout, Millis slice, Stopped stopped, WaitSlice wait_slice)
    -> std::optional<decltype(wait_slice(slice))> {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + clamp_timeout(timeout);
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    try {
      return wait_slice(std::max(Millis(1), std::min(slice, left)));
    } catch (const TimeoutError&) {
      if (Clock::now() >= until) throw;
    }
    if (stopped()) return std::nullopt;
  }
}

}  // namespace weft::comm
