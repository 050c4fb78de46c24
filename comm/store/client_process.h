// Which process a store client is, so that a TCPStoreServer on the same machine can tell
// when that process has exited: a connection that closed because its process died will
// never reconnect, so the keys bound to it need not wait out bound_key_grace (which exists
// for a live client whose connection broke and that reconnects at once).
//
// Identity = pid, the pid namespace it is numbered in (the device and inode of
// /proc/self/ns/pid), and the process's start time (field 22 of /proc/<pid>/stat, clock
// ticks since boot). The namespace makes the pid meaningful to the server; the start time
// tells the process from a later one that reused its pid.
#pragma once

#include <cstdint>
#include <optional>

namespace weft::comm {

struct ClientProcess {
  int64_t pid = 0;
  uint64_t pid_ns_dev = 0, pid_ns_ino = 0;
  uint64_t start_ticks = 0;
};

// This process; nullopt where /proc cannot say (then the client does not offer it).
std::optional<ClientProcess> this_client_process();

// A pidfd (pidfd_open) for `p` when it is a process the caller can see: in the caller's own
// pid namespace, and still the process that started at p.start_ticks (checked after the
// pidfd pins it, so a reused pid is never taken for it). The pidfd becomes readable when the
// process exits. -1 otherwise (another namespace, gone already and reused, no pidfd_open):
// the caller then knows nothing about the process and must assume it lives.
int open_client_process(const ClientProcess& p);

}  // namespace weft::comm
