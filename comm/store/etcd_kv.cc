// etcd's v3 KV JSON: base64 through OpenSSL (already linked for the store's handshake), the
// rest is field names from etcd's rpc.proto as the gateway spells them.
#include "comm/store/etcd_kv.h"

#include <openssl/evp.h>

#include <charconv>

#include "base/error.h"

namespace weft::comm::etcd {

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock adds a NUL
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(n);
  return out;
}

std::string base64(const Bytes& bytes) {
  return base64(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Bytes unbase64(const std::string& text) {
  if (text.size() % 4 != 0) throw CommError("etcd: a reply holds malformed base64");
  Bytes out(3 * (text.size() / 4));
  int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) throw CommError("etcd: a reply holds malformed base64");
  // EVP_DecodeBlock decodes the padding too, as zero bytes: drop one per '='.
  size_t pad = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '=' && pad < 2; --i) ++pad;
  out.resize(size_t(n) - pad);
  return out;
}

int64_t integer(const json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw CommError(std::string("etcd: a reply's \"") + field + "\" is not an integer");
}

std::optional<Kv> first_kv(const json& range_response) {
  auto kvs = range_response.find("kvs");
  if (kvs == range_response.end() || !kvs->is_array() || kvs->empty()) return std::nullopt;
  const json& kv = kvs->front();
  Kv out;
  auto value = kv.find("value");  // left out for an empty value
  if (value != kv.end()) {
    if (!value->is_string()) throw CommError("etcd: a reply's value is not a string");
    out.value = unbase64(value->get<std::string>());
  }
  out.mod_revision = integer(kv, "mod_revision");
  out.lease = integer(kv, "lease");
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();  // "a\xff" ends where "b" begins
  }
  return std::string(1, '\0');  // every key
}

json range_op(const std::string& key, bool count_only) {
  json r = {{"key", base64(key)}};
  if (count_only) r["count_only"] = true;
  return {{"request_range", r}};
}

json put_request(const std::string& key, const Bytes& value, int64_t lease, bool ignore_lease) {
  json p = {{"key", base64(key)}, {"value", base64(value)}, {"prev_kv", true}};
  if (lease) p["lease"] = std::to_string(lease);
  if (ignore_lease) p["ignore_lease"] = true;
  return p;
}

json put_op(const std::string& key, const Bytes& value, int64_t lease, bool ignore_lease) {
  return {{"request_put", put_request(key, value, lease, ignore_lease)}};
}

json absent(const std::string& key) {
  return {
      {"key", base64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}

json mod_revision_is(const std::string& key, int64_t revision) {
  return {{"key", base64(key)},
          {"target", "MOD"},
          {"result", "EQUAL"},
          {"mod_revision", std::to_string(revision)}};
}

json value_is(const std::string& key, const Bytes& value) {
  return {{"key", base64(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", base64(value)}};
}

const json& range_response(const json& txn_reply, size_t i) {
  auto rs = txn_reply.find("responses");
  if (rs == txn_reply.end() || !rs->is_array() || rs->size() <= i ||
      !(*rs)[i].contains("response_range"))
    throw CommError("etcd: a txn reply lacks its range response " + std::to_string(i));
  return (*rs)[i]["response_range"];
}

bool succeeded(const json& txn_reply) {
  auto it = txn_reply.find("succeeded");
  return it != txn_reply.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace weft::comm::etcd
