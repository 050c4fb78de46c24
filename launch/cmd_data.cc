// `weft data`: turn text into llm.c token files and inspect token sources.
//   weft data prepare IN OUT.bin   (IN: a text file or a folder of text files; bytes = tokens)
//   weft data info PATH            (token count, largest token, files read)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/data/token_file.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

namespace data = core::data;

constexpr const char* kHelp =
    "usage: weft data <subcommand> [args]\n"
    "\n"
    "  prepare IN OUT.bin   read IN as bytes (vocabulary 256) and write an llm.c token file.\n"
    "                       IN is a text file, or a folder whose regular files are read in\n"
    "                       name order (symlinks and *.dat skipped). An IN ending in .bin is\n"
    "                       read as a token file and copied.\n"
    "  info PATH            print the number of tokens, the largest token and the files read.\n"
    "\n"
    "A config's data.path may name the text or folder directly; `prepare` makes the token\n"
    "file once so that later runs read it without conversion.\n";

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

int prepare(const std::vector<std::string>& args) {
  if (args.size() != 2)
    throw ConfigError("prepare", "expected `weft data prepare IN OUT.bin`, got " +
                                     std::to_string(args.size()) + " argument(s)");
  const std::string& in = args[0];
  const std::string& out = args[1];
  if (std::filesystem::path(out).extension() != ".bin")
    throw ConfigError("OUT", "'" + out + "' must end in .bin: other names are read back as text");
  std::vector<std::string> files = data::token_source_files(in, "IN");
  std::vector<int32_t> tokens = data::read_token_file(in, "IN");
  data::write_token_file(out, tokens);
  const int32_t max_token = *std::max_element(tokens.begin(), tokens.end());
  std::printf("read %s: %zu file(s), %zu tokens (largest %d)\n", in.c_str(), files.size(),
              tokens.size(), max_token);
  std::printf("wrote %s: %zu tokens, %lld bytes\n", out.c_str(), tokens.size(),
              static_cast<long long>(data::kTokenHeaderBytes + 2 * int64_t(tokens.size())));
  return 0;
}

int info(const std::vector<std::string>& args) {
  if (args.size() != 1)
    throw ConfigError("info", "expected `weft data info PATH`, got " + std::to_string(args.size()) +
                                  " argument(s)");
  std::vector<std::string> files = data::token_source_files(args[0], "PATH");
  std::vector<int32_t> tokens = data::read_token_file(args[0], "PATH");
  const int32_t max_token = *std::max_element(tokens.begin(), tokens.end());
  std::printf("%s\n  tokens: %zu\n  largest token: %d (needs model.vocab >= %d)\n  files: %zu\n",
              args[0].c_str(), tokens.size(), max_token, max_token + 1, files.size());
  return 0;
}

}  // namespace

int cmd_data(const std::vector<std::string>& args) {
  if (args.empty() || (args.size() == 1 && wants_help(args))) {
    std::fputs(kHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (wants_help(args)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "prepare") return prepare(rest);
  if (args[0] == "info") return info(rest);
  throw ConfigError("data", "unknown subcommand '" + args[0] + "'; expected prepare or info");
}

}  // namespace weft::launch
