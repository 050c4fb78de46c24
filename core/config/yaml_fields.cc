// Typed YAML reads, key checks with "did you mean" and --set overrides for the job spec.
// Scalars are converted here rather than by yaml-cpp's as<T>() so that every failure can
// name the key path and quote the text the user wrote.
#include "core/config/yaml_fields.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "base/check.h"
#include "base/error.h"
#include "base/suggest.h"

namespace weft::core {
namespace {

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing (an empty value)";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  return "a mapping";
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Strict full-string parses: "12abc" is not 12.
bool parse_f64(std::string_view s, double& out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && std::isfinite(out);
}

bool parse_i64(std::string_view s, int64_t& out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec == std::errc() && p == s.data() + s.size()) return true;
  // Accept integral values written as floats (steps: 1e3), as YAML users expect.
  double d;
  if (!parse_f64(s, d) || d != std::floor(d) || std::fabs(d) > 9007199254740992.0) return false;
  out = int64_t(d);
  return true;
}

int64_t node_to_int(const YAML::Node& n, const std::string& field) {
  int64_t v;
  if (!n.IsScalar() || !parse_i64(n.Scalar(), v))
    throw ConfigError(field, "expected an integer, got " + describe(n));
  return v;
}

double node_to_double(const YAML::Node& n, const std::string& field) {
  double v;
  if (!n.IsScalar() || !parse_f64(n.Scalar(), v))
    throw ConfigError(field, "expected a number, got " + describe(n));
  return v;
}

}  // namespace

std::string join_key(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

void throw_unknown_key(const std::string& section, const std::string& key,
                       const std::vector<std::string>& allowed) {
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  std::string msg = "unknown key '" + key + "' in " +
                    (section.empty() ? std::string("the top level") : "'" + section + "'") +
                    "; allowed keys: " + list;
  if (std::optional<std::string> best = closest_match(lower(key), allowed))
    msg += "; did you mean '" + join_key(section, *best) + "'?";
  throw ConfigError(join_key(section, key), msg);
}

void check_key_path(const YamlSchema& schema, const std::string& key_path) {
  std::string section;
  size_t start = 0;
  while (true) {
    size_t dot = key_path.find('.', start);
    std::string part = key_path.substr(start, dot == std::string::npos ? dot : dot - start);
    const std::vector<std::string>& allowed = schema.at(section);
    if (std::find(allowed.begin(), allowed.end(), part) == allowed.end())
      throw_unknown_key(section, part, allowed);
    std::string here = join_key(section, part);
    if (dot == std::string::npos) return;
    if (!schema.count(here))
      throw ConfigError(key_path, "'" + here + "' is a value, not a section; set it with --set " +
                                      here + "=VALUE");
    section = here;
    start = dot + 1;
  }
}

std::set<std::string> apply_overrides(YAML::Node& root, const YamlSchema& schema,
                                      const std::vector<std::string>& overrides) {
  std::set<std::string> done;
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    std::string key = eq == std::string::npos ? "" : o.substr(0, eq);
    bool bad_key = key.empty() || key.front() == '.' || key.back() == '.' ||
                   key.find("..") != std::string::npos || key.find(' ') != std::string::npos;
    if (eq == std::string::npos || bad_key)
      throw ConfigError("--set",
                        "expected KEY=VALUE with a dotted key, e.g. --set train.steps=20; "
                        "got '" +
                            o + "'");
    check_key_path(schema, key);
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw ConfigError(key, "--set value '" + o.substr(eq + 1) +
                                 "' is not a YAML scalar or flow list ([a, b]): " + e.msg);
    }
    if (!root.IsDefined() || root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    if (!root.IsMap())
      throw ConfigError("(top level)", "expected a mapping of sections, got " + describe(root));
    YAML::Node cur = root;
    std::string path;
    size_t start = 0;
    for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
      std::string part = key.substr(start, dot - start);
      path = join_key(path, part);
      YAML::Node child = cur[part];
      if (!child.IsDefined() || child.IsNull()) {
        cur[part] = YAML::Node(YAML::NodeType::Map);
      } else if (!child.IsMap()) {
        throw ConfigError(path, "expected a mapping of keys, got " + describe(child));
      }
      cur.reset(cur[part]);  // rebind (operator= would overwrite the node)
    }
    cur[key.substr(start)] = value;
    done.insert(key);
  }
  return done;
}

void check_unique_keys(const YAML::Node& node, const std::string& source, const std::string& path) {
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) check_unique_keys(item, source, path);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;  // key -> 1-based line of its first occurrence
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    const int line = kv.first.Mark().line + 1;
    const std::string here = join_key(path, key);
    if (!key.empty()) {
      auto [it, fresh] = first_line.emplace(key, line);
      if (!fresh)
        throw ConfigError(
            here, "'" + key + "' is written twice" +
                      (path.empty() ? std::string(" at the top level") : " in '" + path + "'") +
                      ", at lines " + std::to_string(it->second) + " and " + std::to_string(line) +
                      " of " + (source.empty() ? std::string("the YAML") : source) +
                      " (YAML would keep only the first); merge them into one");
    }
    check_unique_keys(kv.second, source, here);
  }
}

// An absent key's node is "invalid" in yaml-cpp (any use but IsDefined() throws), and a
// present `key:` with no value is null: both read as an empty section.
static YAML::Node section_node(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Map);
  return node;
}

YamlSection::YamlSection(const YAML::Node& node, std::string path, const YamlSchema& schema)
    : node_(section_node(node)), path_(std::move(path)), schema_(&schema) {
  if (!node_.IsMap())
    throw ConfigError(
        path_.empty() ? "(top level)" : path_,
        "expected a mapping of keys (key: value lines or {key: value}), got " + describe(node_));
  const std::vector<std::string>& allowed = schema.at(path_);
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar())
      throw ConfigError(path_.empty() ? "(top level)" : path_, "keys must be plain names");
    const std::string& k = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      throw_unknown_key(path_, k, allowed);
  }
}

bool YamlSection::has(const std::string& key) const {
  const YAML::Node& n = node_;  // const: operator[] must not insert
  return n[key].IsDefined();
}

void YamlSection::read(const std::string& key, int64_t& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  out = node_to_int(n[key], key_path(key));
}

void YamlSection::read(const std::string& key, uint64_t& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  // Seeds use the full 64-bit range, beyond int64.
  const std::string s = n[key].IsScalar() ? n[key].Scalar() : "";
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    throw ConfigError(key_path(key), "expected a non-negative integer, got " + describe(n[key]));
}

void YamlSection::read(const std::string& key, double& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  out = node_to_double(n[key], key_path(key));
}

void YamlSection::read(const std::string& key, bool& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  std::string s = n[key].IsScalar() ? lower(n[key].Scalar()) : "";
  if (s == "true" || s == "yes" || s == "on") {
    out = true;
  } else if (s == "false" || s == "no" || s == "off") {
    out = false;
  } else {
    throw ConfigError(key_path(key), "expected true or false, got " + describe(n[key]));
  }
}

void YamlSection::read(const std::string& key, std::string& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  if (n[key].IsNull()) {
    out.clear();
  } else if (n[key].IsScalar()) {
    out = n[key].Scalar();
  } else {
    throw ConfigError(key_path(key), "expected a string, got " + describe(n[key]));
  }
}

bool YamlSection::is_auto(const std::string& key) const {
  const YAML::Node& n = node_;
  return has(key) && n[key].IsScalar() && lower(n[key].Scalar()) == "auto";
}

void YamlSection::read_degree(const std::string& key, int64_t& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  if (n[key].IsScalar() && lower(n[key].Scalar()) == "auto") {
    out = 0;
    return;
  }
  int64_t v;
  if (!n[key].IsScalar() || !parse_i64(n[key].Scalar(), v) || v < 1)
    throw ConfigError(key_path(key),
                      "expected a positive integer or auto, got " + describe(n[key]));
  out = v;
}

void YamlSection::read(const std::string& key, std::array<double, 2>& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  const YAML::Node v = n[key];
  if (!v.IsSequence() || v.size() != 2)
    throw ConfigError(key_path(key), "expected a list of two numbers like [0.9, 0.95], got " +
                                         describe(v) +
                                         (v.IsSequence() ? " of " + std::to_string(v.size()) : ""));
  for (size_t i = 0; i < 2; ++i) out[i] = node_to_double(v[i], key_path(key));
}

void YamlSection::read(const std::string& key, std::vector<std::vector<int64_t>>& out) const {
  if (!has(key)) return;
  const YAML::Node& n = node_;
  const YAML::Node v = n[key];
  if (v.IsNull()) {
    out.clear();
    return;
  }
  const std::string hint = "expected a list of lists of integers like [[0, 1], [2, 3]], got ";
  if (!v.IsSequence()) throw ConfigError(key_path(key), hint + describe(v));
  std::vector<std::vector<int64_t>> result;
  for (const YAML::Node& row : v) {
    if (!row.IsSequence()) throw ConfigError(key_path(key), hint + "an element " + describe(row));
    result.emplace_back();
    for (const YAML::Node& x : row) result.back().push_back(node_to_int(x, key_path(key)));
  }
  out = std::move(result);
}

YamlSection YamlSection::section(const std::string& key) const {
  WEFT_CHECK(schema_->count(key_path(key)), "no schema for section ", key_path(key));
  const YAML::Node& n = node_;
  return YamlSection(n[key], key_path(key), *schema_);
}

}  // namespace weft::core
