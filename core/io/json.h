// A small JSON reader and the two writer helpers Weft's files need (safetensors headers,
// metrics lines). Kept in-tree so the core library needs no JSON dependency.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::core::io {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;             // kNumber
  std::string text;              // kString: the value; kNumber: the literal (exact integers)
  std::vector<JsonValue> items;  // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in document order

  // The member named `key` of an object, or nullptr.
  const JsonValue* find(std::string_view key) const;
  // A number written without fraction or exponent that fits int64; sets `out`.
  bool as_int64(int64_t& out) const;
};

// Parses one JSON document (trailing whitespace allowed). Throws IoError
// "<source>: not valid JSON at byte N: <what was expected>".
JsonValue parse_json(std::string_view text, const std::string& source);

// `s` as a quoted JSON string with escapes.
std::string json_quote(std::string_view s);
// Shortest text that reads back as the same double; NaN and infinities (which JSON
// cannot represent) as null.
std::string json_number(double v);

}  // namespace weft::core::io
