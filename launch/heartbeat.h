// The worker's side of `weft run`'s liveness check: when the agent passed a socket in
// WEFT_AGENT_HEARTBEAT_FD, a background thread writes one byte to it every
// WEFT_AGENT_HEARTBEAT_INTERVAL seconds. A stopped or frozen process stops writing, and the
// agent names it. The thread is detached: it never holds up the worker's exit. It is named
// kHeartbeatThreadName, so that the agent can tell a starved worker from a hung one.
//
// The same socket carries one more message, a poke: a worker whose collective failed (a
// peer is gone) tells its agent to look at the membership now rather than at its next
// monitor pass (--monitor-interval, 0.1 s): the lost node's agent has usually left by then,
// and the survivors' new epoch is posted within milliseconds of the failure.
#pragma once

namespace weft::launch {

inline constexpr const char* kHeartbeatFdVar = "WEFT_AGENT_HEARTBEAT_FD";
inline constexpr const char* kHeartbeatIntervalVar = "WEFT_AGENT_HEARTBEAT_INTERVAL";
inline constexpr const char* kHeartbeatThreadName = "weft-heartbeat";  // its comm (15 max)

// Starts the heartbeat thread when the variables are set (once per process; later calls do
// nothing). Marks the descriptor close-on-exec so that the worker's own children do not
// keep it. Never throws.
void start_agent_heartbeat() noexcept;

// Bytes on the socket: a heartbeat, and a poke (the agent treats any other byte as a beat).
inline constexpr char kBeatByte = 'h';
inline constexpr char kPokeByte = 'p';

// Sends a poke when the heartbeat runs (no-op otherwise). Never throws, never blocks.
void poke_agent() noexcept;

// The agent's side: whether worker `pid` has a heartbeat thread and it is runnable (state R
// in /proc/<pid>/task/<tid>/stat). The thread only ever sleeps one interval or sends one
// byte without blocking, so one runnable yet silent for the heartbeat timeout is waiting for
// a CPU: the worker is starved (a machine overloaded, a CPU quota spent), not hung. False
// when it is stopped (T), asleep or blocked (S, D: a cgroup freezer's too), gone, or unknown.
bool heartbeat_thread_runnable(int pid) noexcept;

}  // namespace weft::launch
