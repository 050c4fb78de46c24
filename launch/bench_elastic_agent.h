// One `weft run` agent that `weft bench elastic` and `weft bench snapshot` start: its stdout
// and stderr share one pipe (so its lines keep the order the agent wrote them in: its own
// messages on stderr, its workers' on stdout), and each line is stamped when it arrives here.
// Once reaped, a killed agent's scratch folder is removed (launch/scratch_dir.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace weft::launch {

struct StampedLine {
  double t = 0;  // seconds since the bench's origin (steady clock), on arrival
  std::string text;
};

class BenchAgent {
 public:
  using Clock = std::chrono::steady_clock;
  // Starts `argv` (argv[0]: an executable path) in its own process group with stdout and
  // stderr into one pipe, dying with this process (PR_SET_PDEATHSIG); every line also goes
  // to `log_path` with its stamp. Throws IoError when the pipe, fork or the log fails.
  BenchAgent(const std::vector<std::string>& argv, const std::string& log_path,
             Clock::time_point origin);
  // SIGKILLs and reaps the agent if it still runs, then removes its scratch folder as
  // pump() does; never throws.
  ~BenchAgent();
  BenchAgent(const BenchAgent&) = delete;
  BenchAgent& operator=(const BenchAgent&) = delete;

  pid_t pid() const { return pid_; }
  int fd() const { return fd_; }
  const std::vector<StampedLine>& lines() const { return lines_; }
  bool running() const { return running_; }
  int exit_code() const { return code_; }  // 128 + signal when killed; -1 while running
  // Reads what the pipe holds (non-blocking) and stamps each whole line; reaps the agent
  // once it ended, then removes the scratch folders of dead weft runs under $TMPDIR
  // (ScratchDir::remove_abandoned): a SIGKILLed agent's is among them.
  void pump();
  void kill();  // SIGKILL to the agent alone: its workers die with it, as on a node's death

 private:
  void add_line(std::string text);
  void reaped(int status);  // exit code, then the sweep
  pid_t pid_ = -1;
  int fd_ = -1;
  bool running_ = true;
  int code_ = -1;
  Clock::time_point origin_;
  std::string partial_;
  std::vector<StampedLine> lines_;
  std::FILE* log_ = nullptr;
};

// Waits up to `ms` for output from any running agent, then pumps every agent.
void pump_agents(std::vector<std::unique_ptr<BenchAgent>>& agents, int ms);

}  // namespace weft::launch
