// Typed reads of a YAML job tree: every error is a ConfigError whose field() is the full
// key path ("train.lr") and whose message says what was expected and what was found.
// Also the key schema (which keys each section allows) and the --set overrides.
#pragma once

#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace weft::core {

// Section path ("" for the top level, "model.moe") -> the keys it allows, in file order.
// A key that is itself a section ("model" -> "moe") has its own entry.
using YamlSchema = std::map<std::string, std::vector<std::string>>;

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string join_key(const std::string& parent, const std::string& key);

// Throws the ConfigError for `key` under `section`: lists the allowed keys and suggests
// the closest one when it is near enough to be a typo.
[[noreturn]] void throw_unknown_key(const std::string& section, const std::string& key,
                                    const std::vector<std::string>& allowed);

// Checks that the dotted `key_path` names a key the schema allows (a --set target).
void check_key_path(const YamlSchema& schema, const std::string& key_path);

// Applies "a.b=value" overrides onto `root` (value parsed as a YAML scalar or flow
// sequence). Unknown keys fail like unknown keys in the file; a string without '='
// fails with field "--set". Returns the key paths that were overridden.
std::set<std::string> apply_overrides(YAML::Node& root, const YamlSchema& schema,
                                      const std::vector<std::string>& overrides);

// Refuses a key written twice in one mapping of `node` (yaml-cpp keeps the first and drops
// the second silently): ConfigError on the key's path, naming both lines of `source`.
// --set overrides replace values and are not duplicates.
void check_unique_keys(const YAML::Node& node, const std::string& source,
                       const std::string& path = "");

// One mapping of the tree. Construction rejects keys the schema does not allow for this
// section; read() leaves `out` untouched when the key is absent, so defaults come from
// the JobSpec structs.
class YamlSection {
 public:
  YamlSection(const YAML::Node& node, std::string path, const YamlSchema& schema);

  bool has(const std::string& key) const;
  const std::string& path() const { return path_; }
  std::string key_path(const std::string& key) const { return join_key(path_, key); }

  void read(const std::string& key, int64_t& out) const;
  void read(const std::string& key, uint64_t& out) const;
  void read(const std::string& key, double& out) const;
  void read(const std::string& key, bool& out) const;
  void read(const std::string& key, std::string& out) const;  // null reads as ""
  // Whether `key` holds the scalar `auto` (any case).
  bool is_auto(const std::string& key) const;
  // A parallel degree: a non-negative integer or `auto` (stored as 0).
  void read_degree(const std::string& key, int64_t& out) const;
  void read(const std::string& key, std::array<double, 2>& out) const;              // [a, b]
  void read(const std::string& key, std::vector<std::vector<int64_t>>& out) const;  // [[..], ..]

  // The sub-mapping `key` (an empty section when absent).
  YamlSection section(const std::string& key) const;

 private:
  YAML::Node node_;
  std::string path_;
  const YamlSchema* schema_;
};

}  // namespace weft::core
