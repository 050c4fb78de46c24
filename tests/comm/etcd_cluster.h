// EtcdCluster: real etcd members for tests, on free loopback ports with their data in a
// fresh temporary directory; killed and reaped however the test ends (a crashed test binary
// takes its members with it, and the next EtcdCluster removes the data it left).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <string>
#include <vector>

#include "tests/support/eventually.h"

namespace weft::test {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";
// Whether kEtcdBinary exists and is executable (tests skip, naming it, when not).
bool etcd_available();

// The one skip of the etcd tests: etcd is not installed (setup.sh installs etcd-server).
#define SKIP_WITHOUT_ETCD()                                                   \
  if (!::weft::test::etcd_available())                                        \
  GTEST_SKIP() << ::weft::test::kEtcdBinary                                   \
               << " is not installed (setup.sh installs it: apt-get install etcd-server)"


inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Starts the members from the calling thread, which must outlive them (gtest's main
// thread): each member gets PR_SET_PDEATHSIG = SIGKILL, so even a crashed test binary
// leaves no etcd behind. Elections are fast (25 ms heartbeats, 250 ms election timeout),
// which also makes etcd's smallest lease TTL 1 s instead of 2 s.
class EtcdCluster {
 public:
  // Starts `members` members as one cluster and waits until each serves a linearizable
  // read (a leader exists). Throws std::runtime_error with the member's log tail when one
  // exits or does not serve within 20 s; the members already started are killed first.
  explicit EtcdCluster(int members = 1);
  // SIGKILLs and reaps every member still running, then removes the data directory.
  // Never throws.
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return int(members_.size()); }
  // "127.0.0.1:PORT", member i's client URL.
  std::string endpoint(int i) const;
  std::vector<std::string> endpoints() const;
  // SIGKILL (a crash, no goodbye to its peers), then reaps it.
  void kill(int i);
  bool running(int i) const { return members_[i].pid > 0; }
  // The member that is the raft leader now, as the running members report it; -1 when
  // they report none. Each running member is asked once.
  int leader() const;
  // The last lines of member i's log, for failure messages.
  std::string log_tail(int i) const;

 private:
  struct Member {
    std::string name, dir, log;
    uint16_t client_port = 0, peer_port = 0;
    pid_t pid = -1;
  };
  void start(int i, const std::string& initial_cluster);
  void wait_ready(int i);
  void stop_all() noexcept;

  std::string root_;
  std::vector<Member> members_;
};

}  // namespace weft::test
