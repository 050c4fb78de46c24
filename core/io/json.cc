// Recursive-descent JSON parser (RFC 8259, UTF-8 passed through; \u escapes encoded as
// UTF-8) with a depth limit so a hostile header cannot overflow the stack.
#include "core/io/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace weft::core::io {
namespace {

class Parser {
 public:
  Parser(std::string_view s, const std::string& source) : s_(s), source_(source) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("end of input after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw IoError(source_ + ": not valid JSON at byte " + std::to_string(pos_) + ": expected " +
                  expected);
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("'") + c + "'");
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  JsonValue value(int depth) {
    if (depth > 64) fail("nesting depth at most 64");
    skip_ws();
    if (pos_ >= s_.size()) fail("a value");
    JsonValue v;
    char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = JsonValue::Kind::kObject;
      if (eat('}')) return v;
      do {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("a quoted member name");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      v.kind = JsonValue::Kind::kArray;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      v.text = string();
    } else if (literal("true") || literal("false")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = c == 't';
    } else if (literal("null")) {
      v.kind = JsonValue::Kind::kNull;
    } else {
      number(v);
    }
    return v;
  }

  void number(JsonValue& v) {
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (!digits()) fail("a value");
    if (pos_ < s_.size() && s_[pos_] == '.' && (++pos_, !digits())) fail("digits after '.'");
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) fail("digits in the exponent");
    }
    v.kind = JsonValue::Kind::kNumber;
    v.text = std::string(s_.substr(start, pos_ - start));
    std::from_chars(v.text.data(), v.text.data() + v.text.size(), v.number);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("four hex digits after \\u");
    uint32_t cp = 0;
    auto [p, ec] = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, cp, 16);
    if (ec != std::errc() || p != s_.data() + pos_ + 4) fail("four hex digits after \\u");
    pos_ += 4;
    return cp;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("a closing '\"'");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("no control characters inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("an escape");
      char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {  // surrogate pair
            pos_ += 2;
            uint32_t lo = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
      }
    }
  }

  std::string_view s_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

bool JsonValue::as_int64(int64_t& out) const {
  if (kind != Kind::kNumber) return false;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && p == text.data() + text.size();
}

JsonValue parse_json(std::string_view text, const std::string& source) {
  return Parser(text, source).document();
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

}  // namespace weft::core::io
