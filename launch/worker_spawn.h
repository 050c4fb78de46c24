// Starting one worker of `weft run` so that it cannot outlive its agent: its own process
// group, PR_SET_PDEATHSIG(SIGKILL) checked against the getppid() race, no descriptor of the
// agent's but its stdout, stderr and the heartbeat socket (fd 3). And the guardian: a tiny
// process in its own group that SIGKILLs every worker's group when the agent dies, however
// it dies (a worker's own children do not inherit the parent-death signal).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace weft::launch {

struct SpawnedWorker {
  pid_t pid = -1;    // also its process group id
  int out_fd = -1;   // read ends of its stdout and stderr (non-blocking, close-on-exec)
  int err_fd = -1;
  int beat_fd = -1;  // the agent's end of the heartbeat socket
};

// Forks and execs `command` (a first word of "weft" is this binary) with the current
// environment plus `env` (overriding). Throws IoError when fork or a pipe fails; a command
// that cannot be executed exits 127 after saying why on its stderr.
SpawnedWorker spawn_worker(const std::vector<std::string>& command,
                           const std::vector<std::pair<std::string, std::string>>& env);

// Kills every process group it was told of when the agent (its parent) dies or closes it.
class Guardian {
 public:
  Guardian();  // forks the guardian; throws IoError on failure
  // Closes the pipe (whatever groups are still watched get SIGKILL) and reaps the guardian,
  // which exits at once on end of file: an agent that restarts its workers makes one per
  // attempt, and an unreaped one stays a zombie for the agent's whole life.
  ~Guardian();
  void watch(pid_t pgid);
  void release(pid_t pgid);  // the agent cleaned this group itself

 private:
  void send(int op, pid_t pgid);
  int fd_ = -1;
  pid_t pid_ = -1;
};

// The descriptor the heartbeat socket has in a worker.
inline constexpr int kWorkerBeatFd = 3;

}  // namespace weft::launch
