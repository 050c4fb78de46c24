// Runs the `weft` binary (or any command) as a user would and returns its exit code and
// combined output: the one helper the end-to-end tests share (header-only, so binaries
// that do not link weft_test_support can use it).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace weft::test {

struct CommandResult {
  int code = -1;    // exit code; 128 + signal when killed by one
  std::string out;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// `weft ARGS`, with the binary this build produced (WEFT_BINARY).
inline CommandResult run_weft(const std::string& args) {
  return run_command(std::string(WEFT_BINARY) + " " + args);
}

}  // namespace weft::test
