// Command-line parsing for the subcommands.
#include "launch/args.h"

#include "base/error.h"

namespace weft::launch {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& options,
           const std::set<std::string>& flags, size_t max_positional) {
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (a == "--") {
      positional_.insert(positional_.end(), argv.begin() + i + 1, argv.end());
      break;
    }
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (size_t eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (flags.count(name)) {
      flags_.insert(name);
      continue;
    }
    if (!options.count(name)) {
      std::string known;
      for (const auto& o : options) known += " " + o;
      for (const auto& f : flags) known += " " + f;
      throw ConfigError(name, "unknown option; expected one of:" + known);
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) throw ConfigError(name, "needs a value");
      value = argv[++i];
    }
    values_[name].push_back(value);
  }
  if (positional_.size() > max_positional && !flags_.count("--help")) {
    const std::string& extra = positional_[max_positional];
    std::string msg = "unexpected argument: ";
    msg += max_positional == 0
               ? "this command takes only --options"
               : "this command takes at most " + std::to_string(max_positional) + " arguments";
    if (options.count("--config") && (extra.ends_with(".yaml") || extra.ends_with(".yml")))
      msg += "; did you mean --config " + extra + "?";
    throw ConfigError(extra, msg + " (see --help)");
  }
}

std::string Args::get(const std::string& opt) const {
  auto it = values_.find(opt);
  if (it == values_.end()) throw ConfigError(opt, "missing");
  return it->second.back();
}

std::string Args::get_or(const std::string& opt, const std::string& fallback) const {
  return has(opt) ? get(opt) : fallback;
}

std::string Args::required(const std::string& opt) const {
  if (!has(opt)) throw ConfigError(opt, "is required (see --help)");
  return get(opt);
}

std::vector<std::string> Args::all(const std::string& opt) const {
  auto it = values_.find(opt);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::get_int(const std::string& opt, int64_t fallback) const {
  if (!has(opt)) return fallback;
  std::string v = get(opt);
  try {
    size_t used = 0;
    int64_t x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError(opt, "expected an integer, got '" + v + "'");
}

}  // namespace weft::launch
