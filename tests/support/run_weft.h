// Runs the `weft` binary (or any command) as a user would and returns its exit code and
// combined output: the one helper the end-to-end tests share (header-only, so binaries
// that do not link weft_test_support can use it).
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

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

// Starts `weft ARGS...` in the background (for tests that signal it) with stdout and stderr
// going to the file `log`, OMP_NUM_THREADS=1 and the extra `env` entries ("K=V"). The caller
// waits for it and reaps it.
inline pid_t start_weft(const std::vector<std::string>& args, const std::string& log,
                        const std::vector<std::string>& env = {}) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  for (const std::string& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
  std::vector<char*> argv{const_cast<char*>("weft")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(WEFT_BINARY, argv.data());
  ::_exit(127);
}

}  // namespace weft::test
