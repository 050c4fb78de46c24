// The parts of etcd's v3 KV API that EtcdStore uses, in the JSON form of etcd's gRPC
// gateway: keys and values in base64, 64-bit integers as decimal strings, fields left out
// when they hold their default (no "kvs" for no match, no "count" for 0, no "succeeded" for
// a failed txn compare).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "comm/store/store.h"

namespace weft::comm::etcd {

using json = nlohmann::json;

std::string base64(std::string_view bytes);
std::string base64(const Bytes& bytes);
// Throws CommError when `text` is not base64.
Bytes unbase64(const std::string& text);

// An int64 field: a decimal string (as the gateway writes them), a number, or absent (0).
// Throws CommError on anything else.
int64_t integer(const json& object, const char* field);

// One key as a range reply carries it.
struct Kv {
  Bytes value;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: no lease (a permanent key)
};
// The first of `range_response`'s "kvs", nullopt when there is none.
std::optional<Kv> first_kv(const json& range_response);

// The end of the key range holding every key that starts with `prefix` (etcd's
// range_end): the prefix with its last byte incremented, "\0" (to the end) for "".
std::string prefix_end(const std::string& prefix);

// Request ops for a txn's "success" / "failure" lists.
json range_op(const std::string& key, bool count_only);
// A PutRequest (asking for prev_kv, whose lease set() revokes). `lease` 0: none.
// `ignore_lease`: keep the key's current lease (etcd refuses it for an absent key).
json put_request(const std::string& key, const Bytes& value, int64_t lease, bool ignore_lease);
json put_op(const std::string& key, const Bytes& value, int64_t lease, bool ignore_lease);

// Txn compares.
json absent(const std::string& key);                             // create_revision == 0
json mod_revision_is(const std::string& key, int64_t revision);  // unchanged since read
json value_is(const std::string& key, const Bytes& value);       // fails on an absent key

// The range response inside a txn reply's responses[i].
const json& range_response(const json& txn_reply, size_t i);
// Whether a txn's compares held ("succeeded" is left out when false).
bool succeeded(const json& txn_reply);

}  // namespace weft::comm::etcd
