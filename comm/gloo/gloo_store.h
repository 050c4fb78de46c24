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
//
// With `mesh_size` > 0 (a full mesh of that many ranks connects through this adapter), the
// mesh forms all or nothing. Gloo connects each pair as soon as that peer's address is in the
// store, and a pair's connect cannot be cancelled: a rank that published its address and then
// gave up (its epoch was replaced before a peer arrived; the store's wait is cancellable)
// left a late peer connecting to it until the whole timeout (60 s) ran out, and that
// peer missed the next epoch's world meanwhile. So the first wait here is for every rank's
// address, and the mesh's fate is decided once, by compare-and-set on "<prefix>/fate":
// `formed` by the first rank that sees every address, `abandoned` by the first that gives
// up. A rank that gives up after `formed` connects anyway (every address is there, so its
// connects complete); a rank that finds `abandoned` gives up too, without connecting.
// A rank's addresses for a world of another size than `mesh_size` (ranks that disagree on
// their world) are a CommError that says so.
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  GlooStore(comm::Store& store, std::string prefix, int mesh_size = 0)
      : store_(store), prefix_(std::move(prefix)), mesh_size_(mesh_size) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;
  // Waits for every rank's address and decides the mesh's fate (the class comment).
  void wait_for_mesh(std::chrono::milliseconds timeout);

  comm::Store& store_;
  std::string prefix_;
  int mesh_size_ = 0;
  bool mesh_decided_ = false;  // this rank found the mesh `formed`
};

}  // namespace weft::comm
