// Helpers shared by the Store implementations.
#include "comm/store/store_util.h"

#include "base/error.h"

namespace weft::comm {

std::string timeout_message(const std::vector<std::string>& keys, Millis timeout) {
  constexpr size_t kShown = 8;
  std::string s =
      "store: timed out after " + std::to_string(timeout.count()) + " ms waiting for key";
  s += keys.size() == 1 ? " " : "s [";
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > kShown) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  if (keys.size() != 1) s += "]";
  return s;
}

std::string gone_timeout_message(const std::vector<std::string>& keys, Millis timeout) {
  // "... waiting for key k" -> "... waiting for one of key k to go (...)"
  const std::string plain = timeout_message(keys, timeout);
  const std::string at = "waiting for ";
  const size_t cut = plain.find(at) + at.size();  // timeout_message always says it
  return plain.substr(0, cut) + "one of " + plain.substr(cut) + " to go (every one still exists)";
}

void check_multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw CommError("store: multi_set got " + std::to_string(keys.size()) + " keys and " +
                    std::to_string(values.size()) + " values");
}

}  // namespace weft::comm
