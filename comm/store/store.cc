// Store's defaults: set() with options (a plain set, or a refusal to bind), a refused
// wait_gone() and the waits another thread can stop, in slices (store.h).
#include "comm/store/store.h"

#include "base/error.h"
#include "comm/store/store_util.h"

namespace weft::comm {

void Store::set(const std::string& key, const Bytes& value, const SetOptions& options) {
  if (options.bind)
    throw NotSupported("store: cannot bind '" + key +
                       "' to the connection: this store has no connection of its own to bind "
                       "keys to (binds_to_connection() is false); use a ttl instead");
  set(key, value, options.ttl);
}

std::vector<std::string> Store::wait_gone(const std::vector<std::string>& keys, Millis) {
  throw NotSupported("store: cannot wait for " + std::to_string(keys.size()) +
                     " key(s) to go: this store has no such wait (waits_for_absence() is "
                     "false); poll check() instead");
}

bool Store::wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                           std::stop_token stop) {
  if (stop.stop_requested()) return false;
  return wait_in_slices(
             timeout, kStopSlice, [&] { return stop.stop_requested(); },
             [&](Millis t) {
               wait(keys, t);
               return true;
             })
      .has_value();
}

std::optional<std::vector<std::string>> Store::wait_gone_stoppable(
    const std::vector<std::string>& keys, Millis timeout, std::stop_token stop) {
  if (stop.stop_requested()) return std::nullopt;
  return wait_in_slices(
      timeout, kStopSlice, [&] { return stop.stop_requested(); },
      [&](Millis t) { return wait_gone(keys, t); });
}

}  // namespace weft::comm
