// Small helpers shared by the Store implementations: error messages that name the keys,
// and argument checks every implementation makes the same way.
#pragma once

#include <string>
#include <vector>

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

}  // namespace weft::comm
