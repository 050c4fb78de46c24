// GlooStore: gloo::rendezvous::Store over weft::comm::Store (bytes are bytes on both sides).
#include "comm/gloo/gloo_store.h"

#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/error.h"

namespace weft::comm {

namespace {

// Bytes of one serialised gloo::transport::tcp::Address (a sockaddr_storage and a sequence
// number), asked of Gloo rather than assumed.
size_t address_bytes() {
  static const size_t n = gloo::transport::tcp::Address(sockaddr_storage{}, 0).bytes().size();
  return n;
}

// The keys Gloo's connectFullMesh publishes a rank's addresses under: the rank's number.
bool is_rank_key(const std::string& k) {
  return !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<char> canonical_gloo_addresses(const std::string& k, const std::vector<char>& data) {
  const size_t n = address_bytes();
  if (!is_rank_key(k) || data.empty() || data.size() % n != 0) return data;
  std::vector<char> out;
  out.reserve(data.size());
  for (size_t at = 0; at < data.size(); at += n) {
    std::vector<char> chunk(data.begin() + ptrdiff_t(at), data.begin() + ptrdiff_t(at + n));
    gloo::transport::tcp::Address a(chunk);
    const sockaddr_storage& ss = a.getSockaddr();
    size_t used = ss.ss_family == AF_INET    ? sizeof(sockaddr_in)
                  : ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                             : 0;
    if (used) {
      sockaddr_storage clean{};
      std::memcpy(&clean, &ss, used);
      if (ss.ss_family == AF_INET)  // sin_zero is padding too
        std::memset(reinterpret_cast<sockaddr_in&>(clean).sin_zero, 0, sizeof(sockaddr_in::sin_zero));
      chunk = gloo::transport::tcp::Address(clean, a.getSeq()).bytes();
    }
    out.insert(out.end(), chunk.begin(), chunk.end());
  }
  return out;
}

void GlooStore::set(const std::string& k, const std::vector<char>& data) {
  std::vector<char> v = canonical_gloo_addresses(k, data);
  store_.set(key(k), Bytes(v.begin(), v.end()));
}

std::vector<char> GlooStore::get(const std::string& k) {
  Bytes b = store_.get(key(k));
  // Gloo splits a rank's value into (world - 1) addresses by its size alone: a value of
  // another world's size would give addresses of the wrong length (Gloo's enforce names the
  // lengths, not the cause).
  const size_t n = address_bytes();
  if (mesh_size_ > 1 && is_rank_key(k) && !b.empty() && b.size() % n == 0 &&
      b.size() / n != size_t(mesh_size_ - 1))
    throw CommError(str("gloo rendezvous under ", prefix_, ": rank ", k,
                        " published its addresses for a world of ", b.size() / n + 1,
                        " ranks, this rank's world has ", mesh_size_,
                        ": the ranks of one world disagree on its size"));
  return std::vector<char>(b.begin(), b.end());
}

void GlooStore::wait(const std::vector<std::string>& ks) {
  wait(ks, store_.timeout());
}

void GlooStore::wait(const std::vector<std::string>& ks, const std::chrono::milliseconds& timeout) {
  if (mesh_size_ > 0 && !mesh_decided_) wait_for_mesh(timeout);
  store_.wait(keys(ks), timeout);
}

void GlooStore::wait_for_mesh(std::chrono::milliseconds timeout) {
  static const Bytes kFormed{'f', 'o', 'r', 'm', 'e', 'd'};
  static const Bytes kAbandoned{'a', 'b', 'a', 'n', 'd', 'o', 'n', 'e', 'd'};
  std::vector<std::string> every;
  for (int r = 0; r < mesh_size_; ++r) every.push_back(key(std::to_string(r)));
  const std::string fate = key("fate");
  try {
    store_.wait(every, timeout);
  } catch (const CommError&) {
    // Giving up: nobody may connect to this rank from now on, unless the mesh formed first
    // (then every address is there and this rank's connects complete: it goes on).
    if (store_.compare_set(fate, {}, kAbandoned) != kFormed) throw;
  }
  if (store_.compare_set(fate, {}, kFormed) == kAbandoned)
    throw CommError(str("gloo rendezvous under ", prefix_,
                        ": the world was abandoned by a rank that gave up before every rank "
                        "had arrived"));
  mesh_decided_ = true;
}

std::vector<std::string> GlooStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

}  // namespace weft::comm
