// Store's defaults: set() with options (a plain set, or a refusal to bind) and a refused
// wait_gone() (store.h).
#include "comm/store/store.h"

#include "base/error.h"

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

}  // namespace weft::comm
