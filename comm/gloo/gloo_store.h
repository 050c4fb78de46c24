// Gloo's rendezvous goes through Weft's store: this adapter implements gloo's Store on a
// weft::comm::Store under a key prefix, so each membership epoch builds its Gloo context
// from its own namespace ("epoch/7/gloo/...").
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace weft::comm {

// Gloo's tcp addresses come from getsockname into an uninitialised sockaddr_storage and are
// published whole, so most of each value would be stale stack bytes. Values that Gloo's
// connectFullMesh publishes (key = a rank number, a whole number of serialised addresses)
// are rebuilt with every byte outside the address proper zeroed; anything else is returned
// unchanged. Deterministic for the same addresses.
std::vector<char> canonical_gloo_addresses(const std::string& key, const std::vector<char>& data);

// Not owning; `store` must outlive the adapter. Errors of the store (TimeoutError, CommError)
// propagate unchanged through Gloo's rendezvous.
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  GlooStore(comm::Store& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  comm::Store& store_;
  std::string prefix_;
};

}  // namespace weft::comm
