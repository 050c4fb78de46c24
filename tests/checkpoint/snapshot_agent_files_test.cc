// What a killed snapshot agent leaves (its Unix socket, its lock in /dev/shm) and who may
// remove it (checkpoint/snapshot_agent_files.h): left behind, both go; an agent alive
// (its lock held) keeps both, and so does one between taking its lock and listening; a
// socket something accepts on stays; another job's files are never touched. The "agents"
// here are this process: a listening socket, a flock on a separate open file description
// (flock locks conflict between descriptions even within one process).
#include "checkpoint/snapshot_agent_files.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;

// A Unix socket bound at `path`; listening when `listen`. Closing it leaves the file, as a
// killed agent's does.
int bind_at(const std::string& path, bool listen) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  if (listen) {
    EXPECT_EQ(::listen(fd, 4), 0);
  }
  return fd;
}

// The lock file of an agent, held when `held` (the descriptor is returned; -1 when not held).
int lock_file(const std::string& path, bool held) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  if (held) {
    EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    return fd;
  }
  ::close(fd);
  return -1;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class AgentFiles : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    for (const std::string& job : {job_, other_})
      for (int node = 0; node < 4; ++node) {
        ::unlink(agent_socket_path(job, node).c_str());
        ::unlink(agent_lock_path(job, node).c_str());
      }
  }
  int keep(int fd) {
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }
  const std::string job_ = new_job_id(), other_ = new_job_id();
  std::vector<int> fds_;
};

TEST_F(AgentFiles, PathsNameTheJobAndNode) {
  EXPECT_EQ(agent_lock_path(job_, 3), "/dev/shm/weft-agent-" + job_ + "-n3.lock");
  const std::string s = agent_socket_path(job_, 3);
  EXPECT_TRUE(s.ends_with("/weft-snapshot-" + job_ + "-n3.sock")) << s;
  EXPECT_LT(s.size(), sizeof(sockaddr_un{}.sun_path));
}

TEST_F(AgentFiles, AKilledAgentsSocketAndLockAreRemoved) {
  const std::string sock = agent_socket_path(job_, 1), lock = agent_lock_path(job_, 1);
  ::close(bind_at(sock, true));  // the agent is gone: nothing accepts, the file stays
  lock_file(lock, false);
  ASSERT_TRUE(fs::exists(sock));
  std::vector<std::string> removed = remove_stale_agent_files(job_, 1);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_TRUE(contains(removed, sock) && contains(removed, lock));
  EXPECT_FALSE(fs::exists(sock));
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_TRUE(remove_stale_agent_files(job_, 1).empty());  // nothing left; no lock made
  EXPECT_FALSE(fs::exists(lock));
}

TEST_F(AgentFiles, ASocketWithoutItsLockGoesToo) {
  // A lock another agent of the job removed already (its adopt removes the ones not held).
  const std::string sock = agent_socket_path(job_, 2);
  ::close(bind_at(sock, false));
  EXPECT_EQ(remove_stale_agent_files(job_, 2), std::vector<std::string>{sock});
  EXPECT_FALSE(fs::exists(sock));
  EXPECT_FALSE(fs::exists(agent_lock_path(job_, 2)));
}

TEST_F(AgentFiles, ALiveAgentKeepsBoth) {
  const std::string sock = agent_socket_path(job_, 0), lock = agent_lock_path(job_, 0);
  keep(bind_at(sock, true));
  keep(lock_file(lock, true));
  EXPECT_TRUE(remove_stale_agent_files(job_, 0).empty());
  EXPECT_TRUE(remove_stale_agent_files(job_).empty());
  EXPECT_TRUE(fs::exists(sock));
  EXPECT_TRUE(fs::exists(lock));
}

TEST_F(AgentFiles, AnAgentBetweenItsLockAndItsListenKeepsTheSocket) {
  // Bound, not listening yet: refused like a dead one's, but the lock says it lives.
  const std::string sock = agent_socket_path(job_, 0);
  keep(bind_at(sock, false));
  keep(lock_file(agent_lock_path(job_, 0), true));
  EXPECT_TRUE(remove_stale_agent_files(job_, 0).empty());
  EXPECT_TRUE(fs::exists(sock));
}

TEST_F(AgentFiles, ASocketSomethingAcceptsOnStaysItsUnheldLockGoes) {
  const std::string sock = agent_socket_path(job_, 3), lock = agent_lock_path(job_, 3);
  keep(bind_at(sock, true));
  lock_file(lock, false);
  EXPECT_EQ(remove_stale_agent_files(job_, 3), std::vector<std::string>{lock});
  EXPECT_TRUE(fs::exists(sock));
}

TEST_F(AgentFiles, AJobsSweepFindsEveryNodeAndNoOtherJob) {
  for (int node : {0, 2}) ::close(bind_at(agent_socket_path(job_, node), true));
  lock_file(agent_lock_path(job_, 3), false);
  ::close(bind_at(agent_socket_path(other_, 0), true));
  std::vector<std::string> removed = remove_stale_agent_files(job_);
  EXPECT_EQ(removed.size(), 3u);
  for (int node : {0, 2}) EXPECT_TRUE(contains(removed, agent_socket_path(job_, node)));
  EXPECT_TRUE(contains(removed, agent_lock_path(job_, 3)));
  EXPECT_TRUE(fs::exists(agent_socket_path(other_, 0)));
}

}  // namespace
}  // namespace weft::checkpoint
