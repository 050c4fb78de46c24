// The files a node's snapshot agent keeps outside its segments: its Unix socket, where the
// workers and weft run reach it (<tmp>/weft-snapshot-<job>-n<node>.sock), and its lock
// (/dev/shm/weft-agent-<job>-n<node>.lock), held with flock for as long as it lives. An
// agent that ends removes both; one killed (SIGKILL, its node lost whole) leaves both
// behind, and job ids are per job, so nothing would ever reuse them. weft run removes its
// own node's after it stopped its agent, `weft snapshot clean` every job's.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace weft::checkpoint {

// Where the agent of `job` on `node` listens: in the temporary directory ($TMPDIR), or in
// /tmp when that path would not fit a Unix socket address (107 bytes).
std::string agent_socket_path(const std::string& job, int node);
// The agent's lock.
std::string agent_lock_path(const std::string& job, int node);

// Takes the agent lock of `job` on `node` for this process: an open descriptor (close-on-exec)
// holding flock on the file the path names now, created when missing; -1 when it is held by
// another. Taking it is the choice of the index: weft run takes it and hands the descriptor
// to the agent it starts (--lock-fd), so that two weft runs starting at once cannot both
// find an index free. A held lock is tried again for `patience`: a sweep of stale files
// (below) holds one for microseconds, and an agent whose weft run died follows it
// (PR_SET_PDEATHSIG) within a moment, its node's successor wanting its name (it adopts the
// segments left under it). IoError when the file cannot be opened.
int take_agent_lock(const std::string& job, int node, std::chrono::milliseconds patience);
// Whether `fd` holds the agent lock of `job` on `node`: its flock is this process's (or
// free, and taken now) and it is the file the path names (not one a sweep unlinked).
bool holds_agent_lock(int fd, const std::string& job, int node);

// Removes the socket and the lock of `job`'s agent on `node` when no agent lives: the lock
// is taken first (an agent takes it before it binds its socket, so none can start while it
// is held), the socket goes unless something accepts on it, then the lock file. An agent
// alive (it holds the lock) keeps both. Returns the paths removed.
std::vector<std::string> remove_stale_agent_files(const std::string& job, int node);
// The same for every node of `job` that left a socket or a lock, or of every job ("").
std::vector<std::string> remove_stale_agent_files(const std::string& job = {});

}  // namespace weft::checkpoint
