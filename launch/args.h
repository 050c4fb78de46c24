// A small command-line parser for the subcommands: `--name value` and `--name=value`
// options (repeatable), boolean flags, and positional arguments. Unknown options, missing
// values and positional arguments beyond what the command takes are ConfigErrors naming
// the option or argument.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace weft::launch {

class Args {
 public:
  // `options` take a value; `flags` do not. More than `max_positional` positional arguments
  // (those after `--` included) are refused, naming the first extra one, unless --help is
  // among the flags given: a stray word is a mistake, never silently ignored.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& options,
       const std::set<std::string>& flags = {}, size_t max_positional = 0);

  bool has(const std::string& opt) const { return values_.count(opt) > 0; }
  bool flag(const std::string& f) const { return flags_.count(f) > 0; }
  // The last value of an option; ConfigError when absent.
  std::string get(const std::string& opt) const;
  std::string get_or(const std::string& opt, const std::string& fallback) const;
  std::string required(const std::string& opt) const;
  std::vector<std::string> all(const std::string& opt) const;
  int64_t get_int(const std::string& opt, int64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

}  // namespace weft::launch
