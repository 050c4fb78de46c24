// The worker's side of `weft run`'s liveness check: when the agent passed a socket in
// WEFT_AGENT_HEARTBEAT_FD, a background thread writes one byte to it every
// WEFT_AGENT_HEARTBEAT_INTERVAL seconds. A stopped or frozen process stops writing, and the
// agent names it. The thread is detached: it never holds up the worker's exit.
#pragma once

namespace weft::launch {

inline constexpr const char* kHeartbeatFdVar = "WEFT_AGENT_HEARTBEAT_FD";
inline constexpr const char* kHeartbeatIntervalVar = "WEFT_AGENT_HEARTBEAT_INTERVAL";

// Starts the heartbeat thread when the variables are set (once per process; later calls do
// nothing). Marks the descriptor close-on-exec so that the worker's own children do not
// keep it. Never throws.
void start_agent_heartbeat() noexcept;

}  // namespace weft::launch
