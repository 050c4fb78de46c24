// Store's default for set() with options: a plain set, or a refusal to bind (store.h).
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

}  // namespace weft::comm
