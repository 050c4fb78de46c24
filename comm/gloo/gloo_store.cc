// GlooStore: gloo::rendezvous::Store over weft::comm::Store (bytes are bytes on both sides).
#include "comm/gloo/gloo_store.h"

namespace weft::comm {

void GlooStore::set(const std::string& k, const std::vector<char>& data) {
  store_.set(key(k), Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& k) {
  Bytes b = store_.get(key(k));
  return std::vector<char>(b.begin(), b.end());
}

void GlooStore::wait(const std::vector<std::string>& ks) {
  store_.wait(keys(ks), store_.timeout());
}

void GlooStore::wait(const std::vector<std::string>& ks, const std::chrono::milliseconds& timeout) {
  store_.wait(keys(ks), timeout);
}

std::vector<std::string> GlooStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

}  // namespace weft::comm
